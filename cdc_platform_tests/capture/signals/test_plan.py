"""Signal parsing and planning: pure logic, no broker (the sensor tests use a real one)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_platform.capture.signals import plan as plan_module
from cdc_platform.capture.signals.messages import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Signal,
    SignalMessage,
    Skipped,
    parse_signal,
    signal_value,
)
from cdc_platform.capture.signals.plan import (
    ControlSnapshots,
    LogMessage,
    RegexBudget,
    StartSnapshot,
    match_collections,
    plan_signals,
)
from cdc_platform.capture.snapshot.conditions import Condition
from cdc_platform.capture.source import TableSelector

SERVER, TOPIC = "shop", "cdc-signals"
CAPTURED = ["inv.customers", "inv.orders", "inv.products", "sales.orders"]
SELECTOR = TableSelector(include=(r"(inv|sales)\..*",), exclude=(r"inv\.audit_log",))


def message(value: Any, offset: int = 0, key: bytes | None = SERVER.encode()) -> SignalMessage:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return SignalMessage(offset, key, raw)


def execute(*tables: str, **data: Any) -> dict[str, Any]:
    return {"type": "execute-snapshot",
            "data": {"data-collections": list(tables), "type": "INCREMENTAL", **data}}


def plan(*messages: SignalMessage, busy: dict[str, str] | None = None,
         budget: RegexBudget | None = None) -> list[Any]:
    return plan_signals(list(messages), server_name=SERVER, topic=TOPIC, captured=CAPTURED,
                        selector=SELECTOR, busy=busy, regex_budget=budget)


def reasons(actions: list[Any]) -> list[str]:
    return [a.reason for a in actions if isinstance(a, Skipped)]


def test_the_seed_example_signal_starts_one_snapshot() -> None:
    seed = b'{"type":"execute-snapshot","data": {"data-collections": ["inv.orders"], ' \
           b'"type": "INCREMENTAL"}}'
    [action] = plan(message(seed, offset=7))
    assert isinstance(action, StartSnapshot)
    assert (action.table_id, action.condition, action.signal.id) == (
        "inv.orders", None, f"{TOPIC}@7")


def test_regular_expressions_expand_to_the_captured_tables_they_match() -> None:
    actions = plan(message(execute(r"inv\..*", "sales.orders")))
    assert [a.table_id for a in actions] == ["inv.customers", "inv.orders", "inv.products",
                                             "sales.orders"]
    assert match_collections([r".*\.orders"], CAPTURED) == (["inv.orders", "sales.orders"], [])


def test_additional_conditions_and_the_surrogate_key_reach_the_run() -> None:
    actions = plan(message(execute(
        "inv.orders", "inv.customers", **{
            "additional-conditions": [{"data-collection": "inv.orders",
                                       "filter": "status = 'paid' AND total > 10"}],
            "surrogate-key": "a, b"})))
    by_table = {a.table_id: a for a in actions}
    assert by_table["inv.orders"].condition == "status = 'paid' AND total > 10"
    # checked here, where the signal's text enters: the run gets it as a Condition
    assert isinstance(by_table["inv.orders"].condition, Condition)
    assert by_table["inv.customers"].condition is None
    assert by_table["inv.orders"].surrogate_key == ("a", "b")


def test_the_legacy_single_condition_applies_to_every_table() -> None:
    actions = plan(message(execute("inv.orders", "sales.orders",
                                   **{"additional-condition": "id > 5"})))
    assert [(a.table_id, a.condition) for a in actions] == [
        ("inv.orders", "id > 5"), ("sales.orders", "id > 5")]


@pytest.mark.parametrize(("value", "expected"), [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object, not list"),
    (b"", "empty message value"),
    ({"data": {}}, "missing 'type'"),
    ({"type": "execute-snaphsot", "data": {}}, "unknown type 'execute-snaphsot'"),
    ({"type": "execute-snapshot", "data": {}}, "missing 'data-collections'"),
    ({"type": "execute-snapshot", "data": {"data-collections": [1]}},
     "must be a list of non-empty strings"),
    ({"type": "execute-snapshot", "data": "inv.orders"}, "'data' must be a JSON object"),
    (execute("inv.orders", type="BLOCKING"), "only INCREMENTAL"),
    (execute("inv.orders", **{"additional-conditions": [{"filter": "x = 1"}]}),
     "lacks its 'data-collection'"),
    (execute("inv.orders", **{"additional-conditions": "x = 1"}),
     "'additional-conditions' must be a list"),
    (execute("inv.orders", **{"surrogate-key": 5}), "'surrogate-key' must be"),
    ({"type": "log", "data": {}}, "a log signal needs"),
    ({"id": "", "type": "log", "data": {"message": "x"}}, "'id' must be a non-empty string"),
    # Duplicate keys, at any depth: parsers differ on which value counts (the first one
    # reads as a harmless log to a gateway that keeps the first key).
    (b'{"type": "log", "type": "execute-snapshot", "data": {"data-collections": ["inv.t"]}}',
     "the key 'type' appears twice"),
    (b'{"type": "execute-snapshot", "data": {"data-collections": ["inv.a"], '
     b'"data-collections": ["inv.b"]}}', "the key 'data-collections' appears twice"),
    (b'{"type": "execute-snapshot", "data": {"data-collections": ["inv.a"], '
     b'"additional-conditions": [{"data-collection": "inv.a", "filter": "id > 1", '
     b'"filter": "1 = 1"}]}}', "the key 'filter' appears twice"),
    (b'{"id": "a", "id": "b", "type": "log", "data": {"message": "x"}}',
     "the key 'id' appears twice"),
])
def test_bad_messages_are_skipped_with_the_reason(value: Any, expected: str) -> None:
    [action] = plan(message(value, offset=3))
    assert isinstance(action, Skipped) and action.offset == 3
    assert expected in action.reason, action.reason


def test_a_huge_message_is_skipped_unread() -> None:
    huge = json.dumps(execute("inv.orders", padding="x" * DEFAULT_MAX_MESSAGE_BYTES)).encode()
    [action] = plan(message(huge))
    assert isinstance(action, Skipped) and "exceeds the limit" in action.reason


def test_messages_for_another_source_are_skipped_as_foreign() -> None:
    [foreign] = plan(message(execute("inv.orders"), key=b"other"))
    [keyless] = plan(message(execute("inv.orders"), key=None))
    assert isinstance(foreign, Skipped) and foreign.foreign and "'other'" in foreign.reason
    assert isinstance(keyless, Skipped) and not keyless.foreign and keyless.unaddressed
    assert not foreign.unaddressed
    [not_text] = plan(message(execute("inv.orders"), key=b"\xff\xfe"))
    assert isinstance(not_text, Skipped) and not_text.unaddressed and not not_text.foreign


def test_unknown_excluded_and_non_matching_tables_are_reported_and_the_rest_start() -> None:
    actions = plan(message(execute("inv.orders", "inv.audit_log", "inv.nope", "nomatch.*",
                                   "bad[regex")))
    assert [a.table_id for a in actions if isinstance(a, StartSnapshot)] == ["inv.orders"]
    problems = reasons(actions)
    assert any("inv.audit_log is not captured" in p for p in problems)
    assert any("'inv.nope' matches no captured table" in p for p in problems)
    assert any("'nomatch.*' matches no captured table" in p for p in problems)
    assert any("nor a valid regular expression" in p for p in problems)


def test_unsafe_conditions_skip_their_table_only() -> None:
    actions = plan(message(execute(
        "inv.orders", "inv.products", **{"additional-conditions": [
            {"data-collection": "inv.orders", "filter": "1=1) OR (SELECT SLEEP(5)"}]})))
    assert [a.table_id for a in actions if isinstance(a, StartSnapshot)] == ["inv.products"]
    [reason] = reasons(actions)
    assert "additional condition for inv.orders refused" in reason


def test_a_condition_for_a_table_outside_the_signal_skips_the_whole_signal() -> None:
    actions = plan(message(execute("inv.orders", **{"additional-conditions": [
        {"data-collection": "inv.ordrs", "filter": "id > 1"}]})))
    assert not [a for a in actions if isinstance(a, StartSnapshot)]
    assert "names no table of this signal" in reasons(actions)[0]


def test_a_duplicate_signal_does_not_start_a_parallel_snapshot() -> None:
    busy = {"inv.orders": "run 1234abcd, started"}
    actions = plan(message(execute("inv.orders", "inv.products"), 1),
                   message(execute("inv.products"), 2), busy=busy)
    assert [a.table_id for a in actions if isinstance(a, StartSnapshot)] == ["inv.products"]
    assert "already being snapshotted (run 1234abcd, started)" in reasons(actions)[0]
    assert "in this batch (a duplicate signal)" in reasons(actions)[1]


def test_a_stop_cancels_a_snapshot_of_the_same_batch_and_frees_the_table() -> None:
    stop = {"type": "stop-snapshot", "data": {"data-collections": ["inv.orders"]}}
    actions = plan(message(execute("inv.orders"), 1), message(stop, 2),
                   message(execute("inv.orders"), 3))
    assert isinstance(actions[0], Skipped) and "cancelled by signal" in actions[0].reason
    assert isinstance(actions[1], ControlSnapshots) and actions[1].tables == ("inv.orders",)
    assert isinstance(actions[2], StartSnapshot) and actions[2].signal.offset == 3
    # A running snapshot: stopped, then started over by the next signal.
    stopped, started = plan(message(stop, 4), message(execute("inv.orders"), 5),
                            busy={"inv.orders": "run x"})
    assert isinstance(stopped, ControlSnapshots) and isinstance(started, StartSnapshot)


def test_control_signals_without_tables_mean_all_and_log_signals_are_logged() -> None:
    pause, log = plan(message({"type": "pause-snapshot"}, 1),
                      message({"type": "log", "data": {"message": "hello"}}, 2))
    assert isinstance(pause, ControlSnapshots) and pause.every and pause.action == "pause"
    assert isinstance(log, LogMessage) and log.signal.message == "hello"


def test_the_cli_format_round_trips_through_the_parser() -> None:
    value = signal_value("execute-snapshot", {"data-collections": ["inv.orders"]}, "my-id")
    parsed = parse_signal(SignalMessage(4, SERVER.encode(), value), SERVER, TOPIC)
    assert isinstance(parsed, Signal)
    assert (parsed.id, parsed.type, parsed.data_collections) == (
        "my-id", "execute-snapshot", ("inv.orders",))


def test_deeply_nested_json_is_skipped_and_the_batch_goes_on() -> None:
    deep = b"[" * 50_000 + b"]" * 50_000  # ~100 KB: json.loads raises RecursionError
    deep_in_data = b'{"type": "execute-snapshot", "data": {"data-collections": ' + \
        b"[" * 50_000 + b"]" * 50_000 + b"}}"
    skipped, skipped_too, started = plan(message(deep, 1), message(deep_in_data, 2),
                                         message(execute("inv.orders"), 3))
    for action, offset in ((skipped, 1), (skipped_too, 2)):
        assert isinstance(action, Skipped) and action.offset == offset
        assert "nested too deeply" in action.reason, action.reason
    assert isinstance(started, StartSnapshot) and started.table_id == "inv.orders"


def test_a_nested_value_where_a_string_belongs_is_named_by_its_type() -> None:
    nested = b'{"type": "execute-snapshot", "data": {"data-collections": ["inv.orders"], ' \
             b'"type": ' + b"[" * 300 + b"]" * 300 + b"}}"
    [action] = plan(message(nested))
    assert isinstance(action, Skipped)
    assert action.reason.startswith("snapshot type (a list) is not supported"), action.reason


@pytest.mark.parametrize(("entry", "expected"), [
    ("a{99999999999}", "OverflowError: the repetition number is too large"),
    ("(" * 5000 + ")" * 5000, "is 10,000 characters long: a table name or regular "
                              "expression may have at most 1,000"),
    ("(" * 400 + ")" * 400, "nor a valid regular expression (nested too deeply)"),
    # regex unrolls counted repeats: these would exhaust memory or crash the process
    ("(?:a{65535}){65535}", "too large once its counted repeats are unrolled"),
    ("(?:(a)|b){1000000}", "too large once its counted repeats are unrolled"),
    ("[" + "a-z" * 300 + "]{1000}", "too large once its counted repeats are unrolled"),
    # catastrophic backtracking: minutes in Python's re; regex sees there is no "!" at once
    ("(.*.*.*.*)*!", "'(.*.*.*.*)*!' matches no captured table"),
    # ... and here regex backtracks exponentially too, until its timeout
    (r"(.|\w|[a-z]|[^0-9])*\d", "took longer than 0.5 s to match the captured tables; "
                                "simplify it"),
    (r"\p{L}+", "bad escape \\p"),  # regex syntax that re does not know: re's syntax rules
])
def test_bad_regular_expressions_are_skipped_and_the_batch_goes_on(entry: str,
                                                                   expected: str) -> None:
    started_at = time.monotonic()
    actions = plan(message(execute(entry), 1), message(execute("inv.orders"), 2),
                   message(execute(r"sales\..*"), 3))
    assert time.monotonic() - started_at < 5
    skipped, *rest = actions
    assert isinstance(skipped, Skipped) and skipped.offset == 1
    assert expected in skipped.reason, skipped.reason
    assert [(a.table_id, a.signal.offset) for a in rest] == [("inv.orders", 2),
                                                               ("sales.orders", 3)]


def test_a_batch_of_slow_regular_expressions_is_held_to_its_time_budget() -> None:
    slow = r"(.|\w|[a-z]|[^0-9])*"
    budget = RegexBudget(per_expression=0.2, in_all=0.3)
    started_at = time.monotonic()
    tables, problems = match_collections([slow + r"\d", slow + "[0-9]", "inv.orders",
                                          slow + r"\d\d"], CAPTURED, budget=budget)
    assert time.monotonic() - started_at < 1.5
    assert tables == ["inv.orders"]  # a table named exactly needs no regular expression
    assert "took longer than 0.2 s" in problems[0]
    # The second gets what is left of the 0.3 s (if anything: a timeout fires a little late).
    assert "not finished: the signals of this tick took 0.3 s" in problems[1] or \
        "not tried: the signals of this tick already took 0.3 s" in problems[1]
    assert "not tried: the signals of this tick already took 0.3 s" in problems[2]


def test_regular_expressions_keep_pythons_re_syntax() -> None:
    assert match_collections([r"(?i)INV\.ORDERS", r"inv\.(?P<t>orders|products)",
                              r"(?!inv).*\.orders", r"inv\.[a-c]\w+"], CAPTURED) == (
        ["inv.customers", "inv.orders", "inv.products", "sales.orders"], [])


def test_an_unexpected_error_skips_its_message_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(text: str) -> str:
        if text == "boom":
            raise RuntimeError("validator bug")
        return text

    monkeypatch.setattr(plan_module, "Condition", broken)
    failed, started = plan(
        message({"id": "s1", **execute("inv.orders", **{"additional-condition": "boom"})}, 1),
        message(execute("inv.orders", **{"additional-condition": "id > 1"}), 2))
    assert isinstance(failed, Skipped) and (failed.offset, failed.signal_id) == (1, "s1")
    assert "planning it failed with RuntimeError: validator bug" in failed.reason
    assert isinstance(started, StartSnapshot) and started.condition == "id > 1"


_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
                     lambda inner: st.one_of(
                         st.lists(inner, max_size=4),
                         st.dictionaries(st.sampled_from(
                             ["type", "data", "id", "data-collections",
                              "additional-conditions", "filter", "data-collection",
                              "surrogate-key", "message"]), inner, max_size=5)),
                     max_leaves=12)
_REGEX_ENTRY = st.one_of(
    st.text(alphabet="()[]{}*+?.|\\^$,:<=!-0123456789adinovw", min_size=1, max_size=30),
    st.sampled_from(["a{99999999999}", "(?:(a)|b){1000000}", "(" * 400 + ")" * 400,
                     "(.*.*.*.*)*!", r"(.|\w|[a-z]|[^0-9])*\d", "inv.orders", r"inv\..*"]))


def _deep(depth: int, opening: bytes) -> bytes:
    closing = opening.translate(bytes.maketrans(b"[{", b"]}"))
    return opening * depth + closing * depth


@settings(max_examples=300, deadline=None)
@given(key=st.one_of(st.none(), st.binary(max_size=20), st.just(SERVER.encode())),
       value=st.one_of(
           st.binary(max_size=300),
           _JSON.map(lambda v: json.dumps(v).encode()),
           st.builds(_deep, st.integers(1, 100_000), st.sampled_from([b"[", b'{"a":['])),
           st.builds(lambda kind, entries, condition: json.dumps(
               {"type": kind, "data": {"data-collections": entries, "additional-conditions": [
                   {"data-collection": entries[0], "filter": condition}]}}).encode(),
               st.sampled_from(["execute-snapshot", "stop-snapshot", "pause-snapshot"]),
               st.lists(_REGEX_ENTRY, min_size=1, max_size=3),
               st.sampled_from(["id > 1", "(((", "1; DROP TABLE x"]))))
def test_no_message_content_crashes_the_planner(key: bytes | None, value: bytes) -> None:
    budget = RegexBudget(per_expression=0.05, in_all=0.2)
    actions = plan(SignalMessage(9, key, value), budget=budget)
    for action in actions:
        assert isinstance(action, StartSnapshot | ControlSnapshots | LogMessage | Skipped)
    # ... and none went through the last line of defence: every skip has its own reason.
    assert not any("planning it failed" in reason for reason in reasons(actions))


def test_a_table_the_run_would_refuse_is_skipped_and_only_tables_to_start_are_checked() -> None:
    asked: list[tuple[str, tuple[str, ...], Condition | None]] = []

    def check(table: str, surrogate_key: Any, condition: Condition | None) -> str | None:
        asked.append((table, tuple(surrogate_key), condition))
        return "surrogate-key column 'x' does not exist" if table == "inv.orders" else None

    actions = plan_signals(
        [message(execute("inv.orders", "inv.products", "inv.customers",
                         **{"surrogate-key": "x", "additional-conditions": [
                             {"data-collection": "inv.products", "filter": "id > 1"}]}))],
        server_name=SERVER, topic=TOPIC, captured=CAPTURED, selector=SELECTOR,
        busy={"inv.customers": "run 1"}, check=check)
    assert [a.table_id for a in actions if isinstance(a, StartSnapshot)] == ["inv.products"]
    assert any(r.startswith("inv.orders: the snapshot run would refuse it: surrogate-key "
                            "column 'x' does not exist") for r in reasons(actions))
    # (the busy table is refused for that, without asking the source)
    assert asked == [("inv.orders", ("x",), None), ("inv.products", ("x",), "id > 1")]
    assert isinstance(asked[1][2], Condition)  # what the check puts into SQL was checked


def test_tables_with_dots_in_their_names_are_named_plainly_or_quoted() -> None:
    """Debezium's plain `db.table` resolves against the captured tables; where a dot makes it
    name two tables, the entry is refused with how to quote it, and nothing else starts."""
    captured = ["`my.db`.orders", "shop.a.b", "`shop.a`.b", "shop.x"]
    assert match_collections(["my.db.orders"], captured) == (["`my.db`.orders"], [])
    assert match_collections(["`my.db`.`orders`"], captured) == (["`my.db`.orders"], [])
    assert match_collections(["shop.`a.b`", "`shop.a`.b"], captured) == (
        ["shop.a.b", "`shop.a`.b"], [])
    tables, [problem] = match_collections(["shop.a.b"], captured)
    assert tables == [] and "names 2 tables" in problem and "backticks" in problem
    assert match_collections([r"shop\.x"], captured) == (["shop.x"], [])
