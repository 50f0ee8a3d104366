"""Invariants of evaluate (hypothesis) and its transforms: vmap, jit, float32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import dse
from dse.engines.compiled import COMPILE_FIRST, compile_lowered
from dse.inputs import presets

MODELS = ["gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "megatron-1t"]
pow2 = lambda lo, hi: st.sampled_from([2.0 ** k for k in range(lo, hi + 1)])  # noqa: E731

plans = st.fixed_dictionaries({
    "tp": pow2(0, 4), "pp": pow2(0, 4), "cp": pow2(0, 1), "mbs": pow2(0, 2),
    "gbs": pow2(6, 11), "zero": st.sampled_from([0.0, 1.0, 2.0, 3.0]),
    "recompute": st.sampled_from([0.0, 1.0, 2.0]), "vpp": st.sampled_from([1.0, 2.0]),
    "sp": st.sampled_from([0.0, 1.0]),
})
clusters = st.fixed_dictionaries({"gpus": pow2(6, 12), "domain": pow2(2, 6)})
SETTINGS = settings(max_examples=25, deadline=None)


def _inputs(name, p, c):
    model = presets.load_model(name)
    cluster = presets.load_cluster("seed").replace(gpus=c["gpus"], domain=c["domain"])
    ep = 8.0 if name == "mixtral-8x7b" and c["gpus"] / (p["tp"] * p["pp"] * p["cp"]) >= 8 else 1.0
    return model, cluster, dse.Plan.make(ep=ep, **p)


# float32 as one compiled program, compiled compile-first (dse/engines/compiled.py COMPILE_FIRST: no
# fusion, O0; 7 -> 2 CPU-s for the hypothesis examples, one compile): this test is the program's precision,
# and the sweep kernel's float32 under XLA's default options is checked against float64 at every
# feasible point by tests/engines/test_sweep.py.
_F32: dict = {}


def _jitted(model, cluster, plan):
    """``evaluate`` in float32 as a sweep builds it: model and plan traced, the cluster's swept fields
    (gpus, domain) traced and its other fields and the seed fidelity float32 constants (their
    arithmetic folded on the host in float32: dse/backend.py ``folding``). With every field traced
    the program held every topology's terms and compiled in 4.7 CPU-s against 3.0."""
    args = (model, cluster.gpus, cluster.domain, plan)
    leaves, tree = jax.tree_util.tree_flatten(args)
    fixed = cluster.replace(gpus=0.0, domain=0.0)   # the constants are part of the program
    sig = (tree, tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves),
           tuple(np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(fixed)))
    if sig not in _F32:
        const = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), cluster)
        fid = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), dse.Fidelity.seed())
        run = jax.jit(lambda m, g, u, p: dse.evaluate(m, const.replace(gpus=g, domain=u), p, fid))
        _F32[sig] = compile_lowered(run.lower(*args), COMPILE_FIRST)
    return _F32[sig](*args)


_host = dse.evaluate   # concrete inputs: numpy float64 (dse/backend.py host_when_concrete), no compile
# The four ZeRO stages as one broadcast plan axis: one host evaluation where a loop made four (each
# call's cost is its ~2,500 numpy ops, not the points; broadcast = loop is test_broadcast_grid_equals_loop's)
ZEROS = np.array([0.0, 1.0, 2.0, 3.0])


def _close(a, b, rtol):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=rtol, atol=0)


def _draws(n, seed=0):
    """``n`` random (model, plan, cluster) drawn from the same values as ``plans`` and ``clusters``."""
    rng = np.random.default_rng(seed)
    two = lambda lo, hi: 2.0 ** rng.integers(lo, hi + 1)  # noqa: E731
    return [(MODELS[i % len(MODELS)],
             {"tp": two(0, 4), "pp": two(0, 4), "cp": two(0, 1), "mbs": two(0, 2), "gbs": two(6, 11),
              "zero": float(rng.integers(0, 4)), "recompute": float(rng.integers(0, 3)),
              "vpp": float(rng.integers(1, 3)), "sp": float(rng.integers(0, 2))},
             {"gpus": two(6, 12), "domain": two(2, 6)}) for i in range(n)]


def test_jit_and_vmap_equal_the_host():
    # one jit(vmap(evaluate)) over 36 random plans of the six models (one compile) against the host
    # evaluation of each (numpy float64, the same equations): jit, vmap and a batch change no number.
    # Compiled compile-first (COMPILE_FIRST: XLA's simplification passes run, fusion does not; 9.2 -> 2.5
    # CPU-s of compile): fusion emits the same IEEE ops; every op under XLA's default options is checked
    # bit for bit by tests/engines/test_compiled.py, the default-compiled float32 kernel by test_sweep.
    ms, cs, ps = zip(*[_inputs(*d) for d in _draws(36)])
    args = (dse.stack(ms), dse.stack(cs), dse.stack(ps))
    batched = compile_lowered(jax.jit(jax.vmap(dse.evaluate)).lower(*args), COMPILE_FIRST)(*args)
    batched = jax.tree_util.tree_map(np.asarray, batched)   # rows read in numpy (no eager jax op a field)
    for i in range(len(ms)):
        _close(jax.tree_util.tree_map(lambda x: x[i], batched), _host(ms[i], cs[i], ps[i]), 1e-12)


