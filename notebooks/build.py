"""Write the notebooks under notebooks/ from the cells below (outputs stripped).

The .ipynb files are generated so a review reads Python, not JSON. Edit this file,
then run ``python3 notebooks/build.py`` and commit both. tests/test_notebooks.py
executes every notebook listed in NOTEBOOKS and checks the files are up to date.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

SETUP = """\
%matplotlib inline
import sys, pathlib
root = pathlib.Path.cwd().resolve().parent
if (root / "dse" / "__init__.py").is_file():   # run from a checkout without installing
    sys.path.insert(0, str(root))
import os
import jax
jax.config.update("jax_enable_x64", True)      # single plans in float64, as the CLI does
SMALL = os.environ.get("DSE_NOTEBOOK_SIZE") == "small"   # tests/notebooks: the same cells, smaller searches
import numpy as np
import dse
from dse import plot
from dse.inputs import presets"""


def md(text):
    return ("markdown", text)


def code(text):
    return ("code", text)


# ---------------------------------------------------------------------------- quickstart

QUICKSTART = [
    md("""\
# dse quickstart: one plan, its memory and its step time

dse evaluates a training plan (tensor, pipeline, data, context and expert parallel
degrees, microbatch, ZeRO stage, recompute) on a cluster (accelerator FLOP/s and memory,
a scale-up domain, a scale-out network) with one set of `jnp` equations:
`dse.evaluate(model, cluster, plan)` returns a `Report` in SI units.

The plan below is the seed's worked example: GPT-3 175B on 1,024 accelerators of the
seed's illustrative cluster (400 TFLOP/s, 80 GB, domains of 8 at 450 GB/s, 50 GB/s
scale-out), t = 8, p = 8, d = 16, b = 1, B = 1,024."""),
    code(SETUP),
    code("""\
model = presets.load_model("gpt3-175b")
cluster = presets.load_cluster("seed")
plan = dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024, zero=1, recompute=dse.RECOMPUTE["selective"])
report = dse.evaluate(model, cluster, plan)
print(f"step {float(report.step_s):.3f} s, MFU {100 * float(report.mfu):.1f}%, "
      f"memory {float(report.memory_bytes) / 1e9:.1f} GB of {float(cluster.hbm_bytes) / 1e9:g} GB")"""),
    md("The same Expert view as `dse plan --preset gpt3-175b --tp 8 --pp 8 --gbs 1024`:"),
    code("""\
from dse.text.plan_view import expert_view
print(expert_view(model, cluster, plan, report.to_json()))"""),
    md("""\
## The breakdown as a picture

Left: memory per accelerator (weights, gradients, Adam state, activations) against the
HBM line. Right: the step as compute, pipeline bubble and the exposed communication of
each parallel dimension (`dse plan ... --plot FILE` writes the same figure)."""),
    code("""\
fig = plot.plan_summary(report, cluster.hbm_bytes, plot.plan_labels(plan, dp=report.dp, gpus=cluster.gpus),
                        title="GPT-3 175B, the seed's worked example")
fig"""),
    md("""\
## Several plans at once

Every input field is an array, so a batch of plans is one `Plan` with a leading axis
(`dse.stack`) and one call to `evaluate`. Here the three recompute modes: selective
recompute drops the attention term 5as/h of the activations (Korthikanti et al. 2022),
full recompute keeps only the layer inputs and pays a third more FLOPs."""),
    code("""\
modes = ["none", "selective", "full"]
plans = dse.stack([plan.replace(recompute=dse.RECOMPUTE[m]) for m in modes])
reports = dse.evaluate(model, cluster, plans)
plot.plan_summary(reports, cluster.hbm_bytes, modes, title="GPT-3 175B on 1,024: recompute modes")"""),
    md("""\
## A grid: the best step time over TP x PP

Arrays that broadcast against each other make a grid: TP along one axis, PP along
another, microbatch and ZeRO stage along two more. `plot.best_grid` keeps the best
feasible step time per (PP, TP) cell; cells with no feasible plan are hatched and name
the reason that rules out most of their plans (`OOM`: over HBM; `B % db`: the batch
does not split into whole microbatches)."""),
    code("""\
