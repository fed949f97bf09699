"""What a reader of one table's changelog has still to read past its mark, and how old the
oldest of it is: the one rule of pending segments (``unmerged_segments``), read by the lake's
applier, its freshness verdict and target-lag metric, and by the change-topic publisher's lag
and the change topics' ``published`` check; and the commit time of the oldest pending record
from segment footers alone (``oldest_pending_seconds``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_platform.capture.landing.records import TS_MS
from cdc_platform.capture.landing.zone import LandingReader, Survey, changelog_parts


def unmerged_segments(names: Iterable[tuple[int, int, str]], consumed_pos: int | None,
                      next_pos: int) -> Iterator[tuple[int, int, str]]:
    """The segments (``(first, last, name)``, in the listing's order) that may hold records of
    a table past its target's consumed mark and before the checkpoint's ``next_pos``: the one
    rule of what a target has still to merge (the applier's ``pending``, this verdict's
    ``oldest_pending_seconds`` and the applier's target-lag metric read it)."""
    return ((first, last, name) for first, last, name in names
            if (consumed_pos is None or last > consumed_pos) and first < next_pos)


def oldest_pending_seconds(landing: LandingReader, database: str, table: str,
                           consumed_pos: int | None, next_pos: int,
                           names: list[tuple[int, int, str]] | None = None) -> float | None:
    """Source commit time (seconds) of the oldest landed record of the table past its target's
    consumed mark and before the checkpoint's ``next_pos``; None when there is none.

    Read from the first such segment's footer statistics (``__cdc_ts_ms``), so no data is
    read; a segment without statistics counts from its file's modification time. ``names``:
    the table's segments as a survey listed them (``LandingReader.survey``), else listed now.
    """
    if names is None:
        names = landing.segment_names(database, table)
    for _first, _last, name in unmerged_segments(names, consumed_pos, next_pos):
        filesystem, path = landing.store.arrow(*changelog_parts(database, table), name)
        try:
            metadata = pq.ParquetFile(filesystem.open_input_file(path)).metadata
        except (OSError, pa.ArrowInvalid):
            continue  # deleted by retention since the listing, or being written
        oldest = _min_statistic(metadata, TS_MS)
        if oldest is not None:
            return oldest / 1000
        info = filesystem.get_file_info(path)
        if info.mtime is not None:
            return info.mtime.timestamp()
    return None


def _min_statistic(metadata: pq.FileMetaData, column: str) -> int | None:
    names = metadata.schema.names
    if column not in names:
        return None
    index = names.index(column)
    lowest = None
    for group in range(metadata.num_row_groups):
        statistics = metadata.row_group(group).column(index).statistics
        if statistics is None or not statistics.has_min_max:
            return None
        lowest = statistics.min if lowest is None else min(lowest, statistics.min)
    return lowest


#: Segment footers read at once when many tables are judged (a request each on object storage).
FOOTER_READERS = 8


def oldest_pending_by_table(landing: LandingReader, survey: Survey,
                            marks: Mapping[tuple[str, str], int | None]
                            ) -> dict[tuple[str, str], float | None]:
    """``oldest_pending_seconds`` of each ``(database, table)`` past its mark in ``marks``,
    from one survey, the footers read ``FOOTER_READERS`` at a time (a thousand tables judged
    one footer after another took longer than a sensor tick on object storage)."""
    checkpoint = survey.checkpoint
    if checkpoint is None:
        return dict.fromkeys(marks)

    def oldest(item: tuple[tuple[str, str], int | None]) -> float | None:
        (database, table), mark = item
        return oldest_pending_seconds(landing, database, table, mark, checkpoint.next_pos,
                                      names=survey.segment_names(database, table))

    with ThreadPoolExecutor(max_workers=FOOTER_READERS) as pool:
        return dict(zip(marks, pool.map(oldest, marks.items()), strict=True))
