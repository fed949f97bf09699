"""The change-topic publisher: the landing zone's committed changes -> one Kafka topic per
table, in Debezium's envelope (docs/change-topics.md).

It reads the landing zone the way the lake does, from a position of its own: per table, the
records after what it published through and below the checkpoint's ``next_pos`` (only those
are committed), segment by segment in position order. Each pass sends up to
``batch_records`` records as one batch (a Kafka transaction when ``transactions`` is on),
waits until the broker has it (``ChangeProducer.commit``), and only then saves its position in
the landing zone (``capture.landing.published``), which retention waits for. Hence:

* **no loss**: a segment is swept only once published through (retention reads the record);
  a batch counts as published only once the broker acknowledged all of it;
* **order**: one table's records go in position order (the source's commit order, and
  statement order within a transaction) to one topic, keyed by the primary key (one key, one
  partition);
* **after a kill -9**: at most the batch after the saved position is sent again; each message's
  ``cdc.gtid``/``cdc.position`` headers let a consumer skip what it has seen;
* **a broker that is down** stalls only the publisher: it backs off and retries the batch from
  its saved position; the lag it reports (``stats.lag_seconds``, the metrics) grows meanwhile.
  The engine and the applier never wait for it, but retention does (the landing zone keeps
  what is not published: watch ``cdc_topics_lag_seconds``).

What it cannot publish exactly stops it with one line naming table, position and the fix
(``PublishError``): two tables whose topic names collide, a message larger than the topic
accepts, a second publisher of the same source.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cdc_platform.capture.landing.pending import oldest_pending_seconds
from cdc_platform.capture.landing.published import CHANGE_TOPICS, PublishedMarks
from cdc_platform.capture.landing.records import POS, TS_MS, table_schema_of_segment
from cdc_platform.capture.landing.zone import (
    LandingReader,
    Survey,
    changelog_parts,
    table_of_parts,
)
from cdc_platform.capture.names import table_id
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.source import TableSelector
from cdc_platform.config import S3Settings, Settings
from cdc_platform.topics.envelope import EnvelopeOptions, TableEncoder
from cdc_platform.topics.producer import BrokerUnavailable, ChangeProducer, PublishError

log = logging.getLogger(__name__)

# Rows read from a segment at a time (memory stays bounded whatever the segment's size).
READ_ROWS = 4096
INITIAL_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0


@dataclass(frozen=True)
class PublisherOptions:
    """What the publisher needs from the config (``from_settings``)."""

    server_name: str
    landing_url: str
    bootstrap_servers: str
    captured: TableSelector  # the capture's tables
    published: TableSelector  # change_topics.tables
    envelope: EnvelopeOptions
    kafka_config: dict[str, str] = field(default_factory=dict)
    transactions: bool = True
    partitions: int = 1
    replication_factor: int = -1
    batch_records: int = 20_000
    poll_seconds: float = 0.5
    s3: S3Settings | None = None

    @staticmethod
    def from_settings(settings: Settings) -> PublisherOptions:
        from cdc_platform.capture.source import selector_from_settings

        topics = settings.source.change_topics
        # (no brokers of their own: the signal topic's, with its client settings, which
        # change_topics.kafka.config extends, e.g. with message.max.bytes)
        own = bool(topics.kafka.bootstrap_servers)
        kafka = topics.kafka if own else settings.signals.kafka
        kafka_config = {**({} if own else settings.signals.kafka.config), **topics.kafka.config}
        server = settings.source.server_name
        return PublisherOptions(
            server_name=server,
            landing_url=settings.landing_zone.url,
            bootstrap_servers=kafka.bootstrap_servers,
            kafka_config=kafka_config,
            captured=selector_from_settings(settings),
            published=TableSelector(include=topics.tables.include,
                                    exclude=topics.tables.exclude),
            envelope=EnvelopeOptions(prefix=topics.prefix or server,
                                     schemas_enable=topics.schemas_enable,
                                     tombstones_on_delete=topics.tombstones_on_delete),
            transactions=topics.transactions,
            partitions=topics.partitions,
            replication_factor=topics.replication_factor,
            batch_records=topics.batch_records,
            poll_seconds=topics.poll_seconds,
            s3=settings.s3,
        )

    @property
    def transactional_id(self) -> str | None:
        return f"cdc-topics-{self.server_name}" if self.transactions else None

    def publishes(self, database: str, table: str) -> bool:
        return self.captured.captures(database, table) and \
            self.published.captures(database, table)


@dataclass
class PublisherStats:
    """What the publisher did; read by its metrics and its run's progress lines."""

    started: float = field(default_factory=time.time)
    batches: int = 0
    messages: dict[str, int] = field(default_factory=dict)  # by table id (tombstones too)
    records: int = 0  # landed records read (instructions included)
    failures: int = 0  # batches the broker did not take (each retried)
    broker_up: bool = False
    last_error: str = ""
    last_commit: float | None = None  # time of the newest batch the broker took
    # Per table with records not published yet: the commit time (ms) of the oldest of them.
    pending_since_ms: dict[str, int] = field(default_factory=dict)
    through: dict[str, int] = field(default_factory=dict)  # the saved position, per table
    caught_up: bool = False  # the last pass found nothing left to publish

    def lag_seconds(self, now: float | None = None) -> float:
        """Now minus the source commit time of the oldest landed change not published yet;
        0 when every landed change is published."""
        if not self.pending_since_ms:
            return 0.0
        now = time.time() if now is None else now
        return max(0.0, now - min(self.pending_since_ms.values()) / 1000)


