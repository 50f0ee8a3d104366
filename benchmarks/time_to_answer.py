"""Time to an answer, in one run (run by hand; never a timed test). CPU seconds, children included.

(1) the README's main job, ``dse sweep sweeps/llama3-405b-16k.toml``, phase by phase, in a cold
    process with an empty compile cache and again with the cache warm (a second process);
(2) ``dse sweep`` (the main job) and ``dse plan`` (Llama 3 405B, TP 8 PP 16) end to end, cold and warm;
(3) plans/s for reduced, Pareto and full-dump sweeps at 1e6-1e8 points (1e9 with --big);
(4) peak RSS of each child.
calculon's megatron-1T search space (811,008 plans; calculon: 171 CPU-s with debug logging off,
1,000 CPU-s as shipped, issue 16) is not reproduced here: its axes are not defined in this repo.

    python3 benchmarks/time_to_answer.py [--big] [--skip-sizes]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB = ROOT / "sweeps" / "llama3-405b-16k.toml"
PLAN_ARGS = ["plan", "--preset", "llama3-405b", "--gpus", "16384", "--tp", "8", "--pp", "16", "--gbs", "2048",
             "--json"]

# the phase probe: runs in a child; wraps the kernel build, lowering, compile and the float64 rows
PHASES = r"""
import resource, sys, time, json
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
t = {}
import jax, dse, dse.cli, dse.cli.sweep
from dse.engines import sweep as sw
from dse.engines.sweep import run as run_mod
t["import jax, dse, the CLI"] = cpu()
c0 = cpu(); spec = sw.load_spec(sys.argv[1]); t["spec parsing"] = cpu() - c0
acc = {"lower": 0.0, "compile": 0.0, "rows": 0.0}
class Lowered:
    def __init__(s, lo): s.lo = lo
    def compile(s, *a, **k):
        c = cpu(); r = s.lo.compile(*a, **k); acc["compile"] += cpu() - c; return r
class Kernel:
    def __init__(s, k): s.k = k
    def lower(s, *a, **k):
        c = cpu(); r = Lowered(s.k.lower(*a, **k)); acc["lower"] += cpu() - c; return r
    def __call__(s, *a, **k): return s.k(*a, **k)
bk = run_mod._build_kernel
def build(*a, **k):
    c = cpu(); r = Kernel(bk(*a, **k)); acc["lower"] += cpu() - c; return r
run_mod._build_kernel = build
rows = run_mod._rows
def timed_rows(*a, **k):
    c = cpu(); r = rows(*a, **k); acc["rows"] += cpu() - c; return r
run_mod._rows = timed_rows
c0 = cpu(); res = sw.run_sweep(spec); total = cpu() - c0
t["building the kernel, trace and lower"] = acc["lower"]
t["XLA compile"] = acc["compile"]
t["the kernel itself"] = res.cpu_s
t["float64 re-evaluation of reported rows"] = acc["rows"]
t["other (loading cached kernels, merges)"] = total - acc["lower"] - acc["compile"] - res.cpu_s - acc["rows"]
t["total in process"] = cpu()
t["_rows"] = len(res.top) + len(res.pareto)
t["_points"] = res.points
print(json.dumps(t))
"""

SIZED = r"""
import resource, sys, json, time
import numpy as np
from dse.engines import sweep as sw
kind, n = sys.argv[1], int(float(sys.argv[2]))
axes = {"tp": [1, 2, 4, 8, 16, 32], "pp": [1, 2, 4, 8, 16, 32, 64, 128], "cp": [1, 2, 4, 8, 16],
        "vpp": [1, 2, 3, 4, 6, 8], "mbs": [1, 2, 4, 8], "zero": [0, 1, 2, 3],
        "recompute": ["none", "selective", "full"], "sp": [0, 1]}      # 138,240 plans
