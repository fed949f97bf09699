"""The file layer (capture.store.storage): URL resolution, and the operations the landing zone's
capture and lake sides go through, on the local store and on a pyarrow (object-store) one."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from cdc_platform.capture.landing.zone import Checkpoint, LandingReader, LandingZone
from cdc_platform.capture.store import open_store
from cdc_platform.capture.store.storage import ArrowFileStore, FileStore, LocalFileStore


def test_plain_relative_and_file_urls_resolve_to_the_same_local_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    expected = str(tmp_path / "lake")
    for url in (expected, "lake", "./lake/", f"file://{expected}", f"file://localhost{expected}"):
        store = open_store(url)
        assert store.local_root == Path(expected), url
        assert store.uri == f"file://{expected}"
        assert isinstance(store, LocalFileStore)
    child = open_store("lake").child("demo")
    assert child.arrow("checkpoint.json")[1] == f"{expected}/demo/checkpoint.json"
    assert child.uri_of("checkpoint.json") == f"file://{expected}/demo/checkpoint.json"


def test_home_is_expanded_and_hosts_are_refused():
    assert open_store("~/x").local_root == Path(os.path.expanduser("~/x"))
    with pytest.raises(ValueError, match="host"):
        open_store("file://otherhost/x")


def test_object_store_urls_keep_the_spark_scheme():
    store = open_store("mock://bucket/prefix/")
    assert isinstance(store.arrow()[0], pafs.FileSystem) and store.local_root is None
    assert store.uri == "mock://bucket/prefix"
    assert store.child("t").uri == "mock://bucket/prefix/t"


def test_metadata_io(tmp_path: Path):
    root = open_store(str(tmp_path))
    assert root.read_bytes("missing") is None
    assert root.list_names("missing") == []
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_text("B")
    (tmp_path / "d" / "a").write_text("A")
    assert root.list_names("d") == ["a", "b"]
    assert root.read_bytes("d", "a") == b"A"
    assert root.exists("d") and not root.exists("missing")


@pytest.mark.parametrize("part", ["..", ".", "/etc", "data/../../x", ""])
def test_join_refuses_parts_that_leave_the_directory(tmp_path: Path, part: str):
    """Source names reach paths only escaped (capture.names.path_component); a raw one that
    could climb out of the landing zone or warehouse is refused, never joined."""
    with pytest.raises(ValueError, match="path_component"):
        open_store(str(tmp_path)).child("server", part)
    with pytest.raises(ValueError, match="path_component"):
        open_store(str(tmp_path)).read_bytes("server", part)
    assert open_store(str(tmp_path)).arrow("data/1-base-x")[1] == f"{tmp_path}/data/1-base-x"


def _stores(tmp_path: Path) -> list[FileStore]:
    """A local store, and an object store as pyarrow reaches one (its in-memory mock)."""
    return [open_store(str(tmp_path / "local")), open_store("mock://bucket/landing")]


@pytest.mark.parametrize("kind", ["local", "object"])
def test_every_store_reads_writes_lists_and_deletes_alike(tmp_path: Path, kind: str):
    store = _stores(tmp_path)[kind == "object"]
    store.write_atomically("a", "one.json", data=b"1")
    store.write_atomically("a", "one.json", data=b"one")  # replaces
    store.write_atomically("a", "two.json", data=memoryview(b"2"), durable=False)
    assert store.read_bytes("a", "one.json") == b"one"
    assert store.list_names("a") == ["one.json", "two.json"]
    assert store.exists("a", "two.json")
    store.delete("a", "two.json")
    store.delete("a", "two.json")  # (absent: nothing)
    assert store.list_names("a") == ["one.json"] and not store.exists("a", "two.json")
    assert store.child("a").read_bytes("one.json") == b"one"


def test_local_writes_leave_no_temporary_file_and_exclusive_writes_win_once(tmp_path: Path):
    store = LocalFileStore(tmp_path)
    assert store.write_exclusively("x", "claim", data=b"first")
    assert not store.write_exclusively("x", "claim", data=b"second")
    assert store.read_bytes("x", "claim") == b"first"

    table = pa.table({"v": [1, 2, 3]})
    with store.atomic_output("x", "t.parquet") as sink:
        pq.write_table(table, sink)
    assert pq.read_table(tmp_path / "x" / "t.parquet").equals(table)
    with pytest.raises(RuntimeError), store.atomic_output("x", "broken.parquet") as sink:
        sink.write(b"PAR1")
        raise RuntimeError("writer failed half-way")
    assert store.list_names("x") == ["claim", "t.parquet"]  # no partial file, no temporary


def test_of_racing_exclusive_writers_exactly_one_wins(tmp_path: Path):
    store = LocalFileStore(tmp_path)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        store.write_exclusively("lock", data=str(i).encode()))) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 7 + [True]
    assert store.list_names() == ["lock"]


def test_an_object_store_refuses_exclusive_writes_until_it_has_conditional_puts():
    with pytest.raises(NotImplementedError, match="If-None-Match"):
        open_store("mock://bucket/x").write_exclusively("claim", data=b"1")


def test_the_engine_and_a_reader_of_any_store_read_one_checkpoint(tmp_path: Path):
    """The engine writes the checkpoint through its local store; the lake reads it through
    ``LandingReader`` (from any store), parsed by the one ``Checkpoint``."""
    landing = LandingZone(str(tmp_path), "demo")
    assert landing.read_checkpoint() is None
    written = Checkpoint("demo", "mariadb", gtid="0-1-5", next_pos=6, extra={"x": 1})
    landing.write_checkpoint(written)
    assert LandingReader.open(f"file://{tmp_path}", "demo").read_checkpoint() == written

    objects = ArrowFileStore(pafs._MockFileSystem(), "bucket", "mock://bucket")
    objects.write_atomically("demo", "checkpoint.json", data=written.to_json())
    assert LandingReader(objects, "demo").read_checkpoint() == written
    with pytest.raises(ValueError, match="only local paths"):
        LandingZone("mock://bucket", "demo")

    objects.write_atomically("demo", "checkpoint.json", data=b'{"next_pos": 3}')
    with pytest.raises(ValueError, match=r"checkpoint mock://bucket/demo/checkpoint.json is not "
                                         r"valid .*server_name"):
        LandingReader(objects, "demo").read_checkpoint()
    objects.write_atomically("demo", "checkpoint.json", data=b"{not json")
    with pytest.raises(json.JSONDecodeError, match="checkpoint .* is not valid"):
        LandingReader(objects, "demo").read_checkpoint()
