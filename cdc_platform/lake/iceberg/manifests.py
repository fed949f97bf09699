"""The manifest and manifest-list writers of the lake's commits without Spark
(``iceberg.row_delta``): pyiceberg's, with their Avro schemas, header and record writer made
once per kind instead of once per file.

pyiceberg builds a manifest's Avro schema from the partition type and converts it to Avro for
every file it writes: two thirds of the time a merge of a few records spent writing its two
manifests and its manifest list (5.8 ms of 20). Every lake table is unpartitioned, so the
schemas are the same for every manifest of a kind: they are made on first use and kept (by
format version and partition type). The files are byte for byte what pyiceberg writes
(a random sync marker each).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from pyiceberg.avro.file import (
    _SCHEMA_KEY,
    AVRO_CODEC_KEY,
    CODEC_MAPPING_ICEBERG_TO_AVRO,
    MAGIC,
    META_SCHEMA,
    SYNC_SIZE,
    AvroFileHeader,
    AvroOutputFile,
)
from pyiceberg.avro.resolver import construct_writer, resolve_writer
from pyiceberg.io import OutputFile
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    ManifestContent,
    ManifestListWriterV2,
    ManifestWriterV2,
)
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

_lock = threading.Lock()
_made: dict[tuple[Any, ...], Any] = {}


def _once(key: tuple[Any, ...], make: Any) -> Any:
    """``make()`` the first time ``key`` is asked for, then what it made (thread-safe: two
    threads may both make it the first time; either result is the same)."""
    found = _made.get(key)
    if found is None:
        found = make()
        with _lock:
            _made.setdefault(key, found)
    return found


class _AvroFile(AvroOutputFile[Any]):
    """pyiceberg's Avro writer with its record writer and the header's schema JSON made once
    per (file schema, record schema, name)."""

    def __init__(self, output_file: OutputFile, file_schema: Schema, schema_name: str,
                 record_schema: Schema, metadata: dict[str, str]) -> None:
        key = (id(file_schema), id(record_schema), schema_name)
        self.output_file = output_file
        self.file_schema = file_schema
        self.schema_name = schema_name
        self.sync_bytes = os.urandom(SYNC_SIZE)
        self.writer = _once(("writer", *key), lambda: resolve_writer(
            record_schema=record_schema, file_schema=file_schema))
        self.metadata = metadata
        self._schema_json = _once(("json", *key), lambda: json.dumps(
            AvroSchemaConversion().iceberg_to_avro(file_schema, schema_name=schema_name)))

    def _write_header(self) -> None:
        codec_name = self.metadata.get(AVRO_CODEC_KEY,
                                       TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT)
        codec_name = CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec_name, codec_name)
        meta = {**self.metadata, _SCHEMA_KEY: self._schema_json, AVRO_CODEC_KEY: codec_name}
        header = AvroFileHeader(MAGIC, meta, self.sync_bytes)
        _once(("meta-writer",), lambda: construct_writer(META_SCHEMA)).write(self.encoder,
                                                                            header)


class DataManifestWriter(ManifestWriterV2):
    """A v2 data manifest (``write_manifest``'s), its schemas made once."""

    def _with_partition(self, format_version: Any) -> Schema:
        partition_type = self._spec.partition_type(self._schema)
        return _once(("manifest-schema", format_version, str(partition_type)),
                     lambda: super(DataManifestWriter, self)._with_partition(format_version))

    def new_writer(self) -> AvroOutputFile[Any]:
        return _AvroFile(self._output_file, self._with_partition(self.version),
                         "manifest_entry", self._with_partition(DEFAULT_READ_VERSION),
                         self._meta)


class DeleteManifestWriter(DataManifestWriter):
    """A v2 delete manifest: pyiceberg writes data manifests only."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class ManifestListWriter(ManifestListWriterV2):
    """A v2 manifest list (``write_manifest_list``'s), its writer made once."""

    def __enter__(self) -> ManifestListWriter:
        self._writer = _AvroFile(self._output_file,
                                 MANIFEST_LIST_FILE_SCHEMAS[self._format_version],
                                 "manifest_file", MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION],
                                 self._meta)
        self._writer.__enter__()
        return self
