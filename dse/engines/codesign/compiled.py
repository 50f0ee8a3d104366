"""Compiled functions of a spec: one trace per spec, model, cluster, budget and learning rate as arguments.

The optimizer (vmapped Adam in one ``lax.scan``), the exact batch objective (snap, polish,
exhaustive search, the baseline) and the exact single-point evaluation (the reported designs)
close over the spec's static parts only, so every (model, cluster, budget) case of a spec and
every identical rerun reuses them (issue 13: closing over model and cluster recompiled
``run_all`` for every case). Each program goes through dse's compiled-program cache
(dse/engines/compiled.py ``load_or_compile``): in memory, else a serialized executable in the
cache directory (a later process neither traces, lowers nor compiles it), else traced and
compiled and saved there; ``DSE_CACHE_DIR=off`` keeps them in this process only.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax

from dse.backend import jnp
from dse.engines.codesign import problem, relax
from dse.engines.codesign.spec import Spec
from dse.engines.compiled import COMPILE_FIRST
from dse.equations import steps
from dse.evaluate import evaluate

__all__ = ["compiled", "static_key", "enable_persistent_cache", "cache_dir", "Program"]

_CACHE: dict = {}


def static_key(spec: Spec):
    """What a trace depends on: the spec less its models, clusters, budgets' values, seed and learning
    rate (arguments of the programs), with its fidelity's values (constants of the programs)."""
    s = dataclasses.replace(spec, models=(), clusters=(), budgets=(), budget_usd=float(spec.budget_usd > 0),
                            fidelity=None, seed=0, exhaustive_max=0, polish=0, baseline=False, lr=0.0)
    return repr(s) + repr(_fid_values(spec.fidelity)) + repr(_topology(spec))


def _topology(spec: Spec):
    """The topology code every cluster of the spec shares, a constant of its programs (a cluster
    that is concretely not a torus leaves the torus terms untraced: ``steps.never``); None when
    the clusters differ (it stays an argument)."""
    codes = {float(np.asarray(c.topology)) for _, c in spec.clusters}
    return codes.pop() if len(codes) == 1 else None


def _fid_values(fid):
    """The fidelity's knobs as numbers: part of a program's key, since the optimizer's program holds
    them as constants (a switch such as ``real_shapes`` then traces one branch, not a blend of both)."""
    return tuple(np.asarray(x).tolist() for x in jax.tree_util.tree_leaves(fid))


def compiled(spec: Spec) -> "Compiled":
    key = static_key(spec)
    if key not in _CACHE:
        _CACHE[key] = Compiled(dataclasses.replace(spec, budget_usd=float(spec.budget_usd > 0)))
    return _CACHE[key]


def cache_dir():
    """Where co-design's compiled code is kept: dse's one cache directory (dse/engines/compiled.py:
    $DSE_CACHE_DIR, "off" or "" for none, else $XDG_CACHE_HOME/dse or ~/.cache/dse), its xla/ folder."""
    from dse.engines import compiled as shared

    root = shared.cache_dir()
    return None if root is None else str(root / "xla")


def enable_persistent_cache(path: str | None = None):
    """Keep compiled XLA code on disk (JAX's persistent compilation cache, the one dse/engines/compiled.py
    switches on): a rerun of a spec in a new process loads its functions instead of compiling them.
    With DSE_CACHE_DIR=off nothing is written (it was written to a folder named "off")."""
    if path is None:
        from dse.engines import compiled as shared

        shared.enable_persistent_cache()
        return
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# The budget (a hardware cost cap) is a constraint the optimizer projects onto, not a penalty: a steep
# hinge across the budget line beside a shallow objective along it made Adam creep along the valley
# and the best starts on a budget line end unconverged (issue 13). The gradient loses its outward
# normal part where the budget is active (within BUDGET_ACTIVE in log cost), and before every step a
# Newton step along the cost's gradient brings an over-budget start back onto the line (one cost
# gradient a step: the cost model is a seventh of the loss's trace).
BUDGET_ACTIVE = 1e-3
RESTORE_MAX = 0.25   # largest restoring move, in units of the [0, 1] box (on a flat tread of the cost)

