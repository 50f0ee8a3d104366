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
import jax
jax.config.update("jax_enable_x64", True)      # single plans in float64, as the CLI does
import numpy as np
import dse
from dse import plot, presets
grid_evaluate = jax.jit(dse.evaluate)           # one compile per grid shape"""


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
from dse.cli.plan import expert_view
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
r = grid_evaluate(model, cluster, grid)
best, reason = plot.best_grid(r.step_s, r.feasible, r.reasons, keep=(0, 1))
plot.heatmap(best, tps, pps, x="tp", y="pp", value="step_s", reason=reason,
             title="GPT-3 175B on 1,024, B = 1,536: best step time over b and ZeRO")"""),
]

# ---------------------------------------------------------------------------- seed "Try" studies

SEED_TRY = [
    md("""\
# The seed's three "Try" studies

Seed 000 ends its Expert view with three experiments. Each is run here in seed mode
(the seed's simulator, exactly) with `dse.evaluate` and drawn with `dse.plot`."""),
    code(SETUP),
    md("""\
## 1. Llama 3 405B on 16,384 accelerators: selective against full recompute

"Set the 406B model, 16,384 accelerators, TP 8, PP 16, ZeRO 3, a batch of 2,048 and an
8,192-token sequence, close to Llama 3's Table 4. Compare selective and full recompute."
"""),
    code("""\
m405 = presets.load_model("llama3-405b")                      # seq 8192
big = presets.load_cluster("seed").replace(gpus=16384)
plans = dse.stack([dse.Plan.make(tp=8, pp=16, mbs=1, gbs=2048, zero=3, recompute=dse.RECOMPUTE[m])
                   for m in ("selective", "full")])
r1 = dse.evaluate(m405, big, plans)
for name, i in (("selective", 0), ("full", 1)):
    x = r1[i]
    print(f"{name:>9}: memory {float(x.memory_bytes) / 1e9:6.1f} GB  step {float(x.step_s):6.2f} s  "
          f"MFU {100 * float(x.mfu):4.1f}%  bubble {100 * float(x.bubble_share):4.1f}% of the step  "
          f"{'fits' if float(x.fits) else 'DOES NOT FIT'}")
plot.plan_summary(r1, big.hbm_bytes, ["selective", "full"], title="Llama 3 405B, 16,384 accelerators, t8 p16 d128, ZeRO-3")"""),
    md("""\
With d = 128 and B = 2,048 there are m = 16 microbatches for 16 stages: the bubble
(p-1)/m = 15/16 of compute dominates either way. Full recompute cuts the activations
and adds a third of the FLOPs."""),
    md("""\
## 2. A scale-up domain of 4 with TP 8

"Set the domain to 4 with TP 8 and read the exposed communication." The same 405B plan
(selective recompute) with domains of 8 and of 4: with U = 4 the TP all-reduces leave
the domain and run at the scale-out rate (50 GB/s instead of 450 GB/s)."""),
    code("""\
domains = np.array([8.0, 4.0])
r2 = grid_evaluate(m405, big.replace(domain=domains), dse.Plan.make(tp=8, pp=16, mbs=1, gbs=2048, zero=3, recompute=1))
for U, i in zip(domains, range(2)):
    x = r2[i]
    print(f"domain {U:g}: exposed TP {float(x.exposed_s.tp):.3f} s, step {float(x.step_s):.2f} s, "
          f"MFU {100 * float(x.mfu):.1f}%, warnings {dse.warning_names(x.warnings)}")
plot.step_breakdown(r2, ["domain 8", "domain 4"], title="Llama 3 405B, t8 p16 d128: TP inside and outside the domain")"""),
    md("""\
The same question over a grid, on the seed's worked example (GPT-3 175B on 1,024
accelerators, B = 1,024): the best step time for each (domain size, TP) pair over
pipeline depth and microbatch. TP that outgrows the domain pays the 9x bandwidth gap."""),
    code("""\
gpt3 = presets.load_model("gpt3-175b")
seed = presets.load_cluster("seed")
doms = np.array([1, 2, 4, 8, 16, 32])
tps = np.array([1, 2, 4, 8, 16])
r = grid_evaluate(gpt3, seed.replace(domain=doms[:, None, None, None]),
                  dse.Plan.make(tp=tps[None, :, None, None], pp=np.array([4, 8, 16])[None, None, :, None],
                                mbs=np.array([1, 2])[None, None, None, :], gbs=1024, zero=1, recompute=1))
best, reason = plot.best_grid(r.step_s, r.feasible, r.reasons, keep=(0, 1))
plot.heatmap(best, tps, doms, x="tp", y="domain", value="step_s", reason=reason,
             title="GPT-3 175B on 1,024: best step time by domain size and TP")"""),
    md("""\
## 3. 64 experts: EP 8 inside a domain against EP 64 across domains

"With 64 experts, compare EP 8 (inside a domain of 8 when TP = 1) with EP 64." GPT-3
175B's shape with 64 experts (in seed mode each expert is half the dense FFN and a
token goes to the top 2), TP 1, PP 8, ZeRO-3, full recompute, B = 1,024 on 1,024."""),
    code("""\
moe = gpt3.replace(experts=64)
eps = np.array([8.0, 64.0])
r3 = grid_evaluate(moe, seed, dse.Plan.make(tp=1, pp=8, ep=eps, mbs=1, gbs=1024, zero=3, recompute=2))
for e, i in zip(eps, range(2)):
    x = r3[i]
    print(f"EP {e:g}: all-to-all {float(x.traffic_bytes.ep) / 1e9:.0f} GB a step on "
          f"{'scale-up' if float(x.inside_domain.ep) else 'scale-out'}, exposed EP {float(x.exposed_s.ep):.3f} s, "
          f"DP traffic {float(x.traffic_bytes.dp) / 1e9:.0f} GB (exposed {float(x.exposed_s.dp):.2f} s); "
          f"step {float(x.step_s):.2f} s, MFU {100 * float(x.mfu):.1f}%")
plot.plan_summary(r3, seed.hbm_bytes, ["EP 8", "EP 64"], title="GPT-3 175B shape with 64 experts, t1 p8, ZeRO-3, full recompute")"""),
    md("""\
EP 8 keeps the all-to-all inside the domain, but each expert's weights are then
replicated over d/e = 16 ranks and their ZeRO-3 traffic no longer hides behind the
backward pass; EP 64 puts the all-to-all on the 50 GB/s tier yet wins, because the
expert-DP traffic falls eightfold."""),
]

NOTEBOOKS = {
    "quickstart.ipynb": QUICKSTART,
    "seed_try_studies.ipynb": SEED_TRY,
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