tps = np.array([1, 2, 4, 8, 16])
pps = np.array([1, 2, 4, 8, 16])
grid = dse.Plan.make(tp=tps[None, :, None, None], pp=pps[:, None, None, None],
                     mbs=np.array([1, 2, 4])[None, None, :, None], zero=np.array([0, 1, 3])[None, None, None, :],
                     gbs=1536, recompute=1)
r = dse.evaluate(model, cluster, grid)
best, reason = plot.best_grid(r.step_s, r.feasible, r.reasons, keep=(0, 1))
plot.heatmap(best, tps, pps, x="tp", y="pp", value="step_s", reason=reason,
             title="GPT-3 175B on 1,024, B = 1,536: best step time over b and ZeRO")"""),
]

# ---------------------------------------------------------------------------- seed "Try" studies

SEED_TRY = [
    md("""\
# The seed's three "Try" studies

Seed 000 ends its Expert view with three experiments. Each is run here in seed mode
(the seed's simulator, exactly) with `dse.evaluate` and drawn with `dse.plot`. The
numbers match the table in the README (`dse plan` gives the same)."""),
    code(SETUP),
    md("""\
The seven plans of the three studies differ in model, cluster and plan; `dse.stack`
stacks each input along a leading axis, so one `evaluate` call runs them all."""),
    code("""\
m405 = presets.load_model("llama3-405b")                       # the seed's "406B model", seq 8192
gpt3 = presets.load_model("gpt3-175b")
moe = gpt3.replace(experts=64)                                  # seed mode: half-width experts, top 2
seed = presets.load_cluster("seed")                             # 1,024 x 400 TFLOP/s, 80 GB, domains of 8
big = seed.replace(gpus=16384)
P = lambda **kw: dse.Plan.make(**{"mbs": 1, "zero": 1, "recompute": 1, **kw})   # defaults, then the case
cases = {   # name: (model, cluster, plan)
    "405B selective":   (m405, big, P(tp=8, pp=16, gbs=2048, zero=3)),
    "405B full":        (m405, big, P(tp=8, pp=16, gbs=2048, zero=3, recompute=2)),
    "405B domain 4":    (m405, big.replace(domain=4), P(tp=8, pp=16, gbs=2048, zero=3)),
    "GPT-3 domain 8":   (gpt3, seed, P(tp=8, pp=8, gbs=1024)),
    "GPT-3 domain 4":   (gpt3, seed.replace(domain=4), P(tp=8, pp=8, gbs=1024)),
    "MoE EP 8":         (moe, seed, P(tp=1, pp=8, ep=8, gbs=1024, zero=3, recompute=2)),
    "MoE EP 64":        (moe, seed, P(tp=1, pp=8, ep=64, gbs=1024, zero=3, recompute=2)),
}
names = list(cases)
models, clusters, plans = (dse.stack([c[k] for c in cases.values()]) for k in range(3))
r = dse.evaluate(models, clusters, plans)
pick = lambda *keys: [r[names.index(k)] for k in keys]   # one Report a case
for i, name in enumerate(names):
    x = r[i]
    print(f"{name:>15}: memory {float(x.memory_bytes) / 1e9:5.1f} GB  step {float(x.step_s):6.2f} s  "
          f"MFU {100 * float(x.mfu):4.1f}%  exposed TP {float(x.exposed_s.tp):.3f} s  EP {float(x.exposed_s.ep):.3f} s  "
          f"DP {float(x.exposed_s.dp):.2f} s  bubble {100 * float(x.bubble_share):4.1f}%")"""),
    md("""\
## 1. Llama 3 405B on 16,384 accelerators: selective against full recompute

"Set the 406B model, 16,384 accelerators, TP 8, PP 16, ZeRO 3, a batch of 2,048 and an
8,192-token sequence, close to Llama 3's Table 4. Compare selective and full recompute."
"""),
    code("""\
plot.plan_summary(pick("405B selective", "405B full"), big.hbm_bytes, ["selective", "full"],
                  title="Llama 3 405B, 16,384 accelerators, t8 p16 d128, ZeRO-3")"""),
    md("""\
With d = 128 and B = 2,048 there are m = 16 microbatches for 16 stages: the bubble
(p-1)/m = 15/16 of compute dominates either way. Full recompute cuts the activations
from 68.7 GB to almost nothing and adds a third of the FLOPs."""),
    md("""\
## 2. A scale-up domain of 4 with TP 8

"Set the domain to 4 with TP 8 and read the exposed communication." With U = 4 the TP
all-reduces leave the domain and run at the scale-out rate (50 GB/s instead of 450 GB/s),
for the 405B plan and for the seed's worked example (GPT-3 175B, t8 p8 d16 on 1,024)."""),
    code("""\
keys = ["405B selective", "405B domain 4", "GPT-3 domain 8", "GPT-3 domain 4"]
plot.step_breakdown(pick(*keys), keys,
                    title="TP 8 inside (domain 8) and outside (domain 4) the scale-up domain")"""),
    md("""\
The same question over a grid, on the seed's worked example (B = 1,024): the best step
time for each (domain size, TP) pair over pipeline depth and microbatch. TP that
outgrows the domain pays the 9x bandwidth gap."""),
    code("""\
doms = np.array([1, 2, 4, 8, 16, 32])
tps = np.array([1, 2, 4, 8, 16])
g = dse.evaluate(gpt3, seed.replace(domain=doms[:, None, None, None]),
                  dse.Plan.make(tp=tps[None, :, None, None], pp=np.array([4, 8, 16])[None, None, :, None],
                                mbs=np.array([1, 2])[None, None, None, :], gbs=1024, zero=1, recompute=1))
best, reason = plot.best_grid(g.step_s, g.feasible, g.reasons, keep=(0, 1))
plot.heatmap(best, tps, doms, x="tp", y="domain", value="step_s", reason=reason,
             title="GPT-3 175B on 1,024: best step time by domain size and TP")"""),
    md("""\
## 3. 64 experts: EP 8 inside a domain against EP 64 across domains

"With 64 experts, compare EP 8 (inside a domain of 8 when TP = 1) with EP 64." GPT-3
175B's shape with 64 experts (in seed mode each expert is half the dense FFN and a
token goes to the top 2), TP 1, PP 8, ZeRO-3, full recompute, B = 1,024 on 1,024."""),
    code("""\
for name in ("MoE EP 8", "MoE EP 64"):
    x = r[names.index(name)]
    print(f"{name}: all-to-all {float(x.traffic_bytes.ep) / 1e9:.0f} GB a step on "
          f"{'scale-up' if float(x.inside_domain.ep) else 'scale-out'}, "
          f"DP traffic {float(x.traffic_bytes.dp) / 1e9:.0f} GB a step")
plot.plan_summary(pick("MoE EP 8", "MoE EP 64"), seed.hbm_bytes, ["EP 8", "EP 64"],
                  title="GPT-3 175B shape with 64 experts, t1 p8, ZeRO-3, full recompute")"""),
    md("""\
EP 8 keeps the all-to-all inside the domain, but each expert's weights are then
replicated over d/e = 16 ranks and their ZeRO-3 traffic no longer hides behind the
backward pass; EP 64 puts the all-to-all on the 50 GB/s tier yet wins, because the
expert-DP traffic falls from 369 GB to 65 GB a step."""),
]

