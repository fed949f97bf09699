"""The applier: one long-lived process that keeps every target merged with its changelog.

``loop`` (the ``Applier``: its passes, merges and housekeeping), ``options`` (what it needs
from the config), ``events`` (what it did), ``decisions`` (its per-table rules, pure),
``sweep`` (the landing zone's retention beside the merges) and ``process`` (the loop in a child
process, for the ``apply_changes`` run).
"""
