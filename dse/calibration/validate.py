"""Published measurements as dse inputs: parse the validation CSVs, predict, compare.

Reads the layout of ``validation/calibration_runs.csv`` (one measured training run a
row), ``kernel_microbenchmarks.csv`` and ``collective_bandwidth.csv``. A run row becomes
(ModelShape, Cluster, Plan) plus the published outcome; where the row is silent the
filled-in value and why are kept in ``Run.assumed``. Each source's FLOP convention is
honoured (validation/README.md): predicted figures are the source's FLOPs divided by
dse's predicted iteration time, so the relative error of the metric is
t_published / t_predicted - 1 whatever the convention.

Library code: no printing; the CLI formats.
"""

from __future__ import annotations

import dataclasses
import math
import re
from importlib import resources
from pathlib import Path

import numpy as np

from dse import files
from dse.errors import InputError
from dse.equations import feasibility
from dse.evaluate import derived, evaluate
from dse.inputs import FP8_RECIPES, RECOMPUTE, RECOMPUTE_MODULES, Cluster, ModelShape, Plan, checks, presets, stack, stacks
from dse.inputs.fidelity import SWITCHES, Fidelity

__all__ = ["Run", "load_runs", "read_rows", "convention", "predict", "metric_errors", "summary",
           "split_fitted", "predicted_memory_gb", "MEMORY_KINDS", "load_kernels", "load_stream", "load_attention", "load_collectives", "load_alltoall", "compare", "compare_tables", "shipped_run_tables", "loso_report", "DEFAULT_DIR",
           "OUTCOMES"]

DEFAULT_DIR = Path(str(resources.files("dse") / "data" / "validation"))   # copied from the published tables, with their README
LAYOUT = ("tp", "pp", "num_gpus")
# Outcome columns, in the order the headline metric is chosen (the first one the source
# printed itself, i.e. not named in derived_fields): (column, metric name, kind).
# kind "rate": the metric is proportional to 1 / iteration time; "time": to the time.
OUTCOMES = (("mfu_pct", "MFU %", "rate"), ("hfu_pct", "HFU %", "rate"), ("tflops_per_gpu", "TFLOP/s/GPU", "rate"),
            ("tokens_per_s_per_gpu", "tokens/s/GPU", "rate"), ("tokens_per_s_total", "tokens/s", "rate"),
            ("iteration_time_s", "iteration s", "time"))
# Free-text columns a row's framework and release are read from (stacks.resolve).
STACK_TEXT = ("source_ref", "notes", "zero_or_sharding")
_INT_COLUMNS = {"layers": "layers", "hidden": "hidden", "heads": "heads", "kv_heads": "kv_heads",
                "ffn_hidden": "ffn_hidden", "vocab": "vocab", "seq_len": "seq", "num_experts": "experts",
                "experts_per_token": "topk"}


@dataclasses.dataclass
class Run:
    """One runnable published run."""

    row_id: str
    source: str
    name: str
    model: ModelShape
    cluster: Cluster
    plan: Plan
    time_s: float                 # published (or derived-from-published) iteration time
    metric_name: str              # the source's headline figure ("TFLOP/s/GPU", "MFU %", ...)
    metric: float                 # its published value
    metric_kind: str              # "rate" (~ 1/t) or "time" (~ t)
    stack: str                    # the software-stack profile the plan's switches come from
    assumed: list[str]
    memory_gb: float | None = None   # per-GPU memory the source prints (memory_per_gpu_gb), if it does
    memory_kind: str = "device"      # what that figure holds (MEMORY_KINDS; the stack's memory_printed)
    table: str = ""                  # the runs table (file name) the row was read from


class _NotRunnable(Exception):
    """A row that cannot be predicted; its one-line reason."""


def _text(row, key) -> str:
    return (row.get(key) or "").strip()


def _num(row, key, default=None, check=None):
    """A numeric cell: its first number (``'1979 FP8 / 989 BF16'`` is 1979), checked like CLI input.

    Empty is ``default``; a cell that is no number, or fails ``check``, makes the row not runnable.
    """
    v = _text(row, key)
    if not v:
        return default
    head = v.split()[0].replace(",", "")
    try:
        x = float(head)
    except ValueError:
        raise _NotRunnable(f"{key}: {v!r} is not a number") from None
    try:
        return (check or checks.positive)(key, x)
    except InputError as exc:
        raise _NotRunnable(str(exc)) from None


def _int(row, key, default=None, minimum=1.0):
    return _num(row, key, default, lambda k, x: checks.number(k, x, integer=True, minimum=minimum))


