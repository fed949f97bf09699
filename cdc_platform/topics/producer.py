"""The change publisher's side of Kafka: topics created as needed, and batches sent whole or
not at all as far as the publisher's position goes (``ChangeProducer``).

A batch is sent, then confirmed (``commit``): with transactions, one Kafka transaction per
batch (``read_committed`` consumers see all of it or, on a real Kafka, nothing of a batch a
killed publisher left open); without, an idempotent producer's flush with every delivery
report checked. Only after ``commit`` returns does the publisher save its position, so a
failure anywhere sends the batch again from the saved position (at least once; each message's
``cdc.gtid``/``cdc.position`` headers let a consumer skip a repeat).

Errors are sorted into two kinds: ``BrokerUnavailable`` (the broker is down, a timeout, a full
queue: the publisher backs off and retries, capture and the lake never wait for it) and
``PublishError`` (what retrying cannot fix, e.g. a message larger than the topic accepts, or
a denied topic: a loud stop naming the table, position and the fix).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_platform.capture.signals.kafka import client_config, kafka_error, kafka_error_text

log = logging.getLogger(__name__)

# Seconds a request to the broker may take before the publisher counts the broker unavailable.
REQUEST_TIMEOUT_SECONDS = 15.0
# What the producer holds in memory at most (librdkafka's queue; a full queue waits for
# deliveries, so memory stays bounded whatever the batch).
QUEUE_KBYTES = 64 * 1024
QUEUE_MESSAGES = 100_000


class BrokerUnavailable(RuntimeError):
    """The broker cannot take the batch now (down, slow, or refusing for a while): retry."""


class PublishError(RuntimeError):
    """Publishing cannot go on until someone fixes something (the message says what)."""


# Delivery errors no retry fixes.
_FATAL_CODES = {
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.INVALID_CONFIG, KafkaError._INVALID_ARG, KafkaError.INVALID_REQUIRED_ACKS,
    KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD,
    KafkaError.UNSUPPORTED_VERSION, KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT,
}


class ChangeProducer:
    """One publisher's producer. ``transactional_id`` set: each batch is a transaction (the id
    also fences an older producer of the same publisher, as Kafka does)."""

    def __init__(self, bootstrap_servers: str, extra_config: dict[str, str] | None,
                 transactional_id: str | None, partitions: int = 1,
                 replication_factor: int = -1) -> None:
        if not bootstrap_servers:
            raise PublishError("no Kafka bootstrap servers for the change topics: set "
                               "change_topics.kafka.bootstrap_servers (or "
                               "signals.kafka.bootstrap_servers)")
        self.bootstrap_servers = bootstrap_servers
        self.transactional = transactional_id is not None
        self.partitions, self.replication_factor = partitions, replication_factor
        self._extra = dict(extra_config or {})
        settings = {
            "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "queue.buffering.max.kbytes": QUEUE_KBYTES,
            "queue.buffering.max.messages": QUEUE_MESSAGES,
            "message.timeout.ms": int(REQUEST_TIMEOUT_SECONDS * 4 * 1000),
            "socket.connection.setup.timeout.ms": 5000,
            **({"transactional.id": transactional_id,
                "transaction.timeout.ms": 120_000} if transactional_id else {}),
        }
        try:
            self._producer = Producer(client_config(bootstrap_servers, self._extra, **settings),
                                      logger=log)
            self._admin = AdminClient(client_config(
                bootstrap_servers, self._extra, **{"socket.connection.setup.timeout.ms": 5000}),
                logger=log)
        except (KafkaException, ValueError, TypeError) as error:
            raise PublishError(f"Kafka producer for {bootstrap_servers} not created: "
                               f"{kafka_error_text(error)}; check change_topics.kafka.config"
                               ) from error
        self._topics: set[str] = set()
        self._errors: list[tuple[KafkaError, str]] = []
        self._initialised = not self.transactional
        self._open = False

    # -- topics ----------------------------------------------------------------------------

    def ensure_topics(self, topics: Iterable[str]) -> None:
        """Create the topics not known to exist yet (``partitions``, ``replication_factor``)."""
        missing = [t for t in dict.fromkeys(topics) if t not in self._topics]
        if not missing:
            return
        try:
            listed = self._admin.list_topics(timeout=REQUEST_TIMEOUT_SECONDS).topics
        except KafkaException as error:
            raise BrokerUnavailable(f"listing topics: {kafka_error_text(error)}") from error
        new = [t for t in missing if t not in listed]
        if new:
            futures = self._admin.create_topics(
                [NewTopic(t, num_partitions=self.partitions,
                          replication_factor=self.replication_factor) for t in new],
                operation_timeout=REQUEST_TIMEOUT_SECONDS)
            for topic, future in futures.items():
                try:
                    future.result(timeout=REQUEST_TIMEOUT_SECONDS)
                    log.info("created change topic %r (%d partition(s))", topic, self.partitions)
                except TimeoutError as error:
                    raise BrokerUnavailable(f"creating topic {topic!r}: no answer") from error
                except KafkaException as error:
                    reason = kafka_error(error)
                    if reason is not None and reason.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                        continue
                    if reason is not None and reason.code() in _FATAL_CODES:
                        raise PublishError(
                            f"creating change topic {topic!r} on {self.bootstrap_servers} was "
                            f"refused: {reason.str()}; create it yourself or grant the "
                            "publisher's account CREATE on the cluster") from error
                    raise BrokerUnavailable(
                        f"creating topic {topic!r}: {kafka_error_text(error)}") from error
        self._topics.update(missing)

    # -- batches ---------------------------------------------------------------------------

    def begin(self) -> None:
        """Start a batch (a transaction, when transactional)."""
        self._errors.clear()
        if not self.transactional:
            return
        try:
            if not self._initialised:
                self._producer.init_transactions(REQUEST_TIMEOUT_SECONDS)
                self._initialised = True
            self._producer.begin_transaction()
            self._open = True
        except KafkaException as error:
            raise self._classified("starting a transaction", error) from error

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: list[tuple[str, bytes]], what: str) -> None:
        """Queue one message (``what`` names it in errors: table, GTID, position). A full
        queue waits for deliveries."""
        while True:
            try:
                self._producer.produce(topic, key=key, value=value, headers=headers,
                                       on_delivery=self._delivered)
                break
            except BufferError:
                self._producer.poll(0.1)
                self._raise_delivery_errors()
            except KafkaException as error:
                raise self._classified(f"sending {what}", error) from error
        self._producer.poll(0)

    def commit(self) -> None:
        """Wait until the batch is on the broker (the transaction committed, or every message
        acknowledged); raises ``BrokerUnavailable``/``PublishError`` otherwise (then the batch
        counts as not sent: ``abort`` and send it again)."""
        try:
            if self.transactional:
                self._producer.commit_transaction(REQUEST_TIMEOUT_SECONDS * 4)
                self._open = False
            else:
                remaining = self._producer.flush(REQUEST_TIMEOUT_SECONDS * 4)
                if remaining:
                    raise BrokerUnavailable(f"{remaining} messages not acknowledged within "
                                            f"{REQUEST_TIMEOUT_SECONDS * 4:.0f}s")
        except KafkaException as error:
            raise self._classified("committing the batch", error) from error
        self._raise_delivery_errors()

    def abort(self) -> bool:
        """Give the open batch up; False when the producer cannot go on (then make a new
        one: a broker that is down ends the old transaction by its timeout)."""
        self._errors.clear()
        if not (self.transactional and self._open):
            self._producer.purge(in_queue=True, in_flight=False)
            return True
        self._open = False
        try:
            self._producer.abort_transaction(REQUEST_TIMEOUT_SECONDS)
        except KafkaException as error:
            log.warning("change topics: aborting the transaction failed (%s)",
                        kafka_error_text(error))
            return False
        return True

    def ping(self) -> None:
        """Raise ``BrokerUnavailable`` unless the broker answers."""
        try:
            self._admin.list_topics(timeout=REQUEST_TIMEOUT_SECONDS)
        except KafkaException as error:
            raise BrokerUnavailable(f"the broker does not answer: {kafka_error_text(error)}"
                                    ) from error

    def close(self, timeout: float = 5.0) -> None:
        self._producer.flush(timeout)

    # -- errors ----------------------------------------------------------------------------

    def _delivered(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            self._errors.append((error, f"{message.topic()} position "
                                        f"{_header(message, 'cdc.position')}"))

    def _raise_delivery_errors(self) -> None:
        if not self._errors:
            return
        error, what = self._errors[0]
        if error.code() in _FATAL_CODES:
            raise PublishError(self._fatal_text(error, what))
        raise BrokerUnavailable(f"delivery of {what} failed: {error.str()}")

    def _classified(self, doing: str, error: KafkaException) -> Exception:
        reason = kafka_error(error)
        if reason is None:
            return BrokerUnavailable(f"{doing}: {error}")
        # (a producer in a fatal state fails every call after with the local _FATAL code)
        fatal = reason.fatal() or reason.code() == KafkaError._FATAL
        if reason.code() in _FATAL_CODES or (fatal and not self.transactional):
            return PublishError(self._fatal_text(reason, doing))
        if fatal:
            # (a fenced or broken transactional producer: only a new one goes on, and a new
            # one would fence the publisher that took over)
            return PublishError(f"change topics: {doing}: {reason.str()}: another publisher "
                                "of this source took over its transactional id (two "
                                "publish_changes runs, or a `python -m cdc_platform publish`), "
                                "or the broker lost its transaction state; this one stops, and "
                                "a new run starts from the saved position")
        if reason.txn_requires_abort():
            return BrokerUnavailable(f"{doing}: {reason.str()} (transaction aborted)")
        return BrokerUnavailable(f"{doing}: {reason.str()}")

    def _fatal_text(self, error: KafkaError, what: str) -> str:
        if error.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE):
            return (f"change topics: {what} is larger than the broker or the producer accepts "
                    f"({error.str()}): raise the topic's max.message.bytes and "
                    "change_topics.kafka.config message.max.bytes, or leave the column out "
                    "(capture.excluded_columns)")
        return (f"change topics: {what}: {error.str()}; fix the broker side or "
                "change_topics.kafka.config")


def _header(message: Any, name: str) -> str:
    for key, value in message.headers() or ():
        if key == name:
            return value.decode() if isinstance(value, bytes) else str(value)
    return "?"

