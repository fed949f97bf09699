"""Config loading: validation errors name the key; the README documents every key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

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
    monkeypatch.setenv("CDC_BILLING_PORT", "4407")
    settings = load_settings()
    assert settings.server_names == ("demo", "billing")
    assert settings.for_source("demo").source.port == 4406
    assert settings.for_source("billing").source.port == 4407
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


def _source(name: str, server_id: int, host: str = "h", **capture) -> dict:
    return {"flavour": "mariadb", "host": host, "user": "u", "server_id": server_id,
            "server_name": name, **({"capture": capture} if capture else {})}


def test_one_source_is_a_one_element_list_of_sources():
    settings = parse_settings({**MINIMAL, "capture": {"snapshot_mode": "never"}})
    assert settings.server_names == ("shop",)
    assert settings.sources[0].capture.snapshot_mode == "never"
    assert settings.capture.snapshot_mode == "never"
    assert settings.for_source(None) is settings


def test_several_sources_each_with_its_own_capture():
    data = {**MINIMAL, "sources": [
        _source("shop", 1, tables={"include": ["shop\\..*"]}),
        _source("billing", 1, host="other", snapshot_mode="never")]}
    del data["source"]
    settings = parse_settings(data)
    assert settings.server_names == ("shop", "billing")
    billing = settings.for_source("billing")
    assert (billing.source.host, billing.capture.snapshot_mode) == ("other", "never")
    assert settings.for_source("shop").capture.tables.include == ("shop\\..*",)
    assert billing.landing_zone == settings.landing_zone
    with pytest.raises(ValueError, match="for_source"):
        _ = settings.source
    with pytest.raises(ConfigError, match="--source"):
        settings.for_source(None)
    with pytest.raises(ConfigError, match="no source named 'nope'"):
        settings.for_source("nope")


@pytest.mark.parametrize(("sources", "expected"), [
    ([_source("shop", 1), _source("shop", 2, host="x")],
     "sources[1].server_name 'shop' is also sources[0]'s"),
    ([_source("shop", 1), _source("billing", 1)],
     "sources[1].server_id 1 is also sources[0]'s on h:3306"),
])
def test_sources_need_distinct_names_and_server_ids_per_host(sources, expected):
    data = {k: v for k, v in MINIMAL.items() if k != "source"}
    with pytest.raises(ConfigError) as error:
        parse_settings({**data, "sources": sources}, "c.yaml")
    lines = str(error.value).splitlines()
    assert len(lines) == 2 and expected in lines[1]


def test_errors_of_several_sources_name_the_source():
    data = {k: v for k, v in MINIMAL.items() if k != "source"}
    bad = {**data, "sources": [_source("shop", 1), {**_source("b", 2), "port": "x"}]}
    with pytest.raises(ConfigError, match=r"sources\[1\]\.port"):
        parse_settings(bad)
    with pytest.raises(ConfigError, match="not both"):
        parse_settings({**MINIMAL, "sources": [_source("b", 2)]})


def test_cli_commands_name_their_source_when_the_config_has_several(tmp_path, capsys):
    from cdc_platform.__main__ import main

    data = {k: v for k, v in MINIMAL.items() if k != "source"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**data, "sources": [_source("shop", 1),
                                                       _source("billing", 2)]}))
    assert main(["stream", "--config", str(path)]) == 1
    assert capsys.readouterr().err.strip() == (
        "cdc_platform stream: the config has 2 sources (shop, billing): name one with --source")
    assert main(["snapshot", "x.y", "--config", str(path), "--source", "nope"]) == 1
    assert "no source named 'nope'" in capsys.readouterr().err
