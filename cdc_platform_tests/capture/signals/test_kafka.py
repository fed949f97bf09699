"""Reading and writing the signal topic against the real broker (Tansu, in-memory).

Tansu 0.6.0 reports the end of a partition (librdkafka's partition-EOF event) with the right
offset, but its listed high watermark is the base offset of the last record batch + 1, and it
answers a fetch past the end with nothing at all (no OFFSET_OUT_OF_RANGE): the reads here
cover both.
"""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from cdc_platform.capture.signals.kafka import (
    KafkaChannelError,
    KafkaTopics,
    NotificationPublisher,
    SignalCursor,
)
from cdc_platform.devservices.kafka import TansuBroker
from cdc_platform.devservices.ports import free_port

_topics = itertools.count()


@pytest.fixture
def topic() -> str:
    return f"signals-kafka-{next(_topics)}-{time.monotonic_ns()}"


def produce(bootstrap: str, topic: str, count: int, batched: bool = False) -> None:
    """``count`` messages; ``batched``: in one record batch (as a lingering producer sends)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 200 if batched else 0})
    for n in range(count):
        producer.produce(topic, key=b"k", value=f"m{n}".encode())
        if not batched:
            producer.flush(10)
    assert producer.flush(10) == 0


def offsets(batch: object) -> list[int]:
    return [m.offset for m in batch.messages]  # type: ignore[attr-defined]


def test_a_read_ends_at_the_end_of_the_partition_not_after_a_quiet_spell(
        kafka: TansuBroker, topic: str) -> None:
    topics = KafkaTopics(kafka.bootstrap_servers)
    empty = topics.read(topic, SignalCursor())  # creates the topic
    produce(kafka.bootstrap_servers, topic, 3)
    started = time.monotonic()
    batch = topics.read(topic, empty.cursor, idle_seconds=30, budget_seconds=20)
    again = topics.read(topic, batch.cursor, idle_seconds=30, budget_seconds=20)
    # Two reads, each waiting for a quiet spell of 30 s or its 20 s budget, would take 40 s.
    assert time.monotonic() - started < 5
    assert offsets(batch) == [0, 1, 2] and batch.cursor.offset == 3
    assert offsets(again) == [] and again.cursor == batch.cursor
    assert batch.notes == [] and again.notes == []


def test_the_end_of_a_batch_of_several_records_is_found_despite_the_watermark(
        kafka: TansuBroker, topic: str) -> None:
    """Offsets 0, 1 alone, then 2..4 in one batch: Tansu lists the high watermark as 3."""
    topics = KafkaTopics(kafka.bootstrap_servers)
    topic_id = topics.ensure_topic(topic)
    produce(kafka.bootstrap_servers, topic, 2)
    produce(kafka.bootstrap_servers, topic, 3, batched=True)
    for cursor_offset, expected in ((0, [0, 1, 2, 3, 4]), (3, [3, 4]), (4, [4]), (5, [])):
        batch = topics.read(topic, SignalCursor(topic_id, cursor_offset), idle_seconds=30)
        assert offsets(batch) == expected, cursor_offset
        assert batch.cursor == SignalCursor(topic_id, 5) and batch.notes == []


@pytest.mark.parametrize("cursor_offset", [6, 1000])
def test_a_cursor_past_the_end_is_read_again_from_the_earliest_offset(
        kafka: TansuBroker, topic: str, cursor_offset: int) -> None:
    topics = KafkaTopics(kafka.bootstrap_servers)
    topic_id = topics.ensure_topic(topic)
    produce(kafka.bootstrap_servers, topic, 2)
    produce(kafka.bootstrap_servers, topic, 3, batched=True)
    batch = topics.read(topic, SignalCursor(topic_id, cursor_offset))
    assert offsets(batch) == [0, 1, 2, 3, 4]
    assert batch.cursor == SignalCursor(topic_id, 5)
    [note] = batch.notes
    assert f"ends at offset 5, before the cursor's offset {cursor_offset}" in note
    assert "reading it again from its earliest offset 0" in note


def test_a_cursor_past_the_end_of_an_empty_topic_starts_at_its_beginning(
        kafka: TansuBroker, topic: str) -> None:
    topics = KafkaTopics(kafka.bootstrap_servers)
    topic_id = topics.ensure_topic(topic)
    batch = topics.read(topic, SignalCursor(topic_id, 7))
    assert offsets(batch) == [] and batch.cursor == SignalCursor(topic_id, 0)
    assert "ends at offset 0, before the cursor's offset 7" in batch.notes[0]


@pytest.mark.parametrize(("setting", "reason"), [
    ({"no.such.setting": "1"}, 'No such configuration property: "no.such.setting"'),
    ({"security.protocol": "bogus"}, 'Invalid value "bogus" for configuration property '
                                     '"security.protocol"'),
])
def test_bad_client_settings_are_a_channel_error_naming_the_setting(
        kafka: TansuBroker, topic: str, setting: dict[str, str], reason: str) -> None:
    topics = KafkaTopics(kafka.bootstrap_servers, setting)
    for attempt in (lambda: topics.read(topic, SignalCursor()),
                    lambda: topics.produce(topic, "k", b"{}"),
                    lambda: NotificationPublisher(topics, topic, "k")):
        with pytest.raises(KafkaChannelError) as raised:
            attempt()
        message = str(raised.value)
        assert reason in message and "check the librdkafka settings in signals.kafka.config" \
            in message, message


@dataclass(eq=False)
class _AdvertisingBroker(TansuBroker):
    """Tansu telling its clients to connect to ``advertised_port`` (a proxy) instead."""

    advertised_port: int = 0

    def _argv(self, port: int) -> list[str]:
        return [f"--advertised-listener-url=tcp://{self.host}:{self.advertised_port}"
                if arg.startswith("--advertised-listener-url=") else arg
                for arg in super()._argv(port)]


class _SlowFirstFetch:
    """A TCP proxy to ``upstream_port`` holding the first Fetch request back ``delay`` seconds:
    a remote cluster whose first fetch is slow (TLS, distance)."""

    def __init__(self, upstream_port: int, delay: float) -> None:
        self.upstream_port, self.delay = upstream_port, delay
        self.fetches_delayed = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while header := _read_exactly(client, 4):
                body = _read_exactly(client, struct.unpack(">i", header)[0])
                if struct.unpack(">h", body[:2])[0] == 1 and not self.fetches_delayed:  # Fetch
                    self.fetches_delayed += 1
                    time.sleep(self.delay)
                upstream.sendall(header + body)
        except OSError:
            pass
        finally:
            upstream.close()

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            target.close()

    def close(self) -> None:
        self._server.close()


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


@pytest.fixture
def slow_first_fetch(tmp_path: Path) -> Iterator[tuple[str, _SlowFirstFetch]]:
    broker_port = free_port()
    proxy = _SlowFirstFetch(broker_port, delay=2.5)
    broker = _AdvertisingBroker(base_dir=tmp_path / "kafka", port=broker_port,
                                advertised_port=proxy.port).start()
    try:
        yield f"127.0.0.1:{proxy.port}", proxy
    finally:
        broker.stop()
        proxy.close()


def test_a_slow_first_fetch_is_not_taken_for_a_topic_without_new_signals(
        slow_first_fetch: tuple[str, _SlowFirstFetch], topic: str) -> None:
    bootstrap, proxy = slow_first_fetch
    topics = KafkaTopics(bootstrap)
    topic_id = topics.ensure_topic(topic)
    produce(bootstrap, topic, 2)
    batch = topics.read(topic, SignalCursor(topic_id, 0), idle_seconds=1.0, budget_seconds=10)
    assert proxy.fetches_delayed == 1  # the first fetch did take 2.5 s, past the quiet 1 s
    assert offsets(batch) == [0, 1] and batch.cursor == SignalCursor(topic_id, 2)
