"""The non-gradient baseline: many random allowed points, then discrete local search from the best.

Random multistart with greedy local search (the polish of ``discrete.polish``) under a fixed
budget of exact evaluations: the check that the gradient path earns its gradients on a space
too large to enumerate (issue 13: at least as good at 1/10 of the baseline's evaluations).
"""

from __future__ import annotations

import numpy as np

from dse.engines.codesign import discrete, relax
from dse.engines.codesign.spec import Spec

__all__ = ["random_local_search"]


def random_local_search(spec: Spec, model, cluster, max_evaluations: int, sample_share=0.5):
    """Half the budget on uniform random allowed points, the rest on local search from the best
    distinct ones in turn. Returns (idx, cat, value, evaluations used)."""
    rng = np.random.default_rng(spec.seed + 1)
    ev = discrete.Counter(spec, model, cluster)
    _, combos, _ = relax.cat_grid(spec)
    sizes = np.array([len(v.values) for v in spec.free])
    n0 = max(1, int(max_evaluations * sample_share))
    idx = rng.integers(0, sizes, size=(n0, len(sizes))) if len(sizes) else np.zeros((n0, 0), int)
    cat = combos[rng.integers(0, len(combos), size=n0)]
    vals = ev(idx, cat)
    best = (None, None, np.inf)
    for j in np.argsort(vals):
        if not np.isfinite(vals[j]) or ev.n >= max_evaluations:
            break
        pi, pc, pv, _, _ = discrete.polish(spec, idx[j], cat[j], float(vals[j]), ev)
        if pv < best[2]:
            best = (pi, pc, pv)
    return best[0], best[1], best[2], ev.n
