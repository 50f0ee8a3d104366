"""Helpers more than one test module uses."""

from pathlib import Path

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


def sweep_on_both_engines(name: str, keys: tuple) -> tuple:
    """Run ``sweeps/<name>.toml`` on the compiled kernel (float32 ranking, rows re-evaluated in float64) and
    on the host engine (numpy, float64); assert they list the same plans in the same order at the same step
    times and feasible counts. Returns (feasible, [(point keys, step_s)] in order, {point keys: step_s})."""
    import dse.engines.sweep as sw
    from dse.engines.sweep.spec import load_spec

    spec = load_spec(SWEEPS / f"{name}.toml")
    a, b = sw.run_sweep(spec, engine="xla"), sw.run_sweep(spec, engine="host")
    rows = lambda r: [(tuple(t["point"][k] for k in keys), round(t["step_s"], 9)) for t in r.top]   # noqa: E731
    assert rows(a) == rows(b) and a.feasible == b.feasible
    return b.feasible, rows(b), dict(rows(b))
