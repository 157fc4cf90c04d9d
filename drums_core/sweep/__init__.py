"""Ownership and clean-up: the write-ahead ledger (:mod:`.ledger`) and the sweep that deletes exactly
what dead runs' ledgers own (:mod:`drums_core.sweep.sweep`). ``python -m drums_core.sweep --ledger DIR``
runs the sweep.

The sweep's public functions are re-exported here. Note that the name ``sweep`` in this package is
the function: import the module's other names with ``from drums_core.sweep.sweep import NAME``.
"""
from __future__ import annotations

from .sweep import RunReport, RunStatus, SweepReport, main, session_selector, sweep, sweep_instance

__all__ = ["sweep", "sweep_instance", "session_selector", "RunReport", "RunStatus", "SweepReport", "main"]
