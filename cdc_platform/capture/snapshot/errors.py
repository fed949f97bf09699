"""What ends a snapshot: errors whose message names the table, session or chunk and the fix."""

from __future__ import annotations


class SnapshotError(RuntimeError):
    """The snapshot cannot go on; the message names the table, session or chunk and what to do."""


class NoEngineError(SnapshotError):
    """No capture engine acknowledged or decided the session: the stream is not running."""


class EngineStalledError(NoEngineError):
    """The engine acknowledged the session, then stopped deciding its chunks (it went down):
    a later run adopts the session and goes on where this one stopped."""