ANNEAL_SHARE = 0.6   # the sharpness anneals over this share of the steps, then holds at its final value


def anneal_steps(T: int) -> int:
    return max(1, int(round(ANNEAL_SHARE * T)))


# XLA:CPU options of the optimizer's program. It runs 200 steps of a few hundred points: its
# compile time is what counts (dse/engines/compiled.py COMPILE_FIRST). The exact programs keep
# XLA's defaults (the exhaustive search runs millions of points). Nor does it hoist loop-invariant
# code out of the scan (while-loop-invariant-code-motion): on ratio_dense's first case the compile
# goes 13.5 -> 8.0 CPU-s, the run stays 0.33-0.36 s (the scan's invariants are few: model and
# cluster enter every step's loss).
OPTIMIZER_OPTIONS = {**COMPILE_FIRST, "xla_disable_hlo_passes": "while-loop-invariant-code-motion"}
# The optimizer runs on the CPU wherever JAX sees an accelerator too: its work (a few dozen starts x a
# few hundred steps of scalar equations) is microseconds a step, and XLA:GPU compiles it far slower.
# On an H200 machine (16 CPUs, jax 0.11.2, ratio_dense's first case, benchmarks/codesign_first_case.py):
# compile 23.5 CPU-s (13.9 wall) for the GPU against 8.5 (4.5) for its CPU (that XLA:CPU has no classic
# emitters; 2.1 (1.85) on a 2-core machine with jax 0.10.2), run 0.04 s on the GPU, 0.14 on the CPU.
OPTIMIZER_PLATFORM = "cpu"


def _avals(args):
    """What a compiled program's inputs are: the pytree structure and each leaf's shape and dtype."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    return str(tree), tuple((x.shape, x.dtype.name) for x in leaves)


def _plain(x):
    """``x`` as a numpy array of the dtype jax.numpy would give it (64-bit only under x64), built on
    the host: ``np.asarray(jnp.asarray(x))`` ran an eager device op per input (57 of them, 0.2 CPU-s
    of a warm first case)."""
    a = np.asarray(x)
    return a.astype(jax.dtypes.canonicalize_dtype(a.dtype), copy=False)


class Program:
    """A function compiled once per input structure (shapes, dtypes) through dse's compiled-program
    cache (dse/engines/compiled.py): memory, then disk, then trace + lower + compile. Inputs are passed
    as plain arrays (no weak types), so a loaded executable accepts the same arguments as a fresh one.
    ``compiles`` counts the programs this object built or loaded (tests: one per spec and shape)."""

    def __init__(self, fun, key, options=None, platform=None):
        self.fun, self.key, self.options, self.platform = fun, key, options, platform
        self.programs: dict = {}

    @property
    def compiles(self):
        return len(self.programs)

    def __call__(self, *args):
        from dse.engines.compiled import compile_lowered, load_or_compile

        args = jax.tree_util.tree_map(_plain, args)
        sig = _avals(args)
        if sig not in self.programs:
            def build():
                return compile_lowered(self.lower(*args), self.compile_options())
            self.programs[sig] = load_or_compile(self.key + sig + (repr(self.compile_options()),), build,
                                                 self.devices())
        return self.programs[sig](*args)

    def devices(self):
        """The one device the program runs on: the first of ``platform``'s, else of JAX's default backend."""
        return (jax.devices(self.platform) if self.platform else jax.devices())[:1]

    def compile_options(self):
        """``options`` where that device is a CPU (compiled.cpu_options), else XLA's defaults (None)."""
        from dse.engines.compiled import cpu_options

        return cpu_options(self.options, self.devices()[0].platform)

    def lower(self, *args):
        """The program traced and lowered for ``devices()`` (placed there when ``platform`` names one)."""
        if not self.platform:
            return jax.jit(self.fun).lower(*args)
        place = jax.sharding.SingleDeviceSharding(self.devices()[0])
        return jax.jit(self.fun, in_shardings=place, out_shardings=place).lower(*args)


