"""Command line: ``python -m cdc_platform <command>``.

  stream            run the capture engine in the foreground (SIGTERM/Ctrl-C: flush, checkpoint,
                    exit 0); ``--until-caught-up`` for batch use
  demo              the zero-configuration demo (what ``make demo`` runs)
  ui                start the demo's services and ``dagster dev`` on the demo config
  config-reference  print every config key with its type, default and meaning (Markdown)
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any


def _stream(args: argparse.Namespace) -> int:
    from cdc_platform.capture.engine import CaptureEngine, EngineOptions
    from cdc_platform.capture.landing import LandingZone
    from cdc_platform.config import load_settings

    settings = load_settings(args.config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        logging.info(f"signal {signal.Signals(signum).name}: stopping after the current event")
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    engine = CaptureEngine(
        EngineOptions.from_settings(settings),
        LandingZone(settings.landing_zone.url, settings.source.server_name),
    )
    stats = engine.run(stop, stop_when_caught_up=args.until_caught_up,
                       caught_up_idle_seconds=args.idle_seconds)
    logging.info(f"stopped: {stats.records} records in {stats.transactions} transactions, "
                 f"GTID {stats.position or '-'}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from cdc_platform.demo.run import run_demo

    return run_demo(orders=args.orders, workload_seconds=args.workload_seconds)


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
    stream.add_argument("--config", help="config file (default: $CDC_PLATFORM_CONFIG or the demo)")
    stream.add_argument("--until-caught-up", action="store_true",
                        help="stop once everything the source executed is landed")
    stream.add_argument("--idle-seconds", type=float, default=0.0,
                        help="with --until-caught-up: also wait this long without new commits")
    stream.set_defaults(run=_stream)

    demo = commands.add_parser("demo", help="the zero-configuration demo")
    demo.add_argument("--orders", type=int, default=100_000, help="initial orders (default 100k)")
    demo.add_argument("--workload-seconds", type=float, default=20.0,
                      help="how long the write workload runs while streaming")
    demo.set_defaults(run=_demo)

    ui = commands.add_parser("ui", help="dagster dev on the demo config")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(run=_ui)

    reference = commands.add_parser("config-reference", help="print the config keys")
    reference.set_defaults(run=_config_reference)

    args: Any = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
