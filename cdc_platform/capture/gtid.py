"""GTID algebra for MySQL 8 GTID sets and MariaDB GTID positions (stdlib only).

The watermark dedup (ARCHITECTURE.md section 4) asks a handful of questions: is a transaction
in ``lw``, does ``processed`` contain ``after``, what is ``processed`` after one more
transaction. Both flavours answer them through :class:`GtidSet`. MySQL GTID sets are exact sets
and also support difference, intersection and ``count()``. A MariaDB position is only a
per-domain high-water mark, so it deliberately refuses difference/intersection instead of
returning something that looks like a set but is not one.

All values are immutable and hashable; operations return new values.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Self

MAX_GNO = 2**63 - 1  # MySQL transaction numbers are 1..MAX_GNO
MAX_MARIADB_DOMAIN = MAX_MARIADB_SERVER_ID = 2**32 - 1
MAX_MARIADB_SEQ = 2**64 - 1

# Explicit ASCII classes: re.IGNORECASE would let [a-z] match e.g. the Kelvin sign.
_UUID_RE = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
_TAG_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
_INTERVAL_RE = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+))?")
_MARIADB_GTID_RE = re.compile(r"([0-9]+)-([0-9]+)-([0-9]+)")

_Sid = tuple[str, str]  # (uuid, tag); tag '' = untagged
_Intervals = tuple[tuple[int, int], ...]  # sorted, disjoint, non-adjacent, inclusive


def _int(digits: str, lo: int, hi: int, what: str) -> int:
    """Parse an unsigned decimal bounded to [lo, hi]; ValueError message names ``what``."""
    if len(digits.lstrip("0")) > 20 or not lo <= int(digits) <= hi:
        raise ValueError(f"{what} {digits} is out of range {lo}..{hi}")
    return int(digits)


def _uuid(text: str) -> str:
    if not _UUID_RE.fullmatch(text):
        raise ValueError(f"bad UUID {text!r}")
    return text.lower()


def _tag(text: str) -> str:
    if not _TAG_RE.fullmatch(text):
        raise ValueError(f"bad tag {text!r} (want [a-z_][a-z0-9_]{{0,31}})")
    return text.lower()


class Gtid(ABC):
    """One source transaction id; ``str()`` is its canonical text."""

    __slots__ = ()

    @classmethod
    @abstractmethod
    def parse(cls, text: str) -> Self:
        """Parse the server's text form; ValueError on bad input."""


class GtidSet(ABC):
    """Set-like view of source transactions that both flavours implement.

    Subclasses provide parse/str/contains_gtid/issuperset/union/add/is_empty; the operators
    and helpers below are derived from those. Mixing flavours raises TypeError.
    """

    __slots__ = ()

    @classmethod
    @abstractmethod
    def parse(cls, text: str) -> Self:
        """Parse server text (``''`` is empty); ValueError naming the offending part."""

    @property
    @abstractmethod
    def is_empty(self) -> bool:
        """True if no transaction is contained."""

    @abstractmethod
    def contains_gtid(self, gtid: Gtid) -> bool:
        """Whether transaction ``gtid`` is in this set (e.g. "is this event inside ``lw``")."""

    @abstractmethod
    def issuperset(self, other: Self) -> bool:
        """``self ⊇ other`` (e.g. the chunk commit rule ``processed ⊇ after``)."""

    @abstractmethod
    def union(self, other: Self) -> Self:
        """Smallest value containing both."""

    @abstractmethod
    def add(self, gtid: Gtid) -> Self:
        """A new value that also contains ``gtid`` (advancing ``processed``)."""

    @classmethod
    def empty(cls) -> Self:
        return cls.parse("")

    @classmethod
    def from_gtids(cls, gtids: Iterable[Gtid]) -> Self:
        """Fold GTIDs with :meth:`add`."""
        result = cls.empty()
        for gtid in gtids:
            result = result.add(gtid)
        return result

    def _check(self, other: object) -> None:
        if type(other) is not type(self):
            raise TypeError(f"cannot combine {type(self).__name__} with {type(other).__name__}")

    def __contains__(self, gtid: Gtid) -> bool:
        return self.contains_gtid(gtid)

    def __bool__(self) -> bool:
        return not self.is_empty

    def __or__(self, other: Self) -> Self:
        return self.union(other) if type(other) is type(self) else NotImplemented

    def __ge__(self, other: Self) -> bool:
        return self.issuperset(other) if type(other) is type(self) else NotImplemented

    def __le__(self, other: Self) -> bool:
        return other.issuperset(self) if type(other) is type(self) else NotImplemented

    def __gt__(self, other: Self) -> bool:
        return self >= other and self != other if type(other) is type(self) else NotImplemented

    def __lt__(self, other: Self) -> bool:
        return self <= other and self != other if type(other) is type(self) else NotImplemented

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


