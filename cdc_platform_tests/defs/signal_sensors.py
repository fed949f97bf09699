"""Every loaded source's signal sensor of a code location, ticked as the daemon ticks them."""

from __future__ import annotations

import logging

import dagster as dg

from cdc_platform.config import Settings
from cdc_platform.defs.signals.sensors import sensor_name


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


class SignalSensors:
    """The signal sensors of ``defs`` (one per loaded source of ``settings``), in config order.
    A call evaluates one tick of each with the cursor its previous tick returned, and returns
    each one's run requests; ``logged`` keeps each one's log lines of that tick
    (``LEVEL: message``)."""

    def __init__(self, defs: dg.Definitions, settings: Settings) -> None:
        self.defs = defs
        repository = defs.get_repository_def()
        names = {server: sensor_name(settings, server) for server in settings.server_names}
        self.sensors = {server: repository.get_sensor_def(name) for server, name
                        in names.items() if repository.has_sensor_def(name)}
        self.cursors: dict[str, str | None] = {server: None for server in self.sensors}
        self.logged: dict[str, list[str]] = {server: [] for server in self.sensors}

    def __call__(self, instance: dg.DagsterInstance) -> dict[str, list[dg.RunRequest]]:
        requested = {}
        for server, sensor in self.sensors.items():
            self.logged[server] = []
            with dg.build_sensor_context(instance=instance, definitions=self.defs,
                                         cursor=self.cursors[server]) as context:
                context.log.addHandler(_Lines(self.logged[server]))
                data = sensor.evaluate_tick(context)
            self.cursors[server] = data.cursor or self.cursors[server]
            requested[server] = list(data.run_requests or [])
        return requested
