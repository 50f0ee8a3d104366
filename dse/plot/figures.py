"""Pictures of plans, sweeps and co-design runs (matplotlib, no pyplot state).

Every function takes Reports or plain arrays/records and returns a
``matplotlib.figure.Figure``; nothing is shown or printed. Figures are sized for a
design review (8 x 5 in, fonts >= 11 pt) and every axis names its unit. Values
come in SI (bytes, seconds, bytes/s) and are scaled here, at the edge, to GB, s or
ms, GB/s, TFLOP/s.

No model logic lives here: the figures draw what ``dse.evaluate`` (or a sweep or a
co-design run built on it) computed. The only computations are reductions for
display: which points are on a Pareto front, and the best value over the axes a
heatmap does not show.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from pathlib import Path

import matplotlib
import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from dse import files
from dse.inputs.units import SI_SUFFIXES
from dse.report import DIM_NAMES, REASON_SHORT, REASONS, Report

__all__ = [
    "METRICS", "REASON_SHORT", "axis_label", "metric", "memory_breakdown", "step_breakdown",
    "plan_summary", "pareto", "pareto_mask", "heatmap", "best_grid", "trajectory",
    "plan_labels", "infeasible_counts", "codesign_figures", "sweep_figures", "sensitivity", "predicted_vs_published", "save", "check_path", "FORMATS",
]

FORMATS = (".png", ".svg")
SIZE = (8.0, 5.0)           # inches: a design-review slide
STYLE = {
    "font.size": 12, "axes.titlesize": 13, "axes.labelsize": 12, "xtick.labelsize": 11,
    "ytick.labelsize": 11, "legend.fontsize": 11, "figure.titlesize": 14,
    "axes.spines.top": False, "axes.spines.right": False, "savefig.dpi": 100,
}

# name -> (label, unit, factor from SI to the unit, sense: +1 lower is better, -1 higher is)
METRICS: dict[str, tuple[str, str, float, int]] = {
    "step_s": ("step time", "s", 1.0, 1),
    "time_to_train_s": ("time to train", "days", 1 / 86400.0, 1),
    "compute_s": ("compute time", "s", 1.0, 1),
    "bubble_s": ("pipeline bubble", "s", 1.0, 1),
    "memory_bytes": ("memory per accelerator", "GB", 1e-9, 1),
    "hbm_bytes": ("HBM per accelerator", "GB", 1e-9, 1),
    "gpus": ("accelerators", "count", 1.0, 1),
    "mfu": ("MFU", "%", 100.0, -1),
    "tokens_per_s": ("throughput", "M tokens/s", 1e-6, -1),
    "network_cost": ("network cost", "M$", 1e-6, 1),
    "network_cost_usd": ("network cost", "M$", 1e-6, 1),
    "network_cost_per_gpu_usd": ("network cost per accelerator", "k$", 1e-3, 1),
    "network_power_w": ("network power", "kW", 1e-3, 1),
    "alpha_up_s": ("scale-up latency", "us", 1e6, 1),
    "alpha_out_s": ("scale-out latency", "us", 1e6, 1),
    "bw_up_bytes_per_s": ("scale-up bandwidth", "GB/s per accelerator", 1e-9, -1),
    "bw_out_bytes_per_s": ("scale-out bandwidth", "GB/s per accelerator", 1e-9, -1),
    "bw_up_GBps": ("scale-up bandwidth", "GB/s per accelerator", 1.0, -1),
    "bw_out_GBps": ("scale-out bandwidth", "GB/s per accelerator", 1.0, -1),
    "peak_flops_per_s": ("peak compute", "TFLOP/s per accelerator", 1e-12, -1),
    "domain": ("scale-up domain", "accelerators", 1.0, 1),
    "tp": ("tensor parallel t", "ranks", 1.0, 1),
    "pp": ("pipeline parallel p", "stages", 1.0, 1),
    "cp": ("context parallel c", "ranks", 1.0, 1),
    "ep": ("expert parallel e", "ranks", 1.0, 1),
    "dp": ("data parallel d", "ranks", 1.0, 1),
    "vpp": ("interleaved chunks v", "per stage", 1.0, 1),
    "mbs": ("microbatch b", "sequences", 1.0, 1),
    "gbs": ("global batch B", "sequences", 1.0, 1),
    "iteration": ("iteration", "steps", 1.0, 1),
    "loss": ("relaxed loss", "ln objective + penalty", 1.0, 1),
    "cost_usd": ("hardware cost", "M$", 1e-6, 1),
    "hbm_GB": ("HBM per accelerator", "GB", 1.0, -1),
    "tflops": ("peak compute", "TFLOP/s per accelerator", 1.0, -1),
    "hidden": ("hidden size h", "elements", 1.0, 1),
    "layers": ("layers L", "count", 1.0, 1),
    "experts": ("experts E", "count", 1.0, 1),
    "topk": ("experts per token k", "count", 1.0, 1),
}
# suffix -> (unit, factor) for names not in METRICS (SI names carry their unit): the one unit table
_SUFFIX = SI_SUFFIXES

_MEMORY_PARTS = (("weights", "weights_bytes", "#4c72b0"), ("gradients", "grads_bytes", "#55a868"),
                 ("optimizer", "optimizer_bytes", "#c44e52"), ("activations", "activations_bytes", "#8172b2"),
                 ("other", "other_bytes", "#937860"))
_DIM_COLORS = {"tp": "#dd8452", "cp": "#da8bc3", "ep": "#ccb974", "pp": "#64b5cd", "dp": "#8c8c8c"}


def metric(name: str) -> tuple[str, str, float, int]:
    """(label, unit, factor from SI, sense) for a metric or input name."""
    if name in METRICS:
        return METRICS[name]
    for suffix, unit, factor in _SUFFIX:
        if name.endswith(suffix):
            return (name[: -len(suffix)].replace("_", " "), unit, factor, 1)
    return (name.replace("_", " "), "count", 1.0, 1)


def axis_label(name: str) -> str:
    label, unit, _, _ = metric(name)
    return f"{label} ({unit})"


def _styled(fn):
    """Create the figure under dse's style (fonts are fixed when text is created)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(STYLE):
            return fn(*args, **kwargs)
    return wrapper


