"""The signal sensor against the real broker (Tansu), a real Dagster instance and MariaDB.

Each test evaluates the sensor's ticks as the daemon does (``evaluate_tick`` with the cursor
the previous tick returned); test_signal_runs.py runs the real daemon end to end.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from confluent_kafka import Producer

from cdc_platform.__main__ import main
from cdc_platform.capture.landing.session_records import NO_SESSION, SignalRef, SnapshotRequest
from cdc_platform.capture.signals.kafka import KafkaTopics, SignalCursor
from cdc_platform.capture.snapshot.protocol import read_control, read_request, write_request
from cdc_platform.definitions import build_definitions
from cdc_platform.defs.signals.sensors import SNAPSHOT_TABLE_TAG, run_key, sensor_name
from cdc_platform.defs.snapshots.definitions import run_session_prefix
from cdc_platform.devservices.kafka import TansuBroker
from cdc_platform_tests.conftest import CdcEnv


def _tables(env: CdcEnv, *names: str) -> None:
    for name in names:
        env.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(20))")


def _control(env: CdcEnv, table: str) -> tuple[str, int] | None:
    """The pause or resume kept for a table's next session, with its signal's offset."""
    control = read_control(env.landing, env.db, table)
    return None if control is None else (control[0], control[1].offset)


def send(env: CdcEnv, value: Any, key: str | None = "", raw: bool = False) -> int:
    """Produce one message to the test's signal topic (key: the server name by default)."""
    signals = env.settings.signals
    payload = value if raw else json.dumps(value).encode()
    if key == "":
        return KafkaTopics(signals.kafka.bootstrap_servers).produce(
            signals.topic, env.server_name, payload)
    producer = Producer({"bootstrap.servers": signals.kafka.bootstrap_servers})
    producer.produce(signals.topic, key=None if key is None else key.encode(), value=payload)
    assert producer.flush(10) == 0
    return -1


def execute(env: CdcEnv, *tables: str, **data: Any) -> dict[str, Any]:
    return {"type": "execute-snapshot",
            "data": {"data-collections": [f"{env.db}.{t}" if "." not in t and "\\" not in t
                                          else t for t in tables], **data}}


class Sensor:
    """The signal sensor of ``env``'s definitions, ticked like the daemon ticks it."""

    def __init__(self, env: CdcEnv, instance: dg.DagsterInstance) -> None:
        self.env, self.instance = env, instance
        self.defs = build_definitions(env.settings)
        self.sensor = self.defs.resolve_sensor_def(sensor_name(env.settings))
        self.cursor: str | None = None

    def create_run(self, request: dg.RunRequest, status: dg.DagsterRunStatus) -> dg.DagsterRun:
        """The run the daemon creates from ``request``, in ``status``."""
        job = self.defs.resolve_implicit_global_asset_job_def()
        return self.instance.create_run_for_job(
            job, run_config=request.run_config, tags=request.tags,
            asset_selection=frozenset(request.asset_selection), status=status)

    def tick(self, cursor: str | None = "keep") -> Any:
        with dg.build_sensor_context(instance=self.instance, definitions=self.defs,
                                     cursor=self.cursor if cursor == "keep" else cursor
                                     ) as context:
            data = self.sensor.evaluate_tick(context)
        if data.cursor is not None:
            self.cursor = data.cursor
        return data


@pytest.fixture
def instance() -> Any:
    with dg.instance_for_test() as instance:
        yield instance


