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

from dse.inputs import checks
from dse import files
from dse.inputs import presets
from dse.errors import InputError
from dse.evaluate import derived, evaluate
from dse.inputs import Cluster, ModelShape, Plan, stack

__all__ = ["Run", "load_runs", "source_flops", "predict", "metric_errors", "summary",
           "split_fitted", "load_kernels", "load_stream", "load_collectives", "compare", "DEFAULT_DIR"]

DEFAULT_DIR = Path(str(resources.files("dse") / "data" / "validation"))   # copied from the published tables, with their README
RUN_COLUMNS = ("row_id", "source_id", "layers", "hidden", "heads", "seq_len", "tp", "pp",
               "num_gpus", "iteration_time_s")

# gpu_type prefix -> cluster preset (peaks, HBM bandwidth, alpha); link speeds come from the row.
GPU_PRESETS = (("A100", "a100-80gb"), ("H100", "h100-sxm"), ("H800", "h800"), ("H200", "h200"), ("B200", "b200"))


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
    metric_name: str              # "TFLOP/s/GPU" or "MFU %", the source's headline figure
    metric: float                 # its published value
    flops: float                  # FLOPs a step under the source's convention
    assumed: list[str]


def _num(row, key, default=None):
    v = (row.get(key) or "").strip()
    if not v:
        return default
    try:
        return float(v.split()[0].replace(",", ""))
    except ValueError:
        return default


def source_flops(source, B, s, L, h, V):
    """FLOPs a step as the source counts them (validation/README.md, formulas F13, F16)."""
    if source == "narayanan2021":   # eq.(3): counts the recompute forward
        return 96.0 * B * s * L * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * L * h))
    if source == "korthikanti2022":  # Appendix A eq.(7): model FLOPs
        return 72.0 * B * L * s * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * h * L))
    return None


def _recompute(row, source, assumed):
    text = (row.get("recompute") or "").lower()
    if "microbatch-level" in text:
        return None
    if "full" in text:
        return 2.0
    if "selective" in text:
        return 1.0
    if source == "narayanan2021":
        assumed.append("recompute=full (eq.3 counts the recompute forward)")
        return 2.0
    assumed.append("recompute=none (not stated)")
    return 0.0


def _zero(row, source, assumed):
    text = (row.get("zero_or_sharding") or "").lower()
    if "zero-3" in text:
        return 3.0
    if source == "nemo_perf_2407":
        assumed.append("zero=1 (NeMo distributed optimizer default)")
        return 1.0
    return 0.0


def _cluster(row, assumed) -> Cluster | None:
    gpu = row.get("gpu_type") or ""
    name = next((p for prefix, p in GPU_PRESETS if gpu.startswith(prefix)), None)
    if name is None:
        return None
    over = {"gpus": _num(row, "num_gpus"), "gpus_per_node": _num(row, "gpus_per_node", 8.0)}
    nv = _num(row, "nvlink_GBps_per_dir")
    nic = _num(row, "scaleout_Gbps_per_gpu")
    if nv:
        over["bw_up_GBps"] = nv
    if nic:
        over["bw_out_GBps"] = nic / 8.0
    over["domain"] = over["gpus_per_node"]
    return presets.load_cluster(name, **over)


