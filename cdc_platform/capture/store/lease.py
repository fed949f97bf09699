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

Every write of the lease object is made ``within`` the expiry of the lease it writes (the
store's retries of an unreachable server give up before it, ``ObjectStoreUnavailableError``):
a renewal that could only land after the lease expired is worthless, and a renewer blocked
past the expiry would hold nothing while it waits. A retried write whose first attempt landed
is recognised by its content (the record's token makes it unique), never taken for a loss.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from cdc_platform.capture.store.storage import FileStore, StoreUnavailableError

__all__ = ["Lease", "LeaseRecord"]

_ACQUIRE_ROUNDS = 10  # a lease released and re-created between our read and write: read again
# While waiting for a live lease to expire: how often it is read again (a renewal seen ends the
# wait), as a share of the acquirer's ttl (the holder's renewals come every third of it), and
# the bounds of that interval in seconds.
_WATCH_SHARE, _WATCH_MIN_SECONDS, _WATCH_MAX_SECONDS = 1 / 6, 0.1, 5.0

log = logging.getLogger(__name__)


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


def process_holder() -> str:
    """This process as a lease holder: ``<host> pid <pid> ns <pid namespace>``, so that a
    later process of the same host and namespace can tell whether it still runs
    (``holder_gone``)."""
    return f"{socket.gethostname()} pid {os.getpid()} ns {_pid_namespace()}"


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


_PROCESS_HOLDER = re.compile(r"^(?P<host>.+) pid (?P<pid>\d+) ns (?P<ns>\S+)$")


def holder_gone(record: LeaseRecord) -> bool:
    """Whether the lease's holder is a process of this host and pid namespace that no longer
    exists: killed without releasing it (kill -9, OOM). Its lease is free at once rather than
    at its expiry, so a restarted engine or reader on the same machine goes on at once. Only
    what is certain counts: another host, another namespace (a container), an unreadable
    holder, a live or unknown process are never gone; their leases expire as usual."""
    match = _PROCESS_HOLDER.match(record.holder)
    if match is None or match["host"] != socket.gethostname():
        return False
    if match["ns"] != _pid_namespace() or not match["ns"]:
        return False
    pid = int(match["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # (PermissionError: it exists)
        return False
    return False


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
        # The expired lease of another holder this object's acquire replaced (None: it created
        # the lease, renewed its own, or took over a released one): that holder may still
        # have writes in flight (``LandingZone`` waits them out).
        self.replaced: LeaseRecord | None = None

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

    @property
    def expiry(self) -> float:
        """The ``time.monotonic()`` until which this object trusts the lease (renewals move it
        on); 0.0 when it does not hold it. Never later than the ``expires_at`` the others
        see (it is counted from before the write that set that). A deadline for writes made
        under the lease (``FileStore.within``)."""
        return self._deadline if self._record is not None else 0.0

    def current(self) -> LeaseRecord | None:
        """The lease object as stored (any holder), or None when there is none."""
        versioned = self.store.read_versioned(*self.parts)
        return None if versioned is None else LeaseRecord.parse(versioned[0])

    def acquire(self, holder: str, ttl_seconds: float, *, wait_seconds: float = 0.0) -> bool:
        """Take the lease for ``ttl_seconds`` if it is free, released or expired; False while
        another holder's (or another ``Lease`` object's) lease is live. Holding it already:
        a renewal.

        ``wait_seconds`` > 0: a live lease that would expire within that time is watched
        (logged once); False as soon as it is renewed or replaced meanwhile (its holder is
        alive), or when it would not expire in time; taken over when it expires unrenewed (its
        holder is dead or cut off, and can no longer write once its own deadline passed)."""
        if ttl_seconds <= 0:
            raise ValueError(f"lease ttl_seconds must be positive, not {ttl_seconds}")
        if wait_seconds < 0:
            raise ValueError(f"lease wait_seconds must not be negative, not {wait_seconds}")
        deadline = time.monotonic() + wait_seconds
        watched: LeaseRecord | None = None
        for _ in range(_ACQUIRE_ROUNDS):  # (rounds that found the lease free, yet lost it)
            if self._acquire_once(holder, ttl_seconds):
                return True
            current = self.current()
            remaining = 0.0 if current is None or holder_gone(current) else (
                current.expires_at - self._clock())
            if current is None or remaining <= 0:
                continue  # deleted, expired or released in between: take it
            if watched is not None and current != watched:
                log.info(f"{self!r}: the lease of {current.holder or 'unknown'} was renewed "
                         "(or taken) while waiting for it to expire: refused")
                return False
            left = deadline - time.monotonic()
            if left <= 0 or remaining > left:
                return False
            if watched is None:
                log.warning(f"{self!r}: waiting up to {remaining:.0f} s for the lease of "
                            f"{current.holder or 'unknown'} to expire (not released: a killed "
                            "holder? a live one renews it, and this acquirer is refused)")
            watched = current
            watch = min(_WATCH_MAX_SECONDS, max(_WATCH_MIN_SECONDS, ttl_seconds * _WATCH_SHARE))
            while True:
                time.sleep(min(remaining + 0.05, watch))
                current = self.current()
                if current != watched:
                    break  # changed (renewed, released, taken) or expired: look again
                remaining = current.expires_at - self._clock()
                if remaining <= 0:
                    break
        return False

    def _acquire_once(self, holder: str, ttl_seconds: float) -> bool:
        """One ``acquire`` without waiting."""
        if self._record is not None and self._record.holder == holder:
            self._ttl = ttl_seconds
            if self.renew():
                return True
        self._forget()
        for _ in range(_ACQUIRE_ROUNDS):
            started = time.monotonic()
            record = self._new_record(holder, ttl_seconds)
            written = self.store.within(started + ttl_seconds).write_versioned(
                *self.parts, data=record.to_json(), etag=None)
            if written is not None:
                self.replaced = None
                return self._took(record, written, ttl_seconds, started=started)
            versioned = self.store.read_versioned(*self.parts)
            if versioned is None:
                continue  # deleted in between: try to create it again
            data, etag = versioned
            found = LeaseRecord.parse(data)
            if found.expires_at > self._clock() and not holder_gone(found):
                return False
            started = time.monotonic()
            record = self._new_record(holder, ttl_seconds)
            written = self.store.within(started + ttl_seconds).write_versioned(
                *self.parts, data=record.to_json(), etag=etag)
            if written is not None:
                self.replaced = found if found.expires_at > 0 and not holder_gone(found) \
                    else None
                return self._took(record, written, ttl_seconds, started=started)
        return False

    def renew(self, ttl_seconds: float | None = None) -> bool:
        """Extend the lease (by ``ttl_seconds``, else the acquired ttl) if this object still
        holds it; False, and no longer held, if anyone replaced it since. An unreachable store
        is retried only until the lease held so far expires (then
        ``ObjectStoreUnavailableError``; ``held`` is False by then, or within the store's
        ``bounded_attempt_seconds``). A lease renewed after it expired (its holder was
        frozen) is taken again like an acquire's (within the new ttl), if nobody replaced
        it meanwhile."""
        if self._record is None or self._etag is None:
            return False
        ttl = self._ttl if ttl_seconds is None else ttl_seconds
        started = time.monotonic()
        record = self._new_record(self._record.holder, ttl, token=self._record.token)
        # (a store within a deadline sends nothing past it: an expired lease's renewal is
        # bounded like an acquire, by the lease it would take again)
        deadline = self._deadline if started < self._deadline else started + ttl
        written = self.store.within(deadline).write_versioned(
            *self.parts, data=record.to_json(), etag=self._etag)
        if written is None:
            self._forget()
            return False
        return self._took(record, written, ttl, started=started)

    def release(self) -> None:
        """Give the lease up (marked expired, so the next acquirer takes it at once); nothing
        when this object does not hold it any more. Best effort: a store that does not answer
        before the lease expires is logged in one line (the lease expires on its own)."""
        if self._record is None or self._etag is None:
            return
        record = LeaseRecord(self._record.holder, self._record.token, 0.0)
        try:
            if self.held:  # (an expired lease needs no release)
                self.store.within(self._deadline).write_if_match(
                    *self.parts, data=record.to_json(), etag=self._etag)
        except StoreUnavailableError as error:
            log.warning(f"{self!r}: not released, it expires on its own: {error}")
        finally:
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
