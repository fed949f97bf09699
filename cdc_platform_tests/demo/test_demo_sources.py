"""``DEMO_SOURCES`` (what ``make demo``, ``make ui`` and ``devservices up`` export) against the
embedded demo config: each source reaches its own server."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cdc_platform.config import CONFIG_ENV, load_settings
from cdc_platform.devservices.demo_sources import DEMO_SOURCES


def test_each_demo_source_reads_its_own_servers_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)  # the embedded demo config
    servers: dict[str, dict[str, Any]] = {}
    for index, source in enumerate(DEMO_SOURCES):
        account = {"host": f"10.0.0.{index + 1}", "port": 4400 + index, "user": "cdc",
                   "password": f"secret-{index}"}
        server = SimpleNamespace(connection_settings=lambda account=account: dict(account))
        for name, value in source.variables(server).items():  # type: ignore[arg-type]
            monkeypatch.setenv(name, value)
        servers[source.server_name] = account
    deployment = load_settings()
    assert sorted(deployment.server_names) == sorted(servers)
    for name, account in servers.items():
        connection = deployment.for_source(name).source.connection_settings()
        assert {key: connection[key] for key in account} == account
