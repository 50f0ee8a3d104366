"""Relaxations: log2 boxes for numeric variables, softmax and Sinkhorn weights for categoricals.

Numeric variables are optimized as u in [0, 1] (projected after every step), z = lo + (hi - lo) u,
x = 2**z. A categorical (ZeRO stage, recompute, schedule, hierarchical DP) carries a logit per
option and weights softmax(logits / tau); a permutation (torus fill order, rank order) carries an
n x n logit matrix made doubly stochastic by Sinkhorn's normalization (Mena et al. 2018,
"Learning latent permutations with Gumbel-Sinkhorn networks", sec.2), and each allowed
permutation pi is weighted by prod_i P[i, pi(i)] (normalized over the allowed ones). The
relaxed loss blends the exact options' losses with those weights (an expectation over the
product distribution, so its minimum is at a one-hot vertex); tau anneals with the
sharpness, so the weights tend to one-hot, and the argmax is snapped and re-evaluated exactly.
"""

from __future__ import annotations

import itertools

import numpy as np

from dse.backend import jnp, lax, nn
from dse.engines.codesign import problem
from dse.engines.codesign.spec import PERMUTATION_VARS, Spec
from dse.evaluate import evaluate

__all__ = ["z_to_x", "u_to_z", "z_to_u", "cat_grid", "theta_size", "cat_weights", "combo_weights", "point_loss", "starts_loss", "blended_loss", "relaxed_loss",
           "SINKHORN_ITERS", "LOGIT_SCALE", "PENALTY_WEIGHT"]

PENALTY_WEIGHT = 10.0   # per unit of log-violation (linear and squared) in the relaxed loss
SINKHORN_ITERS = 20     # row/column normalizations (Mena et al. 2018 use 20)
LOGIT_SCALE = 10.0      # logits = LOGIT_SCALE * theta: Adam's steps of ~lr in theta move the weights as fast as u


def _log2_box(spec: Spec):
    """Each free variable's log2 bounds: (lo, hi)."""
    return jnp.array([v.lo for v in spec.free]), jnp.array([v.hi for v in spec.free])


def u_to_z(spec: Spec, u):
    """u in [0, 1] -> log2 value z in [lo, hi]: the optimizer's box (``z_to_u`` inverts it)."""
    lo, hi = _log2_box(spec)
    return lo + (hi - lo) * u


def z_to_u(spec: Spec, z):
    """log2 values z -> u in the box (a variable with lo = hi at 0)."""
    lo, hi = _log2_box(spec)
    return (z - lo) / jnp.where(hi > lo, hi - lo, 1.0)


def z_to_x(spec: Spec, u):
    """u in [0, 1] -> log2 value z in [lo, hi] -> x = 2**z (spec units)."""
    z = u_to_z(spec, u)
    return {v.name: jnp.exp2(z[..., i]) for i, v in enumerate(spec.free)}


def cat_grid(spec: Spec):
    """(names, combos[C, K] of Plan codes, index[C, K] of each option in its variable's list)."""
    names = list(spec.categorical)
    opts = [spec.categorical[n] for n in names]
    idx = list(itertools.product(*[range(len(o)) for o in opts])) or [()]
    index = np.array(idx, dtype=int).reshape(len(idx), len(names))
    combos = np.array([[opts[k][i] for k, i in enumerate(row)] for row in idx], dtype=float).reshape(index.shape)
    return names, combos, index


def _perm_size(name):
    return len(PERMUTATION_VARS[name][0])


def theta_size(spec: Spec) -> int:
    """Length of one start's categorical parameter vector (logits, Sinkhorn matrices)."""
    n = 0
    for name, opts in spec.categorical.items():
        n += _perm_size(name) ** 2 if name in PERMUTATION_VARS else len(opts)
    return n


def sinkhorn(log_alpha, iters=SINKHORN_ITERS):
    """Doubly-stochastic matrix from logits by alternating row and column normalization in log space.

    The iterations are a loop of the program (``lax.fori_loop``, a scan under reverse mode), not
    ``iters`` unrolled copies: fused, the unrolled normalizations compiled in 7.4 CPU-s where the
    loop takes 0.24 (tests/engines/test_codesign.py's Sinkhorn program); on the torus study's first
    case the optimizer's trace + lower went 8.1 -> 7.0 CPU-s, its compile 17.0 -> 11.8, its run 4.1 -> 2.7,
    with the same design and evaluation count."""
    def normalize(_, la):
        la = la - nn.logsumexp(la, axis=-1, keepdims=True)
        return la - nn.logsumexp(la, axis=-2, keepdims=True)

    return lax.fori_loop(0, iters, normalize, log_alpha)


