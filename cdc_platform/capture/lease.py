"""A lease: at most one holder of a name at a time, on any store with conditional writes.

The engine's single-writer lock on object storage, where no process can hold a file lock: the
lease is one small JSON object ``{holder, token, expires_at}`` at a path of a ``FileStore``, and
every change to it is a conditional write, so the store's server decides every race:

* **acquire**: create the object only if absent (``write_exclusively``, S3 ``If-None-Match``);
  if it exists and has expired (or was released), replace it only if it is still the version
  read (``write_if_match``, S3 ``If-Match`` on its ETag). Of N acquirers racing for a free or
  expired lease exactly one wins; while a lease is live every other holder is refused.
* **renew**: the holder replaces its own version with a later ``expires_at``; it fails (the
  lease is lost) if anyone replaced the object since, and a holder that lost it must stop
  writing.
* **release**: the holder marks its own version expired (again ``If-Match``), so the next
  acquirer takes it over at once; a release after losing the lease changes nothing.

Expiry is by wall clock (``expires_at``, seconds since the epoch), compared by whoever reads
the lease: choose ``ttl_seconds`` well above the clocks' skew plus the renewal interval. The
holder itself trusts its lease only until its own monotonic deadline (``held``), which is never
later than what the others see, so a paused holder stops believing before others take over.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from cdc_platform.capture.storage import FileStore

__all__ = ["Lease", "LeaseRecord"]

_ACQUIRE_ROUNDS = 10  # a lease released and re-created between our read and write: read again


@dataclass(frozen=True)
class LeaseRecord:
    """The lease object's content."""

    holder: str
    token: str
    expires_at: float

    def to_json(self) -> bytes:
        return json.dumps({"holder": self.holder, "token": self.token,
                           "expires_at": self.expires_at}, sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes) -> LeaseRecord:
        """The record, or an expired anonymous one for an unreadable object (so that a torn
        or foreign object never blocks the lease forever: it is replaced like an expired one)."""
        try:
            raw = json.loads(data)
            return cls(str(raw["holder"]), str(raw["token"]), float(raw["expires_at"]))
        except (ValueError, KeyError, TypeError):
            return cls("", "", 0.0)


class Lease:
    """The lease at ``parts`` of ``store``; one object per would-be holder (not thread-safe)."""

    def __init__(self, store: FileStore, *parts: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.parts = parts
        self._clock = clock
        self._record: LeaseRecord | None = None
        self._etag: str | None = None
        self._ttl = 0.0
        self._deadline = 0.0  # time.monotonic() until which this holder trusts the lease

    def __repr__(self) -> str:
        return f"Lease({self.store.uri_of(*self.parts)!r}, holder={self.holder!r})"

    @property
    def holder(self) -> str | None:
        """Who this object holds the lease as, or None when it does not hold it."""
        return self._record.holder if self._record is not None else None

    @property
    def held(self) -> bool:
        """Whether this object holds the lease and its own clock says it has not expired."""
        return self._record is not None and time.monotonic() < self._deadline

    def current(self) -> LeaseRecord | None:
        """The lease object as stored (any holder), or None when there is none."""
        versioned = self.store.read_versioned(*self.parts)
        return None if versioned is None else LeaseRecord.parse(versioned[0])

    def acquire(self, holder: str, ttl_seconds: float) -> bool:
        """Take the lease for ``ttl_seconds`` if it is free, released or expired; False while
        another holder's (or another ``Lease`` object's) lease is live. Holding it already:
        a renewal."""
        if ttl_seconds <= 0:
            raise ValueError(f"lease ttl_seconds must be positive, not {ttl_seconds}")
        if self._record is not None and self._record.holder == holder:
            self._ttl = ttl_seconds
            if self.renew():
                return True
        self._forget()
        for _ in range(_ACQUIRE_ROUNDS):
            started = time.monotonic()
            record = self._new_record(holder, ttl_seconds)
            written = self.store.write_versioned(*self.parts, data=record.to_json(), etag=None)
            if written is not None:
                return self._took(record, written, ttl_seconds, started=started)
            versioned = self.store.read_versioned(*self.parts)
            if versioned is None:
                continue  # deleted in between: try to create it again
            data, etag = versioned
            if LeaseRecord.parse(data).expires_at > self._clock():
                return False
            started = time.monotonic()
            record = self._new_record(holder, ttl_seconds)
            written = self.store.write_versioned(*self.parts, data=record.to_json(), etag=etag)
            if written is not None:
                return self._took(record, written, ttl_seconds, started=started)
        return False

    def renew(self, ttl_seconds: float | None = None) -> bool:
        """Extend the lease (by ``ttl_seconds``, else the acquired ttl) if this object still
        holds it; False, and no longer held, if anyone replaced it since."""
        if self._record is None or self._etag is None:
            return False
        ttl = self._ttl if ttl_seconds is None else ttl_seconds
        started = time.monotonic()
        record = self._new_record(self._record.holder, ttl, token=self._record.token)
        written = self.store.write_versioned(*self.parts, data=record.to_json(),
                                             etag=self._etag)
        if written is None:
            self._forget()
            return False
        return self._took(record, written, ttl, started=started)

    def release(self) -> None:
        """Give the lease up (marked expired, so the next acquirer takes it at once); nothing
        when this object does not hold it any more."""
        if self._record is None or self._etag is None:
            return
        record = LeaseRecord(self._record.holder, self._record.token, 0.0)
        self.store.write_if_match(*self.parts, data=record.to_json(), etag=self._etag)
        self._forget()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ---- internals -------------------------------------------------------------------------

    def _new_record(self, holder: str, ttl: float, token: str | None = None) -> LeaseRecord:
        return LeaseRecord(holder, token or uuid.uuid4().hex, self._clock() + ttl)

    def _took(self, record: LeaseRecord, etag: str, ttl: float, *, started: float) -> bool:
        """Remember the version just written (the conditional write's own: a later holder's
        write changes it, and this object's next swap fails)."""
        self._record, self._etag, self._ttl = record, etag, ttl
        self._deadline = started + ttl
        return True

    def _forget(self) -> None:
        self._record = self._etag = None
        self._deadline = 0.0
