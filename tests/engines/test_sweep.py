"""The sweep engine: reductions equal brute force, and do not depend on chunks, devices or interruptions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dse.engines.sweep as sw
from dse.engines.compiled import evaluate_exact
from dse.engines.host import numpy_mode
from dse.cli import main
from dse.report import REASONS

ROOT = Path(__file__).resolve().parents[2]

# 2*4*4*2*2*2*2 = 512 plans of Llama 3 8B on the seed cluster: feasible and infeasible ones
# (batch and GPU divisibility, memory), several ties (ZeRO stages whose DP time hides).
SMALL = dict(model="llama3-8b", cluster="seed", plan={"gbs": 128},
             axes={"gpus": [64, 96], "tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8], "mbs": [1, 2],
                   "gbs": [128, 256], "zero": [0, 3], "recompute": ["none", "full"]},
             top_k=7, pareto=("step_s", "memory_bytes"))


def small_spec(**over):
    return sw.SweepSpec.make(**{**SMALL, **over})


def summary(r):
    """What must not depend on chunking, devices or interruptions: counts, the chosen plans
    and their (float64) figures. The float32 values the sweep ranks by may differ in the
    last bit between chunk layouts (XLA fuses each layout differently); ``sweep_value`` is
    compared to 1e-6 by ``close``."""
    return {"counts": [r.points, r.done, r.feasible, r.infeasible_by_reason],
            "top": [(t["index"], t["step_s"]) for t in r.top],
            "pareto": [(t["index"], t["step_s"], t["memory_bytes"]["total"]) for t in r.pareto]}


def close(a, b):
    """Same plans, float32 sweep values within 1e-6 (relative)."""
    va = np.array([t["sweep_value"] for t in a.top + a.pareto], dtype=object)
    vb = np.array([t["sweep_value"] for t in b.top + b.pareto], dtype=object)
    return all(np.allclose(x, y, rtol=1e-6, atol=0) for x, y in zip(va, vb)) and len(va) == len(vb)


@pytest.fixture(scope="module")
def dumped():
    """The small sweep with every point's outputs kept, by the compiled kernel (the ground truth
    of its reductions, and what the host engine's results are compared with)."""
    spec = small_spec(dump=True)
    return spec, sw.run_sweep(spec, chunk_points=37, engine="xla")   # chunk 37: the resume test's kernel


@pytest.fixture(autouse=True, params=["xla", "host"])
def engine(request, monkeypatch):
    """Each test twice: run_sweep's "auto" on the compiled kernel (as above HOST_POINTS) and on
    the host (numpy, float64: small grids like these)."""
    if request.param == "xla":
        monkeypatch.setattr(sw.run, "HOST_POINTS", 0)
        monkeypatch.setattr(sw.run, "HOST_PARETO3_POINTS", 0)
    return request.param


# The tests that read only ``dumped`` (built by the compiled kernel whatever the engine), or run
# in a subprocess, run once: on the "host" engine they repeated the same work and checks.
ONCE = pytest.mark.parametrize("engine", ["xla"], indirect=True)


@ONCE
def test_reductions_equal_the_dump(dumped):
    spec, r = dumped
    d = r.dump
    assert len(d["index"]) == spec.points == r.points == r.done
    assert np.array_equal(d["index"], np.arange(spec.points))
    feasible = d["reasons"] == 0
    assert r.feasible == int(feasible.sum()) and 0 < r.feasible < r.points
    for k, (name, _) in enumerate(REASONS):
        assert r.infeasible_by_reason[name] == int(((d["reasons"] >> k) & 1).sum())
    # top-K: sorted by (value, index) over the feasible points, exactly
    idx = np.flatnonzero(feasible)
    order = np.lexsort((idx, d["step_s"][idx]))[: spec.top_k]
    assert [t["index"] for t in r.top] == idx[order].tolist()
    # Pareto: the O(n^2) definition (no point at least as good everywhere and better
    # somewhere; of equal points the first) over the same float32 values
    F = np.stack([d["step_s"][idx], d["memory_bytes"][idx]], axis=1).astype(np.float64)
    ref = []
    for i in range(len(idx)):
        le = np.all(F <= F[i], axis=1)
        lt = np.any(F < F[i], axis=1)
        same = np.all(F == F[i], axis=1) & (idx < idx[i])
        if not np.any((le & lt) | same):
            ref.append(int(idx[i]))
    assert sorted(t["index"] for t in r.pareto) == sorted(ref)
    assert len(ref) >= 3


