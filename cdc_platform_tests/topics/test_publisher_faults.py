"""The change-topic publisher under faults: kill -9 mid-publish, a broker that goes away and
comes back, a second publisher of the same source, a message the broker cannot take; and what
the rest of the platform reads from it (retention's hold, the metrics).

Each test has its own database and server name, hence topics of its own on the shared broker
(``<server>.<db>.<table>``); the broker tests start a private one they can stop.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdc_platform.capture.landing import retention
from cdc_platform.capture.landing.published import CHANGE_TOPICS
from cdc_platform.capture.landing.records import GTID, OP, POS, ROW_OPS, TS_MS
from cdc_platform.capture.names import table_id
from cdc_platform.demo.topic_tables import TopicEvent, compare_with_source, read_topic, rebuild
from cdc_platform.devservices.kafka import TansuBroker
from cdc_platform.devservices.ports import free_port, free_port_range
from cdc_platform.lake.applier.options import ApplierOptions
from cdc_platform.topics import producer as producer_module
from cdc_platform.topics import publisher as publisher_module
from cdc_platform.topics.metrics import serve_publisher_metrics
from cdc_platform.topics.producer import PublishError
from cdc_platform.topics.publisher import Publisher, open_publisher
from cdc_platform_tests.conftest import CdcEnv

ISOLATIONS = ("read_uncommitted", "read_committed")


# -- helpers -------------------------------------------------------------------------------


def _publishing(env: CdcEnv, **change_topics: object) -> None:
    """Change topics on for ``env`` (the signal broker unless ``kafka`` says otherwise)."""
    env.overrides["change_topics"] = {"enabled": True, "poll_seconds": 0.1, **change_topics}


def _topic(env: CdcEnv, table: str) -> str:
    return f"{env.server_name}.{env.db}.{table}"


@dataclass(frozen=True)
class Landed:
    """One table's committed row changes in the landing zone: position -> GTID."""

    gtids: dict[int, str]

    @property
    def positions(self) -> set[int]:
        return set(self.gtids)


def _landed(env: CdcEnv, table: str) -> Landed:
    """The row changes (c/u/d/r) of ``table`` below the checkpoint, read from its segments."""
    checkpoint = env.landing.read_checkpoint()
    assert checkpoint is not None, "nothing landed"
    gtids: dict[int, str] = {}
    for _first, _last, path in env.landing.segments(env.db, table):
        records = pq.read_table(path, columns=[POS, GTID, OP])
        ops = records.column(OP).cast("string")
        records = records.filter(pc.and_(pc.is_in(ops, value_set=_row_ops()),
                                         pc.less(records.column(POS), checkpoint.next_pos)))
        gtids.update(zip(records.column(POS).to_pylist(),
                         records.column(GTID).cast("string").to_pylist(), strict=True))
    return Landed(gtids)


def _row_ops() -> object:
    import pyarrow as pa

    return pa.array(list(ROW_OPS))


def _saved_through(env: CdcEnv, table: str) -> int:
    """The publisher's saved position for ``table`` (0: none saved)."""
    marks = env.landing.read_published(CHANGE_TOPICS)
    return 0 if marks is None else marks.through.get(table_id(env.db, table), 0)


def _events(events: list[TopicEvent]) -> list[TopicEvent]:
    """The change events alone (tombstones repeat their delete's headers)."""
    return [e for e in events if e.value is not None]


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout:.0f}s: {what}")
        time.sleep(0.02)


def _publish_command(env: CdcEnv, *extra: str) -> list[str]:
    return [sys.executable, "-m", "cdc_platform", "publish", "--config",
            str(env.write_config()), *extra]


