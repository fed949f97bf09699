"""What follows from the engine's options: the heartbeat the binlog stream asks for (never
slower than a flush or a snapshot poll needs), the reconnect backoff (doubling, capped) and
how long a flush waits (stretched when it would write many tables' segments)."""

from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.capture.engine_options import (
    FLUSH_STRETCH_MAX_SECONDS,
    HEARTBEAT_MAX_SECONDS,
    EngineOptions,
)
from cdc_platform.config import parse_settings


def _options(**overrides: float) -> EngineOptions:
    return EngineOptions("shop", "mariadb", 7, {}, **overrides)


def test_the_stream_heartbeat_is_the_shortest_of_what_needs_one() -> None:
    assert _options().stream_heartbeat_seconds == HEARTBEAT_MAX_SECONDS
    assert _options(heartbeat_seconds=0.01).stream_heartbeat_seconds == 0.01
    assert _options(flush_interval_seconds=0.005).stream_heartbeat_seconds == 0.005


def test_the_reconnect_backoff_doubles_up_to_its_ceiling() -> None:
    options = _options(initial_backoff_seconds=0.5, max_backoff_seconds=3.0)
    assert [options.reconnect_backoff(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


@given(interval=st.floats(0.01, 20.0), budget=st.integers(0, 1000),
       tables=st.integers(0, 100_000))
def test_a_flush_waits_so_that_flushes_write_at_most_the_segment_budget(
        interval: float, budget: int, tables: int) -> None:
    """``flush_wait``: never sooner than ``flush_interval_seconds``; never later than it or
    ``FLUSH_STRETCH_MAX_SECONDS``, whichever is longer; in between, just long enough that the
    tables queued (a segment each) are at most ``budget`` a second."""
    options = _options(flush_interval_seconds=interval, flush_max_segments_per_second=budget)
    wait = options.flush_wait(tables)
    assert interval <= wait <= max(interval, FLUSH_STRETCH_MAX_SECONDS)
    if budget == 0:
        assert wait == interval
    elif wait < FLUSH_STRETCH_MAX_SECONDS:
        assert tables <= budget * wait + 1e-9


def test_few_tables_flush_every_interval_and_a_thousand_at_most_every_ten_seconds() -> None:
    options = _options()  # (defaults: 1 s, 100 segments a second)
    assert options.flush_wait(0) == options.flush_wait(100) == 1.0
    assert options.flush_wait(400) == 4.0
    assert options.flush_wait(1000) == options.flush_wait(50_000) == 10.0


def test_options_built_without_a_config_have_the_defaults_of_a_config_that_omits_the_keys(
) -> None:
    """The defaults are the settings schema's: options built in code (tests, the bench) run
    the engine as a config file leaving those keys out does."""
    settings = parse_settings({
        "source": {"flavour": "mariadb", "host": "db", "user": "u", "server_id": 7,
                   "server_name": "shop"},
        "landing_zone": {"url": "/l"}, "warehouse": {"url": "/w"}})
    from_config = EngineOptions.from_settings(settings)
    in_code = EngineOptions(from_config.server_name, from_config.flavour, from_config.server_id,
                            from_config.connection_settings, selector=from_config.selector)
    assert in_code == from_config
