"""What a publisher of the changelog has published: ``published/<publisher>.json``, one record per
publisher of a source (docs/change-topics.md, "Delivery"; docs/landing-zone.md, "Retention").

A publisher (the change-topic publisher, ``topics.publisher``) reads the landing zone from its
own position and writes each record elsewhere (a Kafka topic). Its record says, per table, the
highest changelog position through which every record of the table is published, and which
tables it does not publish. Retention reads it (``holds``): a segment is deleted only once every
target consumed it **and** every required publisher published it, so a change is never swept
before it is published.

The publisher replaces its record with a conditional write on the version it read
(``FileStore.write_versioned``): a second publisher of the same source that took over makes the
first one's next write fail, and the first one stops instead of publishing twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

PUBLISHED_DIR = "published"
#: The change-topic publisher's name (``change_topics`` in the config).
CHANGE_TOPICS = "change_topics"


@dataclass(frozen=True)
class PublishedMarks:
    """One publisher's progress: ``through[table id]`` is the highest changelog position such
    that every record of the table at or below it is published (inclusive; 0: none yet).
    ``unpublished``: tables it does not publish (its filter leaves them out): retention does
    not wait for it there. A table in neither is held whole (a table the publisher has not
    looked at yet)."""

    publisher: str
    through: Mapping[str, int] = field(default_factory=dict)
    unpublished: frozenset[str] = frozenset()
    written_at: str = ""

    def hold(self, table_id: str) -> int | None:
        """The highest position of ``table_id``'s changelog retention may delete through for
        this publisher, or None when it does not hold the table back."""
        if table_id in self.unpublished and table_id not in self.through:
            return None
        return self.through.get(table_id, 0)

    def to_json(self) -> bytes:
        return json.dumps({
            "publisher": self.publisher, "written_at": self.written_at,
            "through": dict(sorted(self.through.items())),
            "unpublished": sorted(self.unpublished)}, indent=1).encode()

    @staticmethod
    def from_json(text: bytes | str) -> PublishedMarks:
        data = json.loads(text)
        return PublishedMarks(
            publisher=str(data["publisher"]),
            through={str(k): int(v) for k, v in data.get("through", {}).items()},
            unpublished=frozenset(str(t) for t in data.get("unpublished", ())),
            written_at=str(data.get("written_at", "")))


def published_name(publisher: str) -> str:
    """The file name of ``publisher``'s record under ``PUBLISHED_DIR``."""
    if not publisher or not publisher.replace("_", "").isalnum() or not publisher.isascii():
        raise ValueError(f"publisher name {publisher!r}: letters, digits and underscores only")
    return f"{publisher}.json"


def hold(records: Mapping[str, PublishedMarks | None], table_id: str) -> int | None:
    """The highest position of ``table_id`` every required publisher published through (None:
    none holds it back). ``records``: each required publisher's record, None where it has
    written none yet (then it holds every table whole: it has published nothing)."""
    held: int | None = None
    for record in records.values():
        through = 0 if record is None else record.hold(table_id)
        if through is not None:
            held = through if held is None else min(held, through)
    return held
