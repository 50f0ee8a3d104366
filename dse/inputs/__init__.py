"""Inputs: what a plan is evaluated on, as pytrees of float arrays, and where they come from.

- ``model``, ``cluster``, ``plan``: ``ModelShape``, ``Cluster``, ``Plan`` and their option codes
  (``base``: the shared pytree base class, ``broadcast_all``, ``stack``);
- ``checks``: the input checks every entry point shares;
- ``fidelity``: ``Fidelity``, the model's knobs, and the named modes read from data;
- ``presets``: model and cluster presets (TOML) and Hugging Face ``config.json`` files;
- ``units``: the one unit table (preset keys, SI name suffixes).

Nothing here imports an equation, an engine or a front end.
"""

from dse.inputs.base import broadcast_all, stack
from dse.inputs.cluster import FP8_SCALINGS, TOPOLOGIES, Cluster
from dse.inputs.model import ModelShape
from dse.inputs.plan import (FP8_NAMES, FP8_RECIPES, RECOMPUTE, RECOMPUTE_MODULES, RECOMPUTE_NAMES, SCHEDULES,
                             SELECTIVE_MODULES, Plan, recompute_name)
from dse.inputs.fidelity import Fidelity

__all__ = ["ModelShape", "Cluster", "Plan", "Fidelity", "RECOMPUTE", "RECOMPUTE_NAMES", "recompute_name",
           "RECOMPUTE_MODULES", "SELECTIVE_MODULES", "SCHEDULES", "FP8_RECIPES",
           "FP8_NAMES", "TOPOLOGIES", "FP8_SCALINGS",
           "broadcast_all", "stack"]
