"""Fitting the calibrated fidelity: what ``dse calibrate`` runs and writes.

The calibrated mode itself (its switches and the shipped parameter file) is an input,
``dse.inputs.fidelity``; this module fits its parameters. The fits run by gradient descent
(optax) through the same equations: the GEMM-shape curve on cuBLASLt sweeps, latency and
bus bandwidth on nccl-tests sweeps (both in compute/collectives), and the remaining
efficiencies through ``evaluate`` on the fitted rows of published training runs.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import optax

from dse.backend import jnp, nn, numpy_mode
from dse import files
from dse.equations import collectives as col
from dse.equations import compute
from dse.inputs import presets
from dse.calibration import validate as validation
from dse.evaluate import evaluate
from dse.inputs.fidelity import SWITCHES, Fidelity

__all__ = ["RUN_PARAMS", "save_params", "calibrate", "fit_kernels", "fit_attention", "fit_collectives", "fit_alltoall", "fit_runs", "fit_hbm"]

# Fitted on runs, with their transform from an unconstrained number and a start value.
# A knob the fitted rows do not constrain keeps its start value (its gradient is zero), so
# where the seed's equation gives a value inside the transform's range the fit starts there:
# dp_overlap at seed 000 sec.6's 2/3 (DP hides behind the backward pass). A leave-one-source-out
# fit without the only source that exposes DP then predicts with the seed's overlap.
RUN_PARAMS = {
    "flops_efficiency": ("sigmoid", 0.6),
    "attn_efficiency": ("sigmoid", 0.5),     # unfused: batched GEMMs of inner width d, at most the GEMM rate
    "bw_out_efficiency": ("sigmoid", 0.7),
    "dp_overlap": ("sigmoid", Fidelity.__dataclass_fields__["dp_overlap"].default),
    "tp_comm_overlap": ("sigmoid", 0.5),
    "elementwise_passes": ("softplus", 3.0),
    # one copy kernel on a collective's stream (Plan.zero3_rank_copies), in microseconds; started at
    # a kernel's fixed time, the order of the kernel fit's gemm_overhead_s (5.8 us)
    "rank_copy_us": ("softplus", 5.0),
}


def save_params(params: dict, path, header: dict, report: dict | None = None):
    """Write a calibration file: provenance header, [fidelity] knobs, [report] numbers."""
    lines = [f"{k} = {_toml(v)}" for k, v in header.items()]
    lines += ["", "[fidelity]"] + [f"{k} = {float(v)!r}" for k, v in params.items()]
    if report:
        lines += ["", "[report]"] + [f"{k} = {_toml(v)}" for k, v in _flatten(report).items()]
    files.write_text(path, "\n".join(lines) + "\n")   # atomic (dse/files.py)


def _flatten(d: dict, prefix="") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}".replace(" ", "_").replace("-", "_")
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return {k.replace(".", "__"): v for k, v in out.items()}


def _toml(v):
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return repr(float(v))


# ---------------------------------------------------------------- fitting


_TRANSFORMS = {
    "sigmoid": (lambda x: nn.sigmoid(x), lambda y: np.log(y / (1.0 - y))),   # numpy in numpy_mode
    "softplus": (lambda x: nn.softplus(x), lambda y: np.log(np.expm1(y))),
    "exp": (lambda x: jnp.exp(x), np.log),
}


def _descent(loss, steps: int, lr: float):
    """Adam on ``loss(raw, *args)``: a function ``(raw0, *args) -> (raw, final loss)`` (numpy), one
    compiled program for every ``args`` of the same shapes.

    The steps are one ``lax.scan`` in that program: a Python loop of jitted steps dispatched each of
    its 400-3,000 steps, and the eager initial state and final loss compiled dozens of small ops
    (``dse calibrate --no-loso``: 87 compiles). The final loss is one evaluation, in numpy."""
    opt = optax.adam(lr)

    def run(raw, *args):
        def step(carry, _):
            raw, state = carry
            upd, state = opt.update(jax.grad(loss)(raw, *args), state, raw)
            return (optax.apply_updates(raw, upd), state), None

        return jax.lax.scan(step, (raw, opt.init(raw)), None, length=steps)[0][0]

    jitted = jax.jit(run)

    def descend(raw0, *args):
        raw = {k: np.asarray(v) for k, v in jitted({k: np.asarray(v, dtype=float) for k, v in raw0.items()}, *args).items()}
        with numpy_mode():
            return raw, float(loss(raw, *args))
    return descend


def _descend(loss, raw0: dict, steps: int, lr: float):
    """Adam on ``loss(raw)`` from ``raw0``; returns the raw parameters and the final loss."""
    return _descent(loss, steps, lr)(raw0)


def fit_kernels(rows, steps: int = 3000):
    """GEMM knee and exponent (shared), top efficiency per (GPU, precision), FP8 ratio.

    rows: validation.load_kernels(). value / peak = top[g] / (1 + (knee balance / I)^exp)
    (compute.gemm_efficiency), fitted on log TFLOP/s.
    """
    groups = sorted({(g, nb) for _, g, nb, *_ in rows})
    gi = np.array([groups.index((g, nb)) for _, g, nb, *_ in rows])
    peaks, balances, intens, vals, flops = [], [], [], [], []
    for _, g, nb, m, n, k, v in rows:
        c = presets.load_cluster(g)
        peak = float(c.peak_fp8_flops_per_s) if nb == 1.0 else float(c.peak_flops_per_s)
        peaks.append(peak)
        balances.append(peak / float(c.hbm_bw_bytes_per_s))
        intens.append(float(compute.gemm_intensity(m, n, k, nb)))
        vals.append(v * 1e12)
        flops.append(compute.FLOPS_PER_MAC * m * n * k)
    peaks, balances, intens, vals, flops = map(np.asarray, (peaks, balances, intens, vals, flops))

    def unpack(raw):
        fid = Fidelity.make(gemm_shape=1.0, gemm_knee=jnp.exp(raw["log_knee"]),
                            gemm_exponent=nn.softplus(raw["sp_exp"]), gemm_overhead_s=jnp.exp(raw["log_t0"]))
        top = nn.sigmoid(raw["logit_top"])
        return fid, top

    def loss(raw):
        fid, top = unpack(raw)
        pred = peaks * top[gi] * compute.gemm_efficiency(intens, balances, flops, peaks * top[gi], fid)
        return jnp.mean((jnp.log(pred) - jnp.log(vals)) ** 2)

    raw0 = {"log_knee": np.log(0.5), "sp_exp": np.log(np.expm1(2.0)), "log_t0": np.log(5e-6),
            "logit_top": np.zeros(len(groups)) + 1.0}
    raw, final = _descend(loss, raw0, steps, 0.02)
    with numpy_mode():   # the fitted curve in numpy: no eager op to compile
        fid, top = unpack(raw)
        top_r = peaks * np.asarray(top)[gi]
        pred = top_r * np.asarray(compute.gemm_efficiency(intens, balances, flops, top_r, fid))
    tops = {f"{g} {'FP8' if nb == 1.0 else 'BF16'}": float(t) for (g, nb), t in zip(groups, np.asarray(top))}
    bf16 = [t for (g, nb), t in zip(groups, np.asarray(top)) if nb == 2.0]
    fp8 = [t for (g, nb), t in zip(groups, np.asarray(top)) if nb == 1.0]
    params = {"gemm_knee": float(fid.gemm_knee), "gemm_exponent": float(fid.gemm_exponent),
              "gemm_overhead_s": float(fid.gemm_overhead_s),
              "fp8_efficiency": float(np.mean(fp8) / np.mean(bf16)) if fp8 and bf16 else 1.0}
    resid = np.abs(pred / vals - 1.0)
    return params, {"tops": tops, "median_abs_err": float(np.median(resid)), "max_abs_err": float(np.max(resid)),
                    "rmse_log": float(np.sqrt(final))}


def fit_hbm(rows):
    """Achieved / datasheet HBM bandwidth: the mean over STREAM rows (copy, triad, dot)."""
    ratios = [bw / float(presets.load_cluster(g).hbm_bw_bytes_per_s) for _, g, bw in rows]
    return {"hbm_efficiency": float(np.mean(ratios))} if ratios else {}


def fit_attention(rows):
    """The fused-attention kernel rate as a share of the 16-bit peak: the geometric mean over the
    FlashAttention rows (rows: validation.load_attention(); the least-squares fit on log TFLOP/s
    of one share, as the GEMM tops are fitted), with each GPU's own share for the report."""
    if not rows:
        return {}, {}
    shares = {}
    for _, g, v in rows:
        shares.setdefault(g, []).append(v * 1e12 / float(presets.load_cluster(g).peak_flops_per_s))
    logs = [np.log(x) for xs in shares.values() for x in xs]
    eff = float(np.exp(np.mean(logs)))
    resid = [abs(x / eff - 1.0) for xs in shares.values() for x in xs]
    report = {"share_" + g: float(np.exp(np.mean(np.log(xs)))) for g, xs in sorted(shares.items())}
    report.update(rows=len(rows), max_abs_err=float(max(resid)))
    return {"fused_attn_efficiency": eff}, report


