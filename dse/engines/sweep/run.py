"""run_sweep: chunks over every device, reductions merged on the host, reported rows in float64."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

import numpy as np

from dse import backend
from dse.backend import tree_leaves, tree_map, x64
from dse.errors import InputError
from dse.engines.compiled import compile_lowered, evaluate_exact, load_or_compile
from dse.engines.host import numpy_mode
from dse.report import REASONS
from dse.engines.sweep.spec import (CAP_ROWS, DUMP_FIELDS, PROBES, SweepSpec, _IDLE, _objective, default_chunk,
                                   run_figures)
from dse.inputs.fidelity import resolve
from dse.engines.sweep.kernel import _Geometry, _build_kernel, _figures, _full, _inputs, kernel_order
from dse.engines.sweep import frames, kernel
from dse.engines.sweep.state import (_State, _finish_dump, _keep_dump, _write_outputs, check_loaded, open_out,
                                     save_state)


# ---------------------------------------------------------------- results


@dataclasses.dataclass
class SweepResult:
    """What ``run_sweep`` found. Rows are dicts like ``dse plan --json`` plus ``index``, ``point``, ``plan``."""

    spec: SweepSpec
    points: int                  # points in the grid
    done: int                    # points evaluated (== points unless stopped early)
    feasible: int
    infeasible_by_reason: dict
    seconds: float
    points_per_s: float
    compile_s: float
    cpu_s: float                 # CPU seconds this process spent in the sweep loop (all threads)
    best: dict | None
    top: list
    pareto: list
    devices: int
    chunks: int
    chunk_points: int
    dump: dict | None = None     # DUMP_FIELDS + reasons, warnings, index (numpy), when asked
    engine: str = "xla"          # "host" (numpy, float64) or "xla" (the compiled kernel on ``devices``)

    @property
    def complete(self) -> bool:
        return self.done == self.points

    def top_frame(self):
        """The top rows as a pandas DataFrame: axis columns by name, ``sweep_value``, every report field."""
        return frames.frame(frames.row_columns(self.spec, self.top))

    def pareto_frame(self):
        """The Pareto rows as a DataFrame, one ``sweep_value.<objective>`` column per objective."""
        return frames.frame(frames.row_columns(self.spec, self.pareto))

    def dump_frame(self):
        """The full dump (``dump = true`` without ``out_dir``) as a DataFrame with one column per axis."""
        if self.dump is None:
            raise InputError("dump_frame: this sweep kept no dump; allowed: output.dump = true without out_dir")
        return frames.frame(frames.dump_columns(self.spec, self.dump))

    def to_json(self) -> dict:
        return {"name": self.spec.name, "points": self.points, "done": self.done, "feasible": self.feasible,
                "seconds": self.seconds, "points_per_s": self.points_per_s, "compile_s": self.compile_s,
                "cpu_s": self.cpu_s, "engine": self.engine,
                "devices": self.devices, "chunks": self.chunks, "chunk_points": self.chunk_points,
                "objective": {("maximize" if self.spec.maximize else "minimize"): self.spec.objective},
                "pareto_objectives": list(self.spec.pareto),
                "best": self.best, "top": self.top, "pareto": self.pareto,
                "infeasible_by_reason": self.infeasible_by_reason}


def _rows(spec: SweepSpec, index: np.ndarray, sweep_values) -> list:
    """Re-evaluate points exactly (float64, one batched call of a shared compiled program) into rows."""
    if len(index) == 0:
        return []
    index = np.asarray(index, np.int64)
    idx = np.unravel_index(index, spec.sizes)
    with x64(True), numpy_mode():
        arrays = {a.name: np.asarray(a.values, np.float64)[i] for a, i in zip(spec.axes, idx)}
        model, cluster, plan = _inputs(spec, arrays, np.float64)
        rep = evaluate_exact(model, cluster, plan, spec.fidelity)
        plan = {k: np.broadcast_to(np.asarray(v), index.shape) for k, v in plan.to_dict().items()}
        run = ({k: np.broadcast_to(np.asarray(v, np.float64), index.shape)
                for k, v in run_figures(spec.run_dict, rep.tokens_per_s, cluster.gpus).items()} if spec.run else {})
    rows = []
    figures = tree_map(lambda x: np.broadcast_to(x, index.shape), rep).json_rows()
    for j, flat in enumerate(index):
        row = {"index": int(flat),
               "point": {a.name: _plain(a.labels[i[j]]) for a, i in zip(spec.axes, idx)},
               "sweep_value": sweep_values[j]}
        row.update(figures[j])
        row["plan"] = {k: float(v[j]) for k, v in plan.items()}
        if spec.run:
            row["run"] = {**spec.run_dict, **{k: float(v[j]) for k, v in run.items()}}
        row["fidelity"] = spec.fidelity
        rows.append(row)
    return rows


def _plain(x):
    return x.item() if hasattr(x, "item") else x


# ---------------------------------------------------------------- the driver


def run_sweep(spec: SweepSpec, *, chunk_points: int | None = None, out_dir=None, resume: bool = False,
              progress: Callable[[int, int, float], Any] | None = None, max_chunks: int | None = None,
              devices=None, engine: str = "auto") -> SweepResult:
    """Evaluate every point of ``spec``'s grid and reduce it.

    ``chunk_points`` bounds the points a device holds at once (memory; None: ``default_chunk``). With
    ``out_dir`` the state is saved after every group of chunks (atomically) and
    top/Pareto CSVs (and the dump) are written at the end; ``resume`` continues a
    sweep saved there. ``progress(done, total, elapsed_s, eta_s)`` is called after
    each group of chunks: points done (resumed ones included), elapsed seconds since
    the start (compile included), and the ETA from the rate measured over the
    chunks this call ran after compiling. ``max_chunks`` stops early (the result
    then has ``complete == False``). ``engine``: "host" (the equations by numpy on this
    CPU, float64, no compile), "xla" (the compiled kernel on ``devices``) or "auto"
    (``choose_engine``: host for grids up to HOST_POINTS, where no compile pays for itself).
    """
    chunk_points = default_chunk(spec) if chunk_points is None else chunk_points
    _check_args(spec, chunk_points)
    t_start = time.perf_counter()
    engine = choose_engine(spec, engine, devices)
    host = engine == "host"
    devices = [] if host else list(devices or backend.load_jax().devices())
    D = max(1, len(devices))
    dtype = np.float32 if spec.precision == "float32" and not host else np.float64
    fp = spec.fingerprint()
    state = _State(spec)
    out, chunk_points = open_out(out_dir, resume, state, fp, chunk_points, spec.dump)   # state.py: checks, --resume
    kspec, perm = (spec, tuple(range(len(spec.axes)))) if host else kernel_order(spec)
    geo = _Geometry.make(kspec.sizes, min(chunk_points, HOST_CHUNK) if host else chunk_points)
    check_loaded(state, geo, out)
    with x64(dtype == np.float64):
        run = _HostRunner(spec, geo, state) if host else _Runner(kspec, geo, devices, dtype, state, spec.sizes, perm)
        compile_s = run.compile()
        dump_parts = {} if spec.dump else None
        if spec.dump and out is not None and state.stage == "running":
            (out / "dump").mkdir(exist_ok=True)
        last = geo.chunks if max_chunks is None else min(geo.chunks, state.next_chunk + max_chunks)
        t_run = time.perf_counter()
        cpu_run = time.process_time()
        done_here = 0
        while state.next_chunk < last:
            ks = list(range(state.next_chunk, min(last, state.next_chunk + D)))
            for d, k, res in run.group(ks):
                if spec.dump:
                    _keep_dump(spec, geo, k, {f: res[f][d] for f in DUMP_FIELDS + ("reasons", "warnings")},
                               dump_parts, out)
            done_here += sum(geo.chunk(k)[2] * geo.inner for k in ks)
            state.next_chunk = ks[-1] + 1
            if out is not None:
                save_state(out, state, fp, geo)   # after the chunks' part files are durable
            if progress is not None:
                now = time.perf_counter()
                done = int(state.counts[0])
                rate = done_here / (now - t_run) if now > t_run else 0.0   # after compile: chunks only
                eta = (spec.points - done) / rate if rate > 0 else float("inf")
                progress(done, spec.points, now - t_start, eta)
        seconds = time.perf_counter() - t_run
        cpu_s = time.process_time() - cpu_run
    top, pareto = _reported_rows(spec, state)
    dump = None
    if spec.dump and state.next_chunk >= geo.chunks:
        dump = _finish_dump(spec, geo, dump_parts, out, state, fp)   # idempotent (state.py)
    result = _result(spec, state, geo, D, (seconds, done_here, compile_s, cpu_s), top, pareto, dump)
    result.engine = engine
    if out is not None and result.complete:
        _write_outputs(result, out)
    return result


# The host engine: numpy ran the main job's 138,240 plans in 0.09 CPU-s (load ~8, 2 cores), about
# 1.5e6 plans per CPU-second, where tracing and compiling the XLA kernel took 8-10 CPU-s and
# loading a cached one ~1 (issue 16). Up to HOST_POINTS the host answers first even against a
# warm cache; the choice depends on the sweep alone, never on what is cached, so a sweep file
# gives the same result every time. HOST_CHUNK bounds its memory (~0.3 GB a chunk).
HOST_POINTS = 1 << 23
HOST_PARETO3_POINTS = 100_000   # a three-objective front's exact host merge is a Python loop over candidates
HOST_CHUNK = 1 << 18
ENGINES = ("auto", "host", "xla")


def choose_engine(spec: SweepSpec, engine: str = "auto", devices=None) -> str:
    """"host" or "xla" for ``engine``: "auto" is the host for one process without named devices,
    up to HOST_POINTS plans (HOST_PARETO3_POINTS with a three-objective front)."""
    if engine not in ENGINES:
        raise InputError(f"engine: {engine!r} is not allowed; allowed: {', '.join(ENGINES)}")
    if engine != "auto":
        return engine
    small = spec.points <= (HOST_POINTS if len(spec.pareto) < 3 else HOST_PARETO3_POINTS)
    return "host" if small and devices is None and backend.process_count() == 1 else "xla"


def _check_args(spec: SweepSpec, chunk_points) -> None:
    if not isinstance(chunk_points, int) or chunk_points < 1:
        raise InputError(f"--chunk: {chunk_points!r} is not allowed; allowed: an integer >= 1")
    if spec.dump and backend.process_count() > 1:
        raise InputError("output.dump: not supported across several processes; allowed: dump = false")


def _result(spec, state, geo, D, timing, top, pareto, dump) -> SweepResult:
    seconds, done_here, compile_s, cpu_s = timing
    return SweepResult(
        spec=spec, points=spec.points, done=int(state.counts[0]), feasible=int(state.counts[1]),
        infeasible_by_reason={nm: int(c) for (nm, _), c in zip(REASONS, state.counts[2:])},
        seconds=seconds, points_per_s=done_here / seconds if seconds > 0 else 0.0, compile_s=compile_s, cpu_s=cpu_s,
        best=top[0] if top else None, top=top, pareto=pareto, devices=D, chunks=geo.chunks,
        chunk_points=geo.chunk_points, dump=dump)


def _reported_rows(spec: SweepSpec, state) -> tuple[list, list]:
    """The top and Pareto rows, re-evaluated in float64 in one batched call."""
    sign = -1.0 if spec.maximize else 1.0
    signs = [_objective(p, "output.pareto")[1] for p in spec.pareto]
    rows = _rows(spec, np.concatenate([state.top_idx, state.par_idx]),
                 [sign * v for v in state.top_val.tolist()]
                 + [[sg * v for v, sg in zip(row, signs)] for row in state.par_val.tolist()])
    return rows[:len(state.top_idx)], rows[len(state.top_idx):]


class _Runner:
    """The compiled kernel of one sweep and its calls: a group of chunks, one per device."""

    def __init__(self, spec: SweepSpec, geo: _Geometry, devices: list, dtype, state, sizes=None, perm=None):
        """``spec`` in the kernel's axis order; ``sizes`` the sweep's axis lengths, ``perm`` (kernel_order)."""
        self.spec, self.geo, self.devices, self.dtype, self.state = spec, geo, devices, dtype, state
        self.sizes = tuple(sizes or spec.sizes)
        self.perm = tuple(perm or range(len(self.sizes)))
        moved = self.perm != tuple(range(len(self.sizes)))
        self.ostrides = tuple(math.prod(self.sizes[i + 1:]) for i in self.perm) if moved else None
        self.D = len(devices)
        from jax.sharding import Mesh
        self.mesh = Mesh(np.array(devices), ("d",))
        self.nobj = len(spec.pareto)
        self.cap = max(1, min(CAP_ROWS, geo.chunk_points // geo.row))   # candidate rows per pass: all of a chunk's, up to CAP_ROWS
        s = geo.split
        self.ax_s = np.asarray(spec.axes[s].values, dtype)
        self.outer_axes = [np.asarray(a.values, dtype) for a in spec.axes[:s]]

    def compile(self) -> float:
        """Load or compile the kernel (memory, then the cache directory, then XLA); wall seconds."""
        t0 = time.perf_counter()
        fid = tuple(np.asarray(x).tolist() for x in tree_leaves(resolve(self.spec.fidelity)))
        options = kernel.compile_options(self.dtype, self.devices[0].platform, math.prod(self.sizes))
        key = ("sweep", self.spec.fingerprint(arguments=self.geo.split + 1), fid, self.geo, np.dtype(self.dtype).name, self.cap,
               PROBES.get(self.nobj), self.ostrides, kernel.CELL_POINTS, tuple(sorted(options.items())))

        def build():   # tracing is lazy: only on a miss
            fn = _build_kernel(self.spec, self.geo, self.mesh, self.dtype, self.cap, self.ostrides)
            return compile_lowered(fn.lower(*self.args([_IDLE] * self.D)), options)

        self.compiled = load_or_compile(key, build, self.devices)
        return time.perf_counter() - t0

    def args(self, items):
        """Device arrays of a group: outer values, tile values, valid count, skip, first pass, probes."""
        geo, D, dtype = self.geo, self.D, self.dtype
        ov = np.zeros((D, geo.split), dtype)
        tv = np.zeros((D, geo.tile), dtype)
        nv = np.zeros(D, np.int32)
        sk = np.zeros(D, np.int32)
        first = np.zeros(D, bool)
        for d, (k, skip, fst) in enumerate(items):
            oc, j0, nvalid, _ = geo.chunk(k)
            ov[d] = [self.outer_axes[i][c] for i, c in enumerate(oc)]
            vals = self.ax_s[j0:j0 + nvalid]
            tv[d] = np.concatenate([vals, np.full(geo.tile - nvalid, vals[-1], dtype)])
            nv[d], sk[d], first[d] = nvalid, skip, fst
        probes = self.state.probes(self.nobj, dtype)
        jax = backend.load_jax()
        from jax.sharding import NamedSharding, PartitionSpec as P
        shard, repl = NamedSharding(self.mesh, P("d")), NamedSharding(self.mesh, P())
        # every process builds the same host arrays; each places its own devices' slices
        put = lambda a, sh: jax.make_array_from_callback(a.shape, sh, lambda i: a[i])  # noqa: E731
        return (put(ov, shard), put(tv, shard), put(nv, shard), put(sk, shard), put(first, shard),
                put(probes, repl))

    def index(self, flat):
        """The sweep's flat index of kernel-order flat indices ``flat``."""
        flat = np.asarray(flat, np.int64)
        if self.ostrides is None:
            return flat
        coords = np.unravel_index(flat, self.spec.sizes)
        return sum(c.astype(np.int64) * st for c, st in zip(coords, self.ostrides)).astype(np.int64)

    def group(self, ks):
        """Run chunks ``ks`` (at most one per device), merging their reductions into the state.

        Yields (device slot, chunk, outputs) of each chunk's first pass (for the dump). A chunk
        with more Pareto candidate rows than ``cap`` gets another pass from where it stopped.
        """
        state, geo, D = self.state, self.geo, self.D
        queue = [(k, 0, True) for k in ks]
        while queue:
            items, queue = queue[:D], queue[D:]
            items += [_IDLE] * (D - len(items))
            res = backend.load_jax().device_get(self.compiled(*self.args(items)))
            for d, (k, skip, fst) in enumerate(items):
                if (k, skip, fst) == _IDLE:
                    continue
                base = geo.chunk(k)[3]
                if fst:
                    state.counts += res["counts"][d]
                    state.add_top(res["top_val"][d].astype(np.float64), self.index(base + res["top_idx"][d].astype(np.int64)))
                    yield d, k, res
                if self.nobj:   # the candidate rows in the kernel's shape (kernel._pareto_candidates)
                    pi = res["par_idx"][d].reshape(-1)
                    sel = pi >= 0
                    pv = res["par_val"][d].reshape(-1, self.nobj)
                    state.add_pareto(pv[sel].astype(np.float64), self.index(base + pi[sel].astype(np.int64)))
                    if res["par_rows"][d] > self.cap:    # more candidate rows: another pass from there
                        queue.append((k, int(res["par_next"][d]), False))