# ---------------------------------------------------------------------------- torus mapping

TORUS = [
    md("""\
# Mapping parallel dimensions onto a torus

On a torus there is no "inside the domain": each parallel group occupies whole axes,
or a stretch of one, and its collectives run on the links of those axes (a
bidirectional ring on a wraparound axis; a multi-axis all-reduce as per-axis
reduce-scatter and all-gather). TPU v4 places DP on one axis and the model-parallel
dimensions on the others and reports 1.2-2.3x gains from choosing topology and
hyperparameters together (Jouppi et al. 2023).

The cluster is the `tpu-v4-torus` preset: 4,096 chips as a 16 x 16 x 16 torus with
wraparound, 50 GB/s a link a direction, 275 TFLOP/s and 32 GB a chip. The model is
GPT-3 175B, B = 1,024 sequences of 2,048 tokens, seed-mode compute."""),
    code(SETUP),
    code("""\
from dse.equations import topology
torus = presets.load_cluster("tpu-v4-torus")
model = presets.load_model("gpt3-175b")
print({k: float(getattr(torus, k)) for k in ("gpus", "torus_x", "torus_y", "torus_z", "hbm_bytes")})"""),
    md("""\
## Every mapping at once

A mapping is a rank order (which parallel dimension is innermost) and a fill order
of the torus axes: `Plan.rank_order` (120 permutations of TP, CP, EP, PP, DP) and
`Plan.torus_order` (6 of x, y, z). Both are plan fields, so a grid over TP, PP and all
720 (rank order, fill order) pairs is one `evaluate` call; orders that do not split a
group onto whole axes or sub-axes are infeasible (`torus_mapping_invalid`)."""),
    code("""\
tps = np.array([1, 2, 4, 8, 16, 32])
pps = np.array([1, 2, 4, 8, 16])
n_ro, n_to = len(topology.RANK_ORDERS), len(topology.TORUS_ORDERS)
grid = dse.Plan.make(tp=tps[None, :, None, None], pp=pps[:, None, None, None], mbs=1, gbs=1024, zero=1,
                     recompute=1, rank_order=np.arange(n_ro)[None, None, :, None],
                     torus_order=np.arange(n_to)[None, None, None, :])
r = dse.evaluate(model, torus, grid)
print("plans:", r.step_s.size, " feasible:", int(np.asarray(r.feasible).sum()))
best, reason = plot.best_grid(r.step_s, r.feasible, r.reasons, keep=(0, 1))
worst, _ = plot.best_grid(r.step_s, r.feasible, r.reasons, keep=(0, 1), sense=-1)
plot.heatmap(best, tps, pps, x="tp", y="pp", value="step_s", reason=reason,
             title="GPT-3 175B on a 16x16x16 torus: best step time over mappings")"""),
    md("""\
How much the mapping matters: the slowest valid mapping over the fastest, per (TP, PP)."""),
    code("""\
ratio = worst / best
plot.heatmap(ratio, tps, pps, x="tp", y="pp", value="worst_over_best", reason=reason, mark_best=False,
             value_label="slowest / fastest step time (ratio)", title="How much the mapping matters")"""),
    md("""\
## The mappings of one plan

TP 16, PP 4, DP 64. `topology.torus_mappings` lists the distinct placements (which axes
each dimension occupies: `x` a whole axis, `y4` four chips of y, `y4/4` four chips
four links apart); each is a (rank order, fill order) pair, i.e. a cell of the grid above."""),
    code("""\
plan = dse.Plan.make(tp=16, pp=4, mbs=1, gbs=1024, zero=1, recompute=1)
maps = topology.torus_mappings(torus, plan)
i_pp, i_tp = list(pps).index(4), list(tps).index(16)
cells = [r[i_pp, i_tp, m["rank_order"], m["torus_order"]] for m in maps]
steps = np.array([float(x.step_s) for x in cells])
order = np.argsort(steps, kind="stable")
name = lambda m: "\\n".join(f"{k.upper()} {v}" for k, v in m["axes"].items())
for j in order:
    print(f"{steps[j]:7.3f} s  " + "  ".join(f"{k}:{v}" for k, v in maps[j]["axes"].items()))   # one line a mapping
pick = list(order[:3]) + list(order[-3:])
plot.step_breakdown([cells[j] for j in pick], [name(maps[j]) for j in pick],
                    title="TP 16, PP 4, DP 64 on the torus: three fastest and three slowest mappings")"""),
    md("""\
The fastest mappings give TP a whole 16-chip axis (its all-reduces ride a wraparound
ring) and split PP and DP over the others; the slowest split TP over partial stretches
of two axes, where its rings have no wraparound link and take twice as long."""),
]

