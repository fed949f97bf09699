"""The state of one run of a snapshot reader (``reader``): the session's ranges still to read,
its chunks written and not yet decided, its counters, and the thread its chunk files are
written in. A reader makes one per run; it is apart so the reader's methods share one
record of the run instead of many attributes, and so what ``reader.state`` keeps of a run
is written in one place (``ReadRun.record``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdc_platform.capture.snapshot.chunks import Chunk
from cdc_platform.capture.snapshot.protocol import ChunkManifest
from cdc_platform.capture.snapshot.reading.progress import (
    KeyRange,
    ReaderState,
    SnapshotProgress,
    WrittenChunk,
    encode_range,
)


@dataclass
class ReadRun:
    """One run of a reader: its session's ranges still to read, its chunks written and not
    yet decided, its counters, and the writer thread its chunk files are written in.

    Made by ``SnapshotReader.run`` for each run; ``record`` is what ``reader.state`` keeps of
    it, from which a later reader resumes the session if this one dies."""

    stop_event: threading.Event
    on_progress: Callable[[SnapshotProgress], None] | None
    started: float
    base_session_id: str
    writer: concurrent.futures.ThreadPoolExecutor
    todo: collections.deque[KeyRange] = field(default_factory=collections.deque)
    pending: dict[int, WrittenChunk] = field(default_factory=dict)
    held: tuple[Chunk, KeyRange] | None = None
    next_seq: int = 0
    rows: int = 0
    chunks: int = 0
    rejected: int = 0
    reselected: int = 0
    start_gtid: str = ""
    end_gtid: str = ""
    last_key: list[Any] | None = None
    maximum_key: list[str] | None = None
    final_seq: int | None = None
    state: ReaderState = ReaderState.WAITING
    engine_rows: int | None = None
    restarts: int = 0
    restart_requested: bool = False
    writes: collections.deque[concurrent.futures.Future[ChunkManifest]] = field(
        default_factory=collections.deque)

    def record(self) -> dict[str, Any]:
        """``reader.state``: the ranges still to read and the chunks written (see
        ``SnapshotReader._resume_session``)."""
        return {
            "todo": [encode_range(x) for x in self.todo],
            "pending": {str(w.seq): {"range": encode_range(w.range), "rows": w.rows,
                                     "complete": w.complete, "after_gtid": w.after_gtid}
                        for w in self.pending.values()},
            "held": None if self.held is None else encode_range(self.held[1]),
            "next_seq": self.next_seq, "rows": self.rows, "chunks": self.chunks,
            "rejected": self.rejected, "start_gtid": self.start_gtid,
            "end_gtid": self.end_gtid,
        }
