"""At most one capture engine writes a server's landing folder: the engine lock on a local
zone (an ``flock``), the lease and the fencing of every write on object storage.

Apart from ``capture.landing.zone`` (the layout, the checkpoint and the reader/zone classes)
because it is a concept of its own with its own invariant (``ENGINE_LEASE_WAIT_SLACK_SECONDS``):
``SingleWriter`` is the part of ``LandingZone`` that takes and keeps the right to write, and
refuses every write once it is lost (``LandingZoneTakenError``). Layout and contract:
docs/landing-zone.md, "Checkpoint" (one engine per server) and docs/object-storage.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from cdc_platform.capture.store.lease import Lease, process_holder
from cdc_platform.capture.store.storage import FileStore, StoreUnavailableError

ENGINE_LOCK_FILE = "engine.lock"  # local zones: the engine's flock
ENGINE_LEASE_FILE = "engine.lease"  # object stores: the engine's lease (capture.store.lease)
# The engine's lease on object storage: renewed every third of it; a killed engine's lease
# blocks a new engine at most this long.
ENGINE_LEASE_TTL_SECONDS = 60.0
# How much longer than the lease's ttl a starting engine waits for an unrenewed lease (clock
# skew, a slow read) before it is refused; and how long after an expired (unreleased) lease's
# expires_at an engine that took it over waits before its first write. The invariant that keeps
# a cut-off engine's writes from landing after its successor's first one (and so after its
# successor's ``remove_uncommitted``, which would leave them as duplicates): every write the
# engine makes under its lease goes through ``LandingZone.store``, a store ``within`` the
# lease's expiry (``Lease.expiry``, by the holder's monotonic clock and never later than the
# ``expires_at`` it wrote), so no attempt starts after the expiry and a started one ends
# within ``bounded_attempt_seconds`` of it (2 s connect + 5 s read timeout = 7 s, s3store):
#   last attempt end < expiry + 7 s < expires_at + 10 s (this slack) <= successor's first write,
# which holds while the two hosts' clocks are less than 3 s apart.
ENGINE_LEASE_WAIT_SLACK_SECONDS = 10.0

log = logging.getLogger(__name__)


class EngineLockedError(RuntimeError):
    """Another engine holds the server's landing folder: a start failure, not a crash."""


class LandingZoneTakenError(EngineLockedError):
    """On object storage: this engine's lease was lost, or its checkpoint's compare-and-swap
    failed because another engine replaced the checkpoint; it must stop writing at once."""