def _bars_size(n: int) -> tuple[float, float]:
    """Wide enough for n labelled bars (about 1.3 in a bar)."""
    return (max(SIZE[0], 1.3 * n + 3.5), SIZE[1])


def _new(ax=None, size=SIZE):
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.add_subplot()


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=float)


def _per_plan(reports) -> list[Report]:
    """A list of one-plan Reports from a Report (scalar or 1-D batch) or a list of them."""
    if isinstance(reports, Report):
        n = np.ndim(reports.step_s)
        if n == 0:
            return [reports]
        if n != 1:
            raise ValueError(f"a batched Report must be 1-D to plot per plan, got shape {np.shape(reports.step_s)}")
        return [reports[i] for i in range(np.shape(reports.step_s)[0])]
    return list(reports)


def _labels(labels, n, prefix="plan"):
    if labels is None:
        return [f"{prefix} {i + 1}" for i in range(n)] if n > 1 else [prefix]
    labels = list(labels)
    if len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} plans")
    return labels


def _time_unit(seconds_max: float) -> tuple[str, float]:
    return ("s", 1.0) if seconds_max >= 1.0 else ("ms", 1e3)


# --------------------------------------------------------------------------- one plan


@_styled
def memory_breakdown(reports, hbm_bytes, labels=None, *, title="Memory per accelerator", ax=None) -> Figure:
    """Stacked bars of weights, gradients, optimizer state, activations and other
    memory per accelerator (GB) for each plan, against the HBM capacity line."""
    rows = _per_plan(reports)
    labels = _labels(labels, len(rows))
    hbm = np.broadcast_to(_f(hbm_bytes), (len(rows),)) * 1e-9
    fig, ax = _new(ax, _bars_size(len(rows)))
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for name, field, color in _MEMORY_PARTS:
        h = np.array([float(getattr(r, field)) for r in rows]) * 1e-9
        if name == "other" and not h.any():
            continue
        ax.bar(x, h, 0.6, bottom=bottom, label=name, color=color, gid=f"memory:{name}")
        bottom += h
    total = np.array([float(r.memory_bytes) for r in rows]) * 1e-9
    if np.allclose(hbm, hbm[0]):
        ax.axhline(hbm[0], color="black", ls="--", lw=1.5, label=f"HBM {hbm[0]:g} GB", gid="hbm")
    else:
        ax.hlines(hbm, x - 0.4, x + 0.4, color="black", ls="--", lw=1.5, label="HBM", gid="hbm")
    for xi, tot, cap in zip(x, total, hbm):
        over = tot > cap
        ax.annotate(f"{tot:.1f} GB" + (" OOM" if over else ""), (xi, tot), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom",
                    color="#b00000" if over else "black", fontweight="bold" if over else "normal")
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.8, len(rows) - 0.2)
    ax.set_ylabel("memory per accelerator (GB)")
    ax.set_xlabel("plan")
    ax.set_ylim(0, max(total.max(), hbm.max()) * 1.18)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def _step_parts(r: Report):
    parts = [("compute", float(r.compute_s), "#4c72b0"), ("bubble", float(r.bubble_s), "#bbbbbb")]
    parts += [(f"exposed {k.upper()}", float(getattr(r.exposed_s, k)), _DIM_COLORS[k]) for k in DIM_NAMES]
    return parts


@_styled
def step_breakdown(reports, labels=None, *, title="Step time", ax=None) -> Figure:
    """Stacked bars of compute, pipeline bubble and exposed communication per
    parallel dimension (s or ms) for each plan, with MFU written on top."""
    rows = _per_plan(reports)
    labels = _labels(labels, len(rows))
    fig, ax = _new(ax, _bars_size(len(rows)))
    unit, k = _time_unit(max(float(r.step_s) for r in rows))
    x = np.arange(len(rows))
    parts = [_step_parts(r) for r in rows]
    bottom = np.zeros(len(rows))
    for j, (name, _, color) in enumerate(parts[0]):
        h = np.array([p[j][1] for p in parts]) * k
        if not h.any():
            continue
        ax.bar(x, h, 0.6, bottom=bottom, label=name, color=color, gid=f"step:{name}")
        bottom += h
    for xi, r in zip(x, rows):
        ax.annotate(f"{float(r.step_s) * k:.3g} {unit}\nMFU {100 * float(r.mfu):.1f}%",
                    (xi, float(r.step_s) * k), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom")
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.8, len(rows) - 0.2)
    ax.set_ylabel(f"time per step ({unit})")
    ax.set_xlabel("plan")
    ax.set_ylim(0, bottom.max() * 1.22)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


@_styled
def plan_summary(reports, hbm_bytes, labels=None, *, title=None) -> Figure:
    """Memory and step-time breakdowns side by side (``dse plan --plot``)."""
    rows = _per_plan(reports)
    fig = Figure(figsize=(max(11.0, 2.6 * len(rows) + 7), 5.0), layout="constrained")
    a, b = fig.subplots(1, 2)
    memory_breakdown(rows, hbm_bytes, labels, ax=a)
    step_breakdown(rows, labels, ax=b)
    if title:
        fig.suptitle(title)
    return fig


