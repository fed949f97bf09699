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


def load_problem_sensor(server_name: str, line: str) -> dg.SensorDefinition:
    """A source's load-time problem in the UI, in one line: a sensor ``<server>_load_problem``
    whose every tick is skipped with the line (and whose description is it), so the source that
    could not be wired shows beside the others, which load and run as usual."""

    @dg.sensor(name=f"{server_name}_load_problem", minimum_interval_seconds=300,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description=f"source {server_name!r}: {line}")
    def load_problem(_context: dg.SensorEvaluationContext) -> dg.SkipReason:
        return dg.SkipReason(f"source {server_name!r}: {line}")

    return load_problem
