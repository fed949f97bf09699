"""``python -m cdc_platform.devservices up|down|status``: detached MariaDB servers, one per
source of the embedded demo config (``devservices.demo_sources.DEMO_SOURCES``), and a Tansu broker
(``up --s3``: and a SeaweedFS S3 server, in ``<base-dir>/seaweedfs``).

``up`` starts (or reuses) the services in the background and prints shell ``export`` lines on
stdout, each source's server under the variables the demo config reads, so
``eval "$(python -m cdc_platform.devservices up)"`` configures the current shell. Progress and
errors go to stderr. State lives in ``<base-dir>/mariadb``, ``<base-dir>/mariadb-billing`` and
``<base-dir>/kafka``; ``down`` stops whatever is recorded there, from any shell.

``up --foreground`` instead keeps them attached to the command, as ``make ui`` does: it prints
the same lines, then runs until Ctrl-C, SIGTERM or SIGHUP, and stops all before it exits.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from cdc_platform.devservices._process import DevServiceError, ManagedService, terminate_pid
from cdc_platform.devservices.demo_sources import DEMO_SOURCES
from cdc_platform.devservices.kafka import TansuBroker
from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform.devservices.seaweedfs import SeaweedFS
from cdc_platform.devservices.supervisor import Interrupted, ProcessSupervisor


def _services(args: argparse.Namespace) -> tuple[list[MariaDBServer], TansuBroker]:
    """A MariaDB server per demo source (``--mariadb-port`` and ``--server-id`` are the first
    one's; the others take a free port and the next server ids), and the broker."""
    base = Path(args.base_dir)
    server_id = getattr(args, "server_id", 1)
    servers = [MariaDBServer(base / source.folder,
                             port=getattr(args, "mariadb_port", None) if index == 0 else None,
                             server_id=server_id + index)
               for index, source in enumerate(DEMO_SOURCES)]
    kafka = TansuBroker(base / "kafka", port=getattr(args, "kafka_port", None))
    return servers, kafka


def _s3(args: argparse.Namespace) -> SeaweedFS | None:
    """The S3 server: asked for (``up --s3``), or recorded in the base dir (down, status)."""
    base = Path(args.base_dir) / "seaweedfs"
    if getattr(args, "s3", False) or (base / "state.json").exists():
        return SeaweedFS(base, port=getattr(args, "s3_port", None))
    return None


def _all(args: argparse.Namespace) -> list[ManagedService]:
    servers, kafka = _services(args)
    s3 = _s3(args)
    return [*servers, kafka, *([s3] if s3 is not None else [])]


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _name(service: ManagedService) -> str:
    return f"{service.display_name} ({service.base_dir.name})"


def _print_exports(servers: list[MariaDBServer], kafka: TansuBroker,
                   s3: SeaweedFS | None = None) -> None:
    for source, server in zip(DEMO_SOURCES, servers, strict=True):
        for name, value in source.variables(server).items():
            print(f"export {name}={value}")
    if s3 is not None:
        for name, value in s3.client_env().items():
            print(f"export {name}={value}")
    print(f"export CDC_KAFKA_BOOTSTRAP={kafka.bootstrap_servers}", flush=True)


def _up_foreground(args: argparse.Namespace) -> int:
    """The services owned by this command: stopped on a signal, or if any dies."""
    servers, kafka = _services(args)
    s3 = _s3(args)
    services = [*servers, kafka, *([s3] if s3 is not None else [])]
    try:
        with ProcessSupervisor(log=_err) as supervisor:
            for service in services:
                supervisor.start_service(service)
                _err(f"started {_name(service)}: pid {service.pid}, port {service.port}")
            _print_exports(servers, kafka, s3)
            _err("running in the foreground; Ctrl-C stops them all")
            supervisor.wait_forever(services)
    except Interrupted:
        return 0
    except DevServiceError as exc:
        _err(f"error: {exc}")
        return 1
    return 0


def _up(args: argparse.Namespace) -> int:
    if args.foreground:
        return _up_foreground(args)
    servers, kafka = _services(args)
    s3 = _s3(args)
    started: list[ManagedService] = []
    try:
        for service in (*servers, kafka, *([s3] if s3 is not None else [])):
            service.start(reuse=True, detach=True)
            if service.owned:
                started.append(service)
            verb = "started" if service.owned else "reusing"
            _err(f"{verb} {_name(service)}: pid {service.pid}, port {service.port}")
    except DevServiceError as exc:
        for service in started:  # leave nothing half-up
            service.stop()
        _err(f"error: {exc}")
        return 1
    _print_exports(servers, kafka, s3)
    return 0


def _down(args: argparse.Namespace) -> int:
    code = 0
    for service in _all(args):
        try:
            if service.attach():
                pid = service.pid
                service.stop()
                _err(f"stopped {_name(service)} (pid {pid})")
            else:
                _err(f"{_name(service)}: not running")
            for pid in service._stray_pids():
                terminate_pid(pid, 30)
                _err(f"stopped unrecorded {_name(service)} process {pid}")
        except DevServiceError as exc:
            _err(f"error stopping {_name(service)}: {exc}")
            code = 1
    return code


def _status(args: argparse.Namespace) -> int:
    code = 0
    for service in _all(args):
        state = service.status()
        if state is None:
            print(f"{service.executable_name}: stopped ({service.base_dir})")
            code = 1
        else:
            print(
                f"{service.executable_name} ({service.base_dir.name}): running pid={state['pid']} "
                f"{state['host']}:{state['port']} since {state.get('started_at', '?')}"
            )
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code (status: 0 only if all are running)."""
    parser = argparse.ArgumentParser(
        prog="python -m cdc_platform.devservices",
        description="Private MariaDB servers (binlog/GTID sources, one per demo source) and "
                    "Tansu (Kafka) for development.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("up", "start them in the background (reusing running ones); print export lines"),
        ("down", "stop them"),
        ("status", "show what is running; exit 1 unless all are"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("--base-dir", default=".cdc/dev", help="state directory (.cdc/dev)")
        if name == "up":
            cmd.add_argument("--mariadb-port", type=int, default=None,
                             help="the first source's server (default: free port)")
            cmd.add_argument("--kafka-port", type=int, default=None, help="default: free port")
            cmd.add_argument("--server-id", type=int, default=1,
                             help="the first source's MariaDB server_id (1; the next +1)")
            cmd.add_argument("--s3", action="store_true",
                             help="also a SeaweedFS S3 server (prints its AWS_* exports)")
            cmd.add_argument("--s3-port", type=int, default=None, help="default: free port")
            cmd.add_argument("--foreground", action="store_true",
                             help="keep them attached: run until Ctrl-C/SIGTERM, then stop all")
    args = parser.parse_args(argv)
    handler = {"up": _up, "down": _down, "status": _status}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
