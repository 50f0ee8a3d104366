"""Regenerate the README gallery: ``python3 notebooks/make_gallery.py`` writes docs/gallery/*.png.

Every figure is ``dse.evaluate`` on a broadcast grid drawn by ``dse.plot``; nothing
here holds a number of its own beyond the inputs. The grids are concrete inputs, so they
run in numpy float64 (dse/backend.py) and jax is never imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import dse  # noqa: E402
from dse import plot  # noqa: E402
from dse.inputs import presets  # noqa: E402

OUT = ROOT / "docs" / "gallery"


def _flat(a, shape):
    return np.broadcast_to(np.asarray(a), shape).ravel()


def plan_breakdown():
    """The seed's worked example, GPT-3 175B on 1,024, under the three recompute modes."""
    model, cluster = presets.load_model("gpt3-175b"), presets.load_cluster("seed")
    modes = ["none", "selective", "full"]
    plans = dse.stack([dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024, zero=1, recompute=dse.RECOMPUTE[m]) for m in modes])
    r = dse.evaluate(model, cluster, plans)
    return plot.plan_summary(r, cluster.hbm_bytes, [f"recompute\n{m}" for m in modes],
                             title="GPT-3 175B on 1,024 accelerators, t8 p8 d16 (the seed's worked example)")


def domain_tp_heatmap():
    """Best step time by scale-up domain size and TP (over PP and microbatch)."""
    model, cluster = presets.load_model("gpt3-175b"), presets.load_cluster("seed")
    doms, tps = np.array([1, 2, 4, 8, 16, 32]), np.array([1, 2, 4, 8, 16])
    r = dse.evaluate(model, cluster.replace(domain=doms[:, None, None, None]),
                      dse.Plan.make(tp=tps[None, :, None, None], pp=np.array([4, 8, 16])[None, None, :, None],
                                    mbs=np.array([1, 2])[None, None, None, :], gbs=1024, zero=1, recompute=1))
    best, reason = plot.best_grid(r.step_s, r.feasible, r.reasons, keep=(0, 1))
    return plot.heatmap(best, tps, doms, x="tp", y="domain", value="step_s", reason=reason,
                        title="GPT-3 175B on 1,024: best step time by domain size and TP")


def scaling_pareto():
    """Llama 3 405B at B = 2,048: step time against accelerator count, every plan."""
    model, cluster = presets.load_model("llama3-405b"), presets.load_cluster("seed")
    gpus = np.array([2048, 4096, 8192, 16384])[:, None, None, None, None]
    tp = np.array([4, 8, 16])[None, :, None, None, None]
    pp = np.array([4, 8, 16])[None, None, :, None, None]
    zero = np.array([1, 3])[None, None, None, :, None]
    rc = np.array([1, 2])[None, None, None, None, :]
    plan = dse.Plan.make(tp=tp, pp=pp, mbs=1, gbs=2048, zero=zero, recompute=rc)
    r = dse.evaluate(model, cluster.replace(gpus=gpus), plan)
    shape = np.shape(r.step_s)
    labels = plot.plan_labels(dse.Plan.make(tp=_flat(tp, shape), pp=_flat(pp, shape), mbs=1, gbs=2048,
                                            zero=_flat(zero, shape)),
                              dp=_flat(r.dp, shape), gpus=_flat(gpus, shape))
    data = {"step_s": _flat(r.step_s, shape), "gpus": _flat(gpus, shape), "feasible": _flat(r.feasible, shape),
            "plan": labels}
    return plot.pareto(data, x="step_s", y="gpus", label="plan",
                       title="Llama 3 405B, B = 2,048 x 8,192 tokens: fewer accelerators or a shorter step")


FIGURES = {"plan_breakdown.png": plan_breakdown, "domain_tp_heatmap.png": domain_tp_heatmap,
           "scaling_pareto.png": scaling_pareto}


def main(out: Path = OUT) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in FIGURES.items():
        fig = make()
        fig.savefig(out / name, dpi=100, bbox_inches="tight", metadata={"Software": None})
        paths.append(out / name)
    return paths


if __name__ == "__main__":
    for path in main():
        print(f"{path}: {path.stat().st_size / 1e3:.0f} kB")
