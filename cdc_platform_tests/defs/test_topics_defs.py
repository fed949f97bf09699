"""Change topics in Dagster: what ``change_topics.enabled`` adds to a source's definitions, the
sensor that keeps the publisher running and records the ``published`` check, and the
``publish_changes`` job run in-process against the test broker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import dagster as dg
import pytest

from cdc_platform.definitions import build_definitions
from cdc_platform.defs.long_running import REASON_TAG
from cdc_platform.defs.topics import definitions as topics_definitions
from cdc_platform.defs.topics.definitions import RUN_TAGS, TOPICS_TAG
from cdc_platform.topics.publisher import open_publisher
from cdc_platform_tests.conftest import CdcEnv

RUN_CONFIG = {"ops": {"publish_landed_changes": {"config": {"stop_when_caught_up": True}}}}


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


FRESHNESS_SECONDS = 300


def _topics_on(env: CdcEnv) -> None:
    env.overrides["change_topics"] = {"enabled": True, "poll_seconds": 0.1}
    env.overrides["lake"] = {"applier": False, "freshness_seconds": FRESHNESS_SECONDS}


def _asset_key(env: CdcEnv) -> dg.AssetKey:
    return dg.AssetKey([env.server_name, "change_topics"])


def _sensor_name(env: CdcEnv) -> str:
    return f"{env.server_name}_keep_topics_published"


def _items(env: CdcEnv, rows: int) -> None:
    env.execute("CREATE TABLE items (id INT PRIMARY KEY, v INT)",
                f"INSERT INTO items SELECT seq, seq FROM seq_1_to_{rows}")


def _tick(defs: dg.Definitions, env: CdcEnv, instance: dg.DagsterInstance,
          cursor: str | None) -> Any:
    sensor = defs.resolve_sensor_def(_sensor_name(env))
    with dg.build_sensor_context(instance=instance, definitions=defs, cursor=cursor) as context:
        return sensor.evaluate_tick(context)


def _published_checks(data: Any) -> list[dg.AssetCheckEvaluation]:
    return [e for e in data.asset_events or [] if isinstance(e, dg.AssetCheckEvaluation)
            and e.check_name == "published"]


def test_change_topics_on_add_the_job_sensor_asset_and_check_and_off_add_none(
        signal_env: CdcEnv) -> None:
    env = signal_env
    _items(env, 3)
    off = build_definitions(env.settings)
    repository = off.get_repository_def()
    assert not repository.has_job("publish_changes")
    assert not repository.has_sensor_def(_sensor_name(env))
    assert _asset_key(env) not in repository.asset_graph.get_all_asset_keys()

    _topics_on(env)
    on = build_definitions(env.settings)
    repository = on.get_repository_def()
    job = on.resolve_job_def("publish_changes")
    assert job.tags[TOPICS_TAG] == env.server_name
    assert repository.has_sensor_def(_sensor_name(env))
    assert _asset_key(env) in repository.asset_graph.get_all_asset_keys()
    checks = {key for key in repository.asset_graph.asset_check_keys}
    assert dg.AssetCheckKey(_asset_key(env), "published") in checks


def test_the_sensor_launches_the_publisher_and_its_check_fails_while_a_landed_change_waits(
        signal_env: CdcEnv, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = signal_env
    _topics_on(env)
    _items(env, 20)
    env.catch_up()
    defs = build_definitions(env.settings)
    # The sensor's clock runs past lake.freshness_seconds: the landed changes have waited
    # longer than that, unpublished.
    later = time.time() + FRESHNESS_SECONDS + 60
    monkeypatch.setattr(topics_definitions, "time", SimpleNamespace(time=lambda: later))

    first = _tick(defs, env, instance, None)
    [request] = first.run_requests
    assert request.tags[REASON_TAG] == "no run of it yet"
    [check] = _published_checks(first)
    assert check.passed is False and check.asset_key == _asset_key(env)
    assert f"{env.db}.items" in (check.description or "")
    assert "the publisher is not running" in (check.description or "")

    # A run of it is active (its process is this one): no second run; the check unchanged
    # is not recorded again.
    job = defs.resolve_job_def("publish_changes")
    instance.create_run_for_job(job, status=dg.DagsterRunStatus.STARTED, tags={
        **job.tags, RUN_TAGS.pid: str(os.getpid()), RUN_TAGS.host: socket.gethostname()})
    second = _tick(defs, env, instance, first.cursor)
    assert second.run_requests == [] and _published_checks(second) == []

    open_publisher(env.settings).run(threading.Event(), stop_when_caught_up=True)
    third = _tick(defs, env, instance, second.cursor)
    [check] = _published_checks(third)
    assert check.passed is True


def test_publish_changes_run_in_process_publishes_and_records_the_asset(
        signal_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    env = signal_env
    _topics_on(env)
    _items(env, 50)
    env.catch_up()
    defs = build_definitions(env.settings)

    result = defs.resolve_job_def("publish_changes").execute_in_process(
        instance=instance, run_config=RUN_CONFIG)
    assert result.success
    event = instance.get_latest_materialization_event(_asset_key(env))
    assert event is not None and event.asset_materialization is not None
    metadata = event.asset_materialization.metadata
    assert metadata["messages"].value == 50
    assert metadata["messages_by_table"].value == {f"{env.db}.items": 50}
    assert metadata["broker_up"].value is True
    marks = env.landing.read_published("change_topics")
    assert marks is not None
    assert marks.through[f"{env.db}.items"] == env.landing.read_checkpoint().next_pos - 1


def test_the_sensor_fails_a_run_whose_process_is_gone_and_launches_another_saying_so(
        signal_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    env = signal_env
    _topics_on(env)
    _items(env, 5)
    env.catch_up()
    defs = build_definitions(env.settings)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # (a pid that was a publisher's: no process any more)
    job = defs.resolve_job_def("publish_changes")
    run = instance.create_run_for_job(job, status=dg.DagsterRunStatus.STARTED, tags={
        **job.tags, RUN_TAGS.pid: str(gone.pid), RUN_TAGS.host: socket.gethostname()})

    [request] = _tick(defs, env, instance, None).run_requests
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
    assert request.tags[REASON_TAG] == (f"run {run.run_id[:8]} ended without stopping (its "
                                        f"process {gone.pid} is gone)")


def test_a_publisher_that_cannot_go_on_fails_the_run_with_its_one_line(
        signal_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    env = signal_env
    _topics_on(env)
    env.execute("CREATE TABLE files (id INT PRIMARY KEY, body LONGBLOB)",
                "INSERT INTO files VALUES (1, REPEAT('x', 2 * 1024 * 1024))")
    env.catch_up()
    defs = build_definitions(env.settings)

    result = defs.resolve_job_def("publish_changes").execute_in_process(
        instance=instance, run_config=RUN_CONFIG, raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    description = failure.step_failure_data.user_failure_data.description
    assert description.startswith("change topics: ")
    assert f"table {env.db}.files position " in description
    assert "message.max.bytes" in description