def plan_labels(plan, dp=None, gpus=None) -> list[str]:
    """Short labels ("N1024 t8 p8 d16 b1 Z1") for a batch of plans; cp, ep, v when > 1."""
    cols = {k: np.atleast_1d(_f(getattr(plan, k))) for k in ("tp", "pp", "cp", "ep", "vpp", "mbs", "zero")}
    if dp is not None:
        cols["dp"] = np.atleast_1d(_f(dp))
    if gpus is not None:
        cols["gpus"] = np.atleast_1d(_f(gpus))
    n = max(len(v) for v in cols.values())
    cols = {k: np.broadcast_to(v, (n,)) for k, v in cols.items()}
    out = []
    for i in range(n):
        s = [f"N{cols['gpus'][i]:g}"] if "gpus" in cols else []
        s += [f"t{cols['tp'][i]:g}", f"p{cols['pp'][i]:g}"]
        s += [f"{k[0]}{cols[k][i]:g}" for k in ("cp", "ep") if cols[k][i] > 1]
        s += [f"v{cols['vpp'][i]:g}"] if cols["vpp"][i] > 1 else []
        s += [f"d{cols['dp'][i]:g}"] if "dp" in cols else []
        s += [f"b{cols['mbs'][i]:g}", f"Z{cols['zero'][i]:g}"]
        out.append(" ".join(s))
    return out


# --------------------------------------------------------------------------- many plans


def _columns(data) -> dict[str, np.ndarray]:
    """Columns from a mapping of arrays or a sequence of records (dicts)."""
    if isinstance(data, Mapping):
        return {k: np.asarray(v) for k, v in data.items()}
    rows = list(data)
    if not rows:
        return {}
    return {k: np.asarray([r.get(k) for r in rows]) for k in rows[0]}


def pareto_mask(x, y, sense=(1, 1)) -> np.ndarray:
    """True for points no other point beats on both x and y (lower is better for
    sense +1, higher for -1); exact duplicates keep the first; NaN/inf never.
    The sweep's reduction (``dse.engines.sweep.pareto_mask``) on finite points."""
    from dse.engines.sweep import pareto_mask as front   # the one Pareto reduction, shared with sweeps

    x = _f(x).ravel() * sense[0]
    y = _f(y).ravel() * sense[1]
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    mask = np.zeros(x.shape, bool)
    mask[ok] = front(np.stack([x[ok], y[ok]], axis=1), ok)
    return mask


@_styled
def pareto(data, x="step_s", y="network_cost", *, label=None, feasible="feasible", front=None, color=None,
           title=None, max_labels=12, logx=False, logy=False, others="dominated", ax=None) -> Figure:
    """Points of ``data`` (a mapping of columns or a list of records, values in SI,
    e.g. a sweep's rows) with the Pareto front of x against y highlighted and
    labelled; dominated points faint. ``label`` names a column of plan labels;
    ``feasible`` a 0/1 column (infeasible points are left out; missing = all);
    ``front`` a 0/1 column or array marking a front computed elsewhere (e.g. a
    sweep's front over three objectives; default: the 2-D front of x and y);
    ``color`` a column that colours the points (with a colour bar)."""
    cols = _columns(data)
    for name in (x, y) + ((color,) if color else ()) + ((front,) if isinstance(front, str) else ()):
        if name not in cols:
            raise KeyError(f"pareto: no column {name!r}; columns: {sorted(cols)}")
    xl, xu, xf, xs = metric(x)
    yl, yu, yf, ys = metric(y)
    xv, yv = _f(cols[x]).ravel(), _f(cols[y]).ravel()
    keep = _f(cols[feasible]).ravel() > 0 if feasible in cols else np.ones(xv.shape, bool)
    xv, yv = xv[keep], yv[keep]
    names = np.asarray(cols[label]).ravel()[keep] if label in cols else None
    given = front is not None
    if given:
        front = (_f(cols[front] if isinstance(front, str) else front).ravel() > 0)[keep]
    else:
        front = pareto_mask(xv, yv, (xs, ys))
    fig, ax = _new(ax)
    many = xv.size > 5000
    if color:
        cl, cu, cf, cs = metric(color)
        cv = _f(cols[color]).ravel()[keep] * cf
        sc = ax.scatter(xv * xf, yv * yf, c=cv, s=np.where(front, 60, 16), alpha=np.where(front, 1.0, 0.35),
                        cmap="viridis" if cs > 0 else "viridis_r", lw=0, rasterized=many, gid="points")
        fig.colorbar(sc, ax=ax).set_label(f"{cl} ({cu})")
    else:
        ax.scatter(xv[~front] * xf, yv[~front] * yf, s=14, color="#7f7f7f", alpha=0.25, lw=0,
                   label=f"{others} ({(~front).sum():,})" if (~front).any() else None, rasterized=many,
                   gid="dominated")
    order = np.argsort(xv[front] * xs)
    fx, fy = xv[front][order] * xf, yv[front][order] * yf
    ax.plot(fx, fy, "o" if given else "-o", color="#c44e52", ms=7, lw=2, mfc="none" if color else "#c44e52",
            drawstyle="steps-post" if xs == ys and not given else "default",
            label=f"Pareto front ({front.sum()})", gid="front")
    ax.margins(0.08)
    if names is not None:
        # number the labelled front points on the plot and list the labels beside the axes:
        # no label overlaps a point or another label, none runs off the axes
        fnames = names[front][order]
        stride = max(1, math.ceil(len(fnames) / max_labels))
        listed = []
        for n, i in enumerate(range(0, len(fnames), stride), start=1):
            ax.annotate(str(n), (fx[i], fy[i]), xytext=(5, 5), textcoords="offset points", fontsize=11,
                        color="#7a1f22", fontweight="bold", annotation_clip=True, gid=f"front_label:{n}")
            listed.append(f"{n:>2}  {fnames[i]}")
        if listed:
            more = f"\n(every {stride}th of {len(fnames)})" if stride > 1 else ""
            ax.text(1.02, 1.0, "front plans:\n" + "\n".join(listed) + more, transform=ax.transAxes, va="top",
                    ha="left", fontsize=11, family="monospace", gid="front_list")
    ax.set_xlabel(f"{xl} ({xu})" + (" ← better" if xs > 0 else " → better"))
    ax.set_ylabel(f"{yl} ({yu})" + (" ↓ better" if ys > 0 else " ↑ better"))
    for on, axis, setter in ((logx, ax.xaxis, ax.set_xscale), (logy, ax.yaxis, ax.set_yscale)):
        if on:
            setter("log")
            axis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.14), ncol=2, frameon=False)
    ax.set_title(title or f"{yl} against {xl}")
    return fig


