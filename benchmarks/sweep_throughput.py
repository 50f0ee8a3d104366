"""Sweep throughput, in one run (run by hand; never a timed test).

(a) the reduced sweep (counts per reason, top-K) over about 1e9 plans (--quick: 2.5e7);
(b) the same ``evaluate`` called per plan from Python (jitted, one plan a call) on a sample;
(c) keeping every output (the full dump) for 1e7 plans (--quick: 1e6);
(d) the seed's study, sweeps/llama3-405b-16k.toml (1.7e6 plans, with a Pareto front), on both engines;
plus compile times and each phase's peak resident memory (VmHWM, reset before (c) and (d)). Targets on a 2-core CPU: (a) >= 3e8 plans/s,
(a)/(b) >= 1,000, compile <= 2 s, peak RSS <= 1.5 GB, 1e9 plans in < 10 s.

    python3 benchmarks/sweep_throughput.py [--quick] [--chunk N]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dse import evaluate  # noqa: E402
from dse.engines import sweep as sw  # noqa: E402

# Llama 3 405B: the main job's plan axes x cluster size x scale-out x scale-up bandwidth.
PLAN_AXES = {
    "tp": [1, 2, 4, 8, 16, 32], "pp": [1, 2, 4, 8, 16, 32, 64, 128], "cp": [1, 2, 4, 8, 16],
    "vpp": [1, 2, 3, 4, 6, 8], "mbs": [1, 2, 4, 8], "gbs": [512, 1024, 2048, 4096, 8192, 16384],
    "zero": [0, 1, 2, 3], "recompute": ["none", "selective", "full"], "sp": [0, 1], "domain": [8, 16, 32, 64, 72],
}
BIG_AXES = {"gpus": [2048, 4096, 8192, 16384, 32768, 65536], "bw_out_GBps": [12.5, 25, 50, 100, 200],
            "bw_up_GBps": [150, 300, 450, 600, 900, 1200, 1800, 3600]}


def rss_gb() -> float:
    """Peak resident memory since the last ``reset_peak()`` (VmHWM), else of the whole process."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1e6                   # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6   # kB on Linux


_PEAKS: list = []


def reset_peak() -> None:
    """Start a phase's peak at the memory now held (Linux: writing 5 to clear_refs resets VmHWM,
    and with it ru_maxrss), so each phase reports its own peak, not the largest of the phases
    before it; ``_PEAKS`` keeps the phases' peaks for the whole run's."""
    _PEAKS.append(rss_gb())
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def spec_for(axes, **kw):
    return sw.SweepSpec.make(model="llama3-405b", cluster="seed", plan={"gbs": 2048}, axes=axes, **kw)


def per_plan_rate(spec, sample: int) -> float:
    """(b): one jitted ``evaluate`` call per plan from a Python loop, float32 like the sweep."""
    rng = np.random.default_rng(0)
    index = rng.integers(0, spec.points, sample)
    ev = jax.jit(evaluate, static_argnums=3)
    coords = np.unravel_index(index, spec.sizes)

    def one(i):
        arrays = {a.name: np.float32(a.values[c[i]]) for a, c in zip(spec.axes, coords)}
        model, cluster, plan = sw._inputs(spec, arrays, jnp.float32)
        return ev(model, cluster, plan, "seed").step_s

    with jax.enable_x64(False):
        jax.block_until_ready(one(0))                       # compile outside the timing
        t = time.perf_counter()
        for i in range(sample):
            out = one(i)
        jax.block_until_ready(out)
        return sample / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2.5e7 plans for (a), 1e6 for (c)")
    ap.add_argument("--chunk", type=int, default=None, help="points per device per step (default: sw.default_chunk)")
    args = ap.parse_args()
    print(f"devices: {jax.devices()}  chunk {args.chunk or sw.DEFAULT_CHUNK:,} ({sw.DUMP_CHUNK:,} with a dump)")

    axes = dict(PLAN_AXES, **({"gpus": BIG_AXES["gpus"]} if args.quick else BIG_AXES))
    spec = spec_for(axes, top_k=10)
    r = sw.run_sweep(spec, chunk_points=args.chunk, engine="xla")
    cpu = r.cpu_s
    rate_a = r.points / r.seconds
    rss_a = rss_gb()
    print(f"(a) reduced sweep: {r.points:,} plans in {r.seconds:.2f} s = {rate_a:.3g} plans/s"
          f"  (compile {r.compile_s:.2f} s, {r.chunks} chunks, {r.feasible:,} feasible)  peak RSS {rss_a:.2f} GB")
    print(f"    CPU time of this process: about {cpu:.2f} s = {r.points / cpu:.3g} plans per CPU-second"
          f" (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: other processes share them)")
    print(f"    best: {r.best['point']}  step {r.best['step_s']:.4f} s  MFU {100 * r.best['mfu']:.1f}%")
    if not args.quick:
        print(f"    1e9 plans would take {1e9 / rate_a:.1f} s")

    rate_b = per_plan_rate(spec, 500 if args.quick else 2000)
    print(f"(b) per plan from Python: {rate_b:.3g} plans/s; (a)/(b) = {rate_a / rate_b:,.0f}x")

    dump_axes = {k: v for k, v in PLAN_AXES.items() if k != "domain"}
    dump_axes["gpus"] = [1024 * 2 ** i for i in range(2 if args.quick else 12)]
    spec_c = spec_for(dump_axes, dump=True)
    reset_peak()
    r = sw.run_sweep(spec_c, chunk_points=args.chunk, engine="xla")
    print(f"(c) every output kept: {r.points:,} plans in {r.seconds:.2f} s = {r.points / r.seconds:.3g} plans/s"
          f" ({r.points / r.cpu_s:.3g} per CPU-second)"
          f"  (compile {r.compile_s:.2f} s; {sum(v.nbytes for v in r.dump.values()) / 1e9:.2f} GB of columns)"
          f"  peak RSS of this phase {rss_gb():.2f} GB")
    del r

    spec_d = sw.load_spec(ROOT / "sweeps" / "llama3-405b-16k.toml")
    reset_peak()
    for engine in ("xla", "host"):
        r = sw.run_sweep(spec_d, chunk_points=args.chunk, engine=engine)
        print(f"(d) main job with a Pareto front ({engine}): {r.points:,} plans in {r.seconds:.2f} s = "
              f"{r.points / r.seconds:.3g} plans/s ({r.points / r.cpu_s:.3g} per CPU-second)"
              f"  (compile {r.compile_s:.2f} s, front {len(r.pareto)})")
    print(f"peak RSS of (d) {rss_gb():.2f} GB; of the whole run {max(_PEAKS + [rss_gb()]):.2f} GB")


if __name__ == "__main__":
    main()