def convention(row) -> str:
    """The FLOP convention of a row's TFLOP/s: "hardware" (counts recompute) or "model"
    (validation/README.md: Narayanan eq.(3) counts the recompute forward; Korthikanti and
    NeMo count model FLOPs). Read from the tflops_kind text, else flops_convention (which
    may describe both conventions); "model" when neither says."""
    text = (_text(row, "tflops_kind") or _text(row, "flops_convention")).lower()
    if "hardware" in text or "recompute forward" in text or "incl. recompute" in text:
        return "hardware"
    return "model"


def _model(row, assumed, folder=None) -> ModelShape:
    """The row's shape columns, filled from the Hugging Face config.json its ``model_config``
    column names (a path relative to the CSV), else from the preset its model name refers to."""
    name = _text(row, "model")
    config = _text(row, "model_config")
    preset = None if config else presets.model_for_name(name)
    fields = dict(presets.preset_fields("models", preset)) if preset else {}
    if config:
        path = Path(folder or ".") / config
        try:
            fields = {k: float(v) for k, v in presets.model_from_hf_config(path).to_dict().items()}
        except InputError as exc:
            raise _NotRunnable(f"model_config: {exc}") from None
        preset = f"config.json {config}"
    given = {field: _int(row, col) for col, field in _INT_COLUMNS.items()}
    given = {k: v for k, v in given.items() if v is not None}
    if preset:
        filled = sorted(k for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq")
                        if k not in given and k in fields)
        if filled:
            assumed.append(f"{', '.join(filled)} from " + (preset if config else f"model preset {preset}"))
    elif not {"layers", "hidden", "heads"} <= set(given):
        missing = [c for c in ("layers", "hidden", "heads") if c not in given]
        raise _NotRunnable(f"model {name!r}: no {', '.join(missing)} columns and no preset of that name")
    else:
        if "vocab" not in given:
            assumed.append("vocab=51200 (GPT-2/3 BPE)")
            given["vocab"] = 51200.0
        if "ffn_hidden" not in given:
            assumed.append("ffn_hidden=4h (GPT)")
    fields.update(given)
    if "seq" not in fields:
        raise _NotRunnable("seq_len: missing and no model preset gives it")
    try:
        return presets.model_from_fields(fields)
    except InputError as exc:
        raise _NotRunnable(str(exc)) from None


def _cluster(row, assumed, preset=None) -> Cluster:
    """The hardware preset the row's gpu_type names (or ``preset``), with the row's link speeds."""
    gpu = _text(row, "gpu_type")
    name = preset or presets.cluster_for_gpu(gpu)
    if name is None:
        raise _NotRunnable(f"gpu_type: no hardware preset matches {gpu!r}")
    over = {"gpus": _int(row, "num_gpus")}
    gpn = _int(row, "gpus_per_node")
    if gpn is not None:
        over["gpus_per_node"] = gpn
    nv, nic = _num(row, "nvlink_GBps_per_dir"), _num(row, "scaleout_Gbps_per_gpu")
    if nv:
        over["bw_up_GBps"] = nv
    if nic:
        over["bw_out_GBps"] = nic / 8.0
    assumed.append(f"hardware preset {name}" + ("" if preset else f" (gpu_type {gpu!r})"))
    fields = presets.preset_fields("clusters", name)
    if fields.get("topology") == "torus" and over["gpus"] != float(fields["gpus"]):
        x, y, z = _torus_shape(over["gpus"])   # a slice of that many chips: the most cube-like shape
        over.update(torus_x=x, torus_y=y, torus_z=z)
        assumed.append(f"torus slice {x:g}x{y:g}x{z:g} (shape not given)")
    try:
        return presets.load_cluster(name, **over)
    except InputError as exc:
        raise _NotRunnable(str(exc)) from None