@_styled
def infeasible_counts(counts: Mapping[str, int], *, feasible=None, title="Why plans are infeasible", ax=None) -> Figure:
    """Horizontal bars: how many plans each reason rules out (a plan may have
    several), e.g. a sweep's ``infeasible_by_reason``; ``feasible`` adds a bar."""
    items = [(REASON_SHORT.get(k, k) + f"  [{k}]", int(v)) for k, v in counts.items() if int(v) > 0]
    items.sort(key=lambda kv: kv[1])
    if feasible is not None:
        items.append(("feasible", int(feasible)))
    fig, ax = _new(ax, size=(8.0, max(3.0, 0.5 * len(items) + 1.5)))
    y = np.arange(len(items))
    vals = np.array([v for _, v in items], float)
    colors = ["#55a868" if n == "feasible" else "#c44e52" for n, _ in items]
    ax.barh(y, vals, color=colors, gid="counts")
    for yi, v in zip(y, vals):
        ax.annotate(f"{v:,.0f}", (v, yi), xytext=(4, 0), textcoords="offset points", va="center")
    ax.set_yticks(y, [n for n, _ in items])
    ax.set_xlabel("plans (count)")
    if vals.size and vals.max() / max(vals[vals > 0].min(), 1) > 1e3:
        ax.set_xscale("log")
    ax.set_xlim(right=(vals.max() if vals.size else 1) * (3 if ax.get_xscale() == "log" else 1.15))
    ax.set_title(title)
    return fig


def best_grid(values, feasible, reasons=None, keep=(0, 1), sense=1):
    """Reduce an N-D grid to the 2-D grid of axes ``keep`` = (row axis, column axis).

    Returns (best, reason): the best feasible value per cell (NaN where none is
    feasible) and, per cell without a feasible point, the infeasibility bit set on
    the most points of that cell (0 where the cell has a feasible point)."""
    v = _f(values)
    shape = np.broadcast_shapes(v.shape, np.shape(feasible), np.shape(reasons) if reasons is not None else ())
    v = np.broadcast_to(v, shape)
    ok = np.broadcast_to(_f(feasible) > 0, shape)
    rest = [a for a in range(len(shape)) if a not in keep]
    perm = list(keep) + rest
    ny, nx = shape[keep[0]], shape[keep[1]]
    v = np.transpose(v, perm).reshape(ny, nx, -1)
    ok = np.transpose(ok, perm).reshape(ny, nx, -1)
    masked = np.where(ok, v * sense, np.inf)
    best = masked.min(axis=-1) * sense
    best[~ok.any(axis=-1)] = np.nan
    reason = np.zeros((ny, nx), np.int64)
    if reasons is not None:
        r = np.transpose(np.broadcast_to(np.asarray(reasons).astype(np.int64), shape), perm).reshape(ny, nx, -1)
        nbits = max(int(r.max()).bit_length(), 1)
        counts = np.stack([((r >> b) & 1).sum(axis=-1) for b in range(nbits)], axis=-1)
        top = counts.argmax(axis=-1)
        reason = np.where(ok.any(axis=-1) | (counts.max(axis=-1) == 0), 0, 1 << top)
    return best, reason


def _reason_text(bits: int) -> str:
    names = [name for k, (name, _) in enumerate(REASONS) if bits & (1 << k)]
    if not names:
        return f"bit {int(bits).bit_length() - 1}" if bits else ""
    return ", ".join(REASON_SHORT.get(n, n) for n in names)