def reference_share(shares) -> float:
    """The measured share of peak a fitted rate is relative to: the geometric mean over the fitted
    runs' accelerators, a run each, of ``shares`` (0: not measured, left out; none: 0, unused).
    ``matmul_ceiling`` (compute.gemm_top_rates: flops_efficiency) over every fitted run,
    ``flash_attn_share`` (compute.flash_attn_scale) over those whose stack runs a
    FlashAttention-2-generation kernel."""
    c = np.asarray([float(x) for x in shares], dtype=float)
    c = c[c > 0]
    return float(np.exp(np.mean(np.log(c)))) if c.size else 0.0


def fit_collectives(rows, steps: int = 3000):
    """alpha per tier and achieved scale-up bus bandwidth from nccl-tests all-reduce sweeps.

    Ring model (collectives.wire_time): t = 2(n-1) alpha + S 2(n-1)/n / (B eff). One-node
    rows fit alpha_up and the scale-up efficiency against the system's NVLink preset;
    multi-node rows fit alpha_out with their own plateau bandwidth (fabric unknown).
    """
    @functools.lru_cache(maxsize=None)   # a few systems over hundreds of rows
    def nominal(system):   # the scale-up bandwidth of the hardware preset the system names
        name = presets.cluster_for_gpu(system)
        return float(presets.load_cluster(name).bw_up_bytes_per_s) if name else None

    one = [(n, s, bus, nominal(sy)) for _, sy, n, nodes, s, bus in rows if nodes == 1 and nominal(sy)]
    multi = [(n, s, bus) for _, sy, n, nodes, s, bus in rows if nodes > 1]

    def busbw(n, size, alpha, bw):
        t = col.wire_time(size * col.ring_fraction(col.ALL_REDUCE, n), 1.0, col.ring_steps(col.ALL_REDUCE, n),
                          bw, alpha, 1.0)
        return size * col.ring_fraction(col.ALL_REDUCE, n) / t

    n1, s1, b1, nom1 = (np.asarray(x, dtype=float) for x in zip(*one))

    def loss_up(raw):
        pred = busbw(n1, s1, jnp.exp(raw["log_alpha"]), nom1 * jnp.exp(raw["log_eff"]))
        return jnp.mean((jnp.log(pred) - jnp.log(b1)) ** 2)

    raw, final_up = _descend(loss_up, {"log_alpha": np.log(2e-6), "log_eff": np.log(0.9)}, steps, 0.02)
    out = {"alpha_up_s": float(np.exp(raw["log_alpha"])), "bw_up_efficiency": float(np.exp(raw["log_eff"]))}
    report = {"rmse_log_up": float(np.sqrt(final_up)), "rows_up": len(one), "rows_out": len(multi)}
    if multi:
        n2, s2, b2 = (np.asarray(x, dtype=float) for x in zip(*multi))

        def loss_out(raw):
            pred = busbw(n2, s2, jnp.exp(raw["log_alpha"]), jnp.exp(raw["log_bw"]))
            return jnp.mean((jnp.log(pred) - jnp.log(b2)) ** 2)

        raw, final_out = _descend(loss_out, {"log_alpha": np.log(3e-6), "log_bw": np.log(200e9)}, steps, 0.02)
        out["alpha_out_s"] = float(np.exp(raw["log_alpha"]))
        report["rmse_log_out"] = float(np.sqrt(final_out))
        report["plateau_out_bytes_per_s"] = float(np.exp(raw["log_bw"]))
    return out, report


