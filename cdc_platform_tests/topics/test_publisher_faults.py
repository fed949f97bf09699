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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow.compute as pc
import pyarrow.parquet as pq

from cdc_platform.capture.landing.published import CHANGE_TOPICS
from cdc_platform.capture.landing.records import GTID, OP, POS, ROW_OPS
from cdc_platform.capture.names import table_id
from cdc_platform.demo.topic_tables import TopicEvent, compare_with_source, read_topic, rebuild
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
