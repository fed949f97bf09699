"""URL resolution and the exclusive create that commits rely on (no Spark needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from cdc_platform.lake.paths import resolve


def test_plain_relative_and_file_urls_resolve_to_the_same_local_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    expected = str(tmp_path / "lake")
    for url in (expected, "lake", "./lake/", f"file://{expected}", f"file://localhost{expected}"):
        location = resolve(url)
        assert location.path == expected, url
        assert location.spark_uri == f"file://{expected}"
        assert location.is_local
    child = resolve("lake").join("demo", "checkpoint.json")
    assert child.path == f"{expected}/demo/checkpoint.json"
    assert child.spark_uri == f"file://{expected}/demo/checkpoint.json"


def test_home_is_expanded_and_hosts_are_refused():
    assert resolve("~/x").path == os.path.expanduser("~/x")
    with pytest.raises(ValueError, match="host"):
        resolve("file://otherhost/x")


def test_object_store_urls_keep_the_spark_scheme():
    location = resolve("mock://bucket/prefix/")
    assert isinstance(location.fs, pafs.FileSystem) and not location.is_local
    assert location.spark_uri == "mock://bucket/prefix"
    assert location.join("t").spark_uri == "mock://bucket/prefix/t"


def test_metadata_io(tmp_path: Path):
    root = resolve(str(tmp_path))
    assert root.join("missing").read_bytes() is None
    assert root.join("missing").list_names() == []
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_text("B")
    (tmp_path / "d" / "a").write_text("A")
    assert root.join("d").list_names() == ["a", "b"]
    assert root.join("d", "a").read_bytes() == b"A"
    assert root.join("d").exists() and not root.join("missing").exists()


@pytest.mark.parametrize("part", ["..", ".", "/etc", "data/../../x", ""])
def test_join_refuses_parts_that_leave_the_directory(tmp_path: Path, part: str):
    """Source names reach paths only escaped (capture.names.path_component); a raw one that
    could climb out of the landing zone or warehouse is refused, never joined."""
    with pytest.raises(ValueError, match="path_component"):
        resolve(str(tmp_path)).join("server", part)
    assert resolve(str(tmp_path)).join("data/1-base-x").path == f"{tmp_path}/data/1-base-x"