def fit_alltoall(rows):
    """Achieved / nominal rate of MoE dispatch and combine, per tier: the geometric mean over
    bulk all-to-all rows (validate.load_alltoall; DeepEP's normal kernels print the
    bottleneck link's rate) of measured / the GPU preset's bw_up (one node: NVLink) or
    bw_out (several nodes: RDMA). A physical measurement, not a run fit: EP groups time
    their all-to-all at these shares (topology.network) instead of the all-reduce's."""
    def ratio(gpu, nodes, bw):
        c = presets.load_cluster(gpu)
        return bw / float(c.bw_up_bytes_per_s if nodes <= 1 else c.bw_out_bytes_per_s)

    out, report = {}, {}
    for key, sel in (("a2a_up_efficiency", lambda n: n <= 1), ("a2a_out_efficiency", lambda n: n > 1)):
        r = [ratio(g, n, bw) for _, g, n, bw in rows if sel(n)]
        if r:
            out[key] = float(np.exp(np.mean(np.log(r))))
            report[key.replace("efficiency", "rows")] = len(r)
    return out, report


def fit_runs(model, cluster, plan, time_s, base: dict, steps: int = 400, names=tuple(RUN_PARAMS), rmse: bool = True):
    """Fit ``names`` (RUN_PARAMS) by Adam on the mean squared log error of the iteration time.

    model/cluster/plan: batched inputs of the fitted rows; base: every other knob.
    Gradients flow through ``evaluate`` (float64). Returns (fitted, rms log error or None
    with ``rmse=False``).
    """
    (fitted, err), = _fit_runs(model, cluster, plan, time_s, base, steps, names, [np.ones(len(time_s))])
    return fitted, (err if rmse else None)


