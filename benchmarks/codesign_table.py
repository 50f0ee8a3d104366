"""Summarizes benchmarks/codesign_table.sh's output folder: one line a study (the README's co-design table).

    python3 benchmarks/codesign_table.py OUTDIR

Per study: the gap to the exhaustive optimum of each case, the gradient path's evaluations as a share
of the exhaustive search's, the first case's wall seconds (gradient / exhaustive, and the baseline's
where it ran) cold and warm, the later cases' range warm, and how many cases converged.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STUDIES = ("ratio_dense pareto_cost ratio_moe torus shape ratio_dense_cost_per_token ratio_moe_cost_per_token "
           "many_knobs_coarse many_knobs").split()


def first(case):
    """'gradient / exhaustive' wall seconds (the exhaustive search where it ran, the baseline where it ran)."""
    base = f" (baseline {case['baseline_seconds']:.2f})" if case.get("baseline_evaluations") else ""
    if case.get("exhaustive_evaluations"):
        return f"{case['seconds']:.2f} / {case['exhaustive_seconds']:.2f}{base}"
    return f"{case['seconds']:.2f}{base}"


def main(folder):
    d = Path(folder)
    for f in STUDIES:
        try:
            cold, warm = (json.loads((d / f"{f}_{run}.json").read_text())["cases"] for run in ("cold", "warm"))
        except (OSError, ValueError, KeyError):
            print(f"{f}: missing (see {f}_cold.err)")
            continue
        load = (d / f"{f}_cold.load").read_text().split("load average:")[-1].strip()
        gaps = ", ".join("-" if c["gap"] is None else f"{100 * c['gap']:.2f}%" for c in cold)
        base = [c for c in cold if c.get("baseline_evaluations")]
        if base:
            gaps += "; against the baseline " + ", ".join(
                f"{100 * c['baseline_gap']:+.2f}% at {c['evaluations']:,} vs {c['baseline_evaluations']:,} evaluations"
                for c in base)
        share = [100 * c["evaluations"] / c["exhaustive_evaluations"] for c in cold if c.get("exhaustive_evaluations")]
        evals = f"{min(share):.2f}-{max(share):.2f}% of exhaustive" if share else \
            f"{', '.join(str(c['evaluations']) for c in cold)} evaluations"
        later = "-"
        if len(warm) > 1:
            g = [c["seconds"] for c in warm[1:]]
            e = [c["exhaustive_seconds"] for c in warm[1:] if c.get("exhaustive_evaluations")]
            later = f"{min(g):.2f}-{max(g):.2f}" + (f" / {min(e):.2f}-{max(e):.2f}" if e else "")
        conv = sum(1 for c in cold if c["converged"])
        print(f"{f}: gap {gaps}; {evals}; first case cold {first(cold[0])}, warm {first(warm[0])}; "
              f"later warm {later}; converged {conv} of {len(cold)}; load {load}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