def test_a_signal_becomes_one_run_request_per_table_with_stable_run_keys(
        signal_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    env = signal_env
    _tables(env, "a1", "a2", "b1")
    sensor = Sensor(env, instance)
    assert sensor.tick().run_requests == []  # creates the topic; nothing to do
    offset = send(env, execute(env, rf"{env.db}\.a.*", **{"additional-conditions": [
        {"data-collection": f"{env.db}.a1", "filter": "v = 'x'"}]}))
    first = sensor.tick()
    requests = {r.tags[SNAPSHOT_TABLE_TAG]: r for r in first.run_requests}
    assert sorted(requests) == [f"{env.db}.a1", f"{env.db}.a2"]
    topic_id = SignalCursor.from_json(sensor.cursor).topic_id
    assert SignalCursor.from_json(sensor.cursor) == SignalCursor(topic_id, offset + 1)
    a1 = requests[f"{env.db}.a1"]
    assert a1.run_key == run_key(topic_id, offset, f"{env.db}.a1")
    assert a1.asset_selection == [dg.AssetKey([env.server_name, "snapshot", env.db, "a1"])]
    [config] = [c["config"] for c in a1.run_config["ops"].values()]
    assert config["condition"] == "v = 'x'" and config["signal_offset"] == offset
    assert config["signal_id"] == f"{env.settings.signals.topic}@{offset}"
    assert sensor.tick().run_requests == []  # the cursor moved past it
    # A tick replayed from the old cursor (the daemon died before storing the new one) asks
    # for the same runs under the same keys: the daemon launches a run key once.
    replay = sensor.tick(cursor=SignalCursor(topic_id, offset).to_json())
    assert sorted(r.run_key for r in replay.run_requests) == sorted(
        r.run_key for r in first.run_requests)


def test_bad_input_is_skipped_with_reasons_and_never_stalls_the_cursor(
        signal_env: CdcEnv, instance: dg.DagsterInstance,
        capfd: pytest.CaptureFixture[str]) -> None:
    env = signal_env
    env.overrides["capture"] = {"tables": {"include": [rf"{env.db}\..*"],
                                           "exclude": [rf"{env.db}\.secret"]}}
    _tables(env, "orders", "secret")
    sensor = Sensor(env, instance)
    sensor.tick()
    bad = [
        (b"{not json", "not valid JSON"),
        (json.dumps({"type": "execute-snapshot-now", "data": {}}).encode(), "unknown type"),
        (json.dumps({"type": "execute-snapshot", "data": {}}).encode(),
         "missing 'data-collections'"),
        (json.dumps(execute(env, "nope")).encode(), "matches no captured table"),
        (json.dumps(execute(env, "secret")).encode(), "is not captured"),
        (json.dumps(execute(env, "zz.*")).encode(), "matches no captured table"),
        (json.dumps(execute(env, "orders", **{"additional-conditions": [
            {"data-collection": f"{env.db}.orders", "filter": "1; DROP TABLE orders"}]})
         ).encode(), "additional condition for"),
        (json.dumps(execute(env, "orders", padding="x" * 300_000)).encode(),
         "exceeds the limit"),
        (b"", "empty message value"),
        (b"[" * 50_000 + b"]" * 50_000, "not valid JSON: nested too deeply"),
        (json.dumps(execute(env, "a{99999999999}")).encode(),
         "OverflowError: the repetition number is too large"),
        (json.dumps(execute(env, "(" * 5000 + ")" * 5000)).encode(), "at most 1,000"),
        (json.dumps(execute(env, "(?:(a)|b){1000000}")).encode(), "too large once its"),
        (json.dumps(execute(env, r"(.|\w|[a-z]|[^0-9])*\d")).encode(),
         "took longer than 0.5 s to match"),
    ]
    for value, _ in bad:
        send(env, value, raw=True)
    send(env, execute(env, "orders"), key="another_source")
    last = send(env, execute(env, "orders"))
    capfd.readouterr()
    data = sensor.tick()
    assert [r.tags[SNAPSHOT_TABLE_TAG] for r in data.run_requests] == [f"{env.db}.orders"]
    assert SignalCursor.from_json(sensor.cursor).offset == last + 1
    log = capfd.readouterr().err  # the tick's log, as the daemon records it
    for _, reason in bad:
        assert reason in log, reason
    assert "keyed for source 'another_source'" in log
    assert sensor.tick().run_requests == []


def test_a_duplicate_for_a_table_being_snapshotted_starts_nothing(
        signal_env: CdcEnv, instance: dg.DagsterInstance,
        capfd: pytest.CaptureFixture[str]) -> None:
    env = signal_env
    _tables(env, "orders")
    sensor = Sensor(env, instance)
    sensor.tick()
    send(env, execute(env, "orders"))
    [request] = sensor.tick().run_requests
    sensor.create_run(request, dg.DagsterRunStatus.STARTED)
    send(env, execute(env, "orders"))  # same content, new offset
    capfd.readouterr()
    assert sensor.tick().run_requests == []
    assert "already being snapshotted (run " in capfd.readouterr().err


def test_stop_then_execute_in_a_later_tick_starts_again_while_the_old_run_winds_down(
        signal_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    """A stopped run may stay STARTED a while (a pod shutting down): it no longer counts as
    snapshotting the table, so an execute-snapshot after the stop starts a new run."""
    env = signal_env
    _tables(env, "orders")
    sensor = Sensor(env, instance)
    sensor.tick()
    send(env, execute(env, "orders"))
    [request] = sensor.tick().run_requests
    old = sensor.create_run(request, dg.DagsterRunStatus.STARTED)
    [config] = [c["config"] for c in request.run_config["ops"].values()]
    # The old run opened its session (as its live reader writes it), then the stop came.
    write_request(env.landing, env.db, "orders", SnapshotRequest(
        f"{run_session_prefix(old.run_id)}-abc", "open", ("id",), None, 4096,
        signal=SignalRef(config["signal_id"], config["signal_topic_id"],
                         config["signal_offset"])))
    reader = live_reader(env, "orders")
    send(env, {"type": "stop-snapshot", "data": {"data-collections": [f"{env.db}.orders"]}})
    assert sensor.tick().run_requests == []
    assert read_request(env.landing, env.db, "orders").action == "stop"
    reader.close()
    # Still STARTED, but told to stop: the next execute-snapshot starts a new run.
    assert instance.get_run_by_id(old.run_id).status == dg.DagsterRunStatus.STARTED
    again = send(env, execute(env, "orders"))
    [new_request] = sensor.tick().run_requests
    assert new_request.tags["cdc_platform/signal_offset"] == str(again)
    # While that one waits to start, a duplicate still starts nothing.
    sensor.create_run(new_request, dg.DagsterRunStatus.NOT_STARTED)
    send(env, execute(env, "orders"))
    assert sensor.tick().run_requests == []


def test_a_pause_in_the_same_batch_as_its_execute_snapshot_is_kept_for_the_run(
        signal_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    env = signal_env
    _tables(env, "orders")
    sensor = Sensor(env, instance)
    sensor.tick()
    send(env, execute(env, "orders"))
    pause_offset = send(env, {"type": "pause-snapshot",
                              "data": {"data-collections": [f"{env.db}.orders"]}})
    [request] = sensor.tick().run_requests  # one tick reads both
    assert request.tags["cdc_platform/signal_offset"] == str(pause_offset - 1)
    assert _control(env, "orders") == ("pause", pause_offset)


def test_a_pause_for_a_run_not_started_yet_is_kept_for_it(
        signal_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    env = signal_env
    _tables(env, "orders")
    sensor = Sensor(env, instance)
    sensor.tick()
    send(env, execute(env, "orders"))
    [request] = sensor.tick().run_requests
    sensor.create_run(request, dg.DagsterRunStatus.NOT_STARTED)
    pause_offset = send(env, {"type": "pause-snapshot"})  # every table: the waiting run's too
    sensor.tick()
    assert _control(env, "orders") == ("pause", pause_offset)
    assert read_request(env.landing, env.db, "orders") is None  # no session to stop


def test_stop_pause_and_resume_act_once_on_the_tables_session(
        signal_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    env = signal_env
    _tables(env, "orders")
    sensor = Sensor(env, instance)
    sensor.tick()
    topic_id = SignalCursor.from_json(sensor.cursor).topic_id
    assert topic_id is not None
    # A session opened by the signal at offset 0, as its live reader writes it.
    opened = send(env, execute(env, "orders"))
    sensor.tick()
    write_request(env.landing, env.db, "orders", SnapshotRequest(
        "run-1", "open", ("id",), None, 4096,
        signal=SignalRef(f"x@{opened}", topic_id, opened)))
    reader = live_reader(env, "orders")
    pause_offset = send(env, {"type": "pause-snapshot"})
    sensor.tick()
    request = read_request(env.landing, env.db, "orders")
    assert (request.session_id, request.action, request.signal.offset) == (
        "run-1", "pause", pause_offset)
    resume = send(env, {"type": "resume-snapshot",
                        "data": {"data-collections": [f"{env.db}.orders"]}})
    sensor.tick()
    assert read_request(env.landing, env.db, "orders").action == "resume"
    stop = send(env, {"type": "stop-snapshot", "data": {"data-collections": [f"{env.db}.o.*"]}})
    sensor.tick()
    request = read_request(env.landing, env.db, "orders")
    assert (request.action, request.signal.offset) == ("stop", stop)
    # A new session, opened by a later signal; a replay of the old signals leaves it alone.
    later = send(env, execute(env, "orders"))
    sensor.tick()
    write_request(env.landing, env.db, "orders", SnapshotRequest(
        "run-2", "open", ("id",), None, 4096, signal=SignalRef("y", topic_id, later)))
    sensor.tick(cursor=SignalCursor(topic_id, pause_offset).to_json())
    request = read_request(env.landing, env.db, "orders")
    assert (request.session_id, request.action) == ("run-2", "open"), (resume, request)
    # Its reader ends; the request stays behind. A pause now has nothing to pause.
    reader.close()
    send(env, {"type": "pause-snapshot", "data": {"data-collections": [f"{env.db}.orders"]}})
    sensor.tick()
    assert read_request(env.landing, env.db, "orders").action == "open"


def live_reader(env: CdcEnv, table: str) -> Any:
    """Hold the table's reader.lock as a running reader does (release: close())."""
    path = env.landing.root / "snapshots" / env.db / table / "reader.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")  # noqa: SIM115 - closed by the test
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return handle


def test_a_stop_with_no_session_keeps_runs_of_earlier_signals_from_starting(
        signal_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    env = signal_env
    _tables(env, "orders")
    sensor = Sensor(env, instance)
    send(env, {"type": "stop-snapshot", "data": {"data-collections": [f"{env.db}.orders"]}})
    sensor.tick()
    request = read_request(env.landing, env.db, "orders")
    assert (request.session_id, request.action) == (NO_SESSION, "stop")
    assert request.signal is not None and request.signal.offset == 0


def test_a_broker_restart_with_a_new_topic_is_read_from_its_start(
        signal_env: CdcEnv, instance: dg.DagsterInstance, tmp_path: Path) -> None:
    """In-memory Tansu loses its topics on restart; the next signals get offsets from 0 again.
    The cursor's topic id tells the new topic apart, so they are read, and their run keys
    differ from the old topic's."""
    env = signal_env
    _tables(env, "orders")
    broker = TansuBroker(base_dir=tmp_path / "kafka").start()
    try:
        env.kafka_bootstrap = broker.bootstrap_servers
        sensor = Sensor(env, instance)
        send(env, execute(env, "orders"))
        [before] = sensor.tick().run_requests
        broker.stop()
        broker = TansuBroker(base_dir=tmp_path / "kafka", port=broker.port).start()
        down = sensor.tick()  # the topic is created again, empty
        assert down.run_requests == []
        assert SignalCursor.from_json(sensor.cursor).offset == 0
        send(env, execute(env, "orders"))
        [after] = sensor.tick().run_requests
    finally:
        broker.stop()
    assert before.run_key != after.run_key
    assert before.run_key.endswith(f":0:{env.db}.orders")
    assert after.run_key.endswith(f":0:{env.db}.orders")


def test_an_unreachable_broker_skips_the_tick_and_keeps_the_cursor(
        signal_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    env = signal_env
    _tables(env, "orders")
    env.kafka_bootstrap = "127.0.0.1:9"  # nothing listens there
    sensor = Sensor(env, instance)
    sensor.cursor = SignalCursor("some-topic-id", 5).to_json()
    data = sensor.tick()
    assert data.run_requests == [] and "signal topic not read" in (data.skip_message or "")
    assert SignalCursor.from_json(sensor.cursor).offset == 5


def test_a_cursor_past_the_end_of_the_topic_replays_it_with_a_warning(
        signal_env: CdcEnv, instance: dg.DagsterInstance,
        capfd: pytest.CaptureFixture[str]) -> None:
    """An operator's typo in `dagster sensor cursor --set` (or a truncated log): the signals
    below the cursor are read again, not lost; run keys stop those already acted on."""
    env = signal_env
    _tables(env, "orders")
    sensor = Sensor(env, instance)
    offset = send(env, execute(env, "orders"))
    [first] = sensor.tick().run_requests
    topic_id = SignalCursor.from_json(sensor.cursor).topic_id
    capfd.readouterr()
    [again] = sensor.tick(cursor=SignalCursor(topic_id, 500).to_json()).run_requests
    assert again.run_key == first.run_key  # the daemon launches it once
    assert SignalCursor.from_json(sensor.cursor) == SignalCursor(topic_id, offset + 1)
    log = capfd.readouterr().err
    assert f"ends at offset {offset + 1}, before the cursor's offset 500" in log
    assert "reading it again from its earliest offset 0" in log


def test_a_bad_client_setting_skips_the_tick_naming_the_setting(
        signal_env: CdcEnv, instance: dg.DagsterInstance) -> None:
    env = signal_env
    _tables(env, "orders")
    env.overrides["signals"] = {"kafka": {"bootstrap_servers": env.kafka_bootstrap,
                                          "config": {"sasl.mechanisms": "PLAIN",
                                                     "no.such.setting": "1"}}}
    sensor = Sensor(env, instance)
    sensor.cursor = SignalCursor("some-topic-id", 5).to_json()
    data = sensor.tick()
    assert data.run_requests == []
    reason = data.skip_message or ""
    assert reason.startswith("signal topic not read: Kafka client for ")
    assert 'No such configuration property: "no.such.setting"' in reason
    assert "check the librdkafka settings in signals.kafka.config" in reason
    assert SignalCursor.from_json(sensor.cursor) == SignalCursor("some-topic-id", 5)


def test_the_signal_cli_reports_a_bad_client_setting_in_one_line(
        signal_env: CdcEnv, capsys: pytest.CaptureFixture[str]) -> None:
    env = signal_env
    env.overrides["signals"] = {"kafka": {"bootstrap_servers": env.kafka_bootstrap,
                                          "config": {"security.protocol": "bogus"}}}
    capsys.readouterr()
    code = main(["signal", "log", "hello", "--config", str(env.write_config())])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("signal not sent: Kafka client for ")
    assert 'Invalid value "bogus" for configuration property "security.protocol"' in err
    assert "signals.kafka.config" in err


def test_without_kafka_the_sensor_says_so(cdc_env: CdcEnv,
                                          instance: dg.DagsterInstance) -> None:
    _tables(cdc_env, "orders")
    data = Sensor(cdc_env, instance).tick()
    assert "signals.kafka.bootstrap_servers is not set" in (data.skip_message or "")


def test_a_signal_the_run_would_refuse_is_skipped_at_the_sensor_with_the_reason(
        signal_env: CdcEnv, instance: dg.DagsterInstance,
        capfd: pytest.CaptureFixture[str]) -> None:
    """A surrogate key the run cannot use (naming no column, on a table with a primary key,
    unlike capture.surrogate_keys, on a table without any key) or a condition the server
    rejects used to launch a run that then skipped the table or failed: the sensor refuses
    them itself, naming the reason, and starts the good ones of the same batch."""
    env = signal_env
    env.overrides["capture"] = {"surrogate_keys": {f"{env.db}.configured": ["a"]}}
    _tables(env, "keyed")
    env.execute("CREATE TABLE loose (a INT, v VARCHAR(20))",
                "CREATE TABLE configured (a INT NOT NULL, v VARCHAR(20), UNIQUE KEY (a))")
    sensor = Sensor(env, instance)
    sensor.tick()
    bad = [
        (execute(env, "keyed", **{"surrogate-key": "nope"}),
         f"{env.db}.keyed: the snapshot run would refuse it: it has a primary key (id); "
         "surrogate-key (nope) is only for tables without one"),
        (execute(env, "loose", **{"surrogate-key": "nope"}),
         f"{env.db}.loose: the snapshot run would refuse it: no primary key; the surrogate key "
         f"['nope'] must be configured as capture.surrogate_keys['{env.db}.loose']"),
        (execute(env, "loose", **{"surrogate-key": "a"}), "must be configured as "
         f"capture.surrogate_keys['{env.db}.loose']"),
        (execute(env, "loose"), f"{env.db}.loose: the snapshot run would refuse it: no primary "
         "key and no surrogate key (set capture.surrogate_keys)"),
        (execute(env, "configured", **{"surrogate-key": ["v"]}),
         f"{env.db}.configured: the snapshot run would refuse it: it has a primary key (a); "
         "surrogate-key (v) is only"),
        (execute(env, "keyed", **{"additional-conditions": [
            {"data-collection": f"{env.db}.keyed", "filter": "nonexistent = 1"}]}),
         "the additional condition 'nonexistent = 1' does not run on the table: Unknown column "
         "'nonexistent'"),
        (execute(env, "keyed", **{"additional-conditions": [
            {"data-collection": f"{env.db}.keyed", "filter": "no_such_function(v) = 1"}]}),
         "the additional condition 'no_such_function(v) = 1' does not run on the table"),
    ]
    for value, _ in bad:
        send(env, value)
    good = [execute(env, "keyed", **{"surrogate-key": "id", "additional-conditions": [
                {"data-collection": f"{env.db}.keyed", "filter": "v LIKE 'x%' AND id > 0"}]}),
            execute(env, "configured", **{"surrogate-key": "a"})]
    for value in good:
        send(env, value)
    capfd.readouterr()
    data = sensor.tick()
    log = capfd.readouterr().err
    for _, reason in bad:
        assert reason in log, reason
    assert sorted(r.tags[SNAPSHOT_TABLE_TAG] for r in data.run_requests) == [
        f"{env.db}.configured", f"{env.db}.keyed"]