class SingleWriter:
    """The engine's right to write one server's folder, for ``LandingZone``: the lock or lease
    it holds (``_engine_flock``, ``_engine_lease``), the store its writes go through while it
    holds the lease (``store``), and the check each write makes first (``_check_fence``).

    ``LandingZone`` provides ``server_name``, ``root`` (a local directory: the zone, or its
    scratch directory) and ``_store`` (the zone's plain store), and calls
    ``_init_single_writer`` from its ``__init__``; the checkpoint's compare-and-swap on
    ``_checkpoint_etag`` is its ``write_checkpoint``'s.
    """

    server_name: str
    root: Path
    _store: FileStore

    def _init_single_writer(self, lease_ttl_seconds: float) -> None:
        self._lease: Lease | None = None
        self._lease_lost = threading.Event()
        self._fenced = False
        self._bounded: FileStore | None = None
        self.lease_ttl_seconds = lease_ttl_seconds
        # The checkpoint's version this engine last read or wrote (its compare-and-swap).
        self._checkpoint_etag: str | None = None

    @property
    def store(self) -> FileStore:
        """The zone's store: on object storage, while this engine holds the lease, the store
        ``within`` the lease's expiry (``_lease_expiry``), so that each of the engine's writes
        (segments, tables.json, XA copies, column renames, snapshot controls, markers...) is
        sent only before the lease expires and ends within the store's
        ``bounded_attempt_seconds`` of it (``ENGINE_LEASE_WAIT_SLACK_SECONDS``: the
        invariant); a write past it raises ``ObjectStoreUnavailableError`` instead of landing
        after a successor took over. Reads go through it too (single attempts with short
        timeouts, retried until the expiry: an engine past it could do nothing with them).
        Otherwise (local zones, no lease held) the plain store."""
        bounded = self._bounded
        return bounded if self._fenced and bounded is not None else self._store

    @store.setter
    def store(self, store: FileStore) -> None:
        self._store = store

    def _lease_expiry(self) -> float:
        """The deadline of the engine's writes: the lease's expiry, as renewals move it on
        (``time.monotonic()``); 0.0 once the lease is lost."""
        lease = self._lease
        if lease is None or self._lease_lost.is_set():
            return 0.0
        return lease.expiry

    @contextlib.contextmanager
    def _engine_flock(self) -> Iterator[None]:
        """On a local zone: an exclusive ``flock`` of ``engine.lock`` in the zone, naming this
        process; ``EngineLockedError`` (naming the holder) when another engine holds it."""
        self.root.mkdir(parents=True, exist_ok=True)
        handle = open(self.root / ENGINE_LOCK_FILE, "a+")  # noqa: SIM115 - held for the run
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                raise EngineLockedError(
                    f"another capture engine is already streaming {self.server_name!r} into "
                    f"{self.root} ({holder}); stop it first: one engine per source server"
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}")
            handle.flush()
            yield
        finally:
            handle.close()

    @contextlib.contextmanager
    def _engine_lease(self, checkpoint_file: str) -> Iterator[None]:
        """On object storage: the ``Lease`` (``engine.lease``), renewed every third of its ttl
        by a daemon thread and released on exit; then the version of ``checkpoint_file`` for
        the compare-and-swap of the engine's next checkpoint, and every write fenced (the
        store ``within`` the lease's expiry, ``_check_fence``) until the block ends."""
        check = getattr(self._store, "check", None)
        if check is not None:
            check()  # (ObjectStoreError: one line naming landing_zone.url)
        lease = Lease(self._store, ENGINE_LEASE_FILE)
        holder = process_holder()
        # A restarted engine (a run retry, a pod restart) meets the lease of the engine it
        # replaces, killed without releasing it: it waits for that lease to expire rather
        # than fail, and is refused as soon as the lease is renewed (its holder lives).
        if not lease.acquire(holder, self.lease_ttl_seconds,
                             wait_seconds=self.lease_ttl_seconds + ENGINE_LEASE_WAIT_SLACK_SECONDS):
            current = lease.current()
            other = current.holder if current is not None and current.holder else "unknown"
            raise EngineLockedError(
                f"another capture engine is already streaming {self.server_name!r} into "
                f"{self.store.uri} ({other}, lease {ENGINE_LEASE_FILE}); stop it first: one "
                "engine per source server (its lease was renewed while this engine waited for "
                f"it to expire; a killed engine's lease expires after "
                f"{self.lease_ttl_seconds:g} s)")
        self._lease_lost.clear()
        stop = threading.Event()
        renewer = threading.Thread(target=self._renew_lease, args=(lease, stop),
                                   name=f"lease-{self.server_name}", daemon=True)
        try:
            self._lease, self._bounded = lease, self._store.within(self._lease_expiry)
            renewer.start()
            self._wait_out_replaced(lease)
            versioned = self._store.read_versioned(checkpoint_file)
            self._checkpoint_etag = None if versioned is None else versioned[1]
            self._fenced = True
            yield
        finally:
            stop.set()
            if renewer.is_alive():
                renewer.join()
            self._lease, self._fenced, self._checkpoint_etag = None, False, None
            self._bounded = None
            try:
                lease.release()
            except Exception:  # noqa: BLE001 - it expires on its own
                log.warning(f"landing zone {self.store.uri}: releasing the engine lease failed "
                            "(it expires on its own)", exc_info=True)

    def _wait_out_replaced(self, lease: Lease) -> None:
        """After taking over another engine's expired lease (not released, its holder not
        known gone): wait until ``ENGINE_LEASE_WAIT_SLACK_SECONDS`` past its ``expires_at``
        before the first write, so that a write that engine started before its lease expired
        (cut off by a partition, still retrying) has ended by then (the invariant at
        ``ENGINE_LEASE_WAIT_SLACK_SECONDS``). The lease is renewed meanwhile."""
        replaced = lease.replaced
        if replaced is None:
            return
        wait = replaced.expires_at + ENGINE_LEASE_WAIT_SLACK_SECONDS - time.time()
        if wait > 0:
            log.warning(f"landing zone {self._store.uri}: took over the expired lease of "
                        f"{replaced.holder or 'unknown'}; waiting {wait:.0f} s for any write it "
                        "began before its expiry to end before writing")
            time.sleep(wait)

    def _renew_lease(self, lease: Lease, stop: threading.Event) -> None:
        interval = self.lease_ttl_seconds / 3
        while not stop.wait(interval):
            why = "another engine took over the landing zone"
            try:
                renewed = lease.renew()
            except StoreUnavailableError as error:
                # (the renewal retried until it could no longer land before the expiry)
                renewed = False
                why = f"the store did not answer before it expired: {error}"
            except Exception:  # noqa: BLE001 - retried at the next interval while held
                log.warning(f"landing zone {self._store.uri}: renewing the engine lease failed",
                            exc_info=True)
                renewed = lease.held
                why = "it expired while its renewal failed"
            if not renewed:
                self._lease_lost.set()
                log.error(f"landing zone {self._store.uri}: the engine lease was lost ({why}); "
                          "no more writes")
                return

    def _check_fence(self) -> None:
        """On object storage, under the engine lock: refuse to write once the lease is lost
        (renewal failed, or this process was frozen past the lease's ttl)."""
        if self._fenced and (self._lease_lost.is_set() or self._lease is None
                             or not self._lease.held):
            raise LandingZoneTakenError(
                f"capture engine {self.server_name!r}: its lease on {self.store.uri} was lost "
                "(expired or taken by another engine); another engine took over the landing "
                "zone: stopping without writing")
