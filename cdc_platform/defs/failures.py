"""Start errors as Dagster run failures: the same one line the CLI prints
(``capture.start_errors``), as the failure's description."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from cdc_platform.capture.start_errors import SourceAccount, describe_start_error
from cdc_platform.config import Settings


@contextmanager
def start_errors_fail_the_run(settings: Settings) -> Iterator[None]:
    """Known start errors (a wrong password, a missing grant, an unreachable replica, a source
    setting that makes capture inexact, an engine stop) raised inside become a ``dg.Failure``
    whose description is their one line; anything else propagates as it is."""
    try:
        yield
    except dg.Failure:
        raise
    except Exception as error:
        line = describe_start_error(error, SourceAccount.from_settings(settings))
        if line is None:
            raise
        raise dg.Failure(description=line, allow_retries=False) from error