extra = [("domain", [4, 8, 16, 32, 64, 72, 128, 256]), ("bw_up_GBps", [150, 300, 450, 600, 900, 1200, 1800, 3600]),
         ("gpus", [2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]),
         ("bw_out_GBps", [12.5, 25, 50, 100, 200, 400, 800, 1600]), ("alpha_out_us", [1, 2, 4, 8])]
pts = 138240
for name, vals in extra:
    if pts >= n:
        break
    k = min(len(vals), max(1, round(n / pts)))
    axes[name] = vals[:k]
    pts *= k
kw = {"pareto": ["step_s", "memory_bytes"]} if kind == "pareto" else {"dump": True} if kind == "dump" else {}
spec = sw.SweepSpec.make(model="llama3-405b", cluster="seed", plan={"gbs": 2048}, axes=axes, **kw)
r = sw.run_sweep(spec)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
print(json.dumps({"points": r.points, "seconds": r.seconds, "cpu_s": r.cpu_s, "compile_s": r.compile_s,
                  "plans_per_s": r.points_per_s, "plans_per_cpu_s": r.points / r.cpu_s, "rss_gb": rss}))
"""


def child(args, env, code=None):
    """(stdout, CPU seconds, peak RSS GB) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-c", code] + args if code else [sys.executable, "-m", "dse"] + args
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"child failed: {cmd[:3]} {args}\n{p.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p.stdout, cpu, after.ru_maxrss / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", action="store_true", help="also 1e9 plans (reduced and Pareto; long here)")
    ap.add_argument("--skip-sizes", action="store_true", help="only the main job and dse plan")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    cache = tempfile.mkdtemp(prefix="dse-bench-cache-")
    env = dict(os.environ, DSE_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    print("\n(1) main job phases, CPU s (cold: empty compile cache; warm: a second process)")
    print(f"  {'phase':<42}{'cold':>9}{'warm':>9}")
    table = {}
    for run in ("cold", "warm"):
        out, cpu, rss = child([str(MAIN_JOB)], env, PHASES)
        table[run] = dict(json.loads(out.strip().splitlines()[-1]), **{"child CPU s": cpu, "peak RSS GB": rss})
    for k in table["cold"]:
        if not k.startswith("_"):
            print(f"  {k:<42}{table['cold'][k]:>9.2f}{table['warm'][k]:>9.2f}")
    print(f"  ({table['cold']['_points']:,} plans, {table['cold']['_rows']} reported rows)")
    print("\n(2) end to end, CPU s of the child process (each pair: a fresh cache, then warm)")
    for what, argv in (("dse sweep, the main job", ["sweep", str(MAIN_JOB), "--json", "--quiet"]),
                       ("dse plan, Llama 3 405B TP 8 PP 16", PLAN_ARGS)):
        fresh = dict(env, DSE_CACHE_DIR=tempfile.mkdtemp(prefix="dse-bench-cache-"))   # cold: an empty cache
        for run in ("cold", "warm"):
            _, cpu, _ = child(argv, fresh)
            print(f"  end to end `{what}` ({run}): {cpu:.2f} CPU s")
    if not args.skip_sizes:
        print("\n(3) plans/s by size (each size its own program, compiled once; plans/s of wall and of CPU time; loop only)")
        cases = [(k, n) for n in (1e6, 1e7, 1e8) for k in ("reduced", "pareto")] + [("dump", 1e6), ("dump", 1e7)]
        if args.big:
            cases += [("reduced", 1e9), ("pareto", 1e9)]
        for kind, n in cases:
            out, cpu, rss = child([kind, str(n)], env, SIZED)
            r = json.loads(out.strip().splitlines()[-1])
            print(f"  {kind:<8}{r['points']:>14,} plans  {r['seconds']:7.2f} s  {r['plans_per_s']:9.3g} plans/s  "
                  f"{r['plans_per_cpu_s']:9.3g} plans/CPU-s  compile {r['compile_s']:5.2f} s  child {cpu:6.2f} CPU s  "
                  f"RSS {r['rss_gb']:.2f} GB")
    print(f"\nload average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
