"""A stream catch-up that SIGKILLs itself (Python driver and Spark JVM) at a chosen batch:
after that batch's Delta commit and before Spark records the batch done in its checkpoint
(`after_commit`, the window the Delta transaction id exists for), or before it writes
anything (`before_commit`). Deterministic: the point is a batch id, not a moment.

    python -m backfill_platform_tests.reliability.stream_child LAKEHOUSE BOOTSTRAP TOPIC BATCH WHEN
"""

from __future__ import annotations

import os
import signal
import sys

from backfill_platform.operations import stream
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.kafka import OrdersTopicResource
from backfill_platform_tests.reliability.worker import worker_spark

BATCH_SIZE = 10  # messages per micro-batch, so a few dozen messages make several batches


def main(lakehouse: str, bootstrap: str, topic: str, batch: str, when: str) -> int:
    real = stream.write_batch

    def write_then_die(lake, messages, batch_id, app_id, topic_name, fold=None):
        if batch_id == int(batch) and when == "before_commit":
            os.killpg(0, signal.SIGKILL)
        report = real(lake, messages, batch_id, app_id, topic_name, fold)
        if batch_id == int(batch) and when == "after_commit":
            os.killpg(0, signal.SIGKILL)
        return report

    stream.write_batch = write_then_die
    lake = LakehouseResource(root_dir=lakehouse, spark=worker_spark())
    orders = OrdersTopicResource(
        bootstrap_servers=bootstrap, topic=topic, max_offsets_per_batch=BATCH_SIZE
    )
    stream.catch_up(lake, orders)
    return 0  # the kill point was never reached


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