@SETTINGS
@given(st.sampled_from(MODELS), plans, clusters)
def test_memory_never_rises_with_zero_stage(name, p, c):
    m, cl, pl = _inputs(name, p, c)
    assume(c["gpus"] >= p["tp"] * p["pp"] * p["cp"])   # d >= 1: ZeRO shards over whole ranks
    mems = list(np.broadcast_to(_host(m, cl, pl.replace(zero=ZEROS)).memory_bytes, (4,)))
    assert all(b <= a * (1 + 1e-12) for a, b in zip(mems, mems[1:])), mems


@SETTINGS
@given(st.sampled_from(MODELS), plans, clusters)
def test_p1_has_no_bubble(name, p, c):
    m, cl, pl = _inputs(name, p, c)
    r = _host(m, cl, pl.replace(pp=1.0, vpp=1.0))
    assert float(r.bubble_fraction) == 0.0 and float(r.bubble_s) == 0.0
    assert float(r.traffic_bytes.pp) == 0.0


@SETTINGS
@given(st.sampled_from(MODELS), plans)
def test_d1_makes_zero_stages_equal(name, p):
    # ZeRO shards over d ranks; with d = 1 there is nothing to shard.
    model = presets.load_model(name)
    gpus = p["tp"] * p["pp"] * p["cp"]
    cluster = presets.load_cluster("seed").replace(gpus=gpus)
    pl = dse.Plan.make(**p)
    mems = set(np.broadcast_to(_host(model, cluster, pl.replace(zero=ZEROS)).memory_bytes, (4,)).tolist())
    assert len(mems) == 1, mems


@SETTINGS
@given(st.sampled_from(MODELS), plans, clusters)
def test_float32_close_to_float64(name, p, c):
    # The whole program in float32 (traced inputs and float32 constants; no float64 constant promotes
    # it: Inputs.replace keeps a float array's dtype) against the float64 host evaluation. Every
    # input traced, in float64, is test_jit_and_vmap_equal_the_host's.
    m, cl, pl = _inputs(name, p, c)
    f32 = lambda t: jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), t)  # noqa: E731
    r64 = _host(m, cl, pl)
    r32 = _jitted(f32(m), f32(cl), f32(pl))
    for field in ("step_s", "memory_bytes", "compute_s", "mfu", "tokens_per_s"):
        assert getattr(r32, field).dtype == jnp.float32, field
        np.testing.assert_allclose(float(getattr(r32, field)), float(getattr(r64, field)), rtol=1e-5)
    assert int(r32.reasons) == int(r64.reasons)


def test_broadcast_grid_equals_loop():
    # Sweeps call evaluate on arrays that broadcast against each other, one axis each.
    model = presets.load_model("llama3-70b")
    cluster = presets.load_cluster("dgx-h100")
    tps = jnp.array([1.0, 2.0, 4.0, 8.0])[:, None]
    pps = jnp.array([1.0, 2.0, 4.0])[None, :]
    grid = dse.evaluate(model, cluster, dse.Plan.make(tp=tps, pp=pps, mbs=1, gbs=512))
    assert grid.step_s.shape == (4, 3)
    for i, t in enumerate([1, 2, 4, 8]):
        for j, p in enumerate([1, 2, 4]):
            one = dse.evaluate(model, cluster, dse.Plan.make(tp=t, pp=p, mbs=1, gbs=512))
            assert float(grid.step_s[i, j]) == pytest.approx(float(one.step_s), rel=1e-12)
            assert int(grid.reasons[i, j]) == int(one.reasons)


_cal = lambda m, c, p: dse.evaluate(m, c, p, "calibrated")  # noqa: E731  (numpy: no compile)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["llama3-8b", "mixtral-8x7b", "gpt3-175b"]), plans, clusters)
def test_calibrated_memory_never_rises_with_zero_stage(name, p, c):
    # Issue 17: with local gradient accumulation ZeRO-2 used to equal ZeRO-1; now it shards
    # gradients (reduce-scatter every microbatch), and no stage holds more model state than the one
    # before. (The total may: ZeRO-3 adds its gathered units, memory.zero3_gather_bytes, and with
    # local accumulation keeps ZeRO-1's unsharded gradients, so ZeRO-3 can exceed ZeRO-2.)
    m, cl, pl = _inputs(name, p, c)
    assume(c["gpus"] >= p["tp"] * p["pp"] * p["cp"])
    r = _cal(m, cl, pl.replace(zero=ZEROS))
    mems = list(np.broadcast_to(r.weights_bytes + r.grads_bytes + r.optimizer_bytes, (4,)))
    assert all(b <= a * (1 + 1e-12) for a, b in zip(mems, mems[1:])), mems
    # without ZeRO-3's buffers the total never rises either
    rest = list(np.broadcast_to(r.memory_bytes - r.dp_buffer_bytes - r.fragmentation_bytes, (4,)))
    assert all(b <= a * (1 + 1e-12) for a, b in zip(rest, rest[1:])), rest


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])   # pp > 2 | L is rare
@given(st.sampled_from(MODELS), plans, clusters)
def test_even_split_options_change_nothing(name, p, c):
    # An explicit split equal to the even one (first = last = L/p) gives the even plan's compute.
    m, cl, pl = _inputs(name, p, c)
    L = float(m.layers)
    assume(p["pp"] > 2 and L % p["pp"] == 0 and p["vpp"] == 1.0)
    even = _cal(m, cl, pl)
    split = _cal(m, cl, pl.replace(first_stage_layers=L / p["pp"], last_stage_layers=L / p["pp"]))
    assert float(split.compute_s) == pytest.approx(float(even.compute_s), rel=1e-9)
    assert float(split.memory_bytes) == pytest.approx(float(even.memory_bytes), rel=1e-9)