# ---------------------------------------------------------------------------- NVLink / IB co-design

NVLINK_IB = [
    md("""\
# How much scale-up against scale-out bandwidth? An NVLink / InfiniBand co-design study

Seed 000: "Bandwidth ratios set the rules" (300 vs 100 GB/s in Megatron-LM's 2019
cluster, a 3.2x NVLink-to-InfiniBand gap in DeepSeek-V3's). This notebook asks, for
Llama 3 70B on 1,024 H100-class accelerators (989 TFLOP/s, 80 GB, domains of 8,
B = 1,024 sequences of 8,192 tokens): how does the best step time depend on the two
bandwidths, which one limits a given plan, and which split does a network budget buy?
Everything is `dse.evaluate` (seed-mode equations), its gradient, and `dse.engines.codesign`."""),
    code(SETUP),
    code("""\
model = presets.load_model("llama3-70b")
h100 = presets.load_cluster("dgx-h100")
ups = np.array([50, 100, 200, 450, 900, 1800]) * 1e9      # scale-up GB/s per GPU, per direction
outs = np.array([6.25, 12.5, 25, 50, 100, 200]) * 1e9     # scale-out GB/s per GPU (50 = one 400G NIC)
tps, pps = np.array([1, 2, 4, 8, 16]), np.array([1, 2, 4, 8, 16])
grid = dse.evaluate(model, h100.replace(bw_up_bytes_per_s=ups[None, :, None, None, None],
                                         bw_out_bytes_per_s=outs[:, None, None, None, None]),
                     dse.Plan.make(tp=tps[None, None, :, None, None], pp=pps[None, None, None, :, None],
                                   mbs=1, gbs=1024, zero=np.array([1, 3])[None, None, None, None, :], recompute=1))
best, reason = plot.best_grid(grid.step_s, grid.feasible, grid.reasons, keep=(0, 1))
plot.heatmap(best, ups, outs, x="bw_up_bytes_per_s", y="bw_out_bytes_per_s", value="step_s", reason=reason,
             title="Llama 3 70B on 1,024: best step time over TP, PP and ZeRO")"""),
    md("""\
Along a row, more scale-up bandwidth helps until TP's all-reduces hide no more; down a
column, scale-out bandwidth matters only while DP's traffic is exposed. Which one
limits a plan is a derivative: `dse.engines.sensitivity` differentiates the step time through
the same `evaluate` with `jax.grad` (elasticity -1: the step scales as 1/x; 0: x does
not limit this plan). Here at the best plan on the preset's 450 / 50 GB/s:"""),
    code("""\
from dse.engines.sensitivity import sensitivities
sub = grid[list(outs).index(50e9), list(ups).index(450e9)]          # the (TP, PP, ZeRO) grid at 450 / 50
k = np.unravel_index(np.nanargmin(np.where(np.asarray(sub.feasible) > 0, np.asarray(sub.step_s), np.nan)), np.shape(sub.step_s))
plan = dse.Plan.make(tp=tps[k[0]], pp=pps[k[1]], mbs=1, gbs=1024, zero=[1, 3][k[2]], recompute=1)
print("best plan at 450 / 50 GB/s:", plot.plan_labels(plan)[0], f"step {float(sub.step_s[k]):.2f} s")
sens = sensitivities(model, h100, plan)
plot.sensitivity({n: v for n, v in sens.items() if n in ("bw_up_bytes_per_s", "bw_out_bytes_per_s", "peak_flops_per_s")},
                 title=f"Llama 3 70B, {plot.plan_labels(plan)[0]}: elasticity of the step time")"""),
    md("""\
## What does a budget buy? Gradient co-design, bandwidth priced

`dse.engines.codesign` relaxes the hard steps of the same equations (sharpness annealed),
optimizes the log2 of every free variable with projected Adam from many starts in one
compiled scan (model and cluster are arguments: one compile for every case), blends ZeRO
and recompute as softmax weights over their options, snaps to allowed values, polishes,
and re-evaluates exactly; on a space this small it also runs the exhaustive search and
reports the gap. The cost is the network model (`network = true`, `dse/equations/cost.py`):
bw_up buys whole NVLink links of the cheapest generation that serves the domain, bw_out
whole NICs of the cheapest rate (100-800 Gb/s), with switches by radix and tiers and
optics by reach, at the indicative prices of `dse/data/network_cost.toml`. The budget is
$8,000 of network per GPU. Search sizes are cut down so the notebook runs in CI; the study
files use more (and `DSE_NOTEBOOK_SIZE=small`, which the notebook tests set, cuts them further)."""),
    code("""\
from dse.engines import codesign as cd
from dse.text.codesign_view import case_text
spec = cd.parse_spec({
    "model": {"preset": "llama3-70b"},
    "cluster": {"preset": "dgx-h100", "gpus": 1024},
    "plan": {"gbs": 1024, "mbs": 1},
    "objective": {"kind": "step_time", "budget_usd_per_gpu": 8000},
    "cost": {"network": True},
    "free": {"tp": {"min": 1, "max": 16}, "pp": {"min": 1, "max": 16}, "zero": [1, 3],
             "recompute": ["selective", "full"],
             "bw_up_GBps": {"min": 50, "max": 1800, "levels": 12},
             "bw_out_GBps": {"min": 6.25, "max": 200, "levels": 12}},
    "search": {"starts": 2 if SMALL else 8, "steps": 20 if SMALL else 60, "seed": 0},
})
result = cd.run(spec)
case = result.cases[0]
print(case_text(case))
plot.codesign_figures(result)["trajectory_00"]"""),
    md("""\
The trajectory shows every start (faint) and the best (red): the relaxed loss falls as
the sharpness rises, the bandwidths settle where the budget binds, and the last point
(one past the optimizer's steps) is each start's snapped design; the red one ends at
the reported design.

## The whole front: step time against network cost

The network model applied to every design of the bandwidth grid above
(`codesign.hardware_cost_usd`, which reads `Report.network_cost_usd`: no new equation):
each point is one (bandwidths, TP, PP, ZeRO) design, the front the fastest design each
cost buys; the cross is the co-design result for the $8,000-a-GPU budget. The cost is a
staircase in each bandwidth (whole NVLink links and NICs), so the front has steps where a
faster NIC or one more link becomes the cheapest way to the next bandwidth."""),
    code("""\
clusters = h100.replace(bw_up_bytes_per_s=ups[None, :, None, None, None],
                        bw_out_bytes_per_s=outs[:, None, None, None, None])
cost = cd.hardware_cost_usd(spec, clusters, grid)
shape = np.shape(grid.step_s)
flat = lambda a: np.broadcast_to(np.asarray(a), shape).ravel()
up_out = [f"{u:g}/{o:g} GB/s" for u, o in zip(flat(clusters.bw_up_bytes_per_s) / 1e9, flat(clusters.bw_out_bytes_per_s) / 1e9)]
plans = dse.Plan.make(tp=flat(tps[None, None, :, None, None]), pp=flat(pps[None, None, None, :, None]), mbs=1,
                      gbs=1024, zero=flat(np.array([1, 3])[None, None, None, None, :]))
labels = [f"{a} {b}" for a, b in zip(up_out, plot.plan_labels(plans))]
fig = plot.pareto({"step_s": flat(grid.step_s), "cost_usd": flat(cost), "feasible": flat(grid.feasible), "plan": labels},
                  x="step_s", y="cost_usd", label="plan", logx=True, logy=True, max_labels=8,
                  title="Llama 3 70B on 1,024: step time against network cost (network model)")
g = case.gradient
fig.axes[0].scatter([float(g.report.step_s)], [g.cost_usd * 1e-6], marker="x", s=120, color="black", zorder=5,
                    label="co-design, $8,000/GPU budget")
fig.axes[0].legend(loc="upper right", frameon=False)
fig"""),
    md("""\
## What each bandwidth costs

The network model's price of one GPU's share of the network against each bandwidth
(the other at the preset's value): steps where a link or NIC is added, and where a
faster NIC rate or a newer NVLink generation becomes the cheaper way to the bandwidth."""),
    code("""\
from dse.equations import cost as netcost
bws = np.geomspace(6.25, 200, 60)
ups_fine = np.geomspace(50, 1800, 60)
out_usd = np.asarray(netcost.network_cost(h100.replace(bw_out_bytes_per_s=bws * 1e9))[0]) / 1024   # one call a curve
up_usd = np.asarray(netcost.network_cost(h100.replace(bw_up_bytes_per_s=ups_fine * 1e9))[0]) / 1024
from matplotlib.figure import Figure
fig = Figure(figsize=(8, 3.2), layout="constrained")
a, b = fig.subplots(1, 2)
a.step(bws, out_usd, where="post"); a.set_xscale("log"); a.set_xlabel("scale-out GB/s per GPU"); a.set_ylabel("network USD per GPU")
b.step(ups_fine, up_usd, where="post"); b.set_xscale("log"); b.set_xlabel("scale-up GB/s per GPU")
fig"""),
]