def _fit_runs(model, cluster, plan, time_s, base: dict, steps: int, names, weights):
    """``fit_runs`` once per row-weight vector of ``weights`` (1: the row is fitted, 0: left out),
    every fit a run of one compiled program: the weights are its argument, so the
    leave-one-source-out fits trace and compile nothing more (``dse calibrate``: five traces and
    compiles of the differentiated ``evaluate`` were 20 of its 21 CPU-s). The loss is the weighted
    mean; with every weight 1 it is the mean. Returns [(fitted, rms log error)] per vector."""
    fixed = {k: v for k, v in base.items() if k not in names}
    log_t = np.log(np.asarray(time_s, dtype=float))

    def knobs(raw):
        return {k: _TRANSFORMS[RUN_PARAMS[k][0]][0](raw[k]) for k in names}

    def loss(raw, w):
        fid = Fidelity.make(**fixed, **knobs(raw))
        rep = evaluate(model, cluster, plan, fid, network_cost=False)   # step times only
        return jnp.sum(w * (jnp.log(rep.step_s) - log_t) ** 2) / jnp.sum(w)

    raw0 = {k: _TRANSFORMS[RUN_PARAMS[k][0]][1](base.get(k, RUN_PARAMS[k][1])) for k in names}
    descend = _descent(loss, steps, 0.05)
    out = []
    for w in weights:
        raw, final = descend(raw0, np.asarray(w, dtype=float))
        with numpy_mode():
            out.append(({k: float(v) for k, v in knobs(raw).items()}, float(np.sqrt(final))))
    return out


def calibrate(runs, fitted_ids, kernels, stream, collectives, steps: int = 400, attention=(), alltoall=(),
              loso: bool = True):
    """The whole fit: kernel curve, fused-attention rate, collectives (all-reduce sweeps, bulk
    all-to-all rows), then RUN_PARAMS on the fitted runs.

    Returns (params for the [fidelity] table, report dict). The report holds the fit
    residuals and, for each source, the error of a fit that left that source out (the
    kernel and collective fits use no run rows, so they are the same in every such fit);
    ``loso=False`` skips those fits (one per source; the parameters do not depend on them).
    """
    k_params, k_report = fit_kernels(kernels)
    k_params.update(fit_hbm(stream))
    a_params, a_report = fit_attention(attention)
    k_params.update(a_params)
    c_params, c_report = fit_collectives(collectives)
    base = dict(SWITCHES)
    base.update(k_params)
    base["bw_up_efficiency"] = c_params["bw_up_efficiency"]
    aa_params, aa_report = fit_alltoall(alltoall)
    base.update(aa_params)
    base.update({k: v for k, (_, v) in RUN_PARAMS.items()})

    # every fit over the fitted rows' one batch: all rows, then each leave-one-source-out fit with
    # that source's rows at weight 0 (its residual is not reported)
    fit_rows = [r for r in runs if r.row_id in fitted_ids]
    base["matmul_ceiling"] = reference_share([r.cluster.matmul_ceiling for r in fit_rows])
    base["flash_attn_share"] = reference_share([r.cluster.flash_attn_share for r in fit_rows
                                                if float(r.plan.attn_kernel_fa2) >= 1 and float(r.plan.flash_attention) >= 1])
    sources = [s for s in sorted({r.source for r in runs}) if any(r.source != s for r in fit_rows)] if loso else []
    weights = [np.ones(len(fit_rows))] + [np.array([float(r.source != s) for r in fit_rows]) for s in sources]
    m, c, p = validation.batch(fit_rows)
    (r_params, rmse), *left_out = _fit_runs(m, c, p, [r.time_s for r in fit_rows], base, steps, tuple(RUN_PARAMS), weights)
    params = {k: base[k] for k in k_params}
    params["bw_up_efficiency"] = base["bw_up_efficiency"]
    params["matmul_ceiling"] = base["matmul_ceiling"]
    params["flash_attn_share"] = base["flash_attn_share"]
    params.update(aa_params)
    params.update(r_params)
    loso, pooled = {}, []
    for source, (lp, _) in zip(sources, left_out):
        test = [r for r in runs if r.source == source]
        fid = Fidelity.make(**{**base, **lp})
        t, _ = validation.predict(test, fid)
        errs = [e for _, e in validation.metric_errors(test, t)]
        loso[source] = validation.summary(errs)
        pooled += errs
    report = {"kernels": k_report, "fused_attention": a_report, "collectives": {**c_params, **c_report, **aa_params, **aa_report}, "runs_rmse_log": rmse,
              "fitted_rows": sorted(fitted_ids), "leave_one_source_out": loso,
              "loso_pooled": validation.summary(pooled) if pooled else ()}
    return params, report
