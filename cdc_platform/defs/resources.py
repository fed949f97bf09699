"""The source replica as a Dagster resource: one read-only ``SourceSession`` per run.

Assets and checks that read the source (a table's current schema for a snapshot or a
reconcile) require it (key ``defs.names.source_resource_key``: ``source``, or
``<server>_source`` when the deployment has several) instead of opening connections of their
own: the session connects on first use, retries a broken connection once, and is closed
when the run ends.
"""

from collections.abc import Iterator

import dagster as dg

from cdc_platform.capture.source import SourceSession, selector_from_settings
from cdc_platform.config import Settings


def source_resource(settings: Settings) -> dg.ResourceDefinition:
    """The ``source`` resource of a code location (its server's read-only session)."""

    @dg.resource(description=f"Read-only session on the source {settings.source.server_name!r} "
                 "(opened on first use, closed with the run)")
    def source(_context: dg.InitResourceContext) -> Iterator[SourceSession]:
        with SourceSession(settings.source.connection_settings(),
                           selector_from_settings(settings)) as session:
            yield session

    return source