class _HostRunner:
    """The same chunk figures as the kernel (kernel._figures: ``evaluate`` on the chunk's broadcast
    axes) computed by numpy in float64, reduced by the state's exact host merges (the ones the
    device candidates go through): counts, top-K by (value, index), the Pareto front."""

    def __init__(self, spec: SweepSpec, geo: _Geometry, state):
        self.spec, self.geo, self.state = spec, geo, state
        with numpy_mode():
            self.figures, self.names, self.dump_names = _figures(spec, geo, np.float64)
        s = geo.split
        self.ax_s = np.asarray(spec.axes[s].values, np.float64)
        self.outer_axes = [np.asarray(a.values, np.float64) for a in spec.axes[:s]]
        self.sign = -1.0 if spec.maximize else 1.0
        self.objs = [_objective(p, "pareto") for p in spec.pareto]
        self.kind = np.float32 if spec.precision == "float32" else np.float64   # dump columns as the kernel's

    def compile(self) -> float:
        return 0.0

    def group(self, ks):
        """Run chunks ``ks`` one after another; yields (0, chunk, outputs) like ``_Runner.group``."""
        geo, state = self.geo, self.state
        for k in ks:
            oc, j0, nvalid, base = geo.chunk(k)
            vals = self.ax_s[j0:j0 + nvalid]
            tile = np.concatenate([vals, np.full(geo.tile - nvalid, vals[-1])])   # the kernel's padding
            outer = [self.outer_axes[i][c] for i, c in enumerate(oc)]
            with numpy_mode():
                figs = _full(self.figures(outer, tile), geo.dims)
            n = nvalid * geo.inner
            flat = lambda v: np.asarray(v).reshape(-1)[:n]  # noqa: E731  the tile is the leading dimension
            fig = {nm: flat(v) for nm, v in zip(self.names, figs)}
            reasons = flat(figs[len(self.names)]).astype(np.int64)
            feas = reasons == 0
            index = base + np.arange(n, dtype=np.int64)
            state.counts += [n, int(feas.sum())] + [int(((reasons >> b) & 1).sum()) for b in range(len(REASONS))]
            cost = np.where(feas, self.sign * fig[self.spec.objective], np.inf)
            keep = np.isfinite(cost)
            if keep.sum() > state.k:   # the K smallest values (every tie at the K-th): the merge orders by index
                keep &= cost <= np.partition(cost[keep], state.k - 1)[state.k - 1]
            state.add_top(cost[keep], index[keep])
            if self.objs:
                F = np.stack([sg * fig[nm] for nm, sg in self.objs], axis=-1)
                real = feas & np.isfinite(F).all(axis=-1)
                state.add_pareto(F[real], index[real])
            out = {f: [flat(v).astype(np.int32 if f in ("reasons", "warnings") else self.kind)]
                   for f, v in zip(self.dump_names, figs[len(self.names) + 1:])}
            yield 0, k, out
