"""Deprecated location: recovery of planted dependencies now lives in
:mod:`glomo_pyg.analysis.recovery`."""
from glomo_pyg.analysis.recovery import RecoveryReport, planted_source_recovery

__all__ = ["RecoveryReport", "planted_source_recovery"]