@ONCE
def test_best_equals_a_loop_over_evaluate(dumped):
    """Brute force: evaluate each plan on its own (float64) and take the fastest feasible one.
    The plans are the rows of one flat batch (each row its own plan, elementwise: no grid
    broadcasting, chunking or reduction of the sweep's), evaluated by ``evaluate_exact`` (the
    same equations by numpy in float64, bit for bit the compiled float64 program:
    tests/engines/test_compiled.py), so no float64 program is compiled."""
    spec, r = dumped
    coords = np.unravel_index(np.arange(spec.points), spec.sizes)
    arrays = {a.name: np.asarray(a.values, np.float64)[j] for a, j in zip(spec.axes, coords)}
    with numpy_mode():
        model, cluster, plan = sw._inputs(spec, arrays, np.float64)
    rep = evaluate_exact(model, cluster, plan, "seed")
    steps = np.where(rep.reasons == 0, rep.step_s, np.inf)
    best = int(np.argmin(steps))
    assert r.best["index"] == best
    assert r.best["step_s"] == steps[best]
    assert r.feasible == int(np.isfinite(steps).sum())
    # float32 sweep against float64 evaluation, every feasible point: relative error < 1e-5
    # (float32 has a 6e-8 unit roundoff; the model chains a few hundred operations)
    ok = np.isfinite(steps)
    rel = np.abs(r.dump["step_s"][ok] - steps[ok]) / steps[ok]
    assert rel.max() < 1e-5
    for row in r.top + r.pareto:
        assert abs(row["step_s"] - (row["sweep_value"] if np.isscalar(row["sweep_value"]) else row["sweep_value"][0])) \
            <= 1e-5 * row["step_s"]


@pytest.mark.parametrize("chunk", [5, 4096])   # and ``dumped``'s 37 (another kernel: a full dump)
def test_same_result_for_any_chunk_size(dumped, chunk, monkeypatch):
    spec, ref = dumped
    monkeypatch.setattr(sw.run, "CAP_ROWS", 1)   # one candidate row per pass: exercises the extra passes
    r = sw.run_sweep(small_spec(), chunk_points=chunk)
    assert summary(r) == summary(ref) and close(r, ref)


@ONCE   # a subprocess: the engine fixture's monkeypatch does not reach it
@pytest.mark.slow
def test_same_result_on_four_devices(dumped):
    spec, ref = dumped
    code = ("import json, jax, sys\n"
            "sys.path.insert(0, '.')\n"
            "import tests.engines.test_sweep as t, dse.engines.sweep as sw\n"
            "assert len(jax.devices()) == 4\n"
            "out = [t.summary(sw.run_sweep(t.small_spec(), chunk_points=c)) for c in (37, 4096)]\n"
            "print(json.dumps(out))\n")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    four = json.loads(out.stdout.strip().splitlines()[-1])
    want = json.loads(json.dumps(summary(ref)))
    assert four[0] == want and four[1] == want


def test_resume_after_interruption_gives_the_same_result(tmp_path, dumped):
    spec, full = dumped     # chunk 37, as here: the same compiled kernel on both engines
    part = sw.run_sweep(spec, chunk_points=37, out_dir=tmp_path, max_chunks=4)   # "killed" after 4 chunks
    assert not part.complete and part.done == 4 * part.chunk_points
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["next_chunk"] == 4 and not (tmp_path / "top.csv").exists()
    # a second interruption, then the rest; --resume keeps the saved chunk size
    sw.run_sweep(spec, chunk_points=999, out_dir=tmp_path, resume=True, max_chunks=3)
    done = sw.run_sweep(spec, out_dir=tmp_path, resume=True)
    assert done.complete and summary(done) == summary(full)
    assert [t["step_s"] for t in done.top] == [t["step_s"] for t in full.top]
    lines = (tmp_path / "dump.csv").read_text().splitlines()
    assert len(lines) == spec.points + 1 and lines[0].startswith("index,gpus,tp")
    top = (tmp_path / "top.csv").read_text().splitlines()
    assert len(top) == spec.top_k + 1 and "step_s" in top[0]
    assert (tmp_path / "pareto.csv").exists() and (tmp_path / "result.json").exists()
    with pytest.raises(sw.InputError, match="different sweep"):
        sw.run_sweep(small_spec(top_k=3), out_dir=tmp_path, resume=True)
    # a state whose chunks were cut otherwise (an earlier dse's rule, or none saved) is refused,
    # not resumed over other points
    for layout in ({"tile": state["tile"] + 1}, {"split": None, "tile": None}):
        sw.run_sweep(spec, chunk_points=37, out_dir=tmp_path, max_chunks=2)
        saved = json.loads((tmp_path / "state.json").read_text())
        (tmp_path / "state.json").write_text(json.dumps({**saved, **layout}))
        with pytest.raises(sw.InputError, match="another layout"):
            sw.run_sweep(spec, out_dir=tmp_path, resume=True)