@contextmanager
def _running(publisher: Publisher, stop_when_caught_up: bool = False
             ) -> Iterator[list[BaseException]]:
    """``publisher.run`` in a thread (as the publish_changes job runs it); what it raised is
    in the yielded list once the block ends."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            publisher.run(stop, stop_when_caught_up)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            errors.append(error)

    thread = threading.Thread(target=run, name="test-publisher", daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        stop.set()
        thread.join(90)
        assert not thread.is_alive(), "the publisher did not stop"


@contextmanager
def _streaming(env: CdcEnv) -> Iterator[None]:
    """The capture engine in a thread, landing as the stream_changes job does."""
    engine = env.engine()
    stop = threading.Event()
    thread = threading.Thread(target=engine.run, args=(stop,), name="test-engine", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)


def _items_table(env: CdcEnv) -> None:
    env.execute("CREATE TABLE items (id INT PRIMARY KEY, v INT NOT NULL, note VARCHAR(40))")


def _backlog(env: CdcEnv, rows: int) -> None:
    """``rows`` inserts, then an update of every other row and a delete of every tenth, in
    transactions of 2,000 statements' worth of rows."""
    step = 2_000
    for start in range(1, rows + 1, step):
        env.execute(f"INSERT INTO items SELECT seq, seq, CONCAT('row ', seq) "
                    f"FROM seq_{start}_to_{min(start + step - 1, rows)}")
    env.execute("UPDATE items SET v = v + 1, note = 'updated' WHERE id % 2 = 0")
    env.execute("DELETE FROM items WHERE id % 10 = 3")


# -- kill -9 ----------------------------------------------------------------------------