class Publisher:
    """One source's change-topic publisher (``run`` until stopped)."""

    def __init__(self, options: PublisherOptions, landing: LandingReader | None = None,
                 producer: ChangeProducer | None = None,
                 on_batch: Callable[[int], None] | None = None) -> None:
        self.options = options
        self.landing = landing or LandingReader.open(options.landing_url, options.server_name,
                                                     s3=options.s3)
        self._producer = producer
        self.stats = PublisherStats()
        self.on_batch = on_batch  # (tests: called with the messages of each committed batch)
        self._encoders: dict[tuple[str, bytes, bytes], TableEncoder] = {}
        self._topics: dict[str, str] = {}  # topic -> the table id publishing to it
        self._marks: PublishedMarks | None = None
        self._version: str | None = None
        self._filler: str | None = None  # the table that filled the last batch
        # The commit time (ms) of the first record each table's read gave in this pass: if the
        # batch fails, they are the oldest changes not published (the lag counts from them).
        self._first_read: dict[str, int] = {}

    @property
    def producer(self) -> ChangeProducer:
        if self._producer is None:
            options = self.options
            self._producer = ChangeProducer(
                options.bootstrap_servers, options.kafka_config, options.transactional_id,
                options.partitions, options.replication_factor)
        return self._producer

    # -- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event, stop_when_caught_up: bool = False) -> PublisherStats:
        """Publish until ``stop`` is set (or, with ``stop_when_caught_up``, until a pass finds
        nothing left below the checkpoint). Raises ``PublishError`` on what it cannot
        publish exactly."""
        self._load_marks()
        backoff = INITIAL_BACKOFF_SECONDS
        try:
            while not stop.is_set():
                try:
                    sent = self.publish_once()
                except (BrokerUnavailable, OSError) as error:  # (OSError: the landing zone's
                    # store did not answer, e.g. object storage; read again from the position)
                    self._failed(error)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                    continue
                backoff = INITIAL_BACKOFF_SECONDS
                if self.stats.caught_up and stop_when_caught_up:
                    break
                if not sent:
                    stop.wait(self.options.poll_seconds)
        finally:
            if self._producer is not None:
                self._producer.close()
        return self.stats

    def publish_once(self) -> int:
        """One pass: one batch of what is not published yet, sent and saved; the records
        read (0: nothing to publish)."""
        survey = self.landing.survey()
        checkpoint = survey.checkpoint
        if checkpoint is None:
            return 0
        marks = self._marks or PublishedMarks(CHANGE_TOPICS)
        through = dict(marks.through)
        unpublished: set[str] = set()
        # Per table with records left: the commit time (ms) of the oldest not published; made
        # the stats' only once the batch is on the broker (a failed batch published nothing).
        pending = dict(self.stats.pending_since_ms)
        self._first_read = {}
        batch = _Batch(self.options.batch_records)
        filler = None
        for database, table in self._in_turn(_tables(survey)):
            name = table_id(database, table)
            if not self.options.publishes(database, table):
                unpublished.add(name)
                pending.pop(name, None)
                continue
            if batch.full:  # (its turn comes in the next pass; how long it waits, from footers)
                if name not in pending:
                    oldest = oldest_pending_seconds(
                        self.landing, database, table, through.get(name, 0),
                        checkpoint.next_pos, names=survey.segment_names(database, table))
                    if oldest is not None:
                        pending[name] = int(oldest * 1000)
                continue
            left = self._publish_table(survey, database, table, through, checkpoint.next_pos,
                                       batch)
            if left is None:
                # everything committed of the table is sent: the mark moves to the checkpoint
                # even where no record was (so retention can delete what the target consumed)
                through[name] = max(through.get(name, 0), checkpoint.next_pos - 1)
                pending.pop(name, None)
            else:
                pending[name], filler = left, name
        if batch.begun:
            self.producer.commit()
            self.stats.batches += 1
            self.stats.last_commit = time.time()
            self.stats.broker_up = True
            for name, count in batch.messages.items():
                self.stats.messages[name] = self.stats.messages.get(name, 0) + count
            if self.on_batch is not None:
                self.on_batch(sum(batch.messages.values()))
        elif not self.stats.broker_up:
            self.producer.ping()  # (nothing to send: is the broker there?)
            self.stats.broker_up = True
        self.stats.records += batch.records
        self.stats.pending_since_ms = pending
        self._filler = filler
        self._save(PublishedMarks(CHANGE_TOPICS, through, frozenset(unpublished)))
        self.stats.caught_up = not batch.full
        return batch.records

    def _in_turn(self, tables: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The tables in the order this pass visits them: from the one after the table that
        filled the last batch, so a busy table's backlog never keeps the others waiting for
        more than a batch or so (every pass started at the first table did)."""
        names = [table_id(*t) for t in tables]
        if self._filler not in names:
            return tables
        cut = names.index(self._filler) + 1
        return tables[cut:] + tables[:cut]

    # -- one table ---------------------------------------------------------------------------

    def _publish_table(self, survey: Survey, database: str, table: str,
                       through: dict[str, int], next_pos: int, batch: _Batch) -> int | None:
        """Send the table's records after ``through[table]`` and below ``next_pos`` until the
        batch is full, moving ``through``; None when none is left, else the commit time (ms) of
        the oldest record left (of the first one cut off, or, when the batch filled at the end
        of a read, of the last one sent: the next is at most that much newer)."""
        name = table_id(database, table)
        after = through.get(name, 0)
        for first, last, segment in survey.segment_names(database, table):
            if last <= after or first >= next_pos:
                continue
            for schema, read in self._checked_reads(database, table, segment, after, next_pos):
                records = read.slice(0, batch.limit - batch.records)  # (the batch's room)
                self._first_read.setdefault(name, int(read.column(TS_MS)[0].as_py() or 0))
                encoder = self._encoder(name, schema)
                if not batch.begun:
                    self.producer.begin()
                    batch.begun = True
                self.producer.ensure_topics([encoder.topic])
                sent = 0
                try:
                    messages = encoder.encode(records)
                except ValueError as error:
                    raise _unpublishable(database, table, segment, error) from error
                for message in messages:
                    self.producer.send(encoder.topic, message.key, message.value,
                                       list(message.headers),
                                       f"table {name} position {message.position}")
                    sent += 1
                after = int(records.column(POS)[-1].as_py())
                through[name] = after
                batch.add(name, records.num_rows, sent)
                if batch.full:
                    rest = read.column(TS_MS)
                    oldest = rest[records.num_rows] if read.num_rows > records.num_rows \
                        else rest[records.num_rows - 1]
                    return int(oldest.as_py() or 0)
        return None

    def _checked_reads(self, database: str, table: str, segment: str, after: int,
                       before: int) -> Iterator[tuple[TableSchema, pa.Table]]:
        """``_read``, where a segment that is not what the capture engine writes (no schema
        metadata, an unknown op, a record without a commit time) stops the publisher naming
        the segment, rather than failing with a traceback or skipping it."""
        reads = self._read(database, table, segment, after, before)
        while True:
            try:
                schema, records = next(reads)
            except StopIteration:
                return
            except (ValueError, KeyError, TypeError, pa.ArrowInvalid) as error:
                raise _unpublishable(database, table, segment, error) from error
            yield schema, records

    def _read(self, database: str, table: str, segment: str, after: int, before: int
              ) -> Iterator[tuple[TableSchema, pa.Table]]:
        """The segment's records with ``after < pos < before``, ``READ_ROWS`` at a time, with
        the schema it was written with (its footer's)."""
        filesystem, path = self.landing.store.arrow(*changelog_parts(database, table), segment)
        with filesystem.open_input_file(path) as source:
            parquet = pq.ParquetFile(source)
            try:
                schema = table_schema_of_segment(parquet.schema_arrow.metadata or {})
            except KeyError as missing:
                raise ValueError(f"its footer lacks the engine's metadata {missing}") from None
            for batch in parquet.iter_batches(batch_size=READ_ROWS):
                records = pa.Table.from_batches([batch])
                positions = records.column(POS)
                keep = pc.and_(pc.greater(positions, after), pc.less(positions, before))
                records = records.filter(keep)
                if records.num_rows:
                    yield schema, records

    def _encoder(self, name: str, schema: TableSchema) -> TableEncoder:
        key = (name, repr(schema.columns).encode(), repr(schema.primary_key).encode())
        encoder = self._encoders.get(key)
        if encoder is None:
            encoder = TableEncoder(schema, self.options.envelope)
            owner = self._topics.setdefault(encoder.topic, name)
            if owner != name:
                raise PublishError(
                    f"change topics: tables {owner} and {name} both map to topic "
                    f"{encoder.topic!r} (characters a topic name cannot hold become '_'); leave "
                    "one out with change_topics.tables.exclude")
            if len(self._encoders) > 10_000:
                self._encoders.clear()
            self._encoders[key] = encoder
        return encoder

    # -- position --------------------------------------------------------------------------

    def _load_marks(self) -> None:
        found = self.landing.published_version(CHANGE_TOPICS)
        self._marks, self._version = (None, None) if found is None else found
        self.stats.through = dict(self._marks.through) if self._marks else {}

    def _save(self, marks: PublishedMarks) -> None:
        """Save the position (if it moved) with a compare-and-swap on the version read or
        written last: a second publisher of this source that saved meanwhile stops this one."""
        if self._marks is not None and (marks.through, marks.unpublished) == (
                dict(self._marks.through), self._marks.unpublished):
            return
        stamped = PublishedMarks(marks.publisher, marks.through, marks.unpublished,
                                 datetime.now(UTC).isoformat(timespec="seconds"))
        version = self.landing.write_published(stamped, self._version)
        if version is None:
            raise PublishError(
                f"change topics of {self.options.server_name!r}: another publisher saved its "
                "position meanwhile (two publish_changes runs, or a `python -m cdc_platform "
                "publish`, for one source); this one stops so that nothing is published twice")
        self._marks, self._version = stamped, version
        self.stats.through = dict(stamped.through)

    def _failed(self, error: BaseException) -> None:
        """A batch the broker did not take: given up, sent again from the saved position."""
        self.stats.failures += 1
        self.stats.broker_up = False
        for name, oldest in self._first_read.items():
            self.stats.pending_since_ms.setdefault(name, oldest)
        self.stats.last_error = str(error)
        log.warning("change topics: %s; retrying from the saved position with backoff", error)
        if self._producer is not None and not self._producer.abort():
            self._producer.close(0)
            self._producer = None  # (a new one: its transactional id fences the old one)


def _unpublishable(database: str, table: str, segment: str, error: Exception) -> PublishError:
    return PublishError(
        f"change topics: segment {segment} of {table_id(database, table)} cannot be published "
        f"({error}); only the capture engine's files belong in the changelog: move this one out "
        "of the landing zone, or leave the table out with change_topics.tables.exclude")


@dataclass
class _Batch:
    limit: int
    begun: bool = False
    records: int = 0
    messages: dict[str, int] = field(default_factory=dict)

    @property
    def full(self) -> bool:
        return self.records >= self.limit

    def add(self, name: str, records: int, messages: int) -> None:
        self.records += records
        self.messages[name] = self.messages.get(name, 0) + messages


def _tables(survey: Survey) -> list[tuple[str, str]]:
    """``(database, table)`` of every table with segments, from the survey's directories."""
    found = []
    for db_dir, table_dir in survey.segments:
        try:
            found.append(table_of_parts(db_dir, table_dir))
        except ValueError:  # (not a directory the engine wrote)
            continue
    return sorted(found)


def describe(stats: PublisherStats) -> str:
    """One progress line."""
    sent = sum(stats.messages.values())
    state = "caught up" if stats.caught_up else f"lag {stats.lag_seconds():.1f}s"
    broker = "" if stats.broker_up or not stats.last_error else \
        f"; broker unavailable: {stats.last_error}"
    return (f"change topics: {sent} messages in {stats.batches} batches to "
            f"{len(stats.messages)} topics, {state}{broker}")


def open_publisher(settings: Settings, **kwargs: Any) -> Publisher:
    """The publisher of ``settings``' one source."""
    return Publisher(PublisherOptions.from_settings(settings), **kwargs)