def test_ties_are_broken_by_index():
    """alpha_up_us does nothing in seed mode (latency off): each plan appears eight times. The
    network axes (bw_up_GBps x alpha_up_us, 64 points) are the chunk's innermost, so the compiled
    kernel takes its top-K by cells over them (kernel._network_cells), here with the pp axis split
    one value a chunk; the host engine has every point in float64."""
    spec = small_spec(axes={"tp": [1, 2, 4, 8], "pp": [1, 2], "bw_up_GBps": [150, 300, 450, 600, 900, 1200, 1800, 3600],
                            "alpha_up_us": [0, 1, 2, 3, 4, 5, 6, 7]}, top_k=10, pareto=())
    geo = sw.kernel._Geometry.make(spec.sizes, 100)
    assert geo.dims == (1, 8, 8) and sw.kernel._network_cells(spec, geo) == (1, 2)
    a = sw.run_sweep(spec, chunk_points=100)
    b = sw.run_sweep(spec, chunk_points=1000, engine="host")   # every point in float64, the host's merges
    assert summary(a) == summary(b)
    idx = [t["index"] for t in a.top]
    vals = [t["step_s"] for t in a.top]
    assert len(set(vals[:8])) == 1 and idx[:8] == [idx[0] + k for k in range(8)]
    assert all((v, i) < (w, j) for v, i, w, j in zip(vals, idx, vals[1:], idx[1:]))


def test_kernel_axis_order_keeps_results_and_ties(monkeypatch):
    """Network axes first, gpus last: the kernel loops gpus outermost and the network innermost
    (kernel_order), and the result is the one of the sweep's own order (the host engine never reorders):
    counts, the top plans by (value, sweep index) and the Pareto front. alpha_up_us does
    nothing in seed mode, so every plan ties with two copies: ties must break by sweep index."""
    kw = dict(model="llama3-8b", cluster="seed", plan={"gbs": 256}, top_k=7, pareto=("step_s", "memory_bytes"),
              axes={"alpha_up_us": [1, 2, 3], "domain": [8, 16], "tp": [1, 2, 4, 8], "pp": [1, 2, 4],
                    "zero": [0, 3], "gpus": [64, 96]})
    spec = sw.SweepSpec.make(**kw)
    assert sw.kernel.kernel_order(spec)[0] is spec        # off by default (kernel.REORDER: slower here)
    monkeypatch.setattr(sw.kernel, "REORDER", True)
    kspec, perm = sw.kernel.kernel_order(spec)
    assert [a.name for a in kspec.axes] == ["gpus", "tp", "pp", "zero", "alpha_up_us", "domain"]
    assert perm == (5, 2, 3, 4, 0, 1)
    moved = sw.run_sweep(spec, chunk_points=50)
    own = sw.run_sweep(spec, chunk_points=50, engine="host")   # the sweep's own order, every point in float64
    assert summary(moved) == summary(own)
    # ties in sweep order: (value, index) ascending, the best plan's first copy at alpha 1,
    # domain 8, its copy at alpha 2 after those at alpha 1 (alpha is the sweep's outermost axis)
    keys = [(t["sweep_value"], t["index"]) for t in moved.top]
    assert keys == sorted(keys) and len({v for v, _ in keys}) < len(keys)
    assert moved.top[0]["point"]["alpha_up_us"] == 1 and moved.top[0]["point"]["domain"] == 8
    assert [t["point"]["alpha_up_us"] for t in moved.top[:3]] == [1, 1, 2]