def test_kill_9_mid_publish_then_restart_sends_again_at_most_what_followed_the_saved_position(
        signal_env: CdcEnv) -> None:
    env = signal_env
    _publishing(env, batch_records=500)
    _items_table(env)
    _backlog(env, 20_000)
    env.catch_up()
    landed = _landed(env, "items")
    assert len(landed.positions) > 30_000
    last = max(landed.positions)

    publisher = subprocess.Popen(_publish_command(env), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    try:
        _wait_until(lambda: _saved_through(env, "items") > 0, 60, "a first saved position")
        publisher.kill()  # SIGKILL: no abort, no flush; maybe a batch sent but not saved
        publisher.wait(30)
    finally:
        if publisher.poll() is None:
            publisher.kill()
    at_kill = _saved_through(env, "items")
    assert 0 < at_kill < last, f"killed too late to test anything: saved {at_kill} of {last}"

    subprocess.run(_publish_command(env, "--until-caught-up"), check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert _saved_through(env, "items") >= last

    for isolation in ISOLATIONS:
        events = _events(read_topic(env.kafka_bootstrap, _topic(env, "items"),
                                    isolation=isolation, idle_seconds=4))
        seen = collections.Counter(e.position for e in events)
        assert landed.positions - set(seen) == set(), isolation  # every change at least once
        assert set(seen) - landed.positions == set(), isolation  # and nothing else
        repeated = sorted(p for p, n in seen.items() if n > 1)
        assert all(p > at_kill for p in repeated), (isolation, at_kill, repeated[:5])
        wrong_gtid = [(e.position, e.headers.get("cdc.gtid")) for e in events
                      if e.headers.get("cdc.gtid") != landed.gtids[e.position]]
        assert wrong_gtid == [], (isolation, wrong_gtid[:5])

    with env.connect() as conn:
        rebuilt, differences = compare_with_source(env.kafka_bootstrap, _topic(env, "items"),
                                                   conn, env.db, "items", ["id"])
    assert differences == []
    assert len(rebuilt.rows) == 18_000


# Run in its own interpreter: ``ChangeProducer.commit`` waits for every message of the first
# batch to be on the broker, then the process is killed before the transaction's commit.
_KILLED_BEFORE_COMMIT = textwrap.dedent("""
    import os, signal, threading, sys
    from cdc_platform.config import load_settings
    from cdc_platform.topics.producer import ChangeProducer
    from cdc_platform.topics.publisher import open_publisher

    def delivered_then_killed(self):
        assert self._producer.flush(30) == 0
        os.kill(os.getpid(), signal.SIGKILL)

    ChangeProducer.commit = delivered_then_killed
    open_publisher(load_settings(sys.argv[1])).run(threading.Event())
""")


def test_on_tansu_read_committed_consumers_skip_a_killed_publishers_open_batch_but_see_it_once_aborted_and_dedup_by_position_rebuilds_exactly(  # noqa: E501
        signal_env: CdcEnv) -> None:
    """Measured on Tansu (the test broker): the batch of a publisher killed with its
    transaction open is read by ``read_uncommitted`` consumers at once, and not by
    ``read_committed`` ones while the transaction stays open (as on Kafka). Once the restarted
    publisher's producer aborts it (``init_transactions`` with the same transactional id),
    ``read_committed`` consumers on Tansu read the aborted batch too (Kafka would skip it):
    the batch then appears twice, and a consumer that skips what it has seen by
    ``cdc.position`` still rebuilds the table exactly."""
    env = signal_env
    _publishing(env, batch_records=300, transactions=True)
    _items_table(env)
    _backlog(env, 1_000)
    env.catch_up()
    landed = _landed(env, "items")

    killed = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_COMMIT,
                             str(env.write_config())], timeout=120, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    assert _saved_through(env, "items") == 0
    open_batch = {isolation: _events(read_topic(env.kafka_bootstrap, _topic(env, "items"),
                                                isolation=isolation, idle_seconds=3))
                  for isolation in ISOLATIONS}
    first_batch = [e.position for e in open_batch["read_uncommitted"]]
    assert first_batch and first_batch == sorted(landed.positions)[:len(first_batch)]
    assert [e.position for e in open_batch["read_committed"]] == []

    open_publisher(env.settings).run(threading.Event(), stop_when_caught_up=True)
    for isolation in ISOLATIONS:
        events = _events(read_topic(env.kafka_bootstrap, _topic(env, "items"),
                                    isolation=isolation, idle_seconds=3))
        assert [e.position for e in events] == first_batch + sorted(landed.positions), isolation
        assert rebuild(events).repeats == len(first_batch)
    with env.connect() as conn:
        rebuilt, differences = compare_with_source(env.kafka_bootstrap, _topic(env, "items"),
                                                   conn, env.db, "items", ["id"])
    assert differences == [] and len(rebuilt.rows) == 900


def test_a_batch_holds_at_most_batch_records_records(signal_env: CdcEnv) -> None:
    """``change_topics.batch_records`` bounds a batch (one transaction, then the saved
    position), whatever the size of the segments the records are read from."""
    env = signal_env
    _publishing(env, batch_records=300)
    _items_table(env)
    env.execute("INSERT INTO items SELECT seq, seq, NULL FROM seq_1_to_2000")
    env.catch_up()
    batches: list[int] = []
    publisher = open_publisher(env.settings, on_batch=batches.append)
    publisher.run(threading.Event(), stop_when_caught_up=True)
    assert sum(batches) == 2_000
    assert max(batches) <= 300, batches



# -- the broker goes away -------------------------------------------------------------------


class _Writer:
    """Inserts into ``items`` one row a transaction, every ``every`` seconds, from ``first``
    on, until ``stop()`` (the number written is ``written``)."""

    def __init__(self, env: CdcEnv, first: int, every: float = 0.05) -> None:
        self.env, self.next_id, self.every = env, first, every
        self.written = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.env.execute(f"INSERT INTO items VALUES ({self.next_id}, 1, 'live')")
            self.next_id += 1
            self.written += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def test_a_broker_outage_stalls_only_the_publisher_and_every_change_landed_meanwhile_arrives_after_the_restart(  # noqa: E501
        signal_env: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    env = signal_env
    # (shorter request timeouts and backoff: the outage shows within seconds, not minutes)
    monkeypatch.setattr(producer_module, "REQUEST_TIMEOUT_SECONDS", 2.0)
    monkeypatch.setattr(publisher_module, "MAX_BACKOFF_SECONDS", 2.0)
    broker = TansuBroker(port=free_port())
    broker.start()
    writer: _Writer | None = None
    try:
        _publishing(env, kafka={"bootstrap_servers": broker.bootstrap_servers},
                    batch_records=200)
        _items_table(env)
        publisher = open_publisher(env.settings)
        stats = publisher.stats
        with _streaming(env), _running(publisher) as errors:
            env.execute("INSERT INTO items SELECT seq, seq, NULL FROM seq_1_to_100")
            _wait_until(lambda: stats.messages.get(table_id(env.db, "items"), 0) >= 100, 60,
                        "the first rows published")
            writer = _Writer(env, first=101)
            broker.stop()
            _wait_until(lambda: not stats.broker_up and stats.failures >= 1, 60,
                        "the publisher noticed the broker is gone")
            at_outage = _saved_through(env, "items")
            failures, lag = stats.failures, stats.lag_seconds()
            landed_at_outage = env.landing.read_checkpoint().next_pos
            started = time.monotonic()
            _wait_until(lambda: stats.failures >= failures + 2, 60, "the publisher retried")
            waited = time.monotonic() - started
            assert errors == [], "the publisher stopped instead of retrying"
            assert not stats.broker_up
            assert stats.lag_seconds() >= lag + waited - 0.5
            assert _saved_through(env, "items") == at_outage
            assert env.landing.read_checkpoint().next_pos > landed_at_outage  # capture goes on

            broker.start()  # (same port: the publisher's bootstrap stays valid; topics lost)
            time.sleep(2)
            writer.stop()
            written = 100 + writer.written
            _wait_until(lambda: len(_landed(env, "items").positions) == written, 60,
                        "every insert landed")
            last = max(_landed(env, "items").positions)
            _wait_until(lambda: _saved_through(env, "items") >= last, 90,
                        "the publisher caught up after the restart")
            assert errors == [] and stats.broker_up
        landed = _landed(env, "items")
        expected = {p for p in landed.positions if p > at_outage}
        assert len(expected) >= writer.written > 0
        for isolation in ISOLATIONS:
            events = _events(read_topic(broker.bootstrap_servers, _topic(env, "items"),
                                        isolation=isolation, idle_seconds=3))
            seen = collections.Counter(e.position for e in events)
            assert set(seen) == expected, (isolation, sorted(expected - set(seen))[:5],
                                           sorted(set(seen) - expected)[:5])
            assert max(seen.values()) == 1, isolation
    finally:
        if writer is not None:
            writer.stop()
        broker.stop()


# -- a second publisher ---------------------------------------------------------------------


def test_a_second_publisher_of_the_source_stops_the_first_at_its_next_save(
        signal_env: CdcEnv) -> None:
    """The first publisher has sent its second batch when the second one starts, publishes
    everything and saves; the first one's save of that batch then fails (compare-and-swap on
    the published record) and it stops: that one batch is the only thing sent twice."""
    env = signal_env
    _publishing(env, batch_records=500)
    _items_table(env)
    env.execute("INSERT INTO items SELECT seq, seq, NULL FROM seq_1_to_3000")
    env.catch_up()
    landed = sorted(_landed(env, "items").positions)
    second_batch_sent, go_on = threading.Event(), threading.Event()

    def hold_the_second_batch(messages: int) -> None:
        if first.stats.batches == 2:
            second_batch_sent.set()
            go_on.wait(60)

    first = open_publisher(env.settings, on_batch=hold_the_second_batch)
    with _running(first) as errors:
        assert second_batch_sent.wait(60)
        assert _saved_through(env, "items") == landed[499]
        open_publisher(env.settings).run(threading.Event(), stop_when_caught_up=True)
        assert _saved_through(env, "items") == landed[-1]
        go_on.set()
        _wait_until(lambda: bool(errors), 30, "the first publisher stopped")
    [error] = errors
    assert isinstance(error, PublishError), error
    assert "another publisher saved its position meanwhile" in str(error)
    assert first.stats.batches == 2 and first.stats.messages == {table_id(env.db, "items"): 1000}
    assert _saved_through(env, "items") == landed[-1]  # (the first one's save did not land)
    events = _events(read_topic(env.kafka_bootstrap, _topic(env, "items"),
                                isolation="read_uncommitted", idle_seconds=3))
    seen = collections.Counter(e.position for e in events)
    assert set(seen) == set(landed)
    assert sorted(p for p, n in seen.items() if n > 1) == landed[500:1000]


# -- a message the broker cannot take -------------------------------------------------------


def test_a_change_larger_than_the_broker_takes_stops_the_publisher_naming_table_position_and_fix(  # noqa: E501
        signal_env: CdcEnv) -> None:
    env = signal_env
    _publishing(env, batch_records=5)
    env.execute("CREATE TABLE files (id INT PRIMARY KEY, body LONGBLOB)")
    env.execute("INSERT INTO files SELECT seq, 'small' FROM seq_1_to_10")
    env.execute("INSERT INTO files VALUES (11, REPEAT('x', 2 * 1024 * 1024))")
    env.execute("INSERT INTO files VALUES (12, 'after')")
    env.catch_up()
    positions = sorted(_landed(env, "files").positions)
    big = positions[10]

    for _attempt in range(2):  # (and again after a restart: it does not get past it)
        with pytest.raises(PublishError) as raised:
            open_publisher(env.settings).run(threading.Event(), stop_when_caught_up=True)
        message = str(raised.value)
        assert f"{table_id(env.db, 'files')} position {big}" in message, message
        assert "max.message.bytes" in message and "message.max.bytes" in message, message
        assert _saved_through(env, "files") == positions[9]

    # The fix the message names: the producer's message.max.bytes raised (Tansu takes the
    # message as it is); the publisher then goes past it.
    env.overrides["change_topics"]["kafka"] = {
        "bootstrap_servers": env.kafka_bootstrap, "config": {"message.max.bytes": "8000000"}}
    open_publisher(env.settings).run(threading.Event(), stop_when_caught_up=True)
    assert _saved_through(env, "files") >= positions[-1]
    with env.connect() as conn:
        rebuilt, differences = compare_with_source(env.kafka_bootstrap, _topic(env, "files"),
                                                   conn, env.db, "files", ["id"])
    assert differences == [] and len(rebuilt.rows[(11,)]["body"]) == 2 * 1024 * 1024


# -- retention --------------------------------------------------------------------------------


def test_retention_keeps_every_segment_the_publisher_has_not_published(
        signal_env: CdcEnv) -> None:
    env = signal_env
    assert ApplierOptions.from_settings(env.settings).publishers == ()
    _publishing(env)
    assert ApplierOptions.from_settings(env.settings).publishers == (CHANGE_TOPICS,)
    _items_table(env)
    env.execute("INSERT INTO items SELECT seq, seq, NULL FROM seq_1_to_500")
    env.catch_up()
    open_publisher(env.settings).run(threading.Event(), stop_when_caught_up=True)
    published = _saved_through(env, "items")
    for start in (501, 1001):  # two more segments, landed and not published
        env.execute(f"INSERT INTO items SELECT seq, seq, NULL FROM seq_{start}_to_{start + 499}")
        env.catch_up()
    landed = _landed(env, "items").positions
    assert min(landed) <= published < max(landed)
    consumed = {table_id(env.db, "items"): env.landing.read_checkpoint().next_pos - 1}

    retention.sweep(env.landing, consumed=consumed, unread=[], retention_seconds=0,
                    publishers=(CHANGE_TOPICS,))
    assert _landed(env, "items").positions == {p for p in landed if p > published}
    assert all(first > published for first, _last, _path in env.landing.segments(env.db, "items"))

    # (without the publisher's hold the same sweep deletes all but the newest segment, which
    # retention always keeps: it was the hold that kept them)
    retention.sweep(env.landing, consumed=consumed, unread=[], retention_seconds=0)
    [(first, last, _path)] = env.landing.segments(env.db, "items")
    assert first > published and last == max(landed)


# -- metrics ----------------------------------------------------------------------------------


def _scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_the_publisher_metrics_say_lag_broker_state_and_messages_by_table(
        signal_env: CdcEnv) -> None:
    env = signal_env
    port = free_port_range(4)
    env.overrides["metrics"] = {"port": port}
    _publishing(env)
    _items_table(env)
    env.execute("INSERT INTO items SELECT seq, seq, NULL FROM seq_1_to_10")
    env.execute("UPDATE items SET v = 0 WHERE id <= 3")
    env.execute("DELETE FROM items WHERE id > 8")
    env.catch_up()
    publisher = open_publisher(env.settings)
    endpoint = serve_publisher_metrics(env.settings, publisher)
    assert endpoint is not None
    source = ("source", env.server_name)
    table = ("table", table_id(env.db, "items"))
    try:
        assert endpoint.port == port + 3
        before = _scrape(endpoint.url)
        assert before[("cdc_topics_broker_up", frozenset([source]))] == 0
        assert ("cdc_topics_messages_total", frozenset([source, table])) not in before

        publisher.run(threading.Event(), stop_when_caught_up=True)
        after = _scrape(endpoint.url)
        assert after[("cdc_topics_lag_seconds", frozenset([source]))] == 0
        assert after[("cdc_topics_broker_up", frozenset([source]))] == 1
        # 10 inserts, 3 updates, 2 deletes and their 2 tombstones
        assert after[("cdc_topics_messages_total", frozenset([source, table]))] == 17
        assert after[("cdc_topics_published_position", frozenset([source, table]))] == \
            _saved_through(env, "items")
    finally:
        endpoint.close()


def test_while_catching_up_the_lag_is_the_age_of_the_oldest_change_not_published_yet(
        signal_env: CdcEnv) -> None:
    """Three transactions of 300 rows, landed 4 s apart; two batches of 300 publish the first
    two. The lag is then the age of the third's commit, not of the first's (published)."""
    env = signal_env
    _publishing(env, batch_records=300)
    _items_table(env)
    for start in (1, 301, 601):
        if start > 1:
            time.sleep(4)
        env.execute(f"INSERT INTO items SELECT seq, seq, NULL FROM seq_{start}_to_{start + 299}")
    env.catch_up()
    stop = threading.Event()
    batches: list[int] = []

    def two_batches(messages: int) -> None:
        batches.append(messages)
        if len(batches) == 2:
            stop.set()  # (the pass still saves its position)

    publisher = open_publisher(env.settings, on_batch=two_batches)
    publisher.run(stop)
    through = _saved_through(env, "items")
    assert batches == [300, 300] and through == sorted(_landed(env, "items").positions)[599]

    oldest_unpublished_ms = min(
        ts for pos, ts in _commit_times(env, "items").items() if pos > through)
    now = time.time()
    assert publisher.stats.lag_seconds(now) == pytest.approx(
        now - oldest_unpublished_ms / 1000, abs=1.0)


def _commit_times(env: CdcEnv, table: str) -> dict[int, int]:
    """Position -> source commit time (ms) of ``table``'s landed records."""
    times: dict[int, int] = {}
    for _first, _last, path in env.landing.segments(env.db, table):
        records = pq.read_table(path, columns=[POS, TS_MS])
        times.update(zip(records.column(POS).to_pylist(),
                         records.column(TS_MS).cast("int64").to_pylist(), strict=True))
    return times


def test_a_publisher_started_while_the_broker_is_down_waits_for_it_and_then_publishes_all(
        signal_env: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    env = signal_env
    monkeypatch.setattr(producer_module, "REQUEST_TIMEOUT_SECONDS", 2.0)
    monkeypatch.setattr(publisher_module, "MAX_BACKOFF_SECONDS", 2.0)
    broker = TansuBroker(port=free_port())  # (not started yet: nothing listens on its port)
    _publishing(env, kafka={"bootstrap_servers": f"{broker.host}:{broker.port}"})
    _items_table(env)
    env.execute("INSERT INTO items SELECT seq, seq, NULL FROM seq_1_to_200")
    env.catch_up()
    landed = _landed(env, "items")
    publisher = open_publisher(env.settings)
    stats = publisher.stats
    try:
        with _running(publisher) as errors:
            _wait_until(lambda: stats.failures >= 2, 60, "the publisher retried")
            assert errors == [] and not stats.broker_up
            assert _saved_through(env, "items") == 0
            assert stats.lag_seconds() > 0
            broker.start()
            _wait_until(lambda: _saved_through(env, "items") >= max(landed.positions), 60,
                        "published once the broker came")
            assert errors == [] and stats.broker_up and stats.lag_seconds() == 0
        events = _events(read_topic(broker.bootstrap_servers, _topic(env, "items")))
        assert [e.position for e in events] == sorted(landed.positions)
    finally:
        broker.stop()


def test_retention_holds_everything_until_the_publisher_saved_once_and_never_a_table_left_out(
        signal_env: CdcEnv, kafka: TansuBroker) -> None:
    env = signal_env
    _publishing(env, tables={"exclude": [rf"{env.db}\.skipped"]})
    _items_table(env)
    env.execute("CREATE TABLE skipped (id INT PRIMARY KEY, v INT)")
    for start in (1, 501, 1001):  # three segments of each table
        env.execute(f"INSERT INTO items SELECT seq, seq, NULL FROM seq_{start}_to_{start + 499}",
                    f"INSERT INTO skipped SELECT seq, seq FROM seq_{start}_to_{start + 499}")
        env.catch_up()
    next_pos = env.landing.read_checkpoint().next_pos
    consumed = {table_id(env.db, t): next_pos - 1 for t in ("items", "skipped")}

    def segments(table: str) -> int:
        return len(env.landing.segments(env.db, table))

    # No record saved yet: the publisher has published nothing, and holds every table.
    retention.sweep(env.landing, consumed=consumed, unread=[], retention_seconds=0,
                    publishers=(CHANGE_TOPICS,))
    assert (segments("items"), segments("skipped")) == (3, 3)

    open_publisher(env.settings).run(threading.Event(), stop_when_caught_up=True)
    marks = env.landing.read_published(CHANGE_TOPICS)
    assert marks is not None
    assert marks.unpublished == {table_id(env.db, "skipped")}
    assert set(marks.through) == {table_id(env.db, "items")}
    retention.sweep(env.landing, consumed=consumed, unread=[], retention_seconds=0,
                    publishers=(CHANGE_TOPICS,))
    assert (segments("items"), segments("skipped")) == (1, 1)  # (the newest stays, always)
    assert _topic(env, "items") in kafka.list_topics()
    assert _topic(env, "skipped") not in kafka.list_topics()


def test_the_publish_command_serves_its_metrics_on_the_publisher_port_and_stops_on_sigterm(
        signal_env: CdcEnv) -> None:
    env = signal_env
    port = free_port_range(4)
    env.overrides["metrics"] = {"port": port}
    _publishing(env)
    _items_table(env)
    env.execute("INSERT INTO items SELECT seq, seq, NULL FROM seq_1_to_40")
    env.catch_up()
    url = f"http://127.0.0.1:{port + 3}/metrics"
    messages = ("cdc_topics_messages_total",
                frozenset([("source", env.server_name), ("table", table_id(env.db, "items"))]))

    def published_all() -> bool:
        try:
            return _scrape(url).get(messages) == 40
        except OSError:
            return False  # (not serving yet)

    command = subprocess.Popen(_publish_command(env), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        _wait_until(published_all, 60, "40 messages counted on the publisher's metrics port")
        command.send_signal(signal.SIGTERM)
        _, stderr = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
    assert command.returncode == 0, stderr.decode()[-2000:]
    assert "stopped: change topics: 40 messages in 1 batches to 1 topics, caught up" in \
        stderr.decode()


def test_the_publish_command_says_why_it_stops(signal_env: CdcEnv) -> None:
    env = signal_env
    off = subprocess.run(_publish_command(env), capture_output=True, timeout=60)
    assert off.returncode == 1
    assert f"change topics are off for {env.server_name!r}" in off.stderr.decode()

    _publishing(env)
    env.execute("CREATE TABLE files (id INT PRIMARY KEY, body LONGBLOB)",
                "INSERT INTO files VALUES (1, REPEAT('x', 2 * 1024 * 1024))")
    env.catch_up()
    [position] = _landed(env, "files").positions
    stopped = subprocess.run(_publish_command(env, "--until-caught-up"), capture_output=True,
                             timeout=120)
    assert stopped.returncode == 1
    [line] = [line for line in stopped.stderr.decode().splitlines()
              if line.startswith("cdc_platform publish: ")]
    assert f"table {table_id(env.db, 'files')} position {position} is larger" in line


def test_a_table_behind_a_busy_one_is_published_within_a_few_batches(signal_env: CdcEnv) -> None:
    """``a_busy`` has a backlog of eight batches, ``b_quiet`` ten rows: the quiet table's
    changes go out within two batches, not after the busy table's backlog."""
    env = signal_env
    _publishing(env, batch_records=500)
    env.execute("CREATE TABLE a_busy (id INT PRIMARY KEY, v INT)",
                "CREATE TABLE b_quiet (id INT PRIMARY KEY, v INT)")
    env.execute("INSERT INTO a_busy SELECT seq, seq FROM seq_1_to_4000",
                "INSERT INTO b_quiet SELECT seq, seq FROM seq_1_to_10")
    env.catch_up()
    stop = threading.Event()
    batches: list[int] = []

    def two_batches(messages: int) -> None:
        batches.append(messages)
        if len(batches) == 2:
            stop.set()

    open_publisher(env.settings, on_batch=two_batches).run(stop)
    assert _saved_through(env, "b_quiet") >= max(_landed(env, "b_quiet").positions)
