"""``make bench --only topics``: the change-topic publisher's messages/s, landing zone -> Kafka.

A landing zone of ``rows`` change records of one table (the streaming bench's ``orders``
columns: BIGINT key, INT, DECIMAL, VARCHAR x2, DATETIME(6); 80% inserts, 20% updates) in
10,000-record segments is published to a private Tansu broker (in memory) by the publisher as
it runs in production (``topics.publisher.Publisher``: read, encode in Debezium's envelope with
schemas, send in transactions of ``batch_records``, save the position). Beside it, from the
same run:

* encoding only: ``TableEncoder.encode`` over the same records (no broker);
* the bare producer: confluent-kafka (librdkafka, C) sending the same messages, already
  encoded, with the publisher's producer settings, then flushing: the physical reference for
  the broker and client path;
* peers' published figures: Redpanda Connect's mysql_cdc ~164k msg/s on 2 cores; Debezium's
  MySQL connector on Kafka Connect, typically 10-50k events/s per task (JSON converter).
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Producer

from cdc_platform.capture.landing.records import segment_schema
from cdc_platform.capture.landing.zone import Checkpoint, LandingReader, LandingZone
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.source import TableSelector
from cdc_platform.demo.topic_tables import read_topic
from cdc_platform.devservices.kafka import TansuBroker
from cdc_platform.topics.envelope import EnvelopeOptions, TableEncoder
from cdc_platform.topics.publisher import Publisher, PublisherOptions

SEGMENT_ROWS = 10_000
CREATED = dt.datetime(2025, 1, 1, 10, 0, 0, 123456)
SCHEMA = TableSchema("bench", "orders", (
    ColumnSpec("id", "int"), ColumnSpec("customer", "int"),
    ColumnSpec("amount", "decimal", precision=10, scale=2),
    ColumnSpec("status", "string"), ColumnSpec("note", "string"),
    ColumnSpec("created", "datetime", scale=6)), ("id",))


def _write_landing(landing: LandingZone, rows: int) -> None:
    rng = random.Random(5)
    position = 1
    for start in range(0, rows, SEGMENT_ROWS):
        n = min(SEGMENT_ROWS, rows - start)
        ops = ["u" if rng.random() < 0.2 else "c" for _ in range(n)]
        table = pa.Table.from_pydict({
            "__cdc_pos": list(range(position, position + n)),
            "__cdc_gtid": [f"0-1-{(position + i) // 10}" for i in range(n)],
            "__cdc_op": ops,
            "__cdc_ts_ms": [1_700_000_000_000 + position + i for i in range(n)],
            "id": [start + i + 1 for i in range(n)],
            "customer": [rng.randint(1, 5000) for _ in range(n)],
            "amount": [Decimal(rng.randint(100, 99999)).scaleb(-2) for _ in range(n)],
            "status": ["paid" if op == "u" else "new" for op in ops],
            "note": [f"note {start + i}" for i in range(n)],
            "created": [CREATED] * n,
        }, schema=segment_schema(SCHEMA))
        landing.write_segment(SCHEMA, table, position, position + n - 1)
        position += n
    landing.write_checkpoint(Checkpoint("bench", "mariadb", f"0-1-{position}", position))


def bench_topics(rows: int, work: Path) -> None:
    print(f"\n== change topics: {rows:,} landed records -> Kafka (Tansu), Debezium JSON with "
          "schemas ==")
    landing = LandingZone(str(work / "topics-landing"), "bench")
    _write_landing(landing, rows)
    broker = TansuBroker(base_dir=work / "topics-kafka")
    broker.start()
    try:
        options = PublisherOptions(
            server_name="bench", landing_url=str(work / "topics-landing"),
            bootstrap_servers=broker.bootstrap_servers, captured=TableSelector(),
            published=TableSelector(), envelope=EnvelopeOptions(prefix="bench"))
        publisher = Publisher(options, LandingReader.open(options.landing_url, "bench"))
        started = time.perf_counter()
        stats = publisher.run(threading.Event(), stop_when_caught_up=True)
        published_seconds = time.perf_counter() - started
        messages = sum(stats.messages.values())

        records = pa.concat_tables(
            pq.read_table(path) for _first, _last, path in landing.segments("bench", "orders"))
        encoder = TableEncoder(SCHEMA, EnvelopeOptions(prefix="bench"))
        started = time.perf_counter()
        encoded = []
        for offset in range(0, records.num_rows, SEGMENT_ROWS):
            encoded += encoder.encode(records.slice(offset, SEGMENT_ROWS))
        encode_seconds = time.perf_counter() - started

        broker.create_topic("bench.bare")
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers,
                             "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                             "queue.buffering.max.kbytes": 64 * 1024})
        started = time.perf_counter()
        for message in encoded:
            while True:
                try:
                    producer.produce("bench.bare", key=message.key, value=message.value,
                                     headers=list(message.headers))
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        producer.flush(120)
        bare_seconds = time.perf_counter() - started

        started = time.perf_counter()
        read = read_topic(broker.bootstrap_servers, encoder.topic, idle_seconds=5.0)
        read_seconds = time.perf_counter() - started - 5.0
    finally:
        broker.stop()
    size = sum(len(m.value or b"") for m in encoded) / max(1, len(encoded))
    publisher_rate = messages / published_seconds
    print(f"publisher (read + encode + send in transactions + save): {messages:,} messages in "
          f"{published_seconds:.1f}s = {publisher_rate:,.0f} msg/s ({stats.batches} batches; "
          f"{size:,.0f} bytes a value)")
    print(f"encoding only: {len(encoded) / encode_seconds:,.0f} msg/s")
    print(f"a plain consumer reading the topic back (demo.topic_tables.read_topic): "
          f"{len(read):,} messages at {len(read) / read_seconds:,.0f} msg/s")
    print(f"bare confluent-kafka producer, same messages pre-encoded: "
          f"{len(encoded) / bare_seconds:,.0f} msg/s")
    print(f"ratio publisher/bare producer: {publisher_rate / (len(encoded) / bare_seconds):.2f}; "
          "peers: Redpanda Connect mysql_cdc ~164k msg/s on 2 cores (its own format, no "
          "schemas); Debezium MySQL on Kafka Connect ~10-50k events/s a task (JSON converter)")
