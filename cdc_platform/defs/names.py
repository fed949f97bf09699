"""Assets and asset checks of tables with any name: the op, input and output names are ours.

Dagster derives op, input and output names from asset keys (``server__db__table``), and those
must match ``^[A-Za-z0-9_]+$``, which a real table name need not (``ünï``, ``order-items``,
``2024 sales``): one such table made the whole code location fail to load. The asset keys keep
the real names (the UI shows them); the op names come from ``capture.names.joined_name``
(injective, and Dagster's own names for plain tables), inputs and outputs get fixed names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from cdc_platform.config import Settings


def subsettable_assets(name: str, specs: Sequence[dg.AssetSpec], *,
                       check_specs: Sequence[dg.AssetCheckSpec] = (), description: str = "",
                       required_resource_keys: set[str] | None = None,
                       ) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """``@dg.multi_asset(specs=..., check_specs=..., can_subset=True)`` with op ``name`` and
    input and output names of ours (``dep_<i>``, ``asset_<i>``, ``check_<i>``): Dagster's own
    are derived from the asset keys. Every asset and check may record nothing (a subset, a
    table that failed); the function yields ``MaterializeResult``s and ``AssetCheckResult``s
    naming their asset key."""
    own = {spec.key for spec in specs}
    deps = sorted({dep.asset_key for spec in specs for dep in spec.deps} - own,
                  key=lambda key: key.path)
    inputs = {f"dep_{i}": key for i, key in enumerate(deps)}
    assets = {f"asset_{i}": spec for i, spec in enumerate(specs)}
    checks = {f"check_{i}": spec for i, spec in enumerate(check_specs)}

    def decorate(fn: Callable[..., Any]) -> dg.AssetsDefinition:
        op = dg.op(
            name=name, description=description,
            required_resource_keys=required_resource_keys,
            ins={input_name: dg.In(dg.Nothing) for input_name in inputs},
            out={output: dg.Out(dg.Nothing, is_required=False) for output in [*assets, *checks]},
        )(fn)
        return dg.AssetsDefinition(
            keys_by_input_name=inputs,
            keys_by_output_name={output: spec.key for output, spec in assets.items()},
            node_def=op, specs=list(specs), check_specs_by_output_name=checks, can_subset=True)

    return decorate


def subsettable_asset_checks(name: str, specs: Sequence[dg.AssetCheckSpec], *,
                             description: str = "",
                             required_resource_keys: set[str] | None = None,
                             ) -> Callable[[Callable[..., Any]], dg.AssetChecksDefinition]:
    """``@dg.multi_asset_check(specs=..., can_subset=True)`` with op ``name`` and input and
    output names of ours (``asset_<i>``, ``check_<i>``): one definition for a check of every
    table (one per table cost a thousand ops at each code-location load). The function yields
    an ``AssetCheckResult`` naming its asset key for each selected check
    (``context.selected_asset_check_keys``)."""
    assets = sorted({spec.asset_key for spec in specs}, key=lambda key: key.path)
    inputs = {f"asset_{i}": key for i, key in enumerate(assets)}
    checks = {f"check_{i}": spec for i, spec in enumerate(specs)}

    def decorate(fn: Callable[..., Any]) -> dg.AssetChecksDefinition:
        op = dg.op(
            name=name, description=description,
            required_resource_keys=required_resource_keys,
            ins={input_name: dg.In(dg.Nothing) for input_name in inputs},
            out={output: dg.Out(dg.Nothing, is_required=False) for output in checks},
        )(fn)
        return dg.AssetChecksDefinition.create(
            keys_by_input_name=inputs, node_def=op, check_specs_by_output_name=checks,
            can_subset=True)

    return decorate


def single_asset_check(spec: dg.AssetCheckSpec, *, op_name: str,
                       required_resource_keys: set[str] | None = None,
                       ) -> Callable[[Callable[..., Any]], dg.AssetChecksDefinition]:
    """``@dg.asset_check`` for ``spec`` with op ``op_name``; the function returns its
    ``dg.AssetCheckResult``."""

    def decorate(fn: Callable[..., Any]) -> dg.AssetChecksDefinition:
        op = dg.op(name=op_name, description=spec.description,
                   required_resource_keys=required_resource_keys,
                   ins={"asset": dg.In(dg.Nothing)},
                   out={"result": dg.Out(None)})(fn)
        return dg.AssetChecksDefinition.create(
            keys_by_input_name={"asset": spec.asset_key},
            node_def=op,
            check_specs_by_output_name={"result": spec},
            can_subset=False,
        )

    return decorate


def scoped_name(settings: Settings, name: str) -> str:
    """A deployment-wide name (a job, a schedule, a resource key) for one source: ``name`` as
    it was when the deployment has one source, ``<server>_<name>`` when it has several."""
    if len(settings.deployment_server_names) == 1:
        return name
    return f"{settings.source.server_name}_{name}"


def source_resource_key(settings: Settings) -> str:
    """The key of the source's read-only session resource (``defs/resources.py``)."""
    return scoped_name(settings, "source")