def cat_weights(spec: Spec, theta, tau):
    """Per categorical variable, its options' weights (each sums to 1 over the last axis) of
    ``theta[..., P]``: one start's parameters, or a batch of them (no vmap: in numpy on the host)."""
    out, at = [], 0
    for name, opts in spec.categorical.items():
        if name in PERMUTATION_VARS:
            a = _perm_size(name)
            th = theta[..., at:at + a * a]
            logp = sinkhorn(LOGIT_SCALE * th.reshape(th.shape[:-1] + (a, a)) / tau)
            perms = np.array([PERMUTATION_VARS[name][int(c)] for c in opts])      # [options, a]
            score = jnp.sum(logp[..., np.arange(a)[None, :], perms], axis=-1)    # log prod_i P[i, pi(i)]
            out.append(nn.softmax(score))
            at += a * a
        else:
            out.append(nn.softmax(LOGIT_SCALE * theta[..., at:at + len(opts)] / tau))
            at += len(opts)
    return out


def combo_weights(spec: Spec, theta, tau, index):
    """Weight of every combination (the last axis): the product of its options' weights."""
    w = jnp.ones(index.shape[0])
    for k, wk in enumerate(cat_weights(spec, theta, tau)):
        w = w * wk[..., index[:, k]]
    return w


def point_loss(spec: Spec, model, cluster, fid, budget, u, cat_vals, k):
    """log(objective) + penalty of relaxed points (u[..., vars]) with fixed categorical codes (cat_vals[..., K]).

    ``evaluate`` broadcasts, so a batch of points is one trace (no vmap)."""
    x = z_to_x(spec, u)
    cats = {n: cat_vals[..., i] for i, n in enumerate(spec.categorical)}
    m, c, p = problem.build(spec, model, cluster, x, cats, exact=False, fid=fid)
    r = evaluate(m, c, p, fid, sharpness=k, network_cost=False)     # the objective prices the network itself
    val, cost = problem.objective(spec, m, c, p, r, sharpness=k, report_priced=False,
                                  cost=problem.penalty_reads_cost(spec))
    # a budget the optimizer projects onto (compiled.py) is held exactly, not penalized
    viol = problem.violations(spec, m, c, p, r, cost, budget, with_budget=not problem.projects_budget(spec))
    return jnp.log(val) + PENALTY_WEIGHT * problem.relaxed_penalty(viol)


def relaxed_loss(spec: Spec, model, cluster, u, cat_vals, k, fid=None, budget=None):
    """The relaxed loss at fixed categorical codes (``search.categorical = "starts"``, and tests)."""
    fid = spec.fidelity if fid is None else fid
    budget = spec.budget_usd if budget is None else budget
    return point_loss(spec, model, cluster, fid, budget, u, cat_vals, k)


def starts_loss(spec: Spec, model, cluster, fid, budget, u, theta, k, tau, combos, index):
    """``blended_loss`` of every start at once: u[S, vars], theta[S, P] -> loss[S]. Every (start, option)
    pair is one row of a single broadcast ``evaluate`` (one trace, no vmap: the program that is
    differentiated is the evaluation of one flat batch)."""
    S, C = u.shape[0], combos.shape[0]
    losses = point_loss(spec, model, cluster, fid, budget, jnp.repeat(u, C, 0), jnp.tile(combos, (S, 1)), k)
    return jnp.sum(combo_weights(spec, theta, tau, index) * losses.reshape(S, C), axis=-1)


def blended_loss(spec: Spec, model, cluster, fid, budget, u, theta, k, tau, combos, index):
    """Sum over categorical combinations of weight x loss (each option's exact ``evaluate``, one
    broadcast batch of the combinations)."""
    u_rows = jnp.broadcast_to(u, (combos.shape[0],) + jnp.shape(u))
    losses = point_loss(spec, model, cluster, fid, budget, u_rows, combos, k)
    return jnp.sum(combo_weights(spec, theta, tau, index) * losses)