def _torus_shape(n: float) -> tuple[float, float, float]:
    """x <= y <= z with x y z = n and z / x smallest (TPU slices are near-cubes: Jouppi et al. 2023 sec.2)."""
    n = int(n)
    best = min(((x, y, n // (x * y)) for x in range(1, n + 1) if n % x == 0
                for y in range(x, n // x + 1) if (n // x) % y == 0 and n // (x * y) >= y),
               key=lambda d: d[2] / d[0])
    return tuple(float(v) for v in best)


def _stack(row) -> tuple[str, str]:
    named = _text(row, "stack")
    if named:
        if named not in stacks.list_stacks():
            raise _NotRunnable(f"stack: unknown {named!r}; allowed: {', '.join(stacks.list_stacks())}")
        return named, "the row names it"
    return stacks.resolve(" ".join(_text(row, k) for k in STACK_TEXT))


def _dp_shard(row):
    """Hybrid sharding's shard group (Plan.dp_shard) where the row's sharding text names hybrid sharding
    (or HSDP) and its group ('FSDP over 128 GPUs'); None where it names neither."""
    text = _text(row, "zero_or_sharding").lower()
    if "hybrid shard" not in text and "hsdp" not in text:
        return None
    m = re.search(r"(?:fsdp|shard(?:ed|ing)?) over (?:all )?(\d+)", text)
    if m is None:
        raise _NotRunnable("zero_or_sharding: hybrid sharding without its shard group ('FSDP over N GPUs')")
    return float(m.group(1))


def _zero(row):
    text = _text(row, "zero_or_sharding").lower()
    for stage in ("3", "2", "1"):
        if f"zero-{stage}" in text or f"zero{stage}" in text or f"zero stage {stage}" in text:
            return float(stage)
    if "fsdp" in text:
        return 3.0
    if "distributed optimizer" in text:
        return 1.0
    if text.startswith("none") or "no zero" in text:
        return 0.0
    return None


# Words in a row's recompute text and the mode they name (dse.inputs.plan.RECOMPUTE), first match wins:
# MaxText's save_qkv_proj policy before "full" (a row may call it full recompute but the QKV projections);
# op-level selective checkpointing (torchtitan's 'op' policy) before the plain "selective" of Korthikanti.
_RECOMPUTE_WORDS = ((("save_qkv_proj",), "qkv"), (("selective op", "op-level", "op level"), "op"), (("full",), "full"),
                    (("selective",), "selective"),
                    (("none", "no recompute"), "none"))


def _recompute(row, stack) -> tuple:
    """(recompute code, recompute_every, where N came from) the row's recompute text names; None
    where it names none.
    Layer-level selective checkpointing (torchtitan's selective_ac_option N) is full recompute of one
    layer in N (Plan.recompute_every): "every other layer" says N = 2, "selective layer" alone takes
    the stack profile's ``selective_layer_every`` (its default N, with its source). Op-level selective
    checkpointing ("selective op", torchtitan's selective_ac_option 'op') is the op mode, not
    Korthikanti's selective recompute of the attention core."""
    text = _text(row, "recompute").lower()
    if "microbatch-level" in text:
        raise _NotRunnable("recompute mode not modelled (microbatch-level)")
    if "every other layer" in text:
        return RECOMPUTE["full"], 2.0, "recompute_every=2 (the row says every other layer)"
    if "selective layer" in text:
        every = stacks.load_stack(stack)["selective_layer_every"]
        if every is None:
            raise _NotRunnable(f"recompute: layer-level selective, and stack {stack} gives no selective_layer_every")
        return RECOMPUTE["full"], every, f"recompute_every={every:g} (stack {stack}: selective_layer_every)"
    for words, mode in _RECOMPUTE_WORDS:
        if any(w in text for w in words):
            return RECOMPUTE[mode], None, None
    return None, None, None


def _recompute_modules(row):
    """Selective recompute's modules (Plan.recompute_modules) where the row's recompute text names them as
    Megatron's flag does ("--recompute-modules layernorm moe_act", up to a character other than a name,
    a space or a comma), else None; checked as the CLI checks the flag (checks.plan_value)."""
    m = re.search(r"recompute[-_ ]modules[=: ]+((?:[a-z_]+[ ,]*)+)", _text(row, "recompute").lower())
    if not m:
        return None
    try:   # the names up to the next other character, split as the flag's value is
        return checks.plan_value("recompute.recompute_modules", m.group(1).strip(" ,"))
    except InputError as exc:
        raise _NotRunnable(str(exc)) from None


# Words in a row's precision text that name an FP8 recipe (dse.inputs.plan.FP8_RECIPES); FP8 alone is
# delayed scaling, Megatron-LM's and Transformer Engine's default recipe.
_RECIPE_WORDS = (("mxfp8", "mxfp8"), ("blockwise", "blockwise"), ("block scaling", "blockwise"),
                 ("tensorwise", "tensorwise"), ("current scaling", "tensorwise"), ("delayed", "delayed"))


def fp8_recipe_of(precision: str) -> float:
    """The FP8 recipe code a row's precision text names: 0 without FP8, delayed when it names none."""
    text = precision.lower()
    if "fp8" not in text:
        return 0.0
    return next((FP8_RECIPES[r] for w, r in _RECIPE_WORDS if w in text), FP8_RECIPES["delayed"])


def _plan(row, model, cluster, assumed) -> tuple[Plan, str]:
    """The plan: the row's layout and switches; what the row leaves out, from its stack profile."""
    stack, why = _stack(row)
    default = stacks.plan_fields(stack)
    t, p = _int(row, "tp"), _int(row, "pp")
    c, e = _int(row, "cp", 1.0), _int(row, "ep", 1.0)
    b = _int(row, "microbatch")
    if b is None:
        b = 1.0
        assumed.append("microbatch=1 (not given)")
    B = _int(row, "global_batch_seqs")
    if B is None:
        tokens = _int(row, "global_batch_tokens")
        if tokens is None:
            raise _NotRunnable("global_batch_seqs: missing (and no global_batch_tokens)")
        B = tokens / float(model.seq)
    v = _int(row, "vpp")
    if v is None:
        v = 1.0
        assumed.append("vpp=1 (not given)")
    recompute, every, why_every = _recompute(row, stack)
    if why_every:
        assumed.append(why_every)
    stated = {"sp": {"yes": 1.0, "no": 0.0}.get(_text(row, "sequence_parallel").lower()),
              "zero": _zero(row), "recompute": recompute, "recompute_every": every, "dp_shard": _dp_shard(row),
              "recompute_modules": _recompute_modules(row)}
    fields = dict(default)
    fields.update({k: v for k, v in stated.items() if v is not None})
    given = _plan_fields(row)
    fields.update(given)
    if t <= 1:   # SP and TP comm overlap act on TP traffic: nothing to switch on without TP
        fields["sp"], fields["tp_comm_overlap"] = 0.0, 0.0
    show = lambda k: {v: n for n, v in RECOMPUTE.items()}[fields[k]] if k == "recompute" else f"{fields[k]:g}"  # noqa: E731
    filled = [f"{k}={show(k)}" for k in sorted(default)
              if stated.get(k) is None and k not in given and not (t <= 1 and k in ("sp", "tp_comm_overlap"))]
    assumed.append(f"stack {stack} ({why}): " + (", ".join(filled) or "nothing filled in"))
    fp8 = fp8_recipe_of(_text(row, "precision"))
    plan = Plan.make(tp=t, pp=p, cp=c, ep=e, vpp=v, mbs=b, gbs=B, fp8=fp8, **fields)
    piped = stacks.pipelined_fields(stack) if stacks.pipelines(p, float(plan.zero)) else {}
    if piped:   # what the stack's pipeline does whatever the row asked (torchtitan: FSDP as ZeRO-1)
        plan = stacks.pipelined(plan, piped)
        assumed.append(f"pp > 1 under stack {stack}: " + ", ".join(f"{k}={v:g}" for k, v in sorted(piped.items()))
                       + " (its pipelined_source)")
    # the feasibility table's structural rules (N = d t c p, B = m d b, t | heads, ...), as dse plan checks them
    d, _, m = derived(cluster, plan)
    err = feasibility.structural_error(feasibility.quantities(model, cluster, plan, d, m, 0.0, False))
    if err:
        raise _NotRunnable(f"{_LAYOUT_COLUMNS.get(err[0], err[0])}: {err[1]}")
    return plan, stack


def _plan_fields(row) -> dict:
    """Plan fields a row states outright in its ``plan_fields`` column, "name=value" items separated
    by ";" (``ep_comm_overlap=1; capacity_factor=1``): what its source printed that has no column of
    its own (a dispatcher's overlap, the pipeline split's options), each checked as the CLI checks the
    flag (checks.plan_value). They win over the stack's defaults; the layout columns stay the layout's."""
    out = {}
    for item in filter(None, (x.strip() for x in _text(row, "plan_fields").split(";"))):
        name, sep, value = (x.strip() for x in item.partition("="))
        if not sep or name not in Plan.__dataclass_fields__ or name in _LAYOUT_FIELDS:
            raise _NotRunnable(f"plan_fields: {item!r} is not allowed; allowed: name=value of a Plan field "
                               f"other than the layout's ({', '.join(_LAYOUT_FIELDS)})")
        try:
            out[name] = checks.plan_value(f"plan_fields.{name}", value)
        except InputError as exc:
            raise _NotRunnable(str(exc)) from None
    return out


_LAYOUT_FIELDS = ("tp", "pp", "cp", "ep", "vpp", "mbs", "gbs", "fp8")   # read from their own columns
_LAYOUT_COLUMNS = {"gpus": "num_gpus", "gbs": "global_batch_seqs", "mbs": "microbatch"}   # Plan field -> CSV column


def _headline(row):
    """(column, metric name, kind, value) of the source's own headline figure, or None."""
    derived_text = set(re.findall(r"[a-z_]+", _text(row, "derived_fields").lower()))

    def derived(col):
        return col in derived_text or (col.startswith("tokens_per_s") and "tokens_per_s" in derived_text)

    present = [(col, name, kind, _num(row, col)) for col, name, kind in OUTCOMES]
    present = [x for x in present if x[3] is not None]
    if not present:
        return None
    own = [x for x in present if not derived(x[0])]
    return (own or present)[0]


def _time(row, model, cluster, plan, assumed) -> float:
    """The published iteration time, or the time the row's outcome fixes given the global batch."""
    t = _num(row, "iteration_time_s")
    if t is not None:
        return t
    N, B, s = float(cluster.gpus), float(plan.gbs), float(model.seq)
    tok = _num(row, "tokens_per_s_total")
    if tok is not None:
        return B * s / tok
    tok = _num(row, "tokens_per_s_per_gpu")
    if tok is not None:
        return B * s / (tok * N)
    flops = _flops(model, cluster, plan)
    peak = _num(row, "peak_tflops_per_gpu")
    peak = peak * 1e12 if peak else float(cluster.peak_flops_per_s)
    for col, kind, scale in (("tflops_per_gpu", convention(row), 1e12), ("mfu_pct", "model", peak / 100.0),
                             ("hfu_pct", "hardware", peak / 100.0)):
        x = _num(row, col)
        if x is not None:
            assumed.append(f"iteration time from {col} ({kind} FLOPs)")
            return flops[kind] / (N * x * scale)
    raise _NotRunnable("no outcome: give iteration_time_s, tokens/s, TFLOP/s per GPU, MFU or HFU")


def _flops(model, cluster, plan) -> dict:
    """Model and hardware FLOPs a step, as dse counts them (real shapes; compute.model_flops,
    hardware_flops); the FLOP counts do not depend on any fitted efficiency."""
    rep = evaluate(model, cluster, plan, Fidelity.make(**SWITCHES))
    return {"model": float(rep.model_flops), "hardware": float(rep.hardware_flops)}


# What a published per-GPU memory figure holds, and the Report parts to leave out to compare with it:
# "device" everything on the GPU (nvidia-smi); "reserved" the caching allocator's peak reserved
# memory (torch.cuda.max_memory_reserved), which holds fragmentation but neither the CUDA context
# nor NCCL's own buffers.
MEMORY_KINDS = {"device": (), "reserved": ("context_bytes", "nccl_bytes")}


def predicted_memory_gb(rep, i, kind) -> float:
    """Row ``i``'s predicted per-GPU memory in GB as a source of ``kind`` measures it."""
    total = float(np.asarray(rep.memory_bytes).reshape(-1)[i])
    less = sum(float(np.broadcast_to(np.asarray(getattr(rep, part)), np.shape(rep.memory_bytes)).reshape(-1)[i])
               for part in MEMORY_KINDS[kind])
    return (total - less) / 1e9


def _run_from_row(row, cluster_preset=None, folder=None) -> Run:
    """A Run from one row, or _NotRunnable with the reason."""
    missing = [k for k in LAYOUT if not _text(row, k)]
    if missing:
        raise _NotRunnable(f"missing {', '.join(missing)}")
    head = _headline(row)
    if head is None:
        raise _NotRunnable("no outcome: give iteration_time_s, tokens/s, TFLOP/s per GPU, MFU or HFU")
    assumed: list[str] = []
    model = _model(row, assumed, folder)
    cluster = _cluster(row, assumed, cluster_preset)
    plan, stack = _plan(row, model, cluster, assumed)
    time_s = _time(row, model, cluster, plan, assumed)
    _, metric_name, kind, metric = head
    memory = _num(row, "memory_per_gpu_gb")
    printed = stacks.load_stack(stack)["memory_printed"] or "device"
    if memory is not None and printed != "device":
        assumed.append(f"memory_per_gpu_gb is {printed} memory (stack {stack}: memory_printed)")
    return Run(row["row_id"], row["source_id"], _text(row, "model"), model, cluster, plan, time_s,
               metric_name, metric, kind, stack, assumed, memory, printed)


def read_rows(path=None) -> list[dict]:
    """The rows of a CSV in the calibration_runs.csv layout (one InputError line when unreadable)."""
    path = Path(path) if path else DEFAULT_DIR / "calibration_runs.csv"
    rows = files.read_csv_rows(path, "runs CSV", "a CSV in the calibration_runs.csv layout")   # binary, folder: one line
    if not rows or "row_id" not in rows[0] or "source_id" not in rows[0]:
        raise InputError(f"runs CSV: {str(path)!r} lacks row_id/source_id columns; allowed: the calibration_runs.csv layout")
    return rows


def load_runs(path=None, cluster=None) -> tuple[list[Run], list[tuple[str, str]]]:
    """(runnable runs, [(row_id, why not runnable)]) from a calibration_runs.csv layout.

    ``cluster``: a cluster preset every row runs on instead of the one its gpu_type names.
    """
    runs, skipped = [], []
    folder = Path(path).parent if path else DEFAULT_DIR
    table = Path(path).name if path else "calibration_runs.csv"
    for i, row in enumerate(read_rows(path)):
        rid = _text(row, "row_id") or f"line {i + 2}"
        try:
            runs.append(dataclasses.replace(_run_from_row({**row, "row_id": rid}, cluster, folder), table=table))
        except _NotRunnable as exc:
            skipped.append((rid, str(exc)))
    return runs, skipped


def batch(runs):
    """Stack the runs' inputs into one batched (model, cluster, plan)."""
    return (stack([r.model for r in runs]), stack([r.cluster for r in runs]), stack([r.plan for r in runs]))


def predict(runs, fidelity="calibrated"):
    """Predicted iteration time (s) and the batched Report for every run, one float64 evaluate
    call on the host (engines.compiled.evaluate_exact: no XLA program for a few dozen rows)."""
    from dse.engines.compiled import evaluate_exact

    model, cluster, plan = batch(runs)
    rep = evaluate_exact(model, cluster, plan, fidelity)
    return np.asarray(rep.step_s), rep


def metric_errors(runs, step_s):
    """[(predicted metric, relative error)] on each row's headline metric.

    A rate (TFLOP/s, tokens/s, MFU) under the source's own convention scales as 1/t, so
    its prediction is metric x t_published / t_predicted whatever the FLOP convention; an
    iteration time is the predicted time itself.
    """
    out = []
    for r, t in zip(runs, step_s):
        ratio = float(t) / r.time_s
        pred = r.metric * (ratio if r.metric_kind == "time" else 1.0 / ratio)
        out.append((pred, pred / r.metric - 1.0))
    return out


def split_fitted(runs) -> set[str]:
    """The rows the calibration fits: every other runnable row of each source, in row order.

    The rest are judged. A fixed rule, so nobody picks the judged rows after seeing them.
    """
    fitted = set()
    for source in sorted({r.source for r in runs}):
        ids = sorted(r.row_id for r in runs if r.source == source)
        fitted.update(ids[0::2])
    return fitted


def summary(errors):
    """(median |err|, max |err|, mean |err|) of relative errors."""
    a = np.abs(np.asarray(errors, dtype=float))
    if a.size == 0:
        return (math.nan, math.nan, math.nan)
    return float(np.median(a)), float(np.max(a)), float(np.mean(a))


def summary_of(errors) -> dict:
    """``summary`` as a table's summary line: rows, median, max and mean |error|."""
    med, mx, mean = summary(errors)
    return {"rows": len(errors), "median_abs": med, "max_abs": mx, "mean_abs": mean}


# ---------------------------------------------------------------- kernel and collective tables


# The GPUs the shared GEMM-shape curve is fitted on (gpu_type prefix -> preset). GB200 kernel
# rows are left out on purpose: with them the shared knee and exponent move (exponent 1.07 ->
# 0.94) and the A100 16384^3 GEMM goes from within 5% of its measured 256.5 TFLOP/s to -5.5%;
# their small-GEMM falloff is much steeper than the one shared curve can follow.
KERNEL_GPUS = (("A100", "a100-80gb"), ("H100", "h100-sxm"), ("H800", "h800"), ("H200", "h200"), ("B200", "b200"))


def _kernel_gpu(text: str):
    return next((p for prefix, p in KERNEL_GPUS if text.startswith(prefix)), None)


_SHAPE = re.compile(r"m x n x k = (\d+)(?:\^3|x(\d+)x(\d+))")


_COLUMNS = {"kernel_microbenchmarks.csv": ("row_id", "gpu_type", "precision", "unit", "value", "benchmark"),
            "collective_bandwidth.csv": ("row_id", "system", "collective", "message_size_bytes", "busbw_GBps",
                                         "num_gpus")}


def _cell(row, key, default=None):
    """A positive numeric cell of a kernel or collective table row, else None (the row is left out)."""
    try:
        return _num(row, key, default)
    except _NotRunnable:
        return None


def _table(path, default_name):
    """Rows of a validation CSV (``path`` or the shared table ``default_name``), its columns checked."""
    path = Path(path) if path else DEFAULT_DIR / default_name
    return files.read_csv_rows(path, default_name, f"a CSV in the {default_name} layout",
                               required=_COLUMNS.get(default_name, ()))


def load_kernels(path=None):
    """cuBLASLt GEMM rows: [(row_id, gpu preset, precision bytes, m, n, k, TFLOP/s)] (16-bit and FP8, KERNEL_GPUS)."""
    out = []
    for row in _table(path, "kernel_microbenchmarks.csv"):
        mt = _SHAPE.search(row.get("shape_or_params") or "")
        gpu = _kernel_gpu(row.get("gpu_type") or "")
        prec = (row.get("precision") or "").upper()
        if not mt or gpu is None or prec not in ("FP16", "BF16", "FP8") or row.get("unit") != "TFLOP/s" \
                or _cell(row, "value") is None:
            continue
        m = float(mt.group(1))
        n, k = (float(mt.group(2)), float(mt.group(3))) if mt.group(2) else (m, m)
        out.append((row["row_id"], gpu, 1.0 if prec == "FP8" else 2.0, m, n, k, float(row["value"])))
    return out


def load_stream(path=None):
    """HBM STREAM rows: [(row_id, gpu preset, bytes/s)] (kernel_microbenchmarks.csv, TB/s)."""
    out = []
    for row in _table(path, "kernel_microbenchmarks.csv"):
        gpu = _kernel_gpu(row.get("gpu_type") or "")
        if gpu and (row.get("benchmark") or "").startswith("HBM STREAM") and row.get("unit") == "TB/s" \
                and _cell(row, "value") is not None:
            out.append((row["row_id"], gpu, float(row["value"]) * 1e12))
    return out


def load_attention(path=None):
    """Fused-attention rows: [(row_id, gpu preset, TFLOP/s)] of the FlashAttention benchmarks
    (kernel_microbenchmarks.csv, KERNEL_GPUS). Their TFLOP/s count the FLOPs the kernel
    computes (benchmark_flash_attention.py: fwd + bwd = 3.5 x forward, halved when causal;
    compute.FUSED_ATTN_WORK)."""
    out = []
    for row in _table(path, "kernel_microbenchmarks.csv"):
        gpu = _kernel_gpu(row.get("gpu_type") or "")
        if gpu and (row.get("benchmark") or "").startswith("FlashAttention") and row.get("unit") == "TFLOP/s" \
                and _cell(row, "value") is not None:
            out.append((row["row_id"], gpu, float(row["value"])))
    return out


def load_collectives(path=None):
    """nccl-tests all-reduce rows: [(row_id, system, gpus, nodes, bytes, busbw bytes/s)]."""
    out = []
    for row in _table(path, "collective_bandwidth.csv"):
        if not (row.get("collective") or "").startswith("all-reduce"):
            continue
        size, bus = _cell(row, "message_size_bytes"), _cell(row, "busbw_GBps")
        n, nodes = _cell(row, "num_gpus"), _cell(row, "num_nodes", 1.0)
        if size and bus and n and nodes:
            out.append((row["row_id"], row["system"], n, nodes, size, bus * 1e9))
    return out



def load_alltoall(path=None):
    """MoE dispatch/combine rows measured in bulk (not the latency-bound low-latency kernels):
    [(row_id, gpu preset, nodes, bytes/s)], the bottleneck link's achieved rate (NVLink on
    one node, RDMA across nodes, as DeepEP's tables print it). Rows without a GPU and node
    count (logical-bandwidth rows) are left out."""
    out = []
    for row in _table(path, "collective_bandwidth.csv"):
        coll = (row.get("collective") or "")
        if not coll.startswith(("MoE dispatch", "MoE combine")) or "low-latency" in coll:
            continue
        gpu = presets.cluster_for_gpu(row.get("gpu_type") or "")
        bw, n, nodes = _cell(row, "busbw_GBps"), _cell(row, "num_gpus"), _cell(row, "num_nodes")
        if gpu and bw and n and nodes:
            out.append((row["row_id"], gpu, nodes, bw * 1e9))
    return out


def compare(runs, fidelity, fitted_ids=()):
    """Rows (predicted vs published, error, fitted/judged) and summaries, as plain Python.

    ``fitted_ids``: the rows the calibration was fitted on (calibrated.fitted_rows()).
    Each source also gets its iteration-time error summarized (for Korthikanti's runs,
    calculon's published validation: 3.65% average, 8.87% max).
    """
    fitted_ids = set(fitted_ids)
    step_s, rep = predict(runs, fidelity)
    rows = []
    for i, (r, t, (pred, err)) in enumerate(zip(runs, step_s, metric_errors(runs, step_s))):
        rows.append({"row_id": r.row_id, "set": "fitted" if r.row_id in fitted_ids else "judged",
                     "source": r.source, "model": r.name, "stack": r.stack, "metric": r.metric_name,
                     "published": r.metric, "predicted": pred, "error": err,
                     "time_published_s": r.time_s, "time_predicted_s": float(t),
                     "time_error": float(t) / r.time_s - 1.0, "assumed": r.assumed, "table": r.table})
        if r.memory_gb is not None:   # the source prints per-GPU memory: compared as it measures it
            mem = predicted_memory_gb(rep, i, r.memory_kind)
            rows[-1].update(memory_published_gb=r.memory_gb, memory_predicted_gb=mem, memory_kind=r.memory_kind,
                            memory_error=mem / r.memory_gb - 1.0)

    def summ(sel, key="error"):
        return summary_of([x[key] for x in sel])

    out = {"judged (never fitted)": summ([x for x in rows if x["set"] == "judged"]),
           "fitted": summ([x for x in rows if x["set"] == "fitted"]),
           "all": summ(rows)}
    for source in sorted({x["source"] for x in rows}):
        out[f"{source} (all rows)"] = summ([x for x in rows if x["source"] == source])
    for source in sorted({x["source"] for x in rows}):   # calculon's figure for Korthikanti: 3.65% mean, 8.87% max
        out[f"{source} iteration time"] = summ([x for x in rows if x["source"] == source], "time_error")
    out["memory (rows that print it)"] = summ([x for x in rows if "memory_error" in x], "memory_error")
    out = {k: v for k, v in out.items() if v["rows"]}   # no summary of nothing (never a NaN)
    return {"rows": rows, "summary": out, "fitted_rows": sorted(fitted_ids)}



def shipped_run_tables() -> list[Path]:
    """The runs tables dse ships (dse/data/validation): the calibration table, then every judged_*.csv,
    whose rows no fit has seen."""
    return [DEFAULT_DIR / "calibration_runs.csv"] + sorted(DEFAULT_DIR.glob("judged_*.csv"))


def compare_tables(paths, fidelity, fitted_ids=(), cluster=None):
    """``compare`` over every runnable row of several runs tables at once, with the summary of each
    table's judged rows (by file name) and of every judged row outside the first table (the
    calibration table: "outside the calibration table", issue 17's measure), and the rows that could
    not run, as (row_id, why)."""
    runs, skipped = [], []
    for path in paths:
        got, skip = load_runs(path, cluster=cluster)
        runs += got
        skipped += skip
    # the calibration file names its fitted rows by id, so an id two tables share would mark both fitted
    seen = {}
    for r in runs:
        if r.row_id in seen:
            raise InputError(f"runs tables: row {r.row_id} in {r.table} and {seen[r.row_id]}; allowed: a row id in one table")
        seen[r.row_id] = r.table
    table = compare(runs, fidelity, fitted_ids)
    judged = [x for x in table["rows"] if x["set"] == "judged"]
    names = [Path(p).name for p in paths]
    extra = {f"{n} (judged)": summary_of([x["error"] for x in judged if x["table"] == n]) for n in names}
    extra["outside the calibration table"] = summary_of([x["error"] for x in judged if x["table"] != names[0]])
    table["summary"] = {**{k: v for k, v in extra.items() if v["rows"]}, **table["summary"]}
    return table, skipped


def loso_report(path=None) -> dict:
    """Leave-one-source-out errors a calibration file holds ({source: (median, max, mean)}),
    as ``dse calibrate`` fitted and judged them; {} when the file has none."""
    import tomllib

    from dse.inputs.fidelity import calibration_path

    path = Path(path) if path else calibration_path()
    try:
        report = tomllib.loads(path.read_text()).get("report", {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    key = "leave_one_source_out__"
    out = {k[len(key):]: tuple(float(x) for x in v) for k, v in report.items() if k.startswith(key)}
    if out and report.get("loso_pooled"):   # every left-out row of every source, pooled
        out["all rows, pooled"] = tuple(float(x) for x in report["loso_pooled"])
    return out