class Compiled:
    """The jitted functions of one static spec (``compiled(spec)`` caches them): the optimizer
    (``run_all``), the exact batch objective with every input and report (``exact_full``: snap,
    polish, the baseline and the reported designs call its function on the host, in numpy;
    discrete.Counter) and the values-only exact batch (``exact``: an exhaustive search past
    discrete.HOST_POINTS, whose program is its own, so its time includes its compile)."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.names, self.combos, self.index = relax.cat_grid(spec)
        key = static_key(spec)
        self.run_all = Program(self._run_all, ("codesign", "run_all", key), OPTIMIZER_OPTIONS, OPTIMIZER_PLATFORM)
        self.exact = Program(self._exact, ("codesign", "exact", key))
        self.exact_full = Program(self._exact_full, ("codesign", "exact_full", key))

    def _fid(self):
        """The spec's fidelity as constants of the programs (static_key holds its values)."""
        return jax.tree_util.tree_map(np.asarray, self.spec.fidelity)

    def _cluster(self, cluster):
        """``cluster`` with the spec's topology as a constant (static_key holds it), when its clusters share one."""
        t = _topology(self.spec)
        return cluster if t is None else cluster.replace(topology=np.asarray(t))

    # -------------------------------------------------------------- the optimizer

    def _run_all(self, model, cluster, budget, lr, seed, cats, ks, taus):
        """Projected Adam over (u, theta) of every start; returns the end point, the history (loss,
        u, categorical weights and log(cost / cap) before each step, -inf without a projected budget)
        and the categorical weights at the end (at the last temperature).

        The starts are drawn here, from ``seed``: u uniform in the box, theta 0.05 N(0, 1). Drawn by
        eager ``jax.random`` outside the program, they compiled ~0.7 CPU-s of ops in every process's
        first case (issue 13); the uniform draws are the same bits, the normal ones within an ulp.
        The end weights are computed here too (they were an eager vmap of Sinkhorn).

        The starts are independent, so the gradient of the sum of their losses is each start's own
        gradient: one reverse pass through one broadcast ``evaluate`` of every (start, option) row
        (``relax.starts_loss``), not a vmap of per-start gradients (a third of the trace and compile)."""
        spec = self.spec
        fid = self._fid()
        cluster = self._cluster(cluster)
        T = ks.shape[0]
        relaxed = spec.categorical_mode == "relax" and len(spec.categorical) > 0
        combos, index = jnp.asarray(self.combos), self.index

        def per_start(params, k, tau):
            if relaxed:
                return relax.starts_loss(spec, model, cluster, fid, budget, params["u"], params["theta"], k, tau,
                                         combos, index)
            return relax.point_loss(spec, model, cluster, fid, budget, params["u"], cats, k)

        def total(params, k, tau):
            loss = per_start(params, k, tau)
            return jnp.sum(jnp.where(jnp.isfinite(loss), loss, 0.0)), loss

        grad = jax.grad(total, has_aux=True)
        # the step size decays (cosine) to 1% so each start settles while the sharpness rises
        opt = optax.adam(optax.cosine_decay_schedule(lr, T, alpha=0.01))
        key_u, key_t = jax.random.split(jax.random.PRNGKey(seed))
        S = spec.starts
        params0 = {"u": jax.random.uniform(key_u, (S, len(spec.free))),
                   "theta": 0.05 * jax.random.normal(key_t, (S, relax.theta_size(spec)))}
        state = opt.init(params0)

        project = problem.projects_budget(spec)

        def over(u, k):
            """log(cost / cap) of every start and its gradient in u (the cost depends on the hardware only)."""
            f = lambda uu: problem.log_over_budget(spec, cluster, relax.z_to_x(spec, uu), budget, k)  # noqa: E731
            c, vjp = jax.vjp(f, u)
            return c, vjp(jnp.ones_like(c))[0]

        def restore(u, c, gc):
            """Back toward the budget line along the cost's gradient (a Newton step on log cost = log cap),
            at most RESTORE_MAX of the box; starts within the budget do not move."""
            d = (steps.relu(c) / (jnp.sum(gc * gc, -1) + 1e-12))[:, None] * gc
            d = d * jnp.minimum(1.0, RESTORE_MAX / (jnp.linalg.norm(d, axis=-1, keepdims=True) + 1e-30))
            return jnp.clip(u - d, 0.0, 1.0)

        def tangent(g, c, gc):
            """The gradient less its outward normal part where the budget is active (gradient projection):
            Adam's moments then see only moves along the budget line."""
            gn = jnp.sum(g * gc, -1)
            active = (c > -BUDGET_ACTIVE) & (gn < 0)
            return g - jnp.where(active, gn / (jnp.sum(gc * gc, -1) + 1e-12), 0.0)[:, None] * gc

        def body(carry, kt):
            params, s = carry
            k, tau = kt
            c = jnp.full(params["u"].shape[:1], -jnp.inf)
            if project:   # one cost gradient a step: restore, then project the loss's gradient with it
                c, gc = over(params["u"], k)
                params = {"u": restore(params["u"], c, gc), "theta": params["theta"]}
            g, loss = grad(params, k, tau)
            g = jax.tree_util.tree_map(lambda a: jnp.where(jnp.isfinite(a), a, 0.0), g)
            if project:
                g = {"u": tangent(g["u"], c, gc), "theta": g["theta"]}
            upd, s = opt.update(g, s, params)
            new = optax.apply_updates(params, upd)
            # projected Adam: the box [lo, hi] holds optima at a bound exactly (pp = 1, mbs = 1), and a
            # budget by projection onto its line (a start on the line stays on it)
            new = {"u": jnp.clip(new["u"], 0.0, 1.0), "theta": new["theta"]}
            return (new, s), (loss, params["u"], weights(params["theta"], tau), c)

        def weights(theta, tau):
            return (jnp.concatenate(relax.cat_weights(spec, theta, tau), axis=-1) if spec.categorical
                    else jnp.zeros(theta.shape[:-1] + (0,)))

        (params, _), (hist, us, ws, cs) = jax.lax.scan(body, (params0, state), (ks, taus))
        return params, hist, us, ws, cs, weights(params["theta"], taus[-1])

    # -------------------------------------------------------------- exact evaluation

    def _exact_full(self, model, cluster, budget, xs, cats, reported=True):
        """A batch of allowed points, exactly: (value, inf where infeasible), then (model, cluster,
        plan, report, value, cost, feasible) of every point. ``reported``: the reports carry the
        network's cost and power (``evaluate``'s network_cost) even where the objective does not
        price the network, as a reported design shows them."""
        spec = self.spec
        fid = self._fid()
        cluster = self._cluster(cluster)
        cd = {n: cats[..., i] for i, n in enumerate(spec.categorical)}
        m, c, p = problem.build(spec, model, cluster, xs, cd, exact=True, fid=fid)
        r = evaluate(m, c, p, fid, network_cost=reported or spec.network_cost)
        val, cost = problem.objective(spec, m, c, p, r)
        ok = problem.feasible_exact(spec, m, c, p, r, cost, budget)
        return jnp.where(ok, val, jnp.inf), (m, c, p, r, val, cost, ok)

    def _exact(self, model, cluster, budget, xs, cats):
        """Exact objective (inf where infeasible) of a batch of allowed points."""
        return self._exact_full(model, cluster, budget, xs, cats, reported=False)[0]