def _run_from_row(row) -> tuple[Run | None, str]:
    """(Run, "") or (None, why the row cannot run)."""
    rid, source = row["row_id"], row["source_id"]
    missing = [k for k in RUN_COLUMNS if not (row.get(k) or "").strip()]
    if missing:
        return None, f"missing {', '.join(missing)}"
    assumed: list[str] = []
    L, h, a, s = (_num(row, k) for k in ("layers", "hidden", "heads", "seq_len"))
    V = _num(row, "vocab")
    if V is None:
        V = 51200.0
        assumed.append("vocab=51200 (GPT-2/3 BPE)")
    name = row.get("model") or ""
    gated = 1.0 if "llama" in name.lower() else 0.0   # Llama: SwiGLU (Touvron et al. 2023)
    model = ModelShape.make(layers=L, hidden=h, heads=a, kv_heads=_num(row, "kv_heads", a),
                            ffn_hidden=_num(row, "ffn_hidden", 4.0 * h), vocab=V, seq=s,
                            experts=_num(row, "num_experts", 1.0), topk=_num(row, "experts_per_token", 1.0),
                            ffn_gated=gated)
    cluster = _cluster(row, assumed)
    if cluster is None:
        return None, f"no preset for gpu {row.get('gpu_type')!r}"
    rc = _recompute(row, source, assumed)
    if rc is None:
        return None, "recompute mode not modelled (microbatch-level)"
    t, p, N = _num(row, "tp"), _num(row, "pp"), _num(row, "num_gpus")
    c, e = _num(row, "cp", 1.0), _num(row, "ep", 1.0)
    b = _num(row, "microbatch")
    if b is None:
        b = 1.0
        assumed.append("microbatch=1 (not given)")
    B = _num(row, "global_batch_seqs")
    if B is None:
        return None, "missing global_batch_seqs"
    v = _num(row, "vpp")
    if v is None:
        v = 1.0
        assumed.append("vpp=1 (not given)")
    sp_text = (row.get("sequence_parallel") or "").strip().lower()
    if sp_text in ("yes", "no"):
        sp = 1.0 if sp_text == "yes" else 0.0
    else:
        sp = 1.0 if (source == "nemo_perf_2407" and t > 1) else 0.0
        assumed.append(f"sp={int(sp)} ({'NeMo default with TP' if sp else 'not given; SP postdates 2021'})")
    zero = _zero(row, source, assumed)
    fp8 = 1.0 if "fp8" in (row.get("precision") or "").lower() else 0.0
    # Megatron-LM 2021-22 ran the gradient all-reduce after the backward pass (Korthikanti
    # sec.6.3: "not overlapped"); DeepSpeed ZeRO-3 and NeMo overlap it.
    ogr = 1.0 if (zero >= 3 or source == "nemo_perf_2407") else 0.0
    tpo = 1.0 if (source == "nemo_perf_2407" and t > 1) else 0.0
    if tpo:
        assumed.append("tp_comm_overlap=1 (NeMo/TE userbuffers default with TP)")
    # NeMo 24.07 runs fused (flash/cuDNN) attention; Megatron-LM 2021-22 and DeepSpeed did not.
    flash = 1.0 if source == "nemo_perf_2407" else 0.0
    if flash:
        assumed.append("flash_attention=1 (NeMo default)")
    plan = Plan.make(tp=t, pp=p, cp=c, ep=e, vpp=v, mbs=b, gbs=B, zero=zero, recompute=rc, sp=sp,
                     fp8=fp8, overlap_grad_reduce=ogr, tp_comm_overlap=tpo, flash_attention=flash)
    d, _, m = (float(x) for x in derived(cluster, plan))    # d = N/(t c p), m = B/(d b): dse.evaluate
    if abs(m - round(m)) > 1e-9:
        return None, f"global batch {B:g} is not a multiple of dp*mbs = {d * b:g}"
    time_s = _num(row, "iteration_time_s")
    flops = source_flops(source, B, s, L, h, V)
    if source == "korthikanti2022":
        metric_name, metric = "MFU %", _num(row, "mfu_pct")
    else:
        metric_name, metric = "TFLOP/s/GPU", _num(row, "tflops_per_gpu")
    if metric is None:
        return None, "no published throughput"
    if flops is None:   # NeMo: model TFLOP/s as NVIDIA counts them; the FLOPs are what it implies
        flops = metric * 1e12 * N * time_s
    return Run(rid, source, name, model, cluster, plan, time_s, metric_name, metric, flops, assumed), ""


def load_runs(path=None) -> tuple[list[Run], list[tuple[str, str]]]:
    """(runnable runs, [(row_id, why not runnable)]) from a calibration_runs.csv layout."""
    path = Path(path) if path else DEFAULT_DIR / "calibration_runs.csv"
    rows = files.read_csv_rows(path, "runs CSV", "a CSV in the calibration_runs.csv layout")
    if not rows or "row_id" not in rows[0] or "source_id" not in rows[0]:
        raise InputError(f"runs CSV: {str(path)!r} lacks row_id/source_id columns; allowed: the calibration_runs.csv layout")
    runs, skipped = [], []
    for row in rows:
        try:   # a bad number in a row skips the row and says why (dse/inputs/checks.py), never a traceback
            for k in RUN_COLUMNS[2:]:
                if (row.get(k) or "").strip():
                    checks.positive(k, row[k].split()[0].replace(",", ""))
            run, why = _run_from_row(row)
        except InputError as exc:
            run, why = None, str(exc)
        if run is None:
            skipped.append((row["row_id"], why))
        else:
            runs.append(run)
    return runs, skipped


def batch(runs):
    """Stack the runs' inputs into one batched (model, cluster, plan)."""
    return (stack([r.model for r in runs]), stack([r.cluster for r in runs]), stack([r.plan for r in runs]))


def predict(runs, fidelity="calibrated"):
    """Predicted iteration time (s) and the batched Report for every run, one evaluate call."""
    model, cluster, plan = batch(runs)
    rep = evaluate(model, cluster, plan, fidelity)
    return np.asarray(rep.step_s), rep


def metric_errors(runs, step_s):
    """[(predicted metric, relative error)]: metric = source FLOPs / (N t_pred) (x100/peak for MFU)."""
    out = []
    for r, t in zip(runs, step_s):
        pred = r.metric * r.time_s / float(t)
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


