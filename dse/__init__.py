"""dse: a JAX design-space explorer for large-model training plans."""

import os as _os
import sys as _sys


def _is_command() -> bool:
    """Whether this process is the ``dse`` command: its console script, or ``python [options] -m dse``
    (whose package is imported while ``sys.argv[0]`` is still "-m"; ``sys.orig_argv`` holds the
    interpreter's own arguments: its options, then the module, the code or the script)."""
    if _os.path.basename(_sys.argv[0]) == "dse":
        return True
    words = list(getattr(_sys, "orig_argv", ()))[1:]
    while words:
        word = words.pop(0)
        if word == "-m":
            return words[:1] == ["dse"]
        if word in ("-X", "-W"):      # an option and its value
            words = words[1:]
        elif word == "-c" or not word.startswith("-"):
            return False              # code or a script, not a module
    return False


# The dse command multiplies no matrices (numpy's one BLAS call, a least-squares fit of a few
# nccl-tests rows, is tiny), but OpenBLAS starts a thread per core when numpy is imported, and each
# spins before it sleeps: 0.10-0.12 CPU-s a process on this 2-core machine (`import numpy` 0.37 ->
# 0.25 CPU-s with one thread), paid again on every core of a larger host. So the command, and only
# the command, asks for one BLAS thread, before numpy is imported and unless the user chose a number;
# a program that imports dse as a library keeps its own BLAS threads.
if _is_command() and "numpy" not in _sys.modules:
    _os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

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
