"""dse: a JAX design-space explorer for large-model training plans."""

from dse.evaluate import derived, evaluate
from dse.inputs.fidelity import Fidelity
from dse.inputs import RECOMPUTE, Cluster, ModelShape, Plan, broadcast_all, recompute_name, stack
from dse.report import REASONS, WARNINGS, PerDim, Report, reason_names, warning_names

__all__ = [
    "evaluate", "derived", "Fidelity", "ModelShape", "Cluster", "Plan", "RECOMPUTE", "recompute_name",
    "broadcast_all", "stack", "Report", "PerDim", "REASONS", "WARNINGS",
    "reason_names", "warning_names",
]
__version__ = "0.1.0"
