"""Sweep files: axes, objectives and outputs, parsed and checked into a SweepSpec."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from pathlib import Path

import numpy as np

from dse.backend import x64
from dse.inputs import checks, fidelity as fidelity_mod, presets, stacks
from dse.errors import InputError
from dse.inputs import RECOMPUTE, Cluster, ModelShape, Plan
from dse.inputs import plan as plan_tables
from dse.report import Report
from dse.equations import goodput




# ---------------------------------------------------------------- axes and objectives

PLAN_FIELDS = tuple(f.name for f in dataclasses.fields(Plan))     # tp ... sp, rank_order, ...
PLAN_SWITCH = plan_tables.SWITCHES                                # 0 or 1 (or true, false)
PLAN_CHOICES = plan_tables.CHOICES                                # a name or its code (fp8, schedule, recompute)
MODEL_FIELDS = presets.MODEL_FIELDS
CLUSTER_UNITS = presets.CLUSTER_UNITS     # preset unit name -> (Cluster field, factor to SI)
AXIS_NAMES = ("model",) + PLAN_FIELDS + tuple(CLUSTER_UNITS) + MODEL_FIELDS

_REPORT_SCALARS = tuple(f.name for f in dataclasses.fields(Report)
                        if f.type == "jax.Array" and f.name not in ("reasons", "warnings", "feasible", "fits"))
# Objectives: any scalar figure of the Report, the cluster size (a cost), and a whole run's
# figures (goodput.training_run; they need [run] tokens = N in the sweep file).
OBJECTIVES = _REPORT_SCALARS + ("gpus",) + goodput.RUN_FIGURES
MAXIMIZE = ("mfu", "tokens_per_s", "goodput")   # natural direction of the objectives; the rest minimize
# [run] keys -> training_run arguments; defaults as dse plan --tokens (goodput.py).
RUN_KEYS = {"tokens": None, "usd_per_gpu_hour": 0.0,
            "failure_rate_per_gpu_hour": goodput.LLAMA3_FAILURE_RATE_PER_GPU_S * goodput.SECONDS_PER_HOUR,
            "checkpoint_write_s": goodput.CHECKPOINT_WRITE_S, "restart_s": goodput.RESTART_S}


def run_figures(run: dict, tokens_per_s, gpus) -> dict:
    """goodput.training_run for a sweep's [run] table (``run`` as SweepSpec.run_dict)."""
    return goodput.training_run(run["tokens"], tokens_per_s, gpus,
                                run["failure_rate_per_gpu_hour"] / goodput.SECONDS_PER_HOUR,
                                run["checkpoint_write_s"], run["restart_s"], run["usd_per_gpu_hour"])
DUMP_FIELDS = ("step_s", "mfu", "tokens_per_s", "memory_bytes", "compute_s", "bubble_s")
DUMP_LIMIT = 10_000_000                   # points; a larger full dump is refused
PROBES = {2: 1024, 3: 64}                 # front points each device prunes Pareto rows with
CAP_ROWS = 512                            # at most this many candidate rows a device returns per chunk and pass
                                          # (64 gave 6 passes of the whole kernel on the main job's 343 candidates)
# Points a device holds at once, by default (``default_chunk``). XLA:CPU splits each full-chunk
# fusion over its threads along the chunk's leading dimension (kernel._Geometry: the tile of the
# split axis): benchmarks/time_to_answer.py's 1.13e9 plans at 1 << 22 had tiles of 3 vpp values,
# split 2 + 1 over two threads; at 1 << 23 the split axis is cp, one value a chunk of 4.7M points,
# its next dimension (6) split 3 + 3 (loop seconds, one process each, load 1.2-1.8: calibrated
# reduced 3.41-3.50 -> 2.94-2.97, Pareto 3.71-3.83 -> 3.11-3.22; seed reduced 3.11 -> 2.00-2.23).
# A reduced or Pareto sweep keeps a few figures of the chunk's size at most; a full dump keeps
# all of them, and benchmarks/sweep_throughput.py's 9,953,280 plans kept peaked at 1.40 GB in
# chunks of 1 << 23 (issue 16's bound is 1.5 GB at any size), 1.03 GB in chunks of 1 << 22.
DEFAULT_CHUNK = 1 << 23
DUMP_CHUNK = 1 << 22


