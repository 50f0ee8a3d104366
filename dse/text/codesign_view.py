"""Co-design results as text and JSON (``dse codesign``, notebooks)."""

from __future__ import annotations

from dse.engines import codesign as cd
from dse.inputs.units import PRESET_UNITS
from dse.text import fmt

__all__ = ["case_text", "case_json", "CATEGORY_NAMES"]

CATEGORY_NAMES = {name: {v: k for k, v in table.items()} for name, table in cd.CATEGORICAL_VARS.items()}
# display units of the free variables written in preset units (dse/inputs/units.py)
UNITS = {k: u for k, (_, _, u) in PRESET_UNITS.items() if u not in ("", "count", "accelerators", "ratio")}



def _found_json(f: cd.Found | None):
    if f is None:
        return None
    cats = {k: CATEGORY_NAMES[k][v] for k, v in f.categorical.items()}
    return {"values": f.values, "categorical": cats, "objective": f.objective, "cost_usd": f.cost_usd,
            "layers": float(f.model.layers), "report": f.report.to_json()}


def case_json(c: cd.Case) -> dict:
    return {"model": c.model, "cluster": c.cluster, "objective": c.objective, "budget_usd": c.budget_usd,
            "gradient": _found_json(c.gradient), "converged": c.converged,
            "starts_converged": c.starts_converged, "relaxed_loss": c.relaxed_loss,
            "evaluations": c.evaluations, "seconds": c.seconds, "space_size": c.space_size,
            "exhaustive": _found_json(c.exhaustive), "exhaustive_evaluations": c.exhaustive_evaluations,
            "exhaustive_seconds": c.exhaustive_seconds, "gap": c.gap}


def _objective_text(kind, v):
    if kind == "time_to_train":
        return f"time to train {v / 86400:.2f} days"
    if kind == "step_time":
        return f"step {fmt.seconds(v)}"
    return f"step x cost^w {v:.4g}"


def _point_text(f: cd.Found, kind) -> str:
    parts = []
    for k, v in f.values.items():
        parts.append(f"{k}={v:.5g}{' ' + UNITS[k] if k in UNITS else ''}")
    for k, v in f.categorical.items():
        parts.append(f"{k}={CATEGORY_NAMES[k][v]}")
    r = f.report
    extra = (f"  layers={float(f.model.layers):g}" if "hidden" in f.values else "")
    if "bw_up_GBps" in f.values and "bw_out_GBps" in f.values:
        extra += f"  scale-up:scale-out {f.values['bw_up_GBps'] / f.values['bw_out_GBps']:.1f}:1"
    head = "" if kind == "step_time" else f"{_objective_text(kind, f.objective)}; "
    return (", ".join(parts) + extra + f"\n      {head}step {fmt.seconds(float(r.step_s))}"
            f", MFU {100 * float(r.mfu):.1f}%, memory {fmt.bytes_(float(r.memory_bytes))}"
            + (f", cost ${f.cost_usd / 1e6:,.2f}M" if f.cost_usd else ""))


def case_text(c: cd.Case) -> str:
    budget = f"  budget ${c.budget_usd / 1e6:,.2f}M" if c.budget_usd else ""
    lines = [f"{c.model} on {c.cluster}  objective {c.objective}{budget}  space {c.space_size:,} points"]
    if c.gradient is None:
        lines.append("  gradient:   no feasible point found after snapping")
    else:
        lines.append(f"  gradient:   {_point_text(c.gradient, c.objective)}")
    lines.append(f"      {c.evaluations:,} evaluations, {c.seconds:.2f} s; "
                 + ("converged" if c.converged else "DID NOT CONVERGE (best start still moving; raise search.steps or lr)")
                 + f" ({c.starts_converged} starts converged)")
    if c.exhaustive is not None:
        lines.append(f"  exhaustive: {_point_text(c.exhaustive, c.objective)}")
        lines.append(f"      {c.exhaustive_evaluations:,} evaluations, {c.exhaustive_seconds:.2f} s")
        if c.gap is not None:
            lines.append(f"  gap {100 * c.gap:+.3f}%   evaluations {100 * c.evaluations / c.exhaustive_evaluations:.2f}% of exhaustive")
    elif c.exhaustive_evaluations == 0 and c.space_size:
        lines.append("  exhaustive: not run (space over search.exhaustive_max, or --no-exhaustive)")
    return "\n".join(lines)
