"""Config loading: validation errors name the key; the README documents every key."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_platform.config import (
    DEMO_CONFIG,
    ConfigError,
    config_reference,
    load_settings,
    parse_settings,
)

MINIMAL = {
    "source": {"flavour": "mariadb", "host": "h", "user": "u", "server_id": 1,
               "server_name": "shop"},
    "landing_zone": {"url": "/tmp/l"},
    "warehouse": {"url": "/tmp/w"},
}


def test_demo_config_is_the_default_and_valid(monkeypatch):
    monkeypatch.delenv("CDC_PLATFORM_CONFIG", raising=False)
    monkeypatch.setenv("CDC_SOURCE_PORT", "4406")
    settings = load_settings()
    assert settings.source.server_name == "demo"
    assert settings.source.port == 4406
    assert Path(DEMO_CONFIG).is_file()


def test_config_path_comes_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("source: {flavour: mysql, host: db, user: u, server_id: 2, server_name: x}\n"
                    "landing_zone: {url: /l}\nwarehouse: {url: /w}\n")
    monkeypatch.setenv("CDC_PLATFORM_CONFIG", str(path))
    assert load_settings().source.flavour == "mysql"


def test_errors_name_the_bad_keys():
    bad = {**MINIMAL, "source": {**MINIMAL["source"], "port": "x", "server_name": "Bad Name"},
           "capture": {"tables": {"include": ["("]}, "bogus": 1}}
    with pytest.raises(ConfigError) as error:
        parse_settings(bad, "c.yaml")
    message = str(error.value)
    for key in ("source.port", "source.server_name", "capture.tables.include", "capture.bogus"):
        assert key in message


def test_environment_references_and_secrets(monkeypatch):
    monkeypatch.setenv("DB_HOST", "replica-7")
    monkeypatch.setenv("CDC_SOURCE_PASSWORD", "s3cret")
    data = {**MINIMAL, "source": {**MINIMAL["source"], "host": "${DB_HOST}",
                                  "port": "${DB_PORT:-3307}"}}
    settings = parse_settings(data)
    assert (settings.source.host, settings.source.port) == ("replica-7", 3307)
    assert settings.source.connection_settings()["password"] == "s3cret"
    assert "s3cret" not in repr(settings)
    monkeypatch.delenv("DB_HOST")
    with pytest.raises(ConfigError, match="source.host.*DB_HOST"):
        parse_settings(data)


def test_readme_documents_every_config_key():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert config_reference() in readme, (
        "README's config reference is stale: paste `python -m cdc_platform config-reference`")
