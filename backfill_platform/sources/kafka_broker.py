"""Start and stop a one-node Apache Kafka broker (KRaft) on 127.0.0.1: the demo's and the
tests' live stream (docs/live-stream.md).

    python -m backfill_platform.sources.kafka_broker start --data data/kafka   # make kafka-start
    python -m backfill_platform.sources.kafka_broker stop --data data/kafka    # make kafka-stop

The broker is Maven Central's `kafka_2.13` (`make jars` fetches it into
`.spark-jars/kafka-broker/`), run as `java kafka.Kafka server.properties` after the
storage is formatted once: one process that is broker and controller. Its log goes to
`<data>/broker.log`, never to the terminal.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from backfill_platform.processes import running_as
from backfill_platform.resources.jars import KAFKA_BROKER_DIR
from backfill_platform.resources.kafka import CLIENT_LOG
from backfill_platform.resources.spark import spark_jars_dir
from backfill_platform.sources.crm_process import free_port

PID_FILE = "broker.pid"
LOG_FILE = "broker.log"
START_TIMEOUT_SECONDS = 90
# Log4j 2 for the broker: everything to one file beside its data.
LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.state.name = state.change.logger
logger.state.level = WARN
"""


class BrokerError(RuntimeError):
    """The broker's jars are missing, or it did not start; its log says why."""


def broker_classpath() -> str:
    lib = spark_jars_dir() / KAFKA_BROKER_DIR
    if not any(lib.glob("kafka_2.13-*.jar")):
        raise BrokerError(f"the Kafka broker's jars are missing from {lib}: run `make jars`")
    return f"{lib}/*"


def server_properties(data: Path, port: int, controller_port: int) -> str:
    """One node, broker and controller, plaintext on loopback; every internal topic with
    one replica; 7 days of retention (contract 1.4)."""
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={data / 'log'}",
            "num.partitions=4",
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "log.retention.hours=168",
            "auto.create.topics.enable=false",
            "",
        ]
    )