@ONCE
def test_chunk_tiles_split_evenly_over_threads():
    """A chunk holds a tile of the split axis's values (kernel._Geometry), chosen for the least
    cost in points: tiles x (points of the tile, an odd tile > 1 counted as the next even one, as
    XLA:CPU runs a tile of 3 as 2 + 1 on two threads) + CHUNK_COST_POINTS a chunk; ties to the
    least padding. Worked by hand with I = 2**20 points a value and a chunk's cost I / 2, in units
    of I: 6 values with room for 5: tiles of 2 cost 3 x 2.5 = 7.5 against 9 for tiles of 1, 3 or 4;
    5 with room for 2: tiles of 1 cost 7.5 as 2 + 2 + 1 does, and pad nothing; 8 with room for 5:
    4 + 4 costs 9, tiles of 2 10; 6 with room for 6: one tile, 6.5; 7 with room for 7: one odd tile
    of 7 costs 8.5 against 9 for 4 + 4 and 10.5 for tiles of 1; 7 with room for 6: 4 + 4, 9."""
    assert sw.kernel.CHUNK_COST_POINTS == 2 ** 19
    inner = (1024, 1024)
    tile = lambda n, room: sw.kernel._Geometry.make((n,) + inner, room * 2 ** 20).tile  # noqa: E731
    assert [tile(6, 5), tile(5, 2), tile(8, 5), tile(6, 6), tile(7, 7), tile(7, 6)] == [2, 1, 4, 6, 7, 4]


