"""The signal and notification topics on Kafka: reading from an explicit offset, producing.

The sensor reads the one-partition signal topic with ``assign()`` from the offset in its
cursor (no consumer group: nothing is committed to Kafka, and Tansu's group joins take ~20 s),
and stops when the partition goes quiet, the message limit is reached or the time budget is
spent, whichever comes first. The cursor carries the topic's id too: a topic deleted and
created again (or a broker with in-memory storage restarted) starts its offsets at 0 again, so
an offset alone would skip the new topic's first signals; a new id means "read it from the
start".
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

    def _fail(self, what: str, error: BaseException) -> KafkaChannelError:
        detail = str(error) or f"no answer within {_TIMEOUT_SECONDS:.0f}s"
        return KafkaChannelError(f"{what} on Kafka {self.bootstrap_servers} failed: {detail}; "
                                 "check that the broker is up and signals.kafka is right")

    def ensure_topic(self, topic: str) -> str:
        """The topic's id, creating it with one partition if it is missing.

        Raises KafkaChannelError if the broker is unreachable or the topic has more than one
        partition (signals must keep their order).
        """
        admin = AdminClient(self._config(), logger=log)
        description = self._describe(admin, topic)
        if description is None:
            futures = admin.create_topics([NewTopic(topic, num_partitions=1,
                                                    replication_factor=-1)],
                                          operation_timeout=_TIMEOUT_SECONDS)
            try:
                futures[topic].result(timeout=_TIMEOUT_SECONDS)
                log.info(f"created topic {topic!r} (one partition) on {self.bootstrap_servers}")
            except TimeoutError as error:
                raise self._fail(f"creating topic {topic!r}", error) from error
            except KafkaException as error:
                code = error.args[0].code() if error.args and isinstance(
                    error.args[0], KafkaError) else None
                if code != KafkaError.TOPIC_ALREADY_EXISTS:
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

        futures = admin.describe_topics(TopicCollection([topic]),
                                        request_timeout=_TIMEOUT_SECONDS)
        try:
            return futures[topic].result(timeout=_TIMEOUT_SECONDS)
        except TimeoutError as error:
            raise self._fail(f"describing topic {topic!r}", error) from error
        except KafkaException as error:
            kafka_error = error.args[0] if error.args else None
            if isinstance(kafka_error, KafkaError) and kafka_error.code() in (
                    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                return None
            raise self._fail(f"describing topic {topic!r}", error) from error

    def read(self, topic: str, cursor: SignalCursor, *,
             max_messages: int = DEFAULT_MAX_MESSAGES,
             budget_seconds: float = DEFAULT_BUDGET_SECONDS,
             idle_seconds: float = DEFAULT_IDLE_SECONDS,
             max_message_bytes: int | None = None) -> SignalBatch:
        """Messages from ``cursor`` on: until ``idle_seconds`` pass without one, or
        ``max_messages``, or ``budget_seconds`` in all. Creates the topic if it is missing.

        The returned cursor is just after the last message returned (or unchanged), so a
        message is in exactly one batch of a sensor whose cursor advances with its actions.
        """
        started = time.monotonic()
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
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
        })
        if max_message_bytes is not None:
            # Room to receive an oversized signal and skip it, instead of stalling on it.
            config["fetch.message.max.bytes"] = max(1_048_576, 2 * max_message_bytes)
        consumer = Consumer(config, logger=log)
        messages: list[SignalMessage] = []
        next_offset = start
        try:
            consumer.assign([TopicPartition(topic, 0, start)])
            deadline = started + budget_seconds
            quiet_since = time.monotonic()
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
                        continue
                    if error.retriable() or not error.fatal():
                        log.warning(f"signal topic {topic!r}: {error}; retrying")
                        continue
                    raise self._fail(f"reading topic {topic!r}", KafkaException(error))
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
        except KafkaException as error:
            raise self._fail(f"reading topic {topic!r}", error) from error
        finally:
            consumer.close()
        return SignalBatch(messages, SignalCursor(topic_id, next_offset), notes)

    def produce(self, topic: str, key: str, value: bytes) -> int:
        """Send one message and wait for it; its offset. Creates the topic if missing."""
        self.ensure_topic(topic)
        producer = Producer(self._config(**{"enable.idempotence": False}), logger=log)
        delivered: list[Any] = []
        producer.produce(topic, key=key.encode(), value=value,
                         on_delivery=lambda error, message: delivered.append((error, message)))
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
        self._producer = Producer(topics._config(**{"enable.idempotence": False,
                                                    "message.timeout.ms": 30_000}), logger=log)

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