@_styled
def heatmap(best, x_values, y_values, *, x="tp", y="pp", value="step_s", reason=None,
            title=None, annotate=None, value_label=None, mark_best=True, ax=None) -> Figure:
    """A 2-D grid (rows: y_values, columns: x_values) of the best objective, e.g.
    from ``best_grid``; cells with no feasible plan (NaN) are hatched and labelled
    with their reason (bit flags as in ``Report.reasons``). The best cell is boxed
    (``mark_best``). ``value_label`` ("label (unit)") overrides the colour bar's label."""
    best = _f(best)
    ny, nx = best.shape
    if (len(y_values), len(x_values)) != best.shape:
        raise ValueError(f"heatmap: grid {best.shape} vs {len(y_values)} y values x {len(x_values)} x values")
    vl, vu, vf, vs = metric(value)
    shown = best * vf
    if value.endswith("_s") and vu == "s":
        vu, k = _time_unit(np.nanmax(best) if np.isfinite(best).any() else 1.0)
        shown = best * k
    fig, ax = _new(ax)
    cmap = matplotlib.colormaps["viridis" if vs > 0 else "viridis_r"].with_extremes(bad="white")
    im = ax.imshow(np.ma.masked_invalid(shown), origin="lower", cmap=cmap, aspect="auto", gid="best")
    cb = fig.colorbar(im, ax=ax)
    cb.set_label(value_label or f"best {vl} ({vu})")
    annotate = (nx * ny <= 100) if annotate is None else annotate
    bad = ~np.isfinite(best)
    reasons = np.zeros(best.shape, np.int64) if reason is None else np.asarray(reason).astype(np.int64)
    lo, hi = (np.nanmin(shown), np.nanmax(shown)) if (~bad).any() else (0.0, 1.0)
    for i in range(ny):
        for j in range(nx):
            if bad[i, j]:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///",
                                       edgecolor="#b0b0b0", lw=0, gid="infeasible"))
                if annotate:
                    ax.text(j, i, _reason_text(reasons[i, j]) or "infeasible", ha="center", va="center",
                            fontsize=11, color="#7a1f22", bbox=dict(fc="white", ec="none", alpha=0.8, pad=1))
            elif annotate:
                dark = (shown[i, j] - lo) / ((hi - lo) or 1.0)
                dark = dark > 0.5 if vs < 0 else dark < 0.5
                ax.text(j, i, f"{shown[i, j]:.3g}", ha="center", va="center", fontsize=11,
                        color="white" if dark else "black")
    if mark_best and (~bad).any():
        flat = np.where(bad, np.inf, best * vs)
        bi, bj = np.unravel_index(np.argmin(flat), best.shape)
        ax.add_patch(Rectangle((bj - 0.5, bi - 0.5), 1, 1, fill=False, edgecolor="#c44e52", lw=3, gid="optimum"))
    xl, xu, xf, _ = metric(x)
    yl, yu, yf, _ = metric(y)
    tick = lambda v, f: f"{float(v) * f:g}" if isinstance(v, (int, float, np.number)) else str(v)  # noqa: E731
    ax.set_xticks(range(nx), [tick(v, xf) for v in x_values])
    ax.set_yticks(range(ny), [tick(v, yf) for v in y_values])
    ax.set_xlabel(f"{xl} ({xu})")
    ax.set_ylabel(f"{yl} ({yu})")
    ax.spines[["top", "right"]].set_visible(True)
    handles = [Patch(facecolor="white", edgecolor="#b0b0b0", hatch="///", label="no feasible plan")]
    if mark_best:
        handles.append(Patch(facecolor="none", edgecolor="#c44e52", lw=3, label="best"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.12), ncol=2, frameon=False)
    ax.set_title(title or f"best {vl} over {xl} and {yl}")
    return fig


# --------------------------------------------------------------------------- co-design