@dataclass
class KafkaBroker:
    """A running broker: its process (None when found through its pid file) and address."""

    bootstrap: str
    data: Path
    process: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.data / LOG_FILE

    def create_topic(self, topic: str, partitions: int = 4) -> None:
        """The topic with `partitions` partitions; one that exists already is left as it is."""
        create_topic(self.bootstrap, topic, partitions)

    def kill(self) -> None:
        """SIGKILL: the broker dies at once (fault trials)."""
        pid = self._pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._reap()

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (a controlled shutdown), then SIGKILL if it has not stopped in time."""
        pid = self._pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(pid, self.process):
            time.sleep(0.2)
        if _alive(pid, self.process):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._reap()

    def _pid(self) -> int | None:
        if self.process is not None:
            return self.process.pid if self.process.poll() is None else None
        path = self.data / PID_FILE
        pid = int(path.read_text()) if path.exists() else None
        if pid is not None and not _alive(pid, None):
            path.unlink(missing_ok=True)  # a broker that ended; its pid may be another's now
            return None
        return pid

    def _reap(self) -> None:
        if self.process is not None:
            self.process.wait()
        (self.data / PID_FILE).unlink(missing_ok=True)

    def __enter__(self) -> KafkaBroker:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID in URL-safe base64 without '-', drawn again as
    Kafka's own `Uuid.randomUuid()` does (1 in 64 start with '-' otherwise, and the storage
    tool's argument parser reads such an id as an option: the broker would not start)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if "-" not in text:
            return text


def start_broker(
    data: Path, port: int | None = None, controller_port: int | None = None, detach: bool = False
) -> KafkaBroker:
    """Format `data` on first use, start the broker and wait until it answers metadata.

    `detach`: the broker outlives this process (`make kafka-start`), found again through
    `<data>/broker.pid`. A broker whose storage is already formatted keeps its cluster id
    and its topics' messages.
    """
    data = data.resolve()
    data.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    controller_port = controller_port or free_port()
    config = data / "server.properties"
    config.write_text(server_properties(data, port, controller_port))
    log4j = data / "log4j2.properties"
    log4j.write_text(LOG4J2.format(log=data / LOG_FILE))
    java = [
        "java",
        "-Xms256m",
        "-Xmx512m",
        f"-Dlog4j2.configurationFile={log4j.as_uri()}",
        f"-Dkafka.logs.dir={data}",
        "-cp",
        broker_classpath(),
    ]
    if not (data / "log" / "meta.properties").exists():
        formatted = subprocess.run(
            [*java, "kafka.tools.StorageTool", "format", "-t", new_cluster_id(), "-c", str(config)],
            capture_output=True,
            text=True,
        )
        if formatted.returncode != 0:
            raise BrokerError(f"formatting {data} failed: {formatted.stdout}{formatted.stderr}")
    log = data / LOG_FILE
    logged = log.stat().st_size if log.exists() else 0  # the log is appended start after start
    with open(data / "broker.out", "ab") as out:
        process = subprocess.Popen(
            [*java, "kafka.Kafka", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=detach,
        )
    (data / PID_FILE).write_text(str(process.pid))
    broker = KafkaBroker(f"127.0.0.1:{port}", data, None if detach else process)
    try:
        _wait_ready(broker.bootstrap, process, log, logged)
    except BrokerError:
        broker.process = process
        broker.stop(timeout=10)
        raise
    return broker


def controller_port_beside(port: int) -> int:
    """The controller's port: the one after the client's when it is free, else any free one.
    Only the broker itself dials it, so it may change between starts; a taken port+1 (another
    service's ephemeral port) would otherwise kill the broker at start."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port + 1))
        except OSError:
            return free_port()
    return port + 1


def running_broker(data: Path, bootstrap: str) -> KafkaBroker:
    """The detached broker of `data` (`make kafka-stop`)."""
    return KafkaBroker(bootstrap, data.resolve())


@contextmanager
def kafka_broker(data: Path, topic: str, partitions: int = 4) -> Iterator[KafkaBroker]:
    """A broker on free ports with `topic`, stopped on exit (tests)."""
    with start_broker(data) as broker:
        broker.create_topic(topic, partitions)
        yield broker


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """The topic, keeping every message: the demo's clock may lie in the past, and a
    time-based retention would expire such messages at once (contract 1.4 asks >= 7 days)."""
    new = NewTopic(
        topic, num_partitions=partitions, replication_factor=1, config={"retention.ms": "-1"}
    )
    admin = admin_client(bootstrap)  # kept: a client that is gone never completes its futures
    future = admin.create_topics([new])[topic]
    try:
        future.result(timeout=60)
    except KafkaException as error:
        if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def _wait_ready(bootstrap: str, process: subprocess.Popen, log: Path, logged: int) -> None:
    """Until the broker accepts connections and lists itself in metadata, or it exits, or
    the timeout. The port is probed first: a client would log every refused connection."""
    host, _, port = bootstrap.rpartition(":")
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            cause = _first_error(log, logged)
            raise BrokerError(f"the broker exited ({process.returncode}): {cause}; see its log")
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
            try:
                if admin_client(bootstrap).list_topics(timeout=5).brokers:
                    return
            except KafkaException:
                pass  # listening, not serving metadata yet
        time.sleep(0.5)
    raise BrokerError(f"the broker at {bootstrap} did not answer in {START_TIMEOUT_SECONDS} s")


def _first_error(log: Path, logged: int) -> str:
    """This start's first ERROR line in the log (e.g. a port in use), so the refusal names
    the cause; `logged` is the log's size before the start."""
    with contextlib.suppress(OSError), open(log, "rb") as text:
        text.seek(logged)
        for line in text.read().decode(errors="replace").splitlines():
            if "] ERROR " in line or "] FATAL " in line:
                return line.split("] ", 1)[1][:300]
    return "no ERROR line in its log"


def admin_client(bootstrap: str) -> AdminClient:
    """An admin client whose librdkafka log goes to Python's logging, not the terminal."""
    return AdminClient({"bootstrap.servers": bootstrap}, logger=CLIENT_LOG)


def _alive(pid: int, process: subprocess.Popen | None) -> bool:
    if process is not None:
        return process.poll() is None
    with contextlib.suppress(ChildProcessError):  # not our child: its command line decides
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our detached child, exited: reaped here
            return False
    return running_as(pid, "kafka.Kafka")  # a reused pid is another process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--data", type=Path, default=Path("data/kafka"))
    parser.add_argument("--bootstrap", default=os.environ.get("BACKFILL_KAFKA_BOOTSTRAP", ""))
    parser.add_argument("--topic", default=os.environ.get("BACKFILL_ORDERS_TOPIC") or "orders")
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args(argv)
    bootstrap = args.bootstrap or "127.0.0.1:9092"
    if args.action == "stop":
        broker = running_broker(args.data, bootstrap)
        if broker._pid() is None:
            print(f"no broker running from {args.data}")
            return 0
        broker.stop()
        print(f"broker from {args.data} stopped")
        return 0
    pid_file = args.data / PID_FILE
    if pid_file.exists() and _alive(int(pid_file.read_text()), None):
        print(f"a broker from {args.data} is running already (pid {pid_file.read_text()})")
        return 0
    port = int(bootstrap.rpartition(":")[2])
    try:
        broker = start_broker(
            args.data, port=port, controller_port=controller_port_beside(port), detach=True
        )
        broker.create_topic(args.topic, args.partitions)
    except (BrokerError, KafkaException) as error:
        print(f"Refused: {error} ({args.data / LOG_FILE})", file=sys.stderr)
        return 1
    print(
        f"broker at {broker.bootstrap}, topic {args.topic} ({args.partitions} partitions), "
        f"data and log in {args.data} (make kafka-stop stops it)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
