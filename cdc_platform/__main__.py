"""Command line: ``python -m cdc_platform <command>``.

  stream            run the capture engine in the foreground (SIGTERM/Ctrl-C: flush, checkpoint,
                    exit 0); ``--until-caught-up`` for batch use
  snapshot          snapshot one table in the foreground, or pause/resume/stop its session
  signal            send a signal (execute-snapshot, stop/pause/resume-snapshot, log) to the
                    signal topic, as an operator would with a Kafka console producer
  demo              the zero-configuration demo (what ``make demo`` runs; ``--s3``: on a
                    private S3 server and REST catalog, what ``make demo-s3`` runs;
                    ``--spark-cluster``: and a private Spark cluster, ``make demo-cluster``)
  ui                start the demo's services and ``dagster dev`` on the demo config

``demo`` and ``ui`` stop everything they started on Ctrl-C, SIGTERM or SIGHUP, and leave no
process behind (``devservices.supervisor``).
  config-reference  print every config key with its type, default and meaning (Markdown)
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any


def _stop_on_signals(what: str) -> threading.Event:
    """An event SIGTERM and Ctrl-C set (logging ``what`` happens next), for a clean stop."""
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        logging.info(f"signal {signal.Signals(signum).name}: {what}")
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop


def _stream(args: argparse.Namespace) -> int:
    from cdc_platform.capture.engine import CaptureEngine, EngineOptions
    from cdc_platform.capture.landing.zone import LandingZone
    from cdc_platform.capture.metrics import serve_engine_metrics
    from cdc_platform.capture.standing import StandingReport, checkpoint_headroom
    from cdc_platform.capture.start_errors import check_source
    from cdc_platform.config import load_settings

    settings = load_settings(args.config).for_source(args.source)
    check_source(settings)  # before any log line: a start failure is one line on stderr
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = _stop_on_signals("stopping after the current event")
    engine = CaptureEngine(
        EngineOptions.from_settings(settings),
        LandingZone.from_settings(settings),
    )
    log = logging.getLogger("cdc_platform.stream")
    standing = StandingReport(lambda: checkpoint_headroom(settings)[1], log)
    endpoint = serve_engine_metrics(engine, settings, standing.headroom)
    if endpoint is not None:
        log.info(f"metrics: {endpoint.url}")

    def progress() -> None:
        stats = engine.stats
        lag, _headroom = standing.tick(stats)
        log.info(f"{stats.records} records in {stats.transactions} transactions, GTID "
                 f"{stats.position or '-'}, lag {'-' if lag is None else f'{lag:.1f}s'}")

    ticker = _Ticker(progress, every_seconds=30.0)
    try:
        stats = engine.run(stop, stop_when_caught_up=args.until_caught_up,
                           caught_up_idle_seconds=args.idle_seconds)
    finally:
        ticker.stop()
        if endpoint is not None:
            endpoint.close()
    logging.info(f"stopped: {stats.records} records in {stats.transactions} transactions, "
                 f"GTID {stats.position or '-'}")
    return 0


def _apply(args: argparse.Namespace) -> int:
    """The applier in the foreground (the ``apply_changes`` job runs the same loop): keeps
    every target merged with the changelog until stopped."""
    from cdc_platform.config import load_settings
    from cdc_platform.lake.applier.events import Applied
    from cdc_platform.lake.applier.process import build_applier
    from cdc_platform.lake.metrics import applier_metrics, serve_applier_metrics

    settings = load_settings(args.config).for_source(args.source)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = _stop_on_signals("stopping after the merge in progress")

    def report(event: Any) -> None:
        logging.info(event.describe() if isinstance(event, Applied) else f"applier: {event}")

    metrics = applier_metrics(settings)
    applier = build_applier(settings, metrics.observing(report))
    endpoint = serve_applier_metrics(settings, metrics, applier)
    if endpoint is not None:
        logging.info(f"metrics: {endpoint.url}")
    try:
        applier.run(stop)
    finally:
        if endpoint is not None:
            endpoint.close()
    logging.info(f"stopped: {applier.merges} merges in {applier.cycles} passes")
    return 0


def _publish(args: argparse.Namespace) -> int:
    """The change-topic publisher in the foreground (the ``publish_changes`` job runs the same
    loop): landing zone -> Debezium-envelope Kafka topics until stopped."""
    from cdc_platform.config import load_settings
    from cdc_platform.topics.metrics import serve_publisher_metrics
    from cdc_platform.topics.producer import PublishError
    from cdc_platform.topics.publisher import describe, open_publisher

    settings = load_settings(args.config).for_source(args.source)
    if not settings.source.change_topics.enabled:
        print(f"cdc_platform publish: change topics are off for {settings.source.server_name!r}"
              ": set change_topics.enabled: true (sources[].change_topics)", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = _stop_on_signals("stopping after the batch in progress")
    publisher = open_publisher(settings)
    endpoint = serve_publisher_metrics(settings, publisher)
    if endpoint is not None:
        logging.info(f"metrics: {endpoint.url}")
    ticker = _Ticker(lambda: logging.info(describe(publisher.stats)), every_seconds=30.0)
    try:
        publisher.run(stop, stop_when_caught_up=args.until_caught_up)
    except PublishError as error:
        print(f"cdc_platform publish: {error}", file=sys.stderr)
        return 1
    finally:
        ticker.stop()
        if endpoint is not None:
            endpoint.close()
    logging.info(f"stopped: {describe(publisher.stats)}")
    return 0


class _Ticker:
    """Calls ``tick`` every ``every_seconds`` on a daemon thread until ``stop()``: the
    ``stream`` command's progress lines and headroom readings, as the Dagster run's ticks."""

    def __init__(self, tick: Callable[[], None], every_seconds: float) -> None:
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(tick, every_seconds),
                                        name="progress", daemon=True)
        self._thread.start()

    def _run(self, tick: Callable[[], None], every_seconds: float) -> None:
        while not self._stopped.wait(every_seconds):
            try:
                tick()
            except Exception:  # noqa: BLE001 - a progress line is never worth the engine
                logging.exception("progress report failed")

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)


def _progress_logger(describe: Callable[[Any], str], every_seconds: float = 5.0
                     ) -> Callable[[Any], None]:
    """An ``on_progress`` that logs the snapshot's progress at most every few seconds, and
    each change of state (waiting, open, paused, done)."""
    last: list[Any] = [None, 0.0]

    def on_progress(progress: Any) -> None:
        now = time.monotonic()
        if progress.state != last[0] or now - last[1] >= every_seconds:
            last[:] = [progress.state, now]
            logging.info(describe(progress))
    return on_progress


def _snapshot(args: argparse.Namespace) -> int:
    """Snapshot one table in the foreground (the snapshot asset does the same in Dagster), or
    pause/resume/stop its session. The capture engine (``stream``) must be running."""
    from cdc_platform.capture.landing.zone import LandingZone
    from cdc_platform.capture.names import resolve_table_id, split_table_id
    from cdc_platform.capture.snapshot.errors import SnapshotError
    from cdc_platform.capture.snapshot.reading import progress as snapshot_progress
    from cdc_platform.capture.snapshot.reading import reader as snapshot_reader
    from cdc_platform.capture.snapshot.reading.actions import request_action
    from cdc_platform.capture.snapshot.reading.metrics import ReadingTable, serve_snapshot_metrics
    from cdc_platform.capture.snapshot.reading.progress import describe_progress
    from cdc_platform.capture.start_errors import check_source
    from cdc_platform.config import load_settings

    settings = load_settings(args.config).for_source(args.source)
    if args.action == "run":
        check_source(settings)  # before any log line: a start failure is one line on stderr
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.action != "run":
        landing = LandingZone.from_settings(settings)
        try:  # db.table, `my.db`.table or plain my.db.table, as the engine recorded them
            database, table = split_table_id(
                resolve_table_id(args.table, landing.read_tables()) or args.table)
        except ValueError as error:
            logging.error(f"snapshot {args.action}: {error}")
            return 1
        request = request_action(landing, database, table, args.action)
        logging.info(f"snapshot of {args.table}: {args.action} requested for session "
                     f"{request.session_id}")
        return 0
    stop = _stop_on_signals("stopping the snapshot session")
    try:
        reader = snapshot_reader.reader_from_settings(
            settings, args.table,
            chunk_size=(snapshot_reader.DEFAULT_CHUNK_SIZE if args.chunk_size is None
                        else args.chunk_size),
            condition=args.condition,
            surrogate_key=args.surrogate_key.split(",") if args.surrogate_key else None)
        latest: list[ReadingTable] = []
        log_progress = _progress_logger(describe_progress)

        def on_progress(progress: snapshot_progress.SnapshotProgress) -> None:
            latest[:] = [ReadingTable(progress.table_id, progress, False)]
            log_progress(progress)

        endpoint = serve_snapshot_metrics(settings, lambda: list(latest),
                                          logging.getLogger("cdc_platform.snapshot"))
        try:
            result = reader.run(stop, on_progress)
        finally:
            if endpoint is not None:
                endpoint.close()
    except SnapshotError as error:
        logging.error(str(error))
        return 1
    logging.info(f"snapshot of {args.table}: {result.status_text}, {result.rows} rows in "
                 f"{result.chunks} chunks ({result.rejected} rejected and read again), "
                 f"{result.rows_per_second:,.0f} rows/s")
    ended = (snapshot_progress.SnapshotStatus.DONE, snapshot_progress.SnapshotStatus.STOPPED)
    return 0 if result.status in ended else 2


def _signal(args: argparse.Namespace) -> int:
    """Produce one signal message (key: the source's server name) to the signal topic."""
    from cdc_platform.capture.signals.kafka import (
        KafkaChannelError,
        KafkaTopics,
        kafka_error_text,
    )
    from cdc_platform.capture.signals.messages import EXECUTE_SNAPSHOT, LOG, signal_value
    from cdc_platform.config import CONFIG_ENV, load_settings

    if not args.config and not os.environ.get(CONFIG_ENV):
        from cdc_platform.demo.run import use_demo_broker

        use_demo_broker()  # the embedded demo config: the demo's broker, if one is running
    settings = load_settings(args.config).for_source(args.source)
    signals = settings.signals
    bootstrap = args.bootstrap_servers or signals.kafka.bootstrap_servers
    if not bootstrap:
        print("no Kafka to send to: set signals.kafka.bootstrap_servers in the config (or "
              "CDC_KAFKA_BOOTSTRAP for the demo config), or pass --bootstrap-servers",
              file=sys.stderr)
        return 2
    data: dict[str, Any] = {}
    if args.type == LOG:
        data["message"] = " ".join(args.tables)
    elif args.tables:
        data["data-collections"] = list(args.tables)
    if args.type == EXECUTE_SNAPSHOT:
        if not args.tables:
            print("execute-snapshot needs at least one table (database.table or a regular "
                  "expression)", file=sys.stderr)
            return 2
        data["type"] = "INCREMENTAL"
        if args.filter:
            data["additional-conditions"] = [{"data-collection": t, "filter": args.filter}
                                             for t in args.tables]
        if args.surrogate_key:
            data["surrogate-key"] = args.surrogate_key
    elif args.filter or args.surrogate_key:
        print(f"--filter and --surrogate-key are for execute-snapshot, not {args.type}",
              file=sys.stderr)
        return 2
    value = signal_value(args.type, data, args.id)
    try:
        offset = KafkaTopics(bootstrap, signals.kafka.config).produce(
            signals.topic, settings.source.server_name, value)
    except KafkaChannelError as error:  # one line, not a traceback
        print(f"signal not sent: {' '.join(kafka_error_text(error).split())}",
              file=sys.stderr)
        return 1
    print(f"sent to {signals.topic} (offset {offset}, key {settings.source.server_name}): "
          f"{value.decode()}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from cdc_platform.demo.run import run_demo

    return run_demo(orders=args.orders, workload_seconds=args.workload_seconds, s3=args.s3,
                    spark_cluster=args.spark_cluster)


def _ui(args: argparse.Namespace) -> int:
    from cdc_platform.demo.run import run_ui

    return run_ui(port=args.port)


def _config_reference(args: argparse.Namespace) -> int:
    from cdc_platform.config import config_reference

    print(config_reference())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_platform", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    stream = commands.add_parser("stream", help="run the capture engine in the foreground")
    stream.add_argument("--source", help="sources[].server_name of the source (needed "
                        "when the config has several)")
    stream.add_argument("--config", help="config file (default: $CDC_PLATFORM_CONFIG or the demo)")
    stream.add_argument("--until-caught-up", action="store_true",
                        help="stop once everything the source executed is landed")
    stream.add_argument("--idle-seconds", type=float, default=0.0,
                        help="with --until-caught-up: also wait this long without new commits")
    stream.set_defaults(run=_stream)

    apply = commands.add_parser(
        "apply", help="run the applier in the foreground (landing zone -> Iceberg tables)")
    apply.add_argument("--source", help="sources[].server_name of the source (needed "
                        "when the config has several)")
    apply.add_argument("--config", help="config file (default: $CDC_PLATFORM_CONFIG or the demo)")
    apply.set_defaults(run=_apply)

    publish = commands.add_parser(
        "publish", help="run the change-topic publisher in the foreground (landing zone -> "
        "Debezium-envelope Kafka topics)")
    publish.add_argument("--source", help="sources[].server_name of the source (needed "
                         "when the config has several)")
    publish.add_argument("--config", help="config file (default: $CDC_PLATFORM_CONFIG or the "
                         "demo)")
    publish.add_argument("--until-caught-up", action="store_true",
                         help="stop once everything landed is published")
    publish.set_defaults(run=_publish)

    snapshot = commands.add_parser(
        "snapshot", help="incremental snapshot of one table (the engine must be streaming)")
    snapshot.add_argument("table", help="database.table")
    snapshot.add_argument("action", nargs="?", default="run",
                          choices=("run", "pause", "resume", "stop"),
                          help="run (default; resumes a session whose reader died), or act on "
                          "the table's running session")
    snapshot.add_argument("--source", help="sources[].server_name of the source (needed "
                        "when the config has several)")
    snapshot.add_argument("--config", help="config file (default: $CDC_PLATFORM_CONFIG or the "
                          "demo)")
    snapshot.add_argument("--chunk-size", type=int,
                          help="rows per chunk (default: the snapshot asset's, 4096)")
    snapshot.add_argument("--condition", help="additional condition: only matching rows")
    snapshot.add_argument("--surrogate-key", help="comma-separated key columns of a table "
                          "without a primary key (as in capture.surrogate_keys)")
    snapshot.set_defaults(run=_snapshot)

    from cdc_platform.capture.signals.messages import SIGNAL_TYPES

    send = commands.add_parser(
        "signal", help="send a signal to the signal topic",
        description="Send a signal to the signal topic (signals.topic), keyed by the source's "
        "server name. Examples: `signal execute-snapshot inventory.orders --filter "
        "\"status = 'paid'\"`, `signal execute-snapshot 'inventory\\..*'`, `signal "
        "pause-snapshot`, `signal stop-snapshot inventory.orders`, `signal log hello`.")
    send.add_argument("type", choices=SIGNAL_TYPES)
    send.add_argument("tables", nargs="*", help="tables (database.table or regular expressions; "
                      "stop/pause/resume: none means all running snapshots); for log: the "
                      "message")
    send.add_argument("--filter", help="execute-snapshot: an additional condition for every "
                      "listed table (a SQL boolean over its columns)")
    send.add_argument("--surrogate-key", help="execute-snapshot: key column(s) of a table "
                      "without a primary key, comma-separated")
    send.add_argument("--id", help="the signal's id (default: topic@offset); notifications "
                      "carry it")
    send.add_argument("--source", help="sources[].server_name of the source (needed "
                        "when the config has several)")
    send.add_argument("--config", help="config file (default: $CDC_PLATFORM_CONFIG or the demo)")
    send.add_argument("--bootstrap-servers", help="override signals.kafka.bootstrap_servers")
    send.set_defaults(run=_signal)

    demo = commands.add_parser("demo", help="the zero-configuration demo")
    demo.add_argument("--orders", type=int, default=100_000, help="initial orders (default 100k)")
    demo.add_argument("--workload-seconds", type=float, default=20.0,
                      help="how long the write workload runs while streaming")
    demo.add_argument("--s3", action="store_true",
                      help="the landing zone and the lake on a private SeaweedFS (S3) with its "
                      "Iceberg REST catalog (what `make demo-s3` runs)")
    demo.add_argument("--spark-cluster", action="store_true",
                      help="as --s3, with the lake's Spark work on a private Spark standalone "
                      "cluster of two one-core workers (what `make demo-cluster` runs)")
    demo.set_defaults(run=_demo)

    ui = commands.add_parser("ui", help="dagster dev on the demo config")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(run=_ui)

    reference = commands.add_parser("config-reference", help="print the config keys")
    reference.set_defaults(run=_config_reference)

    args: Any = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except Exception as error:
        line = _start_error_line(error, args)
        if line is None:
            raise  # not a known start error: a defect, shown with its traceback
        print(f"cdc_platform {args.command}: {line}", file=sys.stderr)
        return 1


def _start_error_line(error: BaseException, args: Any) -> str | None:
    """The one line for a known start error (``capture.start_errors``), naming the account
    of the config the command used (when that config loads)."""
    from cdc_platform.capture.start_errors import SourceAccount, describe_start_error
    from cdc_platform.config import ConfigError, load_settings
    from cdc_platform.devservices._process import DevServiceError

    if isinstance(error, DevServiceError):  # the demo's own services (its log tail follows)
        return " | ".join(line.strip() for line in str(error).splitlines() if line.strip())
    account = None
    if not isinstance(error, ConfigError):
        try:
            account = SourceAccount.from_settings(load_settings(getattr(args, "config", None))
                                                 .for_source(getattr(args, "source", None)))
        except Exception:  # noqa: BLE001 - the line is still worth showing without it
            account = None
    return describe_start_error(error, account)


if __name__ == "__main__":
    sys.exit(main())