# ---------------------------------------------------------------- kernel and collective tables


_SHAPE = re.compile(r"m x n x k = (\d+)(?:\^3|x(\d+)x(\d+))")


_COLUMNS = {"kernel_microbenchmarks.csv": ("row_id", "gpu_type", "precision", "unit", "value", "benchmark"),
            "collective_bandwidth.csv": ("row_id", "system", "collective", "message_size_bytes", "busbw_GBps",
                                         "num_gpus")}


def _table(path, default_name):
    """Rows of a validation CSV (``path`` or the shared table ``default_name``), its columns checked."""
    path = Path(path) if path else DEFAULT_DIR / default_name
    return files.read_csv_rows(path, default_name, f"a CSV in the {default_name} layout",
                               required=_COLUMNS.get(default_name, ()))


def load_kernels(path=None):
    """cuBLASLt GEMM rows: [(gpu preset, precision bytes, m, n, k, TFLOP/s)] (A100/H100/H200 only)."""
    out = []
    for row in _table(path, "kernel_microbenchmarks.csv"):
        mt = _SHAPE.search(row.get("shape_or_params") or "")
        gpu = next((p for prefix, p in GPU_PRESETS if (row.get("gpu_type") or "").startswith(prefix)), None)
        prec = (row.get("precision") or "").upper()
        if not mt or gpu is None or prec not in ("FP16", "BF16", "FP8") or row.get("unit") != "TFLOP/s" \
                or not (_num(row, "value") or 0) > 0:
            continue
        m = float(mt.group(1))
        n, k = (float(mt.group(2)), float(mt.group(3))) if mt.group(2) else (m, m)
        out.append((row["row_id"], gpu, 1.0 if prec == "FP8" else 2.0, m, n, k, float(row["value"])))
    return out


def load_stream(path=None):
    """HBM STREAM rows: [(row_id, gpu preset, bytes/s)] (kernel_microbenchmarks.csv, TB/s)."""
    out = []
    for row in _table(path, "kernel_microbenchmarks.csv"):
        gpu = next((p for prefix, p in GPU_PRESETS if (row.get("gpu_type") or "").startswith(prefix)), None)
        if gpu and (row.get("benchmark") or "").startswith("HBM STREAM") and row.get("unit") == "TB/s" \
                and (_num(row, "value") or 0) > 0:
            out.append((row["row_id"], gpu, float(row["value"]) * 1e12))
    return out


def load_collectives(path=None):
    """nccl-tests all-reduce rows: [(row_id, system, gpus, nodes, bytes, busbw bytes/s)]."""
    out = []
    for row in _table(path, "collective_bandwidth.csv"):
        if not (row.get("collective") or "").startswith("all-reduce"):
            continue
        size, bus = _num(row, "message_size_bytes"), _num(row, "busbw_GBps")
        n, nodes = _num(row, "num_gpus"), _num(row, "num_nodes", 1.0)
        if size and bus and n:
            out.append((row["row_id"], row["system"], n, nodes, size, bus * 1e9))
    return out



def compare(runs, fidelity, fitted_ids=()):
    """Rows (predicted vs published, error, fitted/judged) and summaries, as plain Python.

    ``fitted_ids``: the rows the calibration was fitted on (calibrated.fitted_rows()).
    Korthikanti's rows also get their iteration-time error summarized (calculon's
    published validation: 3.65% average, 8.87% max).
    """
    fitted_ids = set(fitted_ids)
    step_s, _ = predict(runs, fidelity)
    rows = []
    for r, t, (pred, err) in zip(runs, step_s, metric_errors(runs, step_s)):
        rows.append({"row_id": r.row_id, "set": "fitted" if r.row_id in fitted_ids else "judged",
                     "source": r.source, "model": r.name, "metric": r.metric_name,
                     "published": r.metric, "predicted": pred, "error": err,
                     "time_published_s": r.time_s, "time_predicted_s": float(t),
                     "time_error": float(t) / r.time_s - 1.0, "assumed": r.assumed})

    def summ(sel, key="error"):
        med, mx, mean = summary([x[key] for x in sel])
        return {"rows": len(sel), "median_abs": med, "max_abs": mx, "mean_abs": mean}

    out = {"judged (never fitted)": summ([x for x in rows if x["set"] == "judged"]),
           "fitted": summ([x for x in rows if x["set"] == "fitted"]),
           "all": summ(rows)}
    for source in sorted({x["source"] for x in rows}):
        out[f"{source} (all rows)"] = summ([x for x in rows if x["source"] == source])
    kor = [x for x in rows if x["source"] == "korthikanti2022"]
    if kor:
        out["korthikanti2022 iteration time"] = summ(kor, "time_error")
    return {"rows": rows, "summary": out, "fitted_rows": sorted(fitted_ids)}

