"""The signal and notification topics on Kafka: reading from an explicit offset, producing.

The sensor reads the one-partition signal topic with ``assign()`` from the offset in its
cursor (no consumer group: nothing is committed to Kafka, and Tansu's group joins take ~20 s),
and stops at the end of the partition (librdkafka's partition-EOF event), at the message limit
or when the time budget is spent, whichever comes first. A broker that never reports the end
is covered by a fallback: the partition quiet for ``idle_seconds`` after its last message (or
after the first fetch's grace).

The cursor carries the topic's id too: a topic deleted and created again (or a broker with
in-memory storage restarted) starts its offsets at 0 again, so an offset alone would skip the
new topic's first signals; a new id means "read it from the start". A cursor offset past the
end of the same topic (the log truncated, a cursor set by hand) is read from the earliest
offset again, with a note: run keys keep signals already acted on from starting twice, so
replaying is the safe direction.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_platform.capture.signals.messages import SignalMessage

log = logging.getLogger(__name__)

DEFAULT_BUDGET_SECONDS = 10.0
DEFAULT_IDLE_SECONDS = 1.0
# For a broker that reports no end of partition: how long the first fetch may take before the
# quiet fallback counts (a remote TLS cluster's first fetch is slow; an empty topic on such a
# broker then ends a tick in this plus idle_seconds, not the whole budget).
FIRST_FETCH_GRACE_SECONDS = 4.0
DEFAULT_MAX_MESSAGES = 500
_TIMEOUT_SECONDS = 10.0


class KafkaChannelError(RuntimeError):
    """The broker could not be reached or refused; the message names broker, topic and what
    to check."""


@dataclass(frozen=True)
class SignalCursor:
    """Where the sensor is in the signal topic: the next offset to read, in the topic whose
    Kafka id is ``topic_id`` (None: not read yet)."""

    topic_id: str | None = None
    offset: int = 0

    def to_json(self) -> str:
        return json.dumps({"topic_id": self.topic_id, "offset": self.offset})

    @staticmethod
    def from_json(text: str | None) -> SignalCursor:
        """The cursor from its JSON; None or unreadable JSON is the start (the caller logs)."""
        if not text:
            return SignalCursor()
        data = json.loads(text)
        offset = int(data.get("offset", 0))
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        topic_id = data.get("topic_id")
        return SignalCursor(None if topic_id is None else str(topic_id), offset)


@dataclass
class SignalBatch:
    """Messages read from the signal topic, and the cursor just after them."""

    messages: list[SignalMessage]
    cursor: SignalCursor
    notes: list[str] = field(default_factory=list)  # resets and gaps, for the log


def client_config(bootstrap_servers: str, extra: dict[str, str] | None = None,
                  **overrides: Any) -> dict[str, Any]:
    """librdkafka settings: the bootstrap servers, the config's extra settings (security),
    then ``overrides``."""
    return {"bootstrap.servers": bootstrap_servers, **(extra or {}), **overrides}


class KafkaTopics:
    """One Kafka cluster's signal-side operations."""

    def __init__(self, bootstrap_servers: str, extra_config: dict[str, str] | None = None
                 ) -> None:
        if not bootstrap_servers:
            raise KafkaChannelError("no Kafka bootstrap servers configured "
                                    "(signals.kafka.bootstrap_servers)")
        self.bootstrap_servers = bootstrap_servers
        self.extra_config = dict(extra_config or {})

    def _config(self, **overrides: Any) -> dict[str, Any]:
        return client_config(self.bootstrap_servers, self.extra_config,
                             **{"socket.connection.setup.timeout.ms": 5000, **overrides})

    def _client(self, kind: type[Any], config: dict[str, Any]) -> Any:
        """A ``Consumer``, ``Producer`` or ``AdminClient``; librdkafka checks the settings in
        the constructor, and a bad one (mostly from signals.kafka.config) must reach the
        operator as a KafkaChannelError, not a traceback."""
        try:
            return kind(config, logger=log)
        except (KafkaException, ValueError, TypeError) as error:
            raise KafkaChannelError(
                f"Kafka client for {self.bootstrap_servers} not created: "
                f"{kafka_error_text(error)}; check the librdkafka settings in "
                "signals.kafka.config") from error

    def _fail(self, what: str, error: BaseException) -> KafkaChannelError:
        detail = kafka_error_text(error) or f"no answer within {_TIMEOUT_SECONDS:.0f}s"
        return KafkaChannelError(f"{what} on Kafka {self.bootstrap_servers} failed: {detail}; "
                                 "check that the broker is up and signals.kafka is right")

    def ensure_topic(self, topic: str) -> str:
        """The topic's id, creating it with one partition if it is missing.

        Raises KafkaChannelError if the broker is unreachable or the topic has more than one
        partition (signals must keep their order).
        """
        admin = self._client(AdminClient, self._config())
        description = self._describe(admin, topic)
        if description is None:
            try:
                futures = admin.create_topics([NewTopic(topic, num_partitions=1,
                                                        replication_factor=-1)],
                                              operation_timeout=_TIMEOUT_SECONDS)
                futures[topic].result(timeout=_TIMEOUT_SECONDS)
                log.info(f"created topic {topic!r} (one partition) on {self.bootstrap_servers}")
            except TimeoutError as error:
                raise self._fail(f"creating topic {topic!r}", error) from error
            except KafkaException as error:
                reason = kafka_error(error)
                if reason is None or reason.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise self._fail(f"creating topic {topic!r}", error) from error
            description = self._describe(admin, topic)
            if description is None:
                raise KafkaChannelError(f"topic {topic!r} on {self.bootstrap_servers} was "
                                        "created but cannot be described; try again")
        partitions = len(description.partitions)
        if partitions != 1:
            raise KafkaChannelError(
                f"topic {topic!r} on {self.bootstrap_servers} has {partitions} partitions; a "
                "signal topic needs exactly one (signals keep their order): recreate it with "
                "one partition or point signals.topic at another topic")
        return str(description.topic_id)

    def _describe(self, admin: AdminClient, topic: str) -> Any | None:
        from confluent_kafka import TopicCollection

        try:
            futures = admin.describe_topics(TopicCollection([topic]),
                                            request_timeout=_TIMEOUT_SECONDS)
            return futures[topic].result(timeout=_TIMEOUT_SECONDS)
        except TimeoutError as error:
            raise self._fail(f"describing topic {topic!r}", error) from error
        except KafkaException as error:
            reason = kafka_error(error)
            if reason is not None and reason.code() in (
                    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                return None
            raise self._fail(f"describing topic {topic!r}", error) from error

    def read(self, topic: str, cursor: SignalCursor, *,
             max_messages: int = DEFAULT_MAX_MESSAGES,
             budget_seconds: float = DEFAULT_BUDGET_SECONDS,
             idle_seconds: float = DEFAULT_IDLE_SECONDS,
             max_message_bytes: int | None = None) -> SignalBatch:
        """Messages from ``cursor`` on, up to the end of the partition, ``max_messages`` or
        ``budget_seconds`` in all (for a broker that does not report the end: ``idle_seconds``
        without a message, counted from the last message or after the first fetch's grace).
        Creates the topic if it is missing.

        The returned cursor is just after the last message returned (or unchanged), so a
        message is in exactly one batch of a sensor whose cursor advances with its actions.
        """
        deadline = time.monotonic() + budget_seconds
        topic_id = self.ensure_topic(topic)
        notes: list[str] = []
        start = cursor.offset
        if cursor.topic_id is not None and cursor.topic_id != topic_id:
            notes.append(f"signal topic {topic!r} is not the one the cursor was in (id "
                         f"{cursor.topic_id} before, {topic_id} now: deleted and created "
                         "again, or a broker with in-memory storage restarted); reading the "
                         "new topic from its start")
            start = 0
        config = self._config(**{
            "group.id": f"cdc-platform-signals-{topic}",  # never joined: assign() only
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # An offset out of range is an error event, never a silent jump (see _start).
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
        })
        if max_message_bytes is not None:
            # Room to receive an oversized signal and skip it, instead of stalling on it.
            config["fetch.message.max.bytes"] = max(1_048_576, 2 * max_message_bytes)
        consumer = self._client(Consumer, config)
        try:
            start = self._start(consumer, topic, topic_id, start, deadline, notes)
            messages, next_offset = self._fetch(consumer, topic, start, deadline,
                                                idle_seconds, max_messages, notes)
        except KafkaException as error:
            raise self._fail(f"reading topic {topic!r}", error) from error
        finally:
            consumer.close()
        return SignalBatch(messages, SignalCursor(topic_id, next_offset), notes)

    def _start(self, consumer: Consumer, topic: str, topic_id: str, offset: int,
               deadline: float, notes: list[str]) -> int:
        """Where to read from for a cursor at ``offset``: ``offset`` itself, the earliest
        offset when those before it are gone, or the earliest offset again when ``offset`` is
        past the end of the log (truncated, or a cursor set by hand), with a note.

        Past the end, Kafka answers a fetch with OFFSET_OUT_OF_RANGE and Tansu with nothing at
        all, so the end is checked first. Tansu's listed high watermark is the base offset of
        the last record batch + 1, below the real end when that batch holds several records:
        an offset above it is checked against the end-of-partition event of a read from it.
        """
        watermarks = consumer.get_watermark_offsets(TopicPartition(topic, 0),
                                                    timeout=_TIMEOUT_SECONDS)
        if watermarks is None:
            raise self._fail(f"listing the offsets of topic {topic!r}", TimeoutError())
        low, high = watermarks
        if offset < low:
            notes.append(f"signal topic {topic!r}: offsets {offset}..{low - 1} are gone "
                         "(retention or compaction) before they were read")
            return int(low)
        if offset <= high:
            return offset
        end = high if high <= low else self._end_offset(consumer, topic, high - 1, deadline)
        if offset <= end:
            return offset
        notes.append(f"signal topic {topic!r} (id {topic_id}) ends at offset {end}, before the "
                     f"cursor's offset {offset} (the log was truncated, or the cursor was set "
                     f"past the end by hand): reading it again from its earliest offset {low}; "
                     "run keys keep signals already acted on from starting twice")
        return int(low)

    def _end_offset(self, consumer: Consumer, topic: str, offset: int,
                    deadline: float) -> int:
        """The offset after the last record, from the end-of-partition event of a read from
        ``offset`` (an offset that exists)."""
        consumer.assign([TopicPartition(topic, 0, offset)])
        while (left := deadline - time.monotonic()) > 0:
            message = consumer.poll(min(0.2, left))
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                return int(message.offset())
            if error is not None:
                self._check(topic, offset, error)
        raise KafkaChannelError(
            f"the end of signal topic {topic!r} on {self.bootstrap_servers} was not found "
            f"within the read budget (no end-of-partition event from offset {offset}); the "
            "next tick tries again: if this repeats, compare the sensor's cursor with the "
            "topic's offsets and set it with `dagster sensor cursor`")

    def _fetch(self, consumer: Consumer, topic: str, start: int, deadline: float,
               idle_seconds: float, max_messages: int, notes: list[str]
               ) -> tuple[list[SignalMessage], int]:
        consumer.assign([TopicPartition(topic, 0, start)])
        messages: list[SignalMessage] = []
        next_offset = start
        # The quiet fallback runs from the last message, or from the end of the first fetch's
        # grace: a slow first fetch is not "no new signal".
        quiet_since = time.monotonic() + FIRST_FETCH_GRACE_SECONDS
        while len(messages) < max_messages:
            now = time.monotonic()
            if now >= deadline or now - quiet_since >= idle_seconds:
                break
            message = consumer.poll(min(0.2, deadline - now))
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if message.offset() >= next_offset:
                        break  # everything produced before this fetch is read
                    continue  # left over from an earlier assignment
                self._check(topic, next_offset, error)
                continue
            offset = message.offset()
            if offset < next_offset:
                continue  # a batch that starts before the assigned offset
            if offset > next_offset and not messages:
                notes.append(f"signal topic {topic!r}: offsets {next_offset}..{offset - 1} "
                             "are gone (retention or compaction) before they were read")
            _, timestamp = message.timestamp()
            messages.append(SignalMessage(offset, message.key(), message.value(),
                                          timestamp if timestamp > 0 else None))
            next_offset = offset + 1
            quiet_since = time.monotonic()
        return messages, next_offset

    def _check(self, topic: str, offset: int, error: KafkaError) -> None:
        """Log a passing error; raise on one that ends the read (the cursor stays)."""
        if error.code() == KafkaError._AUTO_OFFSET_RESET:
            raise KafkaChannelError(
                f"signal topic {topic!r} on {self.bootstrap_servers}: offset {offset} went out "
                f"of range while it was read ({error.str()}); the next tick checks the topic's "
                "offsets again")
        if error.retriable() or not error.fatal():
            log.warning(f"signal topic {topic!r}: {error.str()}; retrying")
            return
        raise self._fail(f"reading topic {topic!r}", KafkaException(error))

    def produce(self, topic: str, key: str, value: bytes) -> int:
        """Send one message and wait for it; its offset. Creates the topic if missing."""
        self.ensure_topic(topic)
        producer = self._client(Producer, self._config(**{"enable.idempotence": False}))
        delivered: list[Any] = []
        try:
            producer.produce(topic, key=key.encode(), value=value, on_delivery=lambda error,
                             message: delivered.append((error, message)))
        except (BufferError, KafkaException) as error:
            raise self._fail(f"producing to topic {topic!r}", error) from error
        remaining = producer.flush(_TIMEOUT_SECONDS)
        if remaining or not delivered:
            raise KafkaChannelError(f"message to topic {topic!r} on {self.bootstrap_servers} "
                                    f"not delivered within {_TIMEOUT_SECONDS:.0f}s; check the "
                                    "broker")
        error, message = delivered[0]
        if error is not None:
            raise self._fail(f"producing to topic {topic!r}", KafkaException(error))
        return int(message.offset())


class NotificationPublisher:
    """Publishes notifications to a topic without blocking the caller; ``close`` waits a
    little for delivery and reports what could not be sent (notifications are best effort: a
    broker outage never stops a snapshot)."""

    def __init__(self, topics: KafkaTopics, topic: str, key: str) -> None:
        self.topic, self.key = topic, key.encode()
        self.failures: list[str] = []
        topics.ensure_topic(topic)
        self._producer = topics._client(Producer, topics._config(**{
            "enable.idempotence": False, "message.timeout.ms": 30_000}))

    def publish(self, value: bytes) -> None:
        def delivered(error: KafkaError | None, _: Any) -> None:
            if error is not None:
                self.failures.append(str(error))

        try:
            self._producer.produce(self.topic, key=self.key, value=value,
                                   on_delivery=delivered)
        except (BufferError, KafkaException) as error:
            self.failures.append(str(error))
        self._producer.poll(0)

    def close(self, timeout: float = 5.0) -> int:
        """Wait up to ``timeout`` for outstanding deliveries; how many were not delivered."""
        remaining = self._producer.flush(timeout)
        return remaining + len(self.failures)


def kafka_error(error: BaseException) -> KafkaError | None:
    """The ``KafkaError`` a ``KafkaException`` carries, if any."""
    reason = error.args[0] if isinstance(error, KafkaException) and error.args else None
    return reason if isinstance(reason, KafkaError) else None


def kafka_error_text(error: BaseException) -> str:
    """The librdkafka reason alone (``KafkaException`` prints as ``KafkaError{code=...}``)."""
    reason = kafka_error(error)
    return reason.str() if reason is not None else str(error)
