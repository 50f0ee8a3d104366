"""Co-design by gradient: hardware, plan and model shape optimized through ``evaluate``.

The same ``evaluate`` with a finite ``sharpness`` (dse/equations/steps.py) is smooth in every
degree, bandwidth and size; degrees and sizes are continuous log2 variables (x = 2**z),
categorical choices (ZeRO stage, recompute, schedule, hierarchical DP) are softmax weights
over their options and permutations (torus fill order, rank order) Sinkhorn matrices, their
options' exact evaluations blended inside the loss (``relax``). optax's Adam runs from many
starts in one compiled scan (``compiled``: one trace per spec, model and cluster as arguments;
every start and option is a row of one broadcast ``evaluate``), while the sharpness anneals from soft to nearly hard and the weights to one-hot;
each start is then snapped to the allowed discrete values, re-evaluated exactly and the best
polished by a discrete local search (``discrete``). Where the space is small enough the
exhaustive search runs too; on larger ones the random-multistart local search (``baseline``)
is the check. Library only: nothing here prints; ``dse codesign FILE`` formats a ``Result``.

Modules: spec (TOML spec), problem (inputs, objective, cost, feasibility), relax, compiled,
discrete (snap, polish, exhaustive), baseline, search (one case, a run).
"""

from dse.engines.codesign.compiled import compiled, enable_persistent_cache
from dse.engines.codesign.discrete import Counter, exhaustive, polish, snap
from dse.engines.codesign.problem import (budget_usd, build, feasible_exact, hardware_cost_usd, objective,
                                          violations)
from dse.engines.codesign.relax import PENALTY_WEIGHT, cat_grid, relaxed_loss, z_to_x
from dse.engines.codesign.search import (CONVERGED_LOG2, CONVERGED_WEIGHT, Case, Found, Result, optimize,
                                         run, run_case, space_size)
from dse.engines.codesign.spec import (CATEGORICAL_MODES, CATEGORICAL_VARS, CLUSTER_VARS, MODEL_VARS, OBJECTIVES,
                                       PERMUTATION_VARS, PLAN_VARS, Spec, Var, load_spec, parse_spec)

# names the tests and notebooks used before the package split
_relaxed_loss = relaxed_loss

__all__ = ["Spec", "Var", "Case", "Found", "Result", "load_spec", "parse_spec", "run", "run_case", "optimize",
           "build", "hardware_cost_usd", "budget_usd", "objective", "violations", "feasible_exact",
           "snap", "polish", "exhaustive", "Counter", "compiled", "enable_persistent_cache", "space_size",
           "relaxed_loss", "z_to_x", "cat_grid", "OBJECTIVES", "PLAN_VARS", "CLUSTER_VARS", "MODEL_VARS",
           "CATEGORICAL_VARS", "PERMUTATION_VARS", "CATEGORICAL_MODES", "CONVERGED_LOG2", "CONVERGED_WEIGHT",
           "PENALTY_WEIGHT"]