# ---------------------------------------------------------------------------- validation

VALIDATION = [
    md("""\
# Predicted against published: how good is the calibrated mode?

The seed's simulator is order-of-magnitude by its own account. The calibrated mode
(`fidelity="calibrated"`) adds what the seed leaves out (real shapes, latency,
achievable FLOP/s by GEMM shape, interleaved and zero-bubble schedules, FSDP gathers,
temporary buffers, ...) and fits a few efficiency parameters by gradient on part of
`dse/data/validation/calibration_runs.csv` (the published runs, shipped with dse); the other rows are judged, never fitted.
This notebook runs `dse validate`'s comparison (`dse.calibration.validate.compare`) and draws it:
each point is one published run, fitted rows filled, judged rows hollow."""),
    code(SETUP),
    code("""\
from dse.calibration import validate as validation
from dse.inputs import fidelity
runs, skipped = validation.load_runs()                     # the shipped table of published runs
fitted = fidelity.fitted_rows()                          # rows the shipped calibration was fitted on
table = validation.compare(runs, fidelity.calibrated(), fitted)
print(f"{len(runs)} runnable rows, {len(skipped)} not runnable; {len(fitted)} fitted, "
      f"{len(runs) - len(fitted)} judged")
for name, s in table["summary"].items():
    print(f"{name:<32} rows {s['rows']:>3}   median |error| {100 * s['median_abs']:5.1f}%   max {100 * s['max_abs']:5.1f}%")"""),
    code("""\
rows = table["rows"]
plot.predicted_vs_published([r["time_published_s"] for r in rows], [r["time_predicted_s"] for r in rows],
                            groups=[r["source"] for r in rows], fitted=[r["set"] == "fitted" for r in rows],
                            quantity="iteration time", unit="s",
                            title="calibrated mode: iteration time, every runnable published run")"""),
    md("""\
The same runs in seed mode (the seed's simulator: 100% of peak FLOP/s, no latency, no
embeddings): the order of magnitude is right, the 10-30% that separates plans is not."""),
    code("""\
seed_table = validation.compare(runs, "seed")
plot.predicted_vs_published([r["time_published_s"] for r in seed_table["rows"]],
                            [r["time_predicted_s"] for r in seed_table["rows"]],
                            groups=[r["source"] for r in seed_table["rows"]], quantity="iteration time", unit="s",
                            title="seed mode: iteration time, the same runs")"""),
    md("""\
Per row, judged rows only: the headline metric of each source (MFU or TFLOP/s per
GPU, under that source's FLOP convention) predicted against published."""),
    code("""\
judged = [r for r in rows if r["set"] == "judged"]
for r in sorted(judged, key=lambda r: abs(r["error"]), reverse=True):
    print(f"{r['row_id']:<6}{r['source']:<18}{r['model'][:24]:<25}{r['metric']:<12}"
          f"published {r['published']:7.1f}  predicted {r['predicted']:7.1f}  error {100 * r['error']:+6.1f}%")"""),
]

NOTEBOOKS = {
    "quickstart.ipynb": QUICKSTART,
    "seed_try_studies.ipynb": SEED_TRY,
    "torus_mapping.ipynb": TORUS,
    "nvlink_ib_codesign.ipynb": NVLINK_IB,
    "validation.ipynb": VALIDATION,
}


def build(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, (kind, text) in enumerate(cells):
        text = textwrap.dedent(text).strip("\n")
        cell = nbformat.v4.new_markdown_cell(text) if kind == "markdown" else nbformat.v4.new_code_cell(text)
        cell["id"] = f"c{i:02d}"   # stable ids: rebuilding changes nothing unless the cells do
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(cells) -> str:
    return nbformat.writes(build(cells)) + "\n"


def main(argv=None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    stale = []
    for name, cells in NOTEBOOKS.items():
        path = HERE / name
        text = render(cells)
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("stale notebooks (run python3 notebooks/build.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