# ---------------------------------------------------------------------------------------------
# MySQL


@dataclass(frozen=True)
class MysqlGtid(Gtid):
    """``uuid:gno`` or (MySQL 8.4) ``uuid:tag:gno``; uuid and tag are normalised to lower case."""

    uuid: str
    gno: int
    tag: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "uuid", _uuid(self.uuid))
        object.__setattr__(self, "tag", _tag(self.tag) if self.tag else "")
        if not 1 <= self.gno <= MAX_GNO:
            raise ValueError(f"transaction number {self.gno} is out of range 1..{MAX_GNO}")

    @classmethod
    def parse(cls, text: str) -> MysqlGtid:
        parts = [p.strip() for p in text.split(":")]
        try:
            if len(parts) not in (2, 3) or not parts[-1].isdigit() or not parts[-1].isascii():
                raise ValueError("want uuid:n or uuid:tag:n")
            gno = _int(parts[-1], 1, MAX_GNO, "transaction number")
            return cls(_uuid(parts[0]), gno, _tag(parts[1]) if len(parts) == 3 else "")
        except ValueError as e:
            raise ValueError(f"invalid MySQL GTID {text!r}: {e}") from None

    def __str__(self) -> str:
        return f"{self.uuid}:{self.tag}:{self.gno}" if self.tag else f"{self.uuid}:{self.gno}"


