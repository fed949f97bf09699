"""The change-topic publisher on an S3 landing zone (a real SeaweedFS): it reads the segments,
saves its position with a conditional put (a second publisher's save makes the first stop),
and retention on object storage keeps what it has not published; and what it does with a file
in the changelog that the engine did not write."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_platform.capture.landing import retention
from cdc_platform.capture.landing.published import CHANGE_TOPICS
from cdc_platform.capture.landing.records import segment_schema
from cdc_platform.capture.landing.zone import Checkpoint, LandingReader, LandingZone
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.source import TableSelector
from cdc_platform.demo.topic_tables import read_topic, rebuild
from cdc_platform.devservices.kafka import TansuBroker
from cdc_platform.topics.envelope import EnvelopeOptions
from cdc_platform.topics.producer import PublishError
from cdc_platform.topics.publisher import Publisher, PublisherOptions
from cdc_platform_tests import s3_fixtures
from cdc_platform_tests.s3_fixtures import s3_options

seaweedfs, s3_env, s3_url = s3_fixtures.seaweedfs, s3_fixtures.s3_env, s3_fixtures.s3_url

ITEMS = TableSchema("shop", "items", (ColumnSpec("id", "int"), ColumnSpec("name", "string")),
                    ("id",))


def _landing(seaweedfs, url: str, tmp_path: Path) -> LandingZone:
    zone = LandingZone(url, "s3pub", s3=s3_options(seaweedfs), scratch=tmp_path / "scratch")
    position = 1
    for segment in range(5):  # 5 segments of 20 records: inserts, then updates of the same keys
        ops = ["c" if segment < 3 else "u"] * 20
        ids = [(segment % 3) * 20 + i + 1 for i in range(20)]
        zone.write_segment(ITEMS, pa.Table.from_pydict({
            "__cdc_pos": list(range(position, position + 20)),
            "__cdc_gtid": [f"0-1-{position + i}" for i in range(20)],
            "__cdc_op": ops, "__cdc_ts_ms": [1_700_000_000_000 + position] * 20,
            "id": ids, "name": [f"{op}{position + i}" for i, op in enumerate(ops)],
        }, schema=segment_schema(ITEMS)), position, position + 19)
        position += 20
    zone.write_checkpoint(Checkpoint("s3pub", "mariadb", f"0-1-{position}", position))
    return zone


def _publisher(seaweedfs, url: str, bootstrap: str, prefix: str, batch: int) -> Publisher:
    options = PublisherOptions(
        server_name="s3pub", landing_url=url, bootstrap_servers=bootstrap,
        captured=TableSelector(), published=TableSelector(),
        envelope=EnvelopeOptions(prefix=prefix), batch_records=batch, s3=s3_options(seaweedfs))
    return Publisher(options, LandingReader.open(url, "s3pub", s3=s3_options(seaweedfs)))


@pytest.mark.timeout(300)
def test_publishing_from_s3_saves_by_conditional_put_and_retention_waits(
        seaweedfs, s3_url: str, kafka: TansuBroker, tmp_path: Path) -> None:
    zone = _landing(seaweedfs, s3_url, tmp_path)
    prefix = f"s3pub{int(time.time() * 1000)}"
    first = _publisher(seaweedfs, s3_url, kafka.bootstrap_servers, prefix, batch=30)
    first._load_marks()
    assert first.publish_once() == 30  # one batch of 30, saved
    assert zone.read_published(CHANGE_TOPICS).through == {"shop.items": 30}

    # Retention on object storage: the target consumed everything, the publisher 30 records.
    retention.sweep(zone, {"shop.items": 100}, [], 0.0, compact=False,
                    publishers=[CHANGE_TOPICS])
    assert [s[0] for s in zone.segment_names("shop", "items")] == [21, 41, 61, 81]

    # A second publisher takes over and saves: the first one's next save is refused.
    second = _publisher(seaweedfs, s3_url, kafka.bootstrap_servers, prefix, batch=1000)
    stats = second.run(threading.Event(), stop_when_caught_up=True)
    assert zone.read_published(CHANGE_TOPICS).through == {"shop.items": 100}
    assert stats.messages == {"shop.items": 70}
    with pytest.raises(PublishError, match="another publisher"):
        first.publish_once()

    events = read_topic(kafka.bootstrap_servers, f"{prefix}.shop.items")
    positions = [e.position for e in events]
    assert sorted(positions) == list(range(1, 101))  # each record once, none lost
    table = rebuild(events)
    assert len(table.rows) == 60
    assert table.rows[(1,)]["name"] == "u61"  # updated by the fourth segment
    assert table.rows[(41,)]["name"] == "c41"


def test_a_segment_the_engine_did_not_write_stops_the_publisher_by_name(
        kafka: TansuBroker, tmp_path: Path) -> None:
    """A file named like a segment without the engine's metadata, or with an op the landing
    zone does not know, stops the publisher with one line naming it (never a skip)."""
    url = str(tmp_path / "landing")
    zone = LandingZone(url, "s3pub")
    options = PublisherOptions(
        server_name="s3pub", landing_url=url, bootstrap_servers=kafka.bootstrap_servers,
        captured=TableSelector(), published=TableSelector(),
        envelope=EnvelopeOptions(prefix=f"bad{int(time.time() * 1000)}"))
    row = {"__cdc_pos": [1], "__cdc_gtid": ["0-1-1"], "__cdc_op": ["c"],
           "__cdc_ts_ms": [1_700_000_000_000], "id": [1], "name": ["a"]}
    zone.write_checkpoint(Checkpoint("s3pub", "mariadb", "0-1-2", 2))
    for schema, op, reason in (
            (segment_schema(ITEMS).remove_metadata(), "c", "lacks the engine's metadata"),
            (segment_schema(ITEMS), "x", "unknown change op")):
        zone.write_segment(ITEMS, pa.Table.from_pydict({**row, "__cdc_op": [op]},
                                                       schema=schema), 1, 1)
        publisher = Publisher(options, LandingReader.open(url, "s3pub"))
        with pytest.raises(PublishError, match=r"segment 0+1-0+1\.parquet of shop\.items "
                           rf"cannot be published \(.*{reason}"):
            publisher.run(threading.Event(), stop_when_caught_up=True)
        assert zone.read_published(CHANGE_TOPICS) is None  # nothing saved past it