@ONCE
def test_row_statistics_keep_every_front_row(monkeypatch):
    """The exact row statistics (kernel._row_stats), which the sweeps here skip (their rows are
    few, FEW_POINTS): every row holding a point of the chunk's front is a candidate, and rows
    without one are pruned (16 rows of 8 random points, half of the rows without a real point)."""
    import jax
    import jax.numpy as jnp
    monkeypatch.setattr(sw.kernel, "FEW_POINTS", 0)
    G, R = 16, 8
    rng = np.random.default_rng(0)
    f = rng.random((G, R, 2)).astype(np.float32)
    f[::2] = np.inf                                  # rows without a real point
    f[1::2, :3] = np.inf                             # and points that are not real in the others
    run = jax.jit(lambda a, b, probes: sw.kernel._pareto_candidates([(a, 1.0), (b, 1.0)], None, probes, 0, G, R, G))
    cand = run(f[..., 0], f[..., 1], jnp.full((4, 2), jnp.inf, jnp.float32))
    pts = f.reshape(-1, 2)
    idx = np.flatnonzero(np.isfinite(pts).all(1))
    front = idx[sw.kernel.pareto_mask(pts[idx], idx)]
    got = set(np.asarray(cand["par_idx"]).reshape(-1).tolist()) - {-1}
    assert set(front.tolist()) <= got
    assert {i // R for i in got} < {i // R for i in idx}    # the statistics pruned some real rows


@ONCE
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("probed", [False, True])
def test_candidates_of_figures_in_their_own_shapes(k, probed, monkeypatch):
    """The Pareto pass hands the candidate search each figure in the shape of the axes it depends on
    (kernel._row_form: rows of 4 x 2 points here, the second objective and the feasibility
    constant along the last axis) and costs them where they are read. Every point of the front
    (worked out by brute force on the broadcast figures) is in a candidate row, with and without
    probes from an earlier chunk, through the packed two-objective statistics (k = 2) and the
    general ones (k = 3); the statistics prune rows that hold feasible points (the second half's,
    worse in every objective than any point of the first)."""
    import jax
    import jax.numpy as jnp
    monkeypatch.setattr(sw.kernel, "FEW_POINTS", 0)
    G, cols = 24, (4, 2)
    rng = np.random.default_rng(1)
    figs = [rng.random((G,) + cols), rng.random((G, 4, 1)), rng.random((G, 4, 2))][:k]
    feas = rng.random((G, 4, 1)) < 0.7
    feas[:3] = False                                   # rows without a feasible point
    for f in figs:
        f[G // 2:] += 1.0                              # rows a point of the first half dominates
    figs = [f.astype(np.float32) for f in figs]
    pts = np.stack([np.broadcast_to(f, (G,) + cols).reshape(-1) for f in figs], axis=-1)
    ok = np.broadcast_to(feas, (G,) + cols).reshape(-1)
    idx = np.flatnonzero(ok)
    front = idx[sw.kernel.pareto_mask(pts[idx].astype(np.float64), idx)]
    probes = np.full((4, k), np.inf, np.float32)
    if probed:                 # known points slightly worse than two of the front's: they prune, not the front
        probes[:2] = pts[front[[0, -1]]] + 0.05
    run = jax.jit(lambda fs, fe, pr: sw.kernel._pareto_candidates([(f, 1.0) for f in fs], fe, pr, 0, G, 8, G, cols))
    cand = run(figs, feas, probes)
    got = set(np.asarray(cand["par_idx"]).reshape(-1).tolist()) - {-1}
    assert set(front.tolist()) <= got
    assert got <= set(idx.tolist())                    # only feasible points are sent
    assert max(i // 8 for i in got) < G // 2 < max(i // 8 for i in idx)
    val = np.asarray(cand["par_val"]).reshape(-1, k)[np.asarray(cand["par_idx"]).reshape(-1) >= 0]
    np.testing.assert_array_equal(val, pts[sorted(got)])   # each candidate with its own figures


@ONCE
@pytest.mark.parametrize("objective, reorder, chunk", [("step_s", False, 4096), ("step_s", True, 50), ("mfu", False, 37)])
def test_front_over_cells_equals_the_host(objective, reorder, chunk, monkeypatch):
    """Memory and feasibility do not depend on the network axes, so the kernel seeks the front
    among cells (kernel._cell_min: each cell's first point at the least step time) and, when the
    objective is step time, the top-K among the best cells. Same counts, top-K and front as the
    host engine's (every point in float64, nothing compiled). alpha_up_us does nothing in seed mode: every plan has a
    copy at equal figures, so ties break by index inside a cell and between cells (and, with the
    kernel's axes reordered, by the sweep's index)."""
    monkeypatch.setattr(sw.kernel, "REORDER", reorder)
    monkeypatch.setattr(sw.kernel, "CELL_POINTS", 1)      # cells this small do not pay: the path is exact all the same
    kw = dict(model="llama3-8b", cluster="seed", plan={"gbs": 256}, top_k=9, objective=objective,
              pareto=("step_s", "memory_bytes"),
              axes={"gpus": [64, 96], "tp": [1, 2, 4, 8], "pp": [1, 2, 4], "zero": [0, 3],
                    "bw_out_GBps": [25, 50, 100], "alpha_up_us": [1, 2], "bw_up_GBps": [300, 900]})
    spec = sw.SweepSpec.make(**kw)
    kspec = sw.kernel.kernel_order(spec)[0]
    geo = sw.kernel._Geometry.make(kspec.sizes, chunk)
    lead, T = sw.kernel.front_cells(kspec, geo, np.float32)
    assert lead == ("step_s", 1.0) and T        # cells over network axes, memory constant along them
    assert {kspec.axes[geo.split + a].name for a in T} <= {"bw_out_GBps", "alpha_up_us", "bw_up_GBps"}
    r = sw.run_sweep(spec, engine="xla", chunk_points=chunk)
    ref = sw.run_sweep(spec, engine="host")      # numpy in float64 over every point, the exact host merges
    assert r.points == ref.points and r.feasible == ref.feasible and r.infeasible_by_reason == ref.infeasible_by_reason
    assert [t["index"] for t in r.top] == [t["index"] for t in ref.top]
    assert sorted(t["index"] for t in r.pareto) == sorted(t["index"] for t in ref.pareto) and len(ref.pareto) >= 3


@ONCE
def test_outer_axis_values_are_arguments_of_one_kernel(monkeypatch):
    """Two sweeps whose outer axes (and split axis) differ only in their values share one compiled
    kernel: those values are its arguments, and the program key leaves them out (SweepSpec.fingerprint
    with ``arguments``). The second's answer is its own: the host engine's, every point in float64."""
    builds = []
    monkeypatch.setattr(sw.run, "_build_kernel", lambda *a, _f=sw.run._build_kernel: builds.append(1) or _f(*a))
    kw = dict(model="llama3-8b", cluster="seed", plan={"gbs": 256}, top_k=5, pareto=("step_s", "memory_bytes"))
    a = sw.SweepSpec.make(**kw, axes={"gpus": [64, 96], "tp": [1, 2, 4, 8], "pp": [1, 2, 4], "zero": [0, 3]})
    b = sw.SweepSpec.make(**kw, axes={"gpus": [32, 128], "tp": [1, 2, 4, 16], "pp": [1, 2, 4], "zero": [0, 3]})
    c = sw.SweepSpec.make(**kw, axes={"gpus": [64, 96], "tp": [1, 2, 4, 8], "pp": [1, 2, 4], "zero": [0, 1]})
    geo = sw.kernel._Geometry.make(a.sizes, 16)
    assert geo.split == 1 and a.fingerprint(arguments=2) == b.fingerprint(arguments=2)
    assert a.fingerprint() != b.fingerprint() and a.fingerprint(arguments=2) != c.fingerprint(arguments=2)   # inner: constants
    sw.run_sweep(a, engine="xla", chunk_points=16)
    r = sw.run_sweep(b, engine="xla", chunk_points=16)
    assert len(builds) <= 1
    ref = sw.run_sweep(b, engine="host")
    assert summary(r)["counts"] == summary(ref)["counts"]
    assert [t["index"] for t in r.top] == [t["index"] for t in ref.top]
    assert sorted(t["index"] for t in r.pareto) == sorted(t["index"] for t in ref.pareto)


def test_cell_min_orders_by_value_then_index():
    """kernel._cell_min on float32 under jit with x64 off (as a float32 sweep traces): the packed
    (value, index) int64 path and the two-key reduction give each cell's minimum and the first
    index at it, by hand: -0 equals +0 (the first of them wins), NaN counts as +inf, negatives
    order below zero, a cell of infinities keeps its first index."""
    import jax
    import jax.numpy as jnp

    from dse.engines.compiled import compile_lowered
    K = sw.kernel
    o = np.array([[3.0, 1.0, 1.0, 2.0],          # tie at 1: index 1
                  [0.0, -0.0, 5.0, -0.0],        # +0 and -0 tie: index 4
                  [np.nan, -2.5, -1.0, -2.5],    # index 9
                  [np.inf, np.nan, np.inf, 7.0],  # 7 at index 15
                  [np.inf, np.inf, np.nan, np.inf]], np.float32)   # all +inf: index 16
    idx = np.arange(o.size, dtype=np.int32).reshape(o.shape)
    outs = []
    with jax.enable_x64(False):
        # XLA's defaults, and the float32 kernel's options (FLOAT32_OPTIONS: no signed zeros, under
        # which LLVM folded the packed key's float where(v == 0, 0, v) to v, so -0 sorted below +0)
        for opts in (None, K.FLOAT32_OPTIONS):
            one = compile_lowered(jax.jit(lambda v, i: K._cell_min(v, (i,), (1,))).lower(o, idx), opts)(o, idx)
            two = compile_lowered(jax.jit(lambda v, i: K._cell_min(v, (i, i), (1,))).lower(o, idx), opts)(o, idx)  # variadic
            outs += [one, two[::2]]
    for m, i in outs:
        assert m.dtype == jnp.float32 and i.dtype == jnp.int32
        assert np.array_equal(np.asarray(m).ravel(), np.float32([1.0, 0.0, -2.5, 7.0, np.inf]))
        assert np.asarray(i).ravel().tolist() == [1, 4, 9, 15, 16]


def test_pareto_mask_matches_quadratic_reference():
    rng = np.random.default_rng(0)
    for k in (2, 3):
        values = rng.integers(0, 6, size=(300, k)).astype(float)   # many duplicates and ties
        index = rng.permutation(300)
        got = sw.pareto_mask(values, index)
        for i in range(300):
            le = np.all(values <= values[i], axis=1)
            lt = np.any(values < values[i], axis=1)
            same = np.all(values == values[i], axis=1) & (index < index[i])
            assert got[i] == (not np.any((le & lt) | same))
    # the same point given twice (the front so far merged with a chunk's candidates): one copy, the first
    values, index = np.array([[1.0, 2.0], [0.0, 3.0], [1.0, 2.0], [2.0, 0.0]]), np.array([5, 1, 5, 9])
    assert sw.pareto_mask(values, index).tolist() == [True, True, False, True]


def test_three_objective_front_and_model_axis():
    spec = sw.SweepSpec.make(model="llama3-8b", cluster="seed", plan={"gbs": 512},
                             axes={"model": ["llama3-8b", "llama3-70b"], "gpus": [64, 128, 256],
                                   "tp": [1, 2, 4, 8], "pp": [1, 2, 4], "zero": [1, 3]},
                             pareto=("step_s", "memory_bytes", "gpus"), dump=True)
    r = sw.run_sweep(spec, chunk_points=10)
    d = r.dump
    gpus = np.asarray(spec.coords(d["index"])["gpus"], float)
    ok = d["reasons"] == 0
    F = np.stack([d["step_s"], d["memory_bytes"], gpus], 1)[ok].astype(np.float64)
    ref = set(d["index"][ok][sw.pareto_mask(F, d["index"][ok])].tolist())
    assert {t["index"] for t in r.pareto} == ref
    assert {t["point"]["model"] for t in r.pareto} <= {"llama3-8b", "llama3-70b"}
    assert r.pareto[0]["params_total"] in {r2["params_total"] for r2 in r.pareto}


def write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


BASE = '[model]\npreset = "llama3-8b"\n[cluster]\npreset = "seed"\n[plan]\ngbs = 256\n'


@pytest.mark.parametrize("axes, needle", [
    ('tpp = [1, 2]', "axes.tpp: unknown axis"),
    ('model = ["llama-9"]', "unknown 'llama-9'"),
    ('tp = []', "axes.tp: empty axis"),
    ('tp = [1, "two"]', "axes.tp: 'two' is not a number"),
    ('tp = [1.5]', "axes.tp: 1.5 is not allowed"),
    ('recompute = ["some"]', "axes.recompute: unknown 'some'"),
    ('bw_up_GBps = [-5]', "axes.bw_up_GBps"),
])
def test_bad_axis_is_one_line_and_exit_2(tmp_path, capsys, axes, needle):
    rc = main(["sweep", write(tmp_path, BASE + "[axes]\n" + axes + "\n")])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1 and err.startswith("dse: error: ")


def test_bad_files_and_too_large_dump(tmp_path, capsys):
    for argv, needle in [
        (["sweep", str(tmp_path / "none.toml")], "does not exist"),
        (["sweep", write(tmp_path, "[axes\n", "a.toml")], "not valid TOML"),
        (["sweep", write(tmp_path, BASE + "[axes]\ntp=[1]\n[output]\ndump = true\n", "b.toml"), "--chunk", "0"], "--chunk"),
        (["sweep", write(tmp_path, BASE + "[axes]\n" + "\n".join(f"{a} = [{', '.join(str(i + 1) for i in range(32))}]"
                                                              for a in ("tp", "pp", "mbs", "vpp", "cp"))
                         + "\n[output]\ndump = true\n", "c.toml")], "full-dump limit"),
        (["sweep", write(tmp_path, BASE + "[axes]\ntp=[1]\n[objective]\nminimize = 'speed'\n", "d.toml")], "unknown objective"),
        (["sweep", write(tmp_path, BASE + "[axes]\ntp=[1]\n", "e.toml"), "--resume"], "--resume: needs --out"),
    ]:
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and needle in err and err.count("\n") == 1, (argv, err)


def test_nothing_feasible_says_why(tmp_path, capsys):
    # tp = 3 divides neither the 32 heads of Llama 3 8B nor the 64 GPUs
    path = write(tmp_path, BASE.replace('preset = "seed"', 'preset = "seed"\ngpus = 64') + "[axes]\ntp = [3]\npp = [1, 2]\n")
    assert main(["sweep", path]) == 0
    out = capsys.readouterr().out
    assert "no feasible plan among 2" in out and "heads_not_divisible_by_tp" in out
    assert main(["sweep", path, "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["feasible"] == 0 and js["best"] is None and js["top"] == []
    assert js["infeasible_by_reason"]["heads_not_divisible_by_tp"] == 2
    assert set(js) >= {"points", "feasible", "seconds", "points_per_s", "best", "top", "pareto", "infeasible_by_reason"}


def test_try_study_recompute_matches_dse_plan(capsys):
    """sweeps/try-recompute.toml: the sweep's rows are `dse plan --json` for the same plan."""
    assert main(["sweep", str(ROOT / "sweeps" / "try-recompute.toml"), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    sel = next(t for t in js["top"] if t["point"]["recompute"] == "selective")
    assert main(["plan", "--preset", "llama3-405b", "--cluster", "seed", "--gpus", "16384", "--tp", "8",
                 "--pp", "16", "--zero", "3", "--gbs", "2048", "--recompute", "selective", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {k: sel[k] for k in plan} == plan