def _merge(intervals: Iterable[tuple[int, int]]) -> _Intervals:
    """Sort and coalesce overlapping or adjacent intervals (1-3 + 4-5 -> 1-5)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def _intersect(a: _Intervals, b: _Intervals) -> _Intervals:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def _subtract(a: _Intervals, b: _Intervals) -> _Intervals:
    out, j = [], 0
    for lo, hi in a:
        while j < len(b) and b[j][1] < lo:
            j += 1
        k = j
        while k < len(b) and b[k][0] <= hi:
            if b[k][0] > lo:
                out.append((lo, b[k][0] - 1))
            lo = max(lo, b[k][1] + 1)
            k += 1
        if lo <= hi:
            out.append((lo, hi))
    return tuple(out)


class MysqlGtidSet(GtidSet):
    """An exact set of MySQL transactions, as in ``@@gtid_executed`` / ``Executed_Gtid_Set``.

    Canonical text matches MySQL's ordering (uuids sorted, untagged intervals first, then tags
    sorted; intervals merged) but joins uuids with ``,`` rather than MySQL's ``,\\n``.
    """

    __slots__ = ("_sids",)
    _sids: dict[_Sid, _Intervals]

    def __init__(
        self, sids: Mapping[tuple[str, str], Iterable[tuple[int, int]]] | None = None
    ) -> None:
        """Build from ``{(uuid, tag): [(lo, hi), ...]}``; tag ``''`` means untagged."""
        acc: dict[_Sid, list[tuple[int, int]]] = {}
        for (uuid, tag), intervals in (sids or {}).items():
            key = (_uuid(uuid), _tag(tag) if tag else "")
            for lo, hi in intervals:
                for n in (lo, hi):
                    if not 1 <= n <= MAX_GNO:
                        raise ValueError(f"transaction number {n} is out of range 1..{MAX_GNO}")
                if lo > hi:
                    raise ValueError(f"interval {lo}-{hi} is reversed")
                acc.setdefault(key, []).append((lo, hi))
        self._sids = {k: _merge(v) for k, v in sorted(acc.items()) if v}

    @classmethod
    def _new(cls, sids: dict[_Sid, _Intervals]) -> MysqlGtidSet:
        """Trusted constructor for already-normalised intervals."""
        self = object.__new__(cls)
        self._sids = {k: v for k, v in sorted(sids.items()) if v}
        return self

    @classmethod
    def from_gtids(cls, gtids: Iterable[Gtid]) -> MysqlGtidSet:
        acc: dict[_Sid, list[tuple[int, int]]] = {}
        for g in gtids:
            if not isinstance(g, MysqlGtid):
                raise TypeError(f"MysqlGtidSet cannot contain {type(g).__name__}")
            acc.setdefault((g.uuid, g.tag), []).append((g.gno, g.gno))
        return cls._new({k: _merge(v) for k, v in acc.items()})

    @classmethod
    def parse(cls, text: str) -> MysqlGtidSet:
        acc: dict[_Sid, list[tuple[int, int]]] = {}
        if not text.strip():
            return cls._new({})
        try:
            for part in text.split(","):
                if not part.strip():
                    raise ValueError("empty element")
                tokens = [t.strip() for t in part.split(":")]
                uuid = _uuid(tokens[0])
                sid: _Sid = (uuid, "")
                need_interval = True  # a uuid or tag must be followed by an interval
                for token in tokens[1:]:
                    m = _INTERVAL_RE.fullmatch(token)
                    if m:
                        lo = _int(m[1], 1, MAX_GNO, "transaction number")
                        hi = _int(m[2], 1, MAX_GNO, "transaction number") if m[2] else lo
                        if lo > hi:
                            raise ValueError(f"interval {lo}-{hi} is reversed")
                        acc.setdefault(sid, []).append((lo, hi))
                        need_interval = False
                    elif _TAG_RE.fullmatch(token) and (sid[1] == "" or not need_interval):
                        sid, need_interval = (uuid, token.lower()), True
                    else:
                        raise ValueError(f"expected an interval, got {token!r} in {part.strip()!r}")
                if need_interval:
                    raise ValueError(f"missing interval after {tokens[-1]!r}")
        except ValueError as e:
            raise ValueError(f"invalid GTID set {text!r}: {e}") from None
        return cls._new({k: _merge(v) for k, v in acc.items()})

    def __str__(self) -> str:
        parts: list[list[str]] = []
        for (uuid, tag), ivs in self._sids.items():
            if not parts or parts[-1][0] != uuid:
                parts.append([uuid])
            if tag:
                parts[-1].append(tag)
            parts[-1].extend(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in ivs)
        return ",".join(":".join(p) for p in parts)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._sids == other._sids

    def __hash__(self) -> int:
        return hash(tuple(self._sids.items()))

    @property
    def is_empty(self) -> bool:
        return not self._sids

    def count(self) -> int:
        """Number of transactions in the set."""
        return sum(hi - lo + 1 for ivs in self._sids.values() for lo, hi in ivs)

    def intervals(self) -> dict[tuple[str, str], _Intervals]:
        """``{(uuid, tag): ((lo, hi), ...)}`` in canonical order (a copy)."""
        return dict(self._sids)

    def contains_gtid(self, gtid: Gtid) -> bool:
        if not isinstance(gtid, MysqlGtid):
            raise TypeError(f"MysqlGtidSet cannot contain {type(gtid).__name__}")
        ivs = self._sids.get((gtid.uuid, gtid.tag), ())
        i = bisect_right(ivs, gtid.gno, key=lambda iv: iv[0])
        return i > 0 and ivs[i - 1][1] >= gtid.gno

    def issuperset(self, other: MysqlGtidSet) -> bool:
        self._check(other)
        return all(not _subtract(ivs, self._sids.get(k, ())) for k, ivs in other._sids.items())

    def union(self, other: MysqlGtidSet) -> MysqlGtidSet:
        self._check(other)
        keys = self._sids.keys() | other._sids.keys()
        return self._new({k: _merge(self._sids.get(k, ()) + other._sids.get(k, ())) for k in keys})

    def difference(self, other: MysqlGtidSet) -> MysqlGtidSet:
        """Transactions in self but not other (the seed algorithm's ``hw = executed - lw``)."""
        self._check(other)
        return self._new({k: _subtract(v, other._sids.get(k, ())) for k, v in self._sids.items()})

    def intersection(self, other: MysqlGtidSet) -> MysqlGtidSet:
        self._check(other)
        return self._new(
            {k: _intersect(v, other._sids[k]) for k, v in self._sids.items() if k in other._sids}
        )

    def add(self, gtid: Gtid) -> MysqlGtidSet:
        if not isinstance(gtid, MysqlGtid):
            raise TypeError(f"MysqlGtidSet cannot contain {type(gtid).__name__}")
        if self.contains_gtid(gtid):
            return self
        key = (gtid.uuid, gtid.tag)
        return self._new(
            {**self._sids, key: _merge(self._sids.get(key, ()) + ((gtid.gno, gtid.gno),))}
        )

    def __sub__(self, other: MysqlGtidSet) -> MysqlGtidSet:
        return self.difference(other) if type(other) is type(self) else NotImplemented

    def __and__(self, other: MysqlGtidSet) -> MysqlGtidSet:
        return self.intersection(other) if type(other) is type(self) else NotImplemented


def _varlen_uint(value: int) -> bytes:
    """A "mysql::serialization" unsigned integer (``binlog_decoding.write_varlen_uint``; kept
    here so this module stays stdlib-only)."""
    for width in range(1, 9):
        if value < 1 << (7 * width):
            return ((value << width) | ((1 << (width - 1)) - 1)).to_bytes(width, "little")
    return b"\xff" + value.to_bytes(8, "little")


def _read_varlen_uint(data: bytes, at: int) -> tuple[int, int]:
    first = data[at]
    ones = 0
    while ones < 8 and first >> ones & 1:
        ones += 1
    if ones == 8:
        return int.from_bytes(data[at + 1:at + 9], "little"), at + 9
    return int.from_bytes(data[at:at + ones + 1], "little") >> (ones + 1), at + ones + 1


_TAGGED_FORMAT = 1


def encode_mysql_gtid_set(gtid_set: MysqlGtidSet) -> bytes:
    """The binary form of a GTID set MySQL sends and reads (``Gtid_set::encode``): in
    COM_BINLOG_DUMP_GTID (where a replica names what it has) and PREVIOUS_GTIDS_LOG_EVENT.

    Untagged sets keep the format every MySQL 5.6+ reads: ``n_sids`` (8 bytes), then per
    uuid its 16 bytes, ``n_intervals`` (8 bytes) and ``[start, end)`` pairs (8 bytes each).
    A set with a tag (MySQL 8.3+) uses the tagged format: the first 8 bytes carry the format
    (1) in the lowest and the highest byte and ``n_sids`` in between, and each uuid is
    followed by its tag (a variable-length size, then ASCII; empty for untagged GTIDs).
    """
    tagged = any(tag for _, tag in gtid_set.intervals())
    sids = gtid_set.intervals()
    if tagged:
        out = bytearray(((_TAGGED_FORMAT << 56) | (len(sids) << 8) | _TAGGED_FORMAT)
                        .to_bytes(8, "little"))
    else:
        out = bytearray(len(sids).to_bytes(8, "little"))
    for (uuid, tag), intervals in sids.items():
        out += bytes.fromhex(uuid.replace("-", ""))
        if tagged:
            out += _varlen_uint(len(tag)) + tag.encode("ascii")
        out += len(intervals).to_bytes(8, "little")
        for lo, hi in intervals:
            out += lo.to_bytes(8, "little") + (hi + 1).to_bytes(8, "little")
    return bytes(out)


def decode_mysql_gtid_set(data: bytes) -> MysqlGtidSet:
    """The inverse of :func:`encode_mysql_gtid_set` (both formats); ValueError when the bytes
    do not hold exactly one GTID set."""
    try:
        head = int.from_bytes(data[:8], "little")
        tagged = head >> 56 == _TAGGED_FORMAT and head & 0xFF == _TAGGED_FORMAT
        count = (head >> 8) & ((1 << 48) - 1) if tagged else head
        at = 8
        acc: dict[_Sid, list[tuple[int, int]]] = {}
        for _ in range(count):
            raw = data[at:at + 16]
            if len(raw) != 16:
                raise ValueError("a uuid runs past the end")
            hexa = raw.hex()
            uuid = f"{hexa[:8]}-{hexa[8:12]}-{hexa[12:16]}-{hexa[16:20]}-{hexa[20:]}"
            at += 16
            tag = ""
            if tagged:
                length, at = _read_varlen_uint(data, at)
                tag = data[at:at + length].decode("ascii")
                at += length
            n_intervals = int.from_bytes(data[at:at + 8], "little")
            at += 8
            for _ in range(n_intervals):
                if at + 16 > len(data):
                    raise ValueError("an interval runs past the end")
                lo = int.from_bytes(data[at:at + 8], "little")
                end = int.from_bytes(data[at + 8:at + 16], "little")
                acc.setdefault((uuid, tag), []).append((lo, end - 1))
                at += 16
        if at != len(data):
            raise ValueError(f"{len(data) - at} bytes after the set")
        return MysqlGtidSet(acc)
    except (IndexError, UnicodeDecodeError) as error:
        raise ValueError(f"not an encoded GTID set: {error}") from None


# ---------------------------------------------------------------------------------------------
# MariaDB


@dataclass(frozen=True)
class MariadbGtid(Gtid):
    """``domain-server_id-seq``."""

    domain: int
    server_id: int
    seq: int

    def __post_init__(self) -> None:
        for name, hi in (
            ("domain", MAX_MARIADB_DOMAIN),
            ("server_id", MAX_MARIADB_SERVER_ID),
            ("seq", MAX_MARIADB_SEQ),
        ):
            if not 0 <= getattr(self, name) <= hi:
                raise ValueError(f"{name} {getattr(self, name)} is out of range 0..{hi}")

    @classmethod
    def parse(cls, text: str) -> MariadbGtid:
        m = _MARIADB_GTID_RE.fullmatch(text.strip())
        if not m:
            raise ValueError(f"invalid MariaDB GTID {text!r}: want domain-server_id-seq")
        try:
            return cls(
                _int(m[1], 0, MAX_MARIADB_DOMAIN, "domain"),
                _int(m[2], 0, MAX_MARIADB_SERVER_ID, "server_id"),
                _int(m[3], 0, MAX_MARIADB_SEQ, "seq"),
            )
        except ValueError as e:
            raise ValueError(f"invalid MariaDB GTID {text!r}: {e}") from None

    def __str__(self) -> str:
        return f"{self.domain}-{self.server_id}-{self.seq}"


class MariadbPosition(GtidSet):
    """A MariaDB GTID position: at most one GTID (the last applied) per replication domain.

    Read as the set of all transactions up to that seq in each domain, which is exact under
    ``gtid_strict_mode`` (seq strictly increasing per domain, whatever the server id). It is a
    high-water mark, not a set, so difference and intersection raise TypeError: use an exact
    watermark (``BINLOG_GTID_POS``, ``lw == after``) instead of ``executed - lw``.
    """

    __slots__ = ("_domains",)
    _domains: dict[int, MariadbGtid]

    def __init__(self, gtids: Iterable[MariadbGtid] = ()) -> None:
        """Build from GTIDs with distinct domains (ValueError on a duplicate domain)."""
        domains: dict[int, MariadbGtid] = {}
        for gtid in gtids:
            if gtid.domain in domains:
                raise ValueError(f"duplicate domain {gtid.domain}")
            domains[gtid.domain] = gtid
        self._domains = dict(sorted(domains.items()))

    @classmethod
    def parse(cls, text: str) -> MariadbPosition:
        if not text.strip():
            return cls()
        try:
            return cls(MariadbGtid.parse(part) for part in text.split(","))
        except ValueError as e:
            raise ValueError(f"invalid MariaDB GTID position {text!r}: {e}") from None

    def __str__(self) -> str:
        return ",".join(str(g) for g in self._domains.values())

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._domains == other._domains

    def __hash__(self) -> int:
        return hash(tuple(self._domains.values()))

    def __iter__(self) -> Iterator[MariadbGtid]:
        """The GTIDs, sorted by domain."""
        return iter(self._domains.values())

    def get(self, domain: int) -> MariadbGtid | None:
        """The last GTID of ``domain``, if any."""
        return self._domains.get(domain)

    @property
    def is_empty(self) -> bool:
        return not self._domains

    def contains_gtid(self, gtid: Gtid) -> bool:
        if not isinstance(gtid, MariadbGtid):
            raise TypeError(f"MariadbPosition cannot contain {type(gtid).__name__}")
        mine = self._domains.get(gtid.domain)
        return mine is not None and mine.seq >= gtid.seq

    def issuperset(self, other: MariadbPosition) -> bool:
        self._check(other)
        return all(self.contains_gtid(g) for g in other._domains.values())

    def union(self, other: MariadbPosition) -> MariadbPosition:
        """Per domain, the higher seq; (seq, server_id) breaks ties so union commutes."""
        self._check(other)
        merged = dict(self._domains)
        for d, g in other._domains.items():
            if d not in merged or (g.seq, g.server_id) > (merged[d].seq, merged[d].server_id):
                merged[d] = g
        return MariadbPosition(merged.values())

    def add(self, gtid: Gtid) -> MariadbPosition:
        if not isinstance(gtid, MariadbGtid):
            raise TypeError(f"MariadbPosition cannot contain {type(gtid).__name__}")
        return self.union(MariadbPosition([gtid]))

    def _not_a_set(self, *_: object) -> MariadbPosition:
        raise TypeError(
            "MariaDB GTID positions are per-domain high-water marks: difference/intersection "
            "are not positions (take an exact watermark with BINLOG_GTID_POS instead)"
        )

    difference = intersection = __sub__ = __and__ = _not_a_set


# ---------------------------------------------------------------------------------------------

_FLAVOURS: dict[str, tuple[type[Gtid], type[GtidSet]]] = {
    "mysql": (MysqlGtid, MysqlGtidSet),
    "mariadb": (MariadbGtid, MariadbPosition),
}


def _flavour(flavour: str) -> tuple[type[Gtid], type[GtidSet]]:
    try:
        return _FLAVOURS[flavour]
    except KeyError:
        raise ValueError(f"unknown flavour {flavour!r} (want 'mysql' or 'mariadb')") from None


def parse_position(flavour: str, text: str) -> GtidSet:
    """Parse an executed set / position as printed by a ``flavour`` server."""
    return _flavour(flavour)[1].parse(text)


def parse_gtid(flavour: str, text: str) -> Gtid:
    """Parse one GTID as printed by a ``flavour`` server (e.g. from a binlog GTID event)."""
    return _flavour(flavour)[0].parse(text)


def any_gtid(position: GtidSet) -> Gtid | None:
    """One GTID of a position (its first server's newest), to name it; None when empty."""
    if isinstance(position, MysqlGtidSet):
        for (uuid, tag), intervals in position.intervals().items():
            return MysqlGtid(uuid, intervals[-1][1], tag)
        return None
    return next(iter(position), None)  # (MariaDB: one GTID per domain)
