"""What follows from the engine's options: the heartbeat the binlog stream asks for (never
slower than a flush or a snapshot poll needs) and the reconnect backoff (doubling, capped)."""

from cdc_platform.capture.engine_options import HEARTBEAT_MAX_SECONDS, EngineOptions


def _options(**overrides: float) -> EngineOptions:
    return EngineOptions("shop", "mariadb", 7, {}, **overrides)


def test_the_stream_heartbeat_is_the_shortest_of_what_needs_one() -> None:
    assert _options().stream_heartbeat_seconds == HEARTBEAT_MAX_SECONDS
    assert _options(heartbeat_seconds=0.01).stream_heartbeat_seconds == 0.01
    assert _options(flush_interval_seconds=0.005).stream_heartbeat_seconds == 0.005


def test_the_reconnect_backoff_doubles_up_to_its_ceiling() -> None:
    options = _options(initial_backoff_seconds=0.5, max_backoff_seconds=3.0)
    assert [options.reconnect_backoff(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