def default_chunk(spec) -> int:
    """The points a device holds at once when the user names none: DUMP_CHUNK for a full dump."""
    return DUMP_CHUNK if spec.dump else DEFAULT_CHUNK


_IDLE = (0, 2**31 - 1, False)             # a device slot with nothing to do


@dataclasses.dataclass(frozen=True)
class Axis:
    """One sweep axis: ``labels`` as written (GB/s, preset names), ``values`` in SI."""

    name: str
    labels: tuple
    values: tuple

    def __len__(self):
        return len(self.values)


def _number(where: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(f"{where}: {v!r} is not a number; allowed: numbers")
    x = float(v)
    if not math.isfinite(x):
        raise InputError(f"{where}: {v!r} is not allowed; allowed: finite numbers")
    checks.non_negative(where, abs(x))   # the magnitude rule of every input (checks.MAX_MAGNITUDE)
    return x


def _table(d: dict, key: str) -> dict:
    """A TOML table of the sweep file (absent: empty); anything else is one line."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InputError(f"{key}: {v!r} is not a table; allowed: a [{key}] table, e.g. [{key}] ...")
    return dict(v)


def _codes() -> str:
    return ", ".join(f"{x:g}" for x in RECOMPUTE.values())


def _value(name: str, v, where: str) -> float:
    """One value of input ``name`` in SI units, validated like ``dse plan``."""
    if name == "recompute":
        if isinstance(v, str):
            if v not in RECOMPUTE:
                raise InputError(f"{where}: unknown {v!r}; allowed: {', '.join(RECOMPUTE)} (or {_codes()})")
            return RECOMPUTE[v]
        x = _number(where, v)
        if x not in RECOMPUTE.values():
            raise InputError(f"{where}: {v!r} is not allowed; allowed: {', '.join(RECOMPUTE)} (or {_codes()})")
        return x
    if name in presets.NAMED_CLUSTER_FIELDS:
        return presets.named_code(name, v, where)     # topology, fp8_scaling: by name or code
    if name in plan_tables.SETS:
        return checks.plan_value(where, v)       # a set of names ("layernorm moe_act", a list) or its code
    if name in PLAN_FIELDS and (isinstance(v, str) and name in PLAN_CHOICES or isinstance(v, bool) and name in PLAN_SWITCH):
        return checks.plan_value(where, v)       # a recipe or schedule by name, a switch as true/false
    x = _number(where, v)
    if name in PLAN_FIELDS:
        return checks.plan_value(where, v)       # what the field accepts (dse.inputs.plan tables)
    if name in CLUSTER_UNITS:
        return checks.preset_value(name, x, where) * CLUSTER_UNITS[name][1]
    if name in MODEL_FIELDS:
        return checks.preset_value(name, x, where)
    return x


def _check_model_axes(axes, bases) -> None:
    """Every combination of the model-field axes' values, on every base model (the preset axis's, else
    the sweep's), is a consistent model (checks.model_consistency, as a preset or config.json must
    be: whole counts, kv_heads dividing heads, topk <= experts, ...)."""
    model_axes = [a for a in axes if a.name in MODEL_FIELDS]
    if math.prod(len(a.values) for a in model_axes) <= 100_000:
        combos = (dict(zip((a.name for a in model_axes), c)) for c in itertools.product(*(a.values for a in model_axes)))
    else:   # too many to walk: each axis alone
        combos = ({a.name: v} for a in model_axes for v in a.values)
    for combo in combos:
        for base in bases:
            checks.model_consistency({**base, **combo}, where="axes")


def _check_islands(axes, cluster) -> None:
    """Every island size of the sweep (its axis, else the cluster's) divides every GPU count (its axis,
    else the cluster's), as a preset's must (presets.check_islands)."""
    by = {a.name: a.values for a in axes}
    islands = by.get("island_gpus", (float(cluster.island_gpus),))
    where = "axes.island_gpus" if "island_gpus" in by else "cluster.island_gpus"
    for g in by.get("gpus", (float(cluster.gpus),)):
        for i in islands:
            presets.check_islands(i, g, where)


def _axis(name: str, raw) -> Axis:
    where = f"axes.{name}"
    if name not in AXIS_NAMES:
        raise InputError(f"{where}: unknown axis; allowed: {', '.join(AXIS_NAMES)}")
    if not isinstance(raw, (list, tuple)):
        raw = [raw]
    if len(raw) == 0:
        raise InputError(f"{where}: empty axis; allowed: a list of one or more values")
    if name == "model":
        for v in raw:
            if not isinstance(v, str):
                raise InputError(f"{where}: {v!r} is not a preset name; allowed: {', '.join(presets.list_presets('models'))}")
            presets.load_model(v)   # raises a one-line InputError for an unknown preset
        return Axis(name, tuple(raw), tuple(float(i) for i in range(len(raw))))
    return Axis(name, tuple(raw), tuple(_value(name, v, where) for v in raw))


def _objective(name: str, where: str) -> tuple[str, float]:
    """(name, sign): the sweep minimizes sign * value."""
    if name not in OBJECTIVES:
        raise InputError(f"{where}: unknown objective {name!r}; allowed: {', '.join(OBJECTIVES)}")
    return name, (-1.0 if name in MAXIMIZE else 1.0)


# ---------------------------------------------------------------- the spec


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """What to sweep. Build with ``SweepSpec.make`` or ``SweepSpec.from_dict`` (a TOML table).

    ``model`` and ``cluster`` hold the base inputs (float64 scalars); ``plan`` the
    base plan fields in SI (recompute as 0/1/2); an axis replaces one input by a
    list. ``objective`` is minimized (or maximized when ``maximize``); ``pareto``
    names 2-3 objectives in their natural directions (mfu and tokens_per_s up,
    everything else down); ``dump`` keeps every point's DUMP_FIELDS.
    """

    model: ModelShape
    cluster: Cluster
    plan: dict
    axes: tuple
    model_presets: tuple = ()
    model_table: tuple = ()      # per preset of the ``model`` axis: its fields (with [model] overrides)
    objective: str = "step_s"
    maximize: bool = False
    top_k: int = 10
    pareto: tuple = ()
    dump: bool = False
    fidelity: str = "seed"
    precision: str = "float32"   # the compiled kernel's dtype; the host engine computes in float64
    name: str = ""
    max_points: int | None = None   # the file's consent to a sweep this large (see confirm_size)
    run: tuple = ()              # [run] table as sorted (key, value) pairs: tokens, usd_per_gpu_hour, ...
    pipelined: tuple = ()        # the stack's fields where a point pipelines (stacks.pipelined), sorted pairs

    @property
    def run_dict(self) -> dict:
        return dict(self.run)

    @property
    def sizes(self) -> tuple:
        return tuple(len(a) for a in self.axes)

    @property
    def points(self) -> int:
        return math.prod(self.sizes)

    @classmethod
    def make(cls, *, model="llama3-405b", cluster="seed", plan=None, axes=None, objective="step_s",
             maximize=None, top_k=10, pareto=(), dump=False, fidelity=None, precision="float32", name="",
             run=None):
        """Build a spec in Python: ``model``/``cluster`` a preset name or a dict of fields
        (preset units for the cluster), ``plan`` a dict, ``axes`` a dict name -> list; ``fidelity`` None
        is the cluster's default (``dse.inputs.fidelity.default_mode``)."""
        d = {"model": model if isinstance(model, dict) else {"preset": model},
             "cluster": cluster if isinstance(cluster, dict) else {"preset": cluster},
             "plan": dict(plan or {}), "axes": dict(axes or {}),
             "objective": {("maximize" if (maximize if maximize is not None else objective in MAXIMIZE)
                            else "minimize"): objective},
             "output": {"top": top_k, "pareto": list(pareto), "dump": dump},
             "fidelity": fidelity, "precision": precision, "name": name}
        if run:
            d["run"] = dict(run)
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict) -> "SweepSpec":
        from dse.engines.host import numpy_mode

        with x64(True), numpy_mode():   # base inputs in float64 (numpy: no XLA dispatch per field)
            return cls._from_dict(d)

    @classmethod
    def _from_dict(cls, d: dict) -> "SweepSpec":
        known = {"model", "cluster", "plan", "stack", "axes", "objective", "output", "fidelity", "precision",
                 "name", "description", "run", "max_points"}
        unknown = set(d) - known
        if unknown:
            raise InputError(f"sweep file: unknown table(s) {sorted(unknown)}; allowed: {', '.join(sorted(known))}")
        axes_raw = d.get("axes") or {}
        if not isinstance(axes_raw, dict) or not axes_raw:
            raise InputError("axes: give at least one axis, e.g. [axes] tp = [1, 2, 4, 8]")
        axes = tuple(_axis(k, v) for k, v in axes_raw.items())
        names = [a.name for a in axes]
        model, m, presets_axis = _base_model(d, axes)
        c = _table(d, "cluster")
        cpreset = c.pop("preset", "seed")
        cluster = presets.load_cluster(cpreset, **c)
        _check_islands(axes, cluster)
        plan = _base_plan(d, names)
        direction, objective = _objective_table(d)
        top_k, pareto, dump = _output_table(d)
        fidelity = d.get("fidelity") or fidelity_mod.default_mode(cpreset if isinstance(cpreset, str) else None)
        if fidelity not in fidelity_mod.MODES:
            raise InputError(f"fidelity: unknown {fidelity!r}; allowed: {', '.join(fidelity_mod.MODES)}")
        precision = d.get("precision", "float32")
        if precision not in ("float32", "float64"):
            raise InputError(f"precision: {precision!r}; allowed: float32, float64")
        run = _run_table(d.get("run"))
        for o in (objective,) + pareto:
            if o in goodput.RUN_FIGURES and not run:
                raise InputError(f"objective {o!r}: needs a [run] table with tokens = N (tokens to train)")
        table = tuple({k: float(v) for k, v in presets.load_model(n, **m).to_dict().items()} for n in presets_axis)
        _check_model_axes(axes, table or ({k: float(v) for k, v in model.to_dict().items()},))
        spec = cls(model=model, cluster=cluster, plan=plan, axes=axes, model_presets=tuple(presets_axis),
                   model_table=table,
                   objective=objective, maximize=direction == "maximize", top_k=top_k, pareto=pareto,
                   dump=dump, fidelity=fidelity, precision=precision, name=str(d.get("name", "")), run=run,
                   max_points=_max_points(d.get("max_points")),
                   pipelined=tuple(sorted(stacks.pipelined_fields(d["stack"]).items())) if d.get("stack") else ())
        if dump and spec.points > DUMP_LIMIT:
            raise InputError(f"output.dump: {spec.points:,} points is above the full-dump limit of "
                             f"{DUMP_LIMIT:,}; allowed: dump = false, or fewer points")
        return spec

    def fingerprint(self, arguments: int = 0) -> str:
        """A hash of everything that decides the result (for --resume).

        ``arguments``: leave out the values of the first this many axes (the sweep kernel takes the
        outer and the split axis's values as arguments; the inner axes' values are constants of
        its program, which XLA folds: as arguments the 7.1e7-plan kernel ran 3.6x slower), so one
        compiled kernel serves sweeps that differ only there (issue 16). Lengths are kept, and the
        model axis's values (indices into ``presets``, a table in the program)."""
        f = lambda t: {k: float(np.asarray(v)) for k, v in t.to_dict().items()}  # noqa: E731
        axes = [[a.name, len(a.values) if i < arguments and a.name != "model" else list(a.values)]
                for i, a in enumerate(self.axes)]
        blob = json.dumps({"model": f(self.model), "cluster": f(self.cluster), "plan": self.plan,
                           "axes": axes, "presets": list(self.model_table),
                           "objective": [self.objective, self.maximize], "top": self.top_k,
                           "pareto": list(self.pareto), "dump": self.dump, "fidelity": self.fidelity,
                           "precision": self.precision, **({"run": list(self.run)} if self.run else {}),
                           **({"pipelined": list(self.pipelined)} if self.pipelined else {})},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def coords(self, index) -> dict:
        """Axis values (as written) of flat point index(es)."""
        idx = np.unravel_index(np.asarray(index, dtype=np.int64), self.sizes)
        return {a.name: np.asarray(a.labels, dtype=object)[i] for a, i in zip(self.axes, idx)}


def _base_model(d: dict, axes) -> tuple:
    """The base model (a preset, fields, or a preset with overrides), the overrides, and the model axis."""
    m = _table(d, "model")
    preset = m.pop("preset", None)
    presets_axis = next((a.labels for a in axes if a.name == "model"), ())
    if preset is None and presets_axis:
        preset = presets_axis[0]
    if preset is None:
        return presets.model_from_fields(m), m, presets_axis
    if not isinstance(preset, str):
        raise InputError(f"model.preset: {preset!r} is not a preset name")
    return presets.load_model(preset, **m), m, presets_axis


def _base_plan(d: dict, axis_names) -> dict:
    """The [plan] table over Plan's defaults (tp = pp = mbs = 1), over the switches of the file's
    ``stack`` when it names one (dse/data/stacks); gbs in [plan] or as an axis."""
    plan_raw = _table(d, "plan")
    bad = set(plan_raw) - set(PLAN_FIELDS)
    if bad:
        raise InputError(f"plan: unknown field(s) {sorted(bad)}; allowed: {', '.join(PLAN_FIELDS)}")
    plan = {f.name: float(f.default) for f in dataclasses.fields(Plan) if f.default is not dataclasses.MISSING}
    plan.update({"tp": 1.0, "pp": 1.0, "mbs": 1.0})
    if d.get("stack") is not None:   # a software stack's defaults, then [plan] on top
        if not isinstance(d["stack"], str):
            raise InputError(f"stack: {d['stack']!r} is not a name; allowed: {', '.join(stacks.list_stacks())}")
        plan.update(stacks.plan_fields(d["stack"]))
    plan.update({k: _value(k, v, f"plan.{k}") for k, v in plan_raw.items()})
    if "gbs" not in plan and "gbs" not in axis_names:
        raise InputError("plan.gbs: missing; give the global batch in [plan] or as an axis")
    return plan


def _objective_table(d: dict) -> tuple[str, str]:
    obj = _table(d, "objective") or {"minimize": "step_s"}
    if set(obj) - {"minimize", "maximize"} or len(obj) != 1:
        raise InputError("objective: give one of minimize = NAME or maximize = NAME")
    ((direction, objective),) = obj.items()
    _objective(objective, f"objective.{direction}")
    return direction, objective


def _output_table(d: dict) -> tuple[int, tuple, bool]:
    out = _table(d, "output")
    bad = set(out) - {"top", "pareto", "dump"}
    if bad:
        raise InputError(f"output: unknown field(s) {sorted(bad)}; allowed: top, pareto, dump")
    top_k = out.get("top", 10)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= 1000:
        raise InputError(f"output.top: {top_k!r} is not allowed; allowed: an integer 1..1000")
    pareto = out.get("pareto", ())
    if not isinstance(pareto, (list, tuple)) or not all(isinstance(p, str) for p in pareto):
        raise InputError(f"output.pareto: {pareto!r} is not allowed; allowed: a list of 2 or 3 objective names")
    pareto = tuple(pareto)
    if pareto and not 2 <= len(pareto) <= 3:
        raise InputError(f"output.pareto: {list(pareto)!r}; allowed: 2 or 3 objective names")
    for p in pareto:
        _objective(p, "output.pareto")
    dump = out.get("dump", False)
    if not isinstance(dump, bool):
        raise InputError(f"output.dump: {dump!r} is not allowed; allowed: true, false")
    return top_k, pareto, dump


# Plans/s to estimate a sweep's time before it starts: README "Speed", one 2-core CPU at low
# load: 6.37e8 plans/s reduced, 3.16e6 plans/s with a Pareto front (every output kept: 2.44e7).
PLANNING_RATE = {"reduced": 6.37e8, "pareto": 3.16e6, "dump": 2.44e7}
CONFIRM_S = 600.0   # a sweep estimated above ten minutes asks for --yes (or max_points) first


def _max_points(v):
    if v is None:
        return None
    return int(checks.number("max_points", v, integer=True))


def estimate_s(spec: SweepSpec) -> tuple[float, float]:
    """(seconds, plans/s): the time a sweep takes at the README's measured CPU rate."""
    rate = PLANNING_RATE["pareto" if spec.pareto else "dump" if spec.dump else "reduced"]
    return spec.points / rate, rate


def confirm_size(spec: SweepSpec, yes: bool) -> None:
    """Refuse a sweep above ``max_points``, or one estimated above CONFIRM_S without --yes or max_points."""
    seconds, rate = estimate_s(spec)
    about = f"about {seconds / 3600:.3g} h" if seconds >= 3600 else f"about {seconds / 60:.3g} min"
    if spec.max_points is not None and spec.points > spec.max_points:
        raise InputError(f"max_points: the sweep has {spec.points:,} plans, above max_points = {spec.max_points:,} "
                         f"({about} at {rate:.3g} plans/s on one CPU); allowed: fewer points or a larger max_points")
    if seconds > CONFIRM_S and not yes and spec.max_points is None:
        raise InputError(f"sweep: {spec.points:,} plans, {about} at {rate:.3g} plans/s on one CPU (README, Speed); "
                         f"allowed: --yes to start it, or max_points = {spec.points} in the sweep file")


def _run_table(raw) -> tuple:
    """[run]: tokens (required), usd_per_gpu_hour, failure_rate_per_gpu_hour, checkpoint_write_s, restart_s."""
    if not raw:
        return ()
    if not isinstance(raw, dict):
        raise InputError("run: give a table, e.g. [run] tokens = 15e12")
    bad = set(raw) - set(RUN_KEYS)
    if bad:
        raise InputError(f"run: unknown field(s) {sorted(bad)}; allowed: {', '.join(RUN_KEYS)}")
    if "tokens" not in raw:
        raise InputError("run.tokens: missing; allowed: a positive number of tokens to train")
    out = {k: v for k, v in RUN_KEYS.items() if v is not None}
    out["tokens"] = checks.positive("run.tokens", raw["tokens"])
    for k, v in raw.items():
        if k != "tokens":
            out[k] = checks.non_negative(f"run.{k}", v)
    return tuple(sorted(out.items()))


def load_spec(path) -> SweepSpec:
    """Read a sweep file (TOML)."""
    d = presets.read_toml(path, "sweep file")
    d.setdefault("name", Path(path).stem)
    return SweepSpec.from_dict(d)


# ---------------------------------------------------------------- inputs from axis arrays
