"""Supervision of the live stream (contract 1.4): Dagster has no streaming runs, so the
stream is a process of its own (`stream start`) and this sensor keeps it alive.

Each tick: running, nothing to do; stopped by `stream stop`, left alone (the tick says
so); otherwise start it, and when a pid file outlived its process (killed, crashed, the
machine restarted) report the death on `raw/orders` as an observation with the end of the
stream's log, so the asset's page shows when the stream died and why. A restarted stream
resumes from its checkpoint: the batch it was in is re-run over the same offsets, and
Delta's transaction id skips it if it had committed (docs/live-stream.md).

Stopped by default: a deployment that runs the stream turns it on in the UI (Automation),
with `dagster sensor start stream_supervisor`, or with BACKFILL_STREAM_SUPERVISOR=true
(`make ui STREAM=on`), which makes it running by default.
"""

from __future__ import annotations

from pathlib import Path

from dagster import (
    AssetObservation,
    DefaultSensorStatus,
    MetadataValue,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from backfill_platform.resources.stream_process import StreamProcess, StreamProcessError
from backfill_platform.settings import STREAM_SUPERVISOR, bool_setting
from backfill_platform.tables import RAW_ORDERS

STREAM_DIED = "stream_died"  # the observation's `event` on raw/orders


def stream_process(context: SensorEvaluationContext) -> StreamProcess:
    """The process files under the instance's home, where `stream start` keeps them."""
    return StreamProcess(Path(context.instance.root_directory) / "stream")


@sensor(
    name="stream_supervisor",
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING
    if bool_setting(STREAM_SUPERVISOR)
    else DefaultSensorStatus.STOPPED,
    description="Keeps the live stream's process running: starts it when it is not running "
    "(unless `stream stop` stopped it) and reports on raw/orders when it died.",
)
def stream_supervisor(context: SensorEvaluationContext) -> SensorResult:
    """A tick requests no run, so Dagster's UI labels every tick "0 runs requested"; what it
    did is said three ways: its skip reason (the label's tooltip and the tick's details),
    its cursor (the tick table's Cursor column: the action and the pid, on every tick) and,
    when it started the stream, a line in the tick's logs ("View logs")."""
    process = stream_process(context)
    state = process.state()
    if state.pid is not None:
        return SensorResult(
            skip_reason=f"the stream is running (pid {state.pid}); nothing to do",
            cursor=f"running pid {state.pid}",
        )
    if state.stopped:
        return SensorResult(
            skip_reason="left the stream stopped: `stream stop` stopped it; `stream start` "
            "runs it again and puts it back under this sensor",
            cursor="stopped by stream stop",
        )
    try:
        pid = process.start()
    except StreamProcessError as error:  # another starter won the race: it runs now
        return SensorResult(skip_reason=str(error), cursor="started elsewhere")
    if state.died is None:
        context.log.info(f"started the stream (pid {pid}): it was not running")
        return SensorResult(
            skip_reason=f"started the stream (pid {pid}): it was not running",
            cursor=f"started pid {pid}",
        )
    context.log.warning(f"restarted the stream (pid {pid}): pid {state.died} had died")
    died = AssetObservation(
        RAW_ORDERS,
        metadata={
            "event": STREAM_DIED,
            "died_pid": state.died,
            "restarted_pid": pid,
            "log_tail": MetadataValue.md(f"```\n{process.log_tail()}\n```"),
        },
    )
    return SensorResult(
        skip_reason=f"restarted the stream (pid {pid}): pid {state.died} had died",
        cursor=f"restarted pid {pid} ({state.died} died)",
        asset_events=[died],
    )
