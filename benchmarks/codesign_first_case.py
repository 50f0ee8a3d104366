"""Where the first co-design case's time goes, against the exhaustive search of the same case.

    PYTHONPATH=$PWD python3 benchmarks/codesign_first_case.py sweeps/codesign_ratio_dense.toml

Runs the first (model, cluster, budget) case of a spec in a fresh process with every on-disk
cache off: the optimizer's trace + lowering and its XLA compile, the optimizer's run, the
rest of the gradient path (snap, polish, the reported design: the exact program's compile and
runs), then the exhaustive search cold (its own program) and warm. Prints CPU seconds (this
process, user + system) and wall seconds with the load average: on a shared machine the CPU
seconds are the comparable figure.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import sys
import time

os.environ["DSE_CACHE_DIR"] = "off"


def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Clock:
    def __init__(self, label):
        self.label = label

    def __enter__(self):
        self.c, self.w = _cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        print(f"{self.label:<44s} cpu {_cpu() - self.c:7.2f} s   wall {time.perf_counter() - self.w:7.2f} s   "
              f"load {os.getloadavg()[0]:.1f}", flush=True)


def main(path):
    import jax
    import numpy as np

    from dse.cli import common

    common.enable_x64()
    from dse.engines import codesign as cd
    from dse.engines.codesign import discrete, search
    from dse.engines.codesign.compiled import anneal_steps
    from dse.engines.compiled import compile_lowered

    spec = cd.load_spec(path)
    (lm, m), (lc, c) = spec.models[0], spec.clusters[0]
    sb = dataclasses.replace(spec, budget_usd=spec.budgets[0])
    fn = cd.compiled(sb)
    S, T = sb.starts, sb.steps
    k0, k1 = sb.sharpness
    ks = k0 * (k1 / k0) ** np.minimum(np.arange(T) / max(anneal_steps(T) - 1, 1), 1.0)
    args = (m, c, np.asarray(float(sb.budget_usd)), np.asarray(float(sb.lr)), np.asarray(sb.seed),
            np.asarray(fn.combos[np.arange(S) % len(fn.combos)]), ks, k0 / ks)
    print(f"{path}: first case {lm} on {lc}, {S} starts x {T} steps x {len(fn.combos)} options, "
          f"space {search.space_size(sb):,} points")
    with _Clock("optimizer: trace + lower"):
        lowered = fn.run_all.lower(*args)          # as dse codesign builds it (on the CPU, with its options)
    with _Clock("optimizer: XLA compile (OPTIMIZER_OPTIONS)"):
        exe = compile_lowered(lowered, fn.run_all.compile_options())
    with _Clock("optimizer: run"):
        jax.block_until_ready(exe(*args))
    with _Clock("gradient path, whole case (its trace and compile reused)"):
        case = search.run_case(sb, lm, m, lc, c, exhaustive_search=False)
    with _Clock("gradient path, whole case, warm"):
        search.run_case(sb, lm, m, lc, c, exhaustive_search=False)
    with _Clock("exhaustive search, cold (its own program)"):
        _, _, best, n = discrete.exhaustive(sb, m, c)
    with _Clock("exhaustive search, warm"):
        discrete.exhaustive(sb, m, c)
    print(f"gradient {case.gradient.objective:.6g} at {case.evaluations:,} evaluations; "
          f"exhaustive {best:.6g} at {n:,}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sweeps/codesign_ratio_dense.toml")
