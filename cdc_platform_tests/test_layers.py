"""The package's import layers, and the landing-zone contract as one definition below
everything that uses it.

Read from the sources (no import needed): capture imports nothing of the layers above it
(lake, defs, Dagster, Spark), the contract's modules import (almost) nothing of the project,
module-level imports form no cycle, the snapshot's reader side and engine side reach each
other only through the modules both import, and no module outside the contract spells a
changelog column name of its own.
"""

from __future__ import annotations

import ast
import re
from graphlib import TopologicalSorter
from pathlib import Path

import pyarrow as pa

from cdc_platform.capture.landing import records as contract
from cdc_platform.capture.schema import ColumnSpec, TableSchema

PACKAGE = Path(__file__).resolve().parents[1] / "cdc_platform"

# Layer -> imports it must never make (anywhere in a module, function bodies included).
FORBIDDEN = {
    "capture": ("cdc_platform.lake", "cdc_platform.defs", "cdc_platform.definitions",
                "dagster", "pyspark"),
    "lake": ("cdc_platform.defs", "cdc_platform.definitions", "dagster"),
    # the change-topic publisher: beside the lake, reading the landing zone as it does
    "topics": ("cdc_platform.lake", "cdc_platform.defs", "cdc_platform.definitions",
               "dagster", "pyspark"),
    # the ground floor: the settings schema, and the private services of the demo and tests
    "config": ("cdc_platform.capture", "cdc_platform.lake", "cdc_platform.defs",
               "cdc_platform.definitions", "cdc_platform.demo", "cdc_platform.devservices"),
    "metrics": ("cdc_platform.config", "cdc_platform.capture", "cdc_platform.lake",
                "cdc_platform.defs", "cdc_platform.definitions", "cdc_platform.demo",
                "cdc_platform.devservices"),
    "devservices": ("cdc_platform.capture", "cdc_platform.lake", "cdc_platform.defs",
                    "cdc_platform.definitions", "cdc_platform.demo"),
}
# The contract's modules, and the project modules each may import at run time.
CONTRACT = {
    # (the segment schema and its metadata are built from a TableSchema; names parses the
    # table ids of older segments)
    "cdc_platform.capture.landing.records": {"cdc_platform.capture.schema",
                                             "cdc_platform.capture.names"},
    "cdc_platform.capture.store.storage": set(),
    "cdc_platform.capture.keys": {"cdc_platform.capture.schema"},
}
# Files not yet moved onto the contract (listed for their owners; shrink, never grow).
COLUMN_LITERALS_ALLOWED = {"capture/landing/records.py"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(module: str, path: Path, top_level_only: bool) -> set[str]:
    """Imported module names; ``top_level_only``: those run at import time (not in function
    bodies, not under ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    is_package = path.name == "__init__.py"

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, node, is_package)
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                if not top_level_only:
                    visit(node.body)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not top_level_only:
                    visit([n for n in ast.walk(node)
                           if isinstance(n, (ast.Import, ast.ImportFrom))])
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
                visit([child for child in ast.iter_child_nodes(node)
                       if isinstance(child, ast.stmt)])

    visit(tree.body)
    return found


def test_no_import_points_up_a_layer() -> None:
    offending = []
    for module, path in _modules().items():
        layer = module.split(".")[1] if module.count(".") else ""
        for imported in _imports(module, path, top_level_only=False):
            if any(imported == f or imported.startswith(f + ".")
                   for f in FORBIDDEN.get(layer, ())):
                offending.append(f"{module} imports {imported}")
    assert offending == []


# capture/'s floors, bottom up: the route binlog -> changes -> landing, then what builds on
# it. A module imports only modules of its own floor or of floors below it.
CAPTURE_FLOORS = (
    # landing.records on the bottom floor, below landing/'s other modules: it is the contract
    # every floor writes or reads (changes/ spells the ops), and it imports only schema and
    # names (landing/__init__.py imports nothing, so importing it never loads the zone).
    {"schema", "names", "charsets", "landing.records", "keys", "values", "events", "gtid",
     "store"},
    {"flavours", "source"},
    {"binlog"},
    {"changes"},
    {"landing"},
    {"snapshot"},
    {"ddl"},
    {"signals"},
    {"engine", "engine_options", "standing", "metrics"},
    {"start_errors"},
)


def _capture_floor(module: str) -> int | None:
    """The floor of a capture module: that of the longest entry naming it or a package above
    it (``landing.records`` before ``landing``; most entries are a sub-package, or a module at
    the top)."""
    parts = module.split(".")
    if parts[:2] != ["cdc_platform", "capture"] or len(parts) < 3:
        return None
    relative = ".".join(parts[2:])
    placed = [(len(entry), i) for i, floor in enumerate(CAPTURE_FLOORS) for entry in floor
              if relative == entry or relative.startswith(entry + ".")]
    return max(placed)[1] if placed else None


def test_capture_floors_import_only_downwards() -> None:
    """binlog/ never imports changes/ or landing/, changes/ never landing/, and so on: the
    folders show the route, and no floor reaches into one above it (every module is placed)."""
    modules = _modules()
    unplaced, upward = [], []
    for module, path in modules.items():
        if module.count(".") < 2 or not module.startswith("cdc_platform.capture."):
            continue
        floor = _capture_floor(module)
        if floor is None:
            unplaced.append(module)
            continue
        for imported in _imports(module, path, top_level_only=False):
            other = _capture_floor(imported)
            if other is not None and other > floor:
                upward.append(f"{module} imports {imported}")
    assert unplaced == [] and upward == []


# capture/snapshot/ runs in two processes that talk only through the landing zone: the reader
# side (reading/, in the snapshot asset's run) and the engine side (in the stream_changes run).
# What both import (protocol, chunks, commit_rule, conditions, ...) stays in snapshot/ itself,
# and so do watermark and native, which the lake's reconcile reads the source with too.
SNAPSHOT = "cdc_platform.capture.snapshot"
SNAPSHOT_READER_SIDE = f"{SNAPSHOT}.reading"
SNAPSHOT_ENGINE_SIDE = {f"{SNAPSHOT}.sessions", f"{SNAPSHOT}.chunk_decisions"}
# The chunk words both sides share run no SQL: reading a chunk is the reader side's (keyset).
SNAPSHOT_CHUNK_WORDS = f"{SNAPSHOT}.chunks"
SERVER_READS = ("pymysql", "MySQLdb", f"{SNAPSHOT}.native", f"{SNAPSHOT}.watermark")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_snapshot_reader_and_engine_sides_import_only_what_they_share() -> None:
    """No capture module outside reading/ imports the reader side (the engine side, the
    shared modules, the engine itself), and no module of snapshot/ but the engine side's
    imports the engine side (the reader side, the shared modules): function bodies included."""
    modules = _modules()
    reader_side = {m for m in modules if _within(m, SNAPSHOT_READER_SIDE)}
    assert {f"{SNAPSHOT_READER_SIDE}.reader", f"{SNAPSHOT_READER_SIDE}.keyset"} <= reader_side
    assert SNAPSHOT_ENGINE_SIDE.issubset(modules)
    crossing = []
    for module, path in modules.items():
        if not _within(module, "cdc_platform.capture"):
            continue
        for imported in _imports(module, path, top_level_only=False):
            if _within(imported, SNAPSHOT_READER_SIDE) and module not in reader_side:
                crossing.append(f"{module} imports the reader side's {imported}")
            engine_side = any(_within(imported, m) for m in SNAPSHOT_ENGINE_SIDE)
            if (engine_side and _within(module, SNAPSHOT)
                    and not any(_within(module, m) for m in SNAPSHOT_ENGINE_SIDE)):
                crossing.append(f"{module} imports the engine side's {imported}")
    assert crossing == []


def test_the_shared_chunk_words_read_nothing_from_a_server() -> None:
    """chunks.py is what the engine side and the reader side both speak (ChunkKey,
    ChunkedTable, Chunk, the fingerprint): the SELECTs it builds are run by reading/keyset.py,
    so importing it brings no driver and no watermark along, function bodies included."""
    modules = _modules()
    imported = _imports(SNAPSHOT_CHUNK_WORDS, modules[SNAPSHOT_CHUNK_WORDS],
                        top_level_only=False)
    assert [i for i in imported if any(_within(i, m) for m in SERVER_READS)] == []


def test_the_contract_modules_stand_on_their_own() -> None:
    modules = _modules()
    for module, allowed in CONTRACT.items():
        project = {i for i in _imports(module, modules[module], top_level_only=True)
                   if i.startswith("cdc_platform") and i in modules}
        assert project <= allowed, module


def test_module_level_imports_form_no_cycle() -> None:
    modules = _modules()
    graph = {m: {i for i in _imports(m, p, top_level_only=True) if i in modules and i != m}
             for m, p in modules.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles: list[list[str]] = []

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for imported in sorted(graph[module]):
            # (a package's __init__ importing its own submodule is how packages load)
            if imported.startswith(module + "."):
                continue
            if state.get(imported) == 1:
                cycles.append([*path[path.index(imported):], imported])
            elif imported not in state:
                walk(imported, [*path, imported])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    assert cycles == []


def test_lake_iceberg_imports_form_no_cycle_counting_type_hints() -> None:
    """A ``LakeTable`` is called by commit, schema and maintenance, never calls them back."""
    package = {m: p for m, p in _modules().items() if _within(m, "cdc_platform.lake.iceberg")}
    graph = {m: {i for i in _imports(m, p, top_level_only=False) if i in package
                 and i != m and not i.startswith(m + ".")} for m, p in package.items()}
    TopologicalSorter(graph).prepare()  # (CycleError names the circle)


def test_changelog_column_names_are_spelled_only_in_the_contract() -> None:
    spelled = re.compile(r"""["'](__cdc_(?:pos|gtid|op|ts_ms|threshold|lo_open|hi_open|hi__))""")
    offending = []
    for path in PACKAGE.rglob("*.py"):
        relative = str(path.relative_to(PACKAGE))
        if relative not in COLUMN_LITERALS_ALLOWED and spelled.search(path.read_text()):
            offending.append(relative)
    assert offending == []


def test_segments_begin_with_the_contract_columns_and_snapshot_fields_follow_the_key() -> None:
    schema = TableSchema("shop", "t", (ColumnSpec("id", "int"), ColumnSpec("d", "date"),
                                       ColumnSpec("v", "string")), ("id", "d"))
    arrow = contract.segment_schema(schema)
    assert arrow.names == [contract.POS, contract.GTID, contract.OP, contract.TS_MS, "id", "d",
                           "v"]
    assert tuple(arrow)[:4] == contract.CHANGELOG_META_FIELDS
    assert not arrow.field(contract.POS).nullable
    assert set(contract.DICTIONARY_COLUMNS) < set(arrow.names)
    fields = contract.snapshot_arrow_fields(schema)
    assert [(f.name, f.type) for f in fields] == [
        ("__cdc_threshold", pa.int64()), ("__cdc_lo_open", pa.bool_()),
        ("__cdc_hi_open", pa.bool_()), ("__cdc_hi__id", pa.int64()),
        ("__cdc_hi__d", pa.date32())]
    assert contract.snapshot_field(schema, contract.hi_column("d")).type == pa.date32()
    assert set(contract.ROW_OPS) & set(contract.INSTRUCTION_OPS) == set()