@_styled
def trajectory(history, objective="step_s", variables=None, *, best=None, design=None, title=None) -> Figure:
    """The co-design trajectory: the objective and each free variable against the
    iteration. ``history`` maps names to arrays [iterations] or [iterations, starts]
    (values in SI or the unit their name carries); ``best`` marks one start. ``design``
    maps variables to the reported design (the relaxed end snapped to allowed values and
    polished), drawn as a star after the last iteration so the two can be told apart."""
    cols = {k: _f(v) for k, v in _columns(history).items()}
    if objective not in cols:
        raise KeyError(f"trajectory: no {objective!r} in history; has {sorted(cols)}")
    variables = [k for k in cols if k not in (objective, "iteration")] if variables is None else list(variables)
    names = [objective] + variables
    n = len(names)
    fig = Figure(figsize=(8.0, max(5.0, 1.9 * n + 1)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(n, 1, sharex=True))
    obj = cols[objective]
    starts = 1 if obj.ndim == 1 else obj.shape[1]
    it = cols.get("iteration", np.arange(obj.shape[0]))
    for ax, name in zip(axes, names):
        label, unit, factor, _ = metric(name)
        vals = cols[name].reshape(len(it), -1) * factor
        for s in range(vals.shape[1]):
            hl = best is not None and s == best or starts == 1
            ax.plot(it, vals[:, s], color="#c44e52" if hl else "#4c72b0", lw=2.2 if hl else 0.9,
                    alpha=1.0 if hl else 0.35, zorder=3 if hl else 2, gid=f"traj:{name}:{s}")
        if design is not None and name in design:
            ax.plot([it[-1] + max(1, len(it) // 20)], [float(design[name]) * factor], "*", color="black", ms=14,
                    zorder=4, gid=f"design:{name}", clip_on=False)
        ax.set_ylabel(f"{label}\n({unit})")
        ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color="#c44e52", lw=2.2, label="best start" if starts > 1 else "trajectory (relaxed)")]
    if starts > 1:
        handles.append(Line2D([], [], color="#4c72b0", lw=0.9, alpha=0.6, label=f"other starts ({starts - 1})"))
    if design is not None and any(k in design for k in names):
        handles.append(Line2D([], [], ls="none", marker="*", color="black", ms=12,
                              label="reported design (snapped, polished)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
    if np.all(obj[np.isfinite(obj)] > 0) and np.nanmax(obj) / np.nanmin(obj) > 20:
        axes[0].set_yscale("log")
    axes[-1].set_xlabel("iteration (optimizer steps)")
    axes[0].set_title(title or "co-design trajectory" + (f" ({starts} starts, best in red)" if starts > 1 else ""))
    return fig


_SHORT = {"tp": "t", "pp": "p", "cp": "c", "ep": "e", "mbs": "b", "vpp": "v", "bw_up_GBps": "up ",
          "bw_out_GBps": "out ", "hbm_GB": "HBM ", "tflops": "TFLOP/s ", "domain": "U"}


def codesign_figures(result) -> dict[str, Figure]:
    """Figures of a co-design run (``dse.engines.codesign.run``'s Result): the trajectory of
    every case, and, when it has several cases with a cost (budgets traced by the
    epsilon-constraint method), the step time against hardware cost of the designs
    found (gradient, and exhaustive where it ran). Keys are file stems."""
    figs = {}
    cases = list(result.cases)
    for i, c in enumerate(cases):
        if not getattr(c, "history", None):
            continue
        hist = dict(c.history)
        loss = np.asarray(hist["loss"])
        best = int(np.nanargmin(loss[-1])) if loss.ndim == 2 else None
        budget = f", budget {c.budget_usd / 1e6:.3g} M$" if getattr(c, "budget_usd", 0) else ""
        design = c.gradient.values if getattr(c, "gradient", None) is not None else None
        figs[f"trajectory_{i:02d}"] = trajectory(hist, "loss", best=best, design=design,
                                                title=f"{c.model} on {c.cluster}{budget}: co-design trajectory")
    rows = []
    for c in cases:
        for how in ("gradient", "exhaustive"):
            f = getattr(c, how, None)
            if f is not None and f.cost_usd:
                # four significant figures, never an exponent for a bandwidth (1800, not 1.8e+03)
                vals = " ".join(f"{_SHORT.get(k, k)}{v:.4g}" for k, v in f.values.items())
                rows.append({"step_s": float(f.report.step_s), "cost_usd": f.cost_usd, "how": how,
                             "label": f"{vals} ({how})" if how == "exhaustive" else vals})
    if len(rows) > 1:
        grad = [r for r in rows if r["how"] == "gradient"]
        fig = pareto(grad, x="step_s", y="cost_usd", label="label", max_labels=8,
                     title="designs found by gradient, one per budget: step time against cost")
        ex = [r for r in rows if r["how"] == "exhaustive"]
        if ex:
            ax = fig.axes[0]
            ax.scatter([r["step_s"] for r in ex], [r["cost_usd"] * 1e-6 for r in ex], marker="x", s=80,
                       color="black", label="exhaustive optimum", gid="exhaustive", zorder=4)
            ax.legend(loc="best", frameon=False)
        figs["pareto_cost"] = fig
    return figs


class _RowView:
    """A ``dse plan --json`` row (sweep top/Pareto rows) read like a one-plan Report."""

    def __init__(self, row: Mapping):
        mem = row.get("memory_bytes", {})
        self.weights_bytes, self.grads_bytes = mem.get("weights", 0.0), mem.get("grads", 0.0)
        self.optimizer_bytes, self.activations_bytes = mem.get("optimizer", 0.0), mem.get("activations", 0.0)
        self.other_bytes, self.memory_bytes = mem.get("other", 0.0), mem.get("total", 0.0)
        self.compute_s, self.bubble_s = row["compute_s"], row["bubble_s"]
        self.step_s, self.mfu = row["step_s"], row["mfu"]
        self.exposed_s = type("PerDimView", (), dict(row["exposed_s"]))


def _row_value(row: Mapping, name: str, base: Mapping | None = None) -> float:
    """An objective of a sweep row: a report field, a run figure, an axis value, a plan field,
    or the spec's base value (``gpus`` when it is no axis)."""
    for where in (row, row.get("run") or {}, row.get("point") or {}, row.get("plan") or {}, base or {}):
        v = where.get(name)
        if isinstance(v, Mapping):          # memory_bytes: {weights, ..., total}
            v = v.get("total")
        if isinstance(v, (int, float, np.number)):
            return float(v)
    return math.nan


def _point_label(point: Mapping, varying) -> str:
    return " ".join(f"{_SHORT.get(k, k + '=')}{v:g}" if isinstance(v, (int, float)) else f"{v}"
                    for k, v in point.items() if k in varying)


def _distinct(rows, varying, max_top):
    """Rows grouped by what the step-time bars show (step parts and MFU), best first: one bar per
    distinct plan. Each group: (first row, its label, how many rows it stands for)."""
    groups = {}
    for r in rows:
        key = (round(r["compute_s"], 12), round(r["bubble_s"], 12), round(r["mfu"], 12),
               tuple(round(v, 12) for v in r["exposed_s"].values()))
        groups.setdefault(key, []).append(r)
    out = []
    for members in list(groups.values())[:max_top]:
        first = members[0]
        parts = []
        for k in varying:
            vals = list(dict.fromkeys(m["point"][k] for m in members))
            if all(isinstance(v, (int, float)) for v in vals):
                parts.append(_SHORT.get(k, k + "=") + "/".join(f"{v:g}" for v in vals))
            else:   # names (recompute, a model preset) read on their own
                parts.append("/".join(str(v) for v in vals))
        label = "\n".join(parts) + (f"\n({len(members)} plans)" if len(members) > 1 else "")
        out.append((first, label, len(members)))
    return out


def _dump_points(result, dump, x, y, limit=20000):
    """Feasible points of a full dump for a Pareto plot's background (a deterministic sample above
    ``limit``): columns x, y, and how many feasible points there are."""
    ok = np.flatnonzero(np.asarray(dump["reasons"]) == 0)
    n = ok.size
    if n > limit:
        ok = ok[np.linspace(0, n - 1, limit).round().astype(np.int64)]
    return {x: np.asarray(dump[x], float)[ok], y: np.asarray(dump[y], float)[ok]}, n


def sweep_figures(result, max_top=8, dump=None) -> dict[str, Figure]:
    """Figures of a sweep (``dse.engines.sweep.run_sweep``'s SweepResult): why plans are
    infeasible; the step-time breakdown of the best distinct plans (rows whose bars would be
    identical share one bar); the Pareto front over the first two Pareto objectives against
    every feasible point of the full dump (or, without one, the reported rows); and, with a
    dump, a heatmap of the best objective over the two largest axes with infeasible cells
    marked by reason. ``dump``: the dump's columns when the result does not hold them (a sweep
    written to ``out_dir``). Keys are file stems."""
    spec = result.spec
    figs = {}
    name = spec.name or "sweep"
    varying = [a.name for a in spec.axes if len(a) > 1]
    dump = dump if dump is not None else getattr(result, "dump", None)
    if result.points > result.feasible:
        figs["infeasible"] = infeasible_counts(result.infeasible_by_reason, feasible=result.feasible,
                                               title=f"{name}: why {result.points - result.feasible:,}"
                                                     f" of {result.points:,} plans are infeasible")
    if result.top:
        # axis values every top row shares go in the title, the rest under each bar
        same = {k: v for k, v in result.top[0]["point"].items()
                if k in varying and all(r["point"][k] == v for r in result.top)}
        groups = _distinct(result.top, [k for k in varying if k not in same], max_top)
        common = f"\nall with {_point_label(same, same)}" if same else ""
        figs["top"] = step_breakdown([_RowView(g[0]) for g in groups], [g[1] or "plan" for g in groups],
                                     title=f"{name}: the {len(groups)} best distinct plans by "
                                           f"{metric(spec.objective)[0]}{common}")
    if len(spec.pareto) >= 2 and result.pareto:
        x, y = spec.pareto[0], spec.pareto[1]
        base = {"gpus": float(np.asarray(spec.cluster.gpus))}
        fx = [_row_value(r, x, base) for r in result.pareto]
        fy = [_row_value(r, y, base) for r in result.pareto]
        shared = {k: v for k, v in result.pareto[0]["point"].items()
                  if k in varying and all(r["point"][k] == v for r in result.pareto)}
        labels = [_point_label(r["point"], [k for k in varying if k not in shared]) for r in result.pareto]
        if dump is not None and x in dump and y in dump:
            bg, n = _dump_points(result, dump, x, y)
            others = "feasible plans" if len(bg[x]) == n else f"feasible plans, {len(bg[x]):,} of {n:,} shown:"
        else:
            rows = [r for r in result.top if r["index"] not in {p["index"] for p in result.pareto}]
            bg = {x: [_row_value(r, x, base) for r in rows], y: [_row_value(r, y, base) for r in rows]}
            others = f"other top-{spec.top_k} plans (no dump: not the whole grid)"
        cols = {x: np.r_[np.asarray(bg[x], float), fx], y: np.r_[np.asarray(bg[y], float), fy],
                "front": np.r_[np.zeros(len(bg[x]), bool), np.ones(len(fx), bool)],
                "plan": np.r_[np.full(len(bg[x]), "", dtype=object), np.asarray(labels, dtype=object)]}
        more = f" (front over {', '.join(spec.pareto)})" if len(spec.pareto) > 2 else ""
        common = f"\nfront plans all with {_point_label(shared, shared)}" if shared else ""
        figs["pareto"] = pareto(cols, x=x, y=y, label="plan", front="front", others=others,
                                title=f"{name}: Pareto front{more}{common}")
    big = sorted((a for a in spec.axes if len(a) > 1), key=len, reverse=True)[:2]
    if dump is not None and len(big) == 2 and spec.objective in dump and result.done == result.points:
        order = np.argsort(np.asarray(dump["index"]))
        shape = spec.sizes
        grid = np.asarray(dump[spec.objective], float)[order].reshape(shape)
        reasons = np.asarray(dump["reasons"]).astype(np.int64)[order].reshape(shape)
        names = [a.name for a in spec.axes]
        iy, ix = sorted(names.index(a.name) for a in big)      # rows: the earlier axis of the file
        ay, ax_ = spec.axes[iy], spec.axes[ix]
        best, reason = best_grid(grid, reasons == 0, reasons, keep=(iy, ix), sense=-1 if spec.maximize else 1)
        figs["heatmap"] = heatmap(best, list(ax_.labels), list(ay.labels), x=ax_.name, y=ay.name,
                                  value=spec.objective, reason=reason,
                                  title=f"{name}: best {metric(spec.objective)[0]}"
                                        f" over the other axes")
    return figs


# --------------------------------------------------------------------------- sensitivities, validation


@_styled
def sensitivity(sens: Mapping[str, Mapping[str, float]], *, title="Where the step time comes from", ax=None) -> Figure:
    """Horizontal bars of the elasticity of the step time to each input, from a
    mapping {field: {"elasticity": e, "value": x}} (e.g. dse.engines.sensitivity's):
    -1 means the step scales as 1/x, 0 that x does not limit the plan."""
    names = list(sens)
    el = np.array([float(sens[n]["elasticity"]) for n in names])
    labels = []
    for n in names:
        label, unit, factor, _ = metric(n)
        value = sens[n].get("value")
        labels.append(f"{label}" + (f"\n= {float(value) * factor:.4g} {unit}" if value is not None else ""))
    fig, ax = _new(ax, size=(8.0, max(3.5, 0.75 * len(names) + 1.5)))
    y = np.arange(len(names))
    ax.barh(y, el, color=["#c44e52" if e < 0 else "#4c72b0" for e in el], gid="elasticity")
    for yi, e in zip(y, el):
        ax.annotate(f"{e:+.3f}", (e, yi), xytext=(4 if e >= 0 else -4, 0), textcoords="offset points",
                    va="center", ha="left" if e >= 0 else "right")
    ax.axvline(0, color="black", lw=1)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()   # first field on top
    lim = max(1.0, float(np.abs(el).max()) if el.size else 1.0) * 1.25
    ax.set_xlim(-lim, lim)
    ax.set_xlabel("elasticity of step time (% per % change)")
    ax.set_title(title)
    return fig


LEGEND_INSIDE = 8   # legend entries predicted_vs_published keeps inside its scatter panel


@_styled
def predicted_vs_published(published, predicted, *, groups=None, fitted=None, labels=None,
                           quantity="iteration time", unit="s", title=None, max_labels=6) -> Figure:
    """Two panels. Left: predicted against published (log-log), one point per run, with the
    y = x line and +-10% / +-20% bands; ``groups`` colours the points (e.g. by source),
    ``fitted`` (bools) draws fitted rows filled and judged rows hollow, and the ``max_labels``
    worst rows are named. Right: every row's error (predicted / published - 1) as a bar,
    sorted, named by ``labels`` on its axis, so no row label overlaps another."""
    pub, pred = _f(published).ravel(), _f(predicted).ravel()
    n = pub.size
    groups = np.asarray(["runs"] * n if groups is None else groups).ravel()
    fitted = np.zeros(n, bool) if fitted is None else np.asarray(fitted, bool).ravel()
    names = [f"row {i + 1}" for i in range(n)] if labels is None else [str(t) for t in labels]
    err = pred / pub - 1
    fig = Figure(figsize=(13.0, max(6.0, 0.24 * n + 2.0)), layout="constrained")
    ax, bx = fig.subplots(1, 2, width_ratios=(1.25, 1.0))
    lo, hi = np.nanmin(np.r_[pub, pred]) / 1.5, np.nanmax(np.r_[pub, pred]) * 1.5
    line = np.geomspace(lo, hi, 50)
    ax.plot(line, line, color="black", lw=1.2, label="predicted = published", gid="identity")
    for band, alpha in ((0.2, 0.08), (0.1, 0.12)):
        ax.fill_between(line, line * (1 - band), line * (1 + band), color="#4c72b0", alpha=alpha, lw=0,
                        label=f"±{100 * band:.0f}%")
    order = list(dict.fromkeys(groups))        # tab10 up to ten sources, else tab20: no two sources share a colour
    colors = matplotlib.colormaps["tab10" if len(order) <= 10 else "tab20"]
    color_of = {g: colors(k % colors.N) for k, g in enumerate(order)}
    for g, c in color_of.items():
        for is_fit in (True, False):
            sel = (groups == g) & (fitted == is_fit)
            if not sel.any():
                continue
            ax.scatter(pub[sel], pred[sel], s=55, facecolors=c if is_fit else "none", edgecolors=c, lw=1.6,
                       label=f"{g} ({'fitted' if is_fit else 'judged'})", gid=f"runs:{g}:{'fitted' if is_fit else 'judged'}",
                       zorder=3)
    # the ``max_labels`` worst spots are named; rows that sit on one spot (within 5% on both axes) share
    # one label, "R146 +4", not five on top of each other
    spots = []
    for i in np.argsort(-np.abs(np.nan_to_num(err))):
        if abs(err[i]) <= 0.05:
            break
        near = [sp for sp in spots if abs(np.log(pub[i] / pub[sp[0]])) < 0.05 and abs(np.log(pred[i] / pred[sp[0]])) < 0.05]
        if near:
            near[0].append(i)
        elif len(spots) < max_labels:
            spots.append([i])
    for sp in spots:   # above the line (predicted slow): up and to the left; below it: down and to the right
        i = sp[0]
        text = names[i] if len(sp) == 1 else f"{names[i]} +{len(sp) - 1}"
        up = err[i] > 0
        ax.annotate(text, (pub[i], pred[i]), xytext=(-10, 8) if up else (10, -14), textcoords="offset points",
                    ha="right" if up else "left", fontsize=11, color="#444444",
                    arrowprops=dict(arrowstyle="-", color="#999999", lw=0.8), gid=f"worst:{names[i]}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel(f"published {quantity} ({unit})")
    ax.set_ylabel(f"predicted {quantity} ({unit})")
    ax.grid(alpha=0.3, which="both")
    handles = len(ax.get_legend_handles_labels()[1])
    if handles > LEGEND_INSIDE:   # many sources: below the panel, where it hides no point and no label
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    else:
        ax.legend(loc="upper left", frameon=True, framealpha=0.9)
    order = np.argsort(err)
    y = np.arange(n)
    bx.barh(y, 100 * err[order], color=[color_of[groups[i]] for i in order],
            alpha=0.9, gid="errors")
    for yi, i in zip(y, order):
        if not fitted[i]:
            bx.patches[yi].set_hatch("//")
    bx.set_yticks(y, [names[i] for i in order])
    bx.axvline(0, color="black", lw=1)
    for v in (-10, 10):
        bx.axvline(v, color="#4c72b0", lw=0.8, ls="--")
    bx.set_xlabel(f"{quantity} error (%): predicted / published - 1")
    bx.set_ylabel("row (hatched: judged, solid: fitted)")
    bx.set_ylim(-0.7, n - 0.3)
    bx.grid(alpha=0.3, axis="x")
    fig.suptitle(title or f"{quantity}: median |error| {100 * np.nanmedian(np.abs(err)):.1f}%, "
                          f"max {100 * np.nanmax(np.abs(err)):.1f}%")
    ax.set_title(f"median |error| {100 * np.nanmedian(np.abs(err)):.1f}%, max {100 * np.nanmax(np.abs(err)):.1f}%")
    return fig


# --------------------------------------------------------------------------- files


def check_path(path, what="figure file") -> Path:
    """The path, if its extension names a format dse writes; else an InputError."""
    return files.check_out_file(path, what, suffixes=FORMATS)


def save(fig: Figure, path) -> Path:
    """Write a figure as PNG or SVG, chosen by the file's extension."""
    if Path(path).suffix.lower() in FORMATS:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    path = check_path(path)
    with files.atomic_open(path, "wb") as fh:   # never a half-written figure (dse/files.py)
        fig.savefig(fh, format=path.suffix[1:].lower(), bbox_inches="tight")
    return path
