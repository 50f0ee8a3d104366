"""Time to an answer, in one run (run by hand; never a timed test). CPU seconds, children included.

(1) the README's main job, ``dse sweep sweeps/llama3-405b-h100.toml`` (138,240 plans, calibrated,
    a Pareto front), phase by phase, in a cold process with an empty compile cache and again
    with the cache warm (a second process), on the engine ``auto`` picks (the host) and on the
    compiled XLA kernel (``--skip-xla`` leaves the latter out);
(2) end to end, child CPU seconds, cold and warm: ``dse sweep`` of the main job, of calculon's
    megatron-1T space (sweeps/megatron-1t-calculon.toml, 811,008 plans) against calculon's
    published 171 CPU-s (debug logging off) and 1,000 CPU-s (as shipped) for that space
    (issue 16), and ``dse plan`` (Llama 3 405B, TP 8 PP 16);
(3) plans/s for reduced, Pareto and full-dump sweeps at 1e6-1e8 plans on the XLA kernel
    (``--big``: also 1e9 reduced and Pareto, in seed mode on the seed's cluster and in calibrated
    mode on DGX H100, issue 16's target), and on the host engine at 1e6-1e7: the first run
    in a fresh process, and below 1e8 plans the median of four more runs of the same program
    (a loop of tens of milliseconds is noise in one run);
(4) peak RSS of each child, and the load average before and after.

    python3 benchmarks/time_to_answer.py [--big] [--skip-sizes] [--skip-xla]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB = ROOT / "sweeps" / "llama3-405b-h100.toml"
MEGATRON_1T = ROOT / "sweeps" / "megatron-1t-calculon.toml"
CALCULON_CPU_S = {"debug logging off": 171.0, "as shipped": 1000.0}   # issue 16, the same space
PLAN_ARGS = ["plan", "--preset", "llama3-405b", "--gpus", "16384", "--tp", "8", "--pp", "16", "--gbs", "2048",
             "--json"]

# the phase probe: runs in a child; wraps the kernel build, lowering, compile and the float64 rows
PHASES = r"""
import resource, sys, time, json
sys.argv[0] = "dse"   # the probe runs as the dse command does: one BLAS thread (dse/__init__.py)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
t = {}
if sys.argv[2] == "xla":
    import jax        # the host engine never imports jax (dse/backend.py)
import dse, dse.cli, dse.cli.sweep
from dse.engines import sweep as sw
from dse.engines.sweep import run as run_mod
t["import dse, the CLI (and jax on the XLA engine)"] = cpu()
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
c0 = cpu(); res = sw.run_sweep(spec, engine=sys.argv[2]); total = cpu() - c0
t["trace and lower the kernel"] = acc["lower"]
t["XLA compile"] = acc["compile"]
t["evaluating the grid (kernel or host)"] = res.cpu_s
t["float64 re-evaluation of reported rows"] = acc["rows"]
t["other (loading a cached kernel, merges)"] = total - acc["lower"] - acc["compile"] - res.cpu_s - acc["rows"]
t["total in process"] = cpu()
t["_rows"] = len(res.top) + len(res.pareto)
t["_points"] = res.points
t["_engine"] = res.engine
t["_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
print(json.dumps(t))
"""

SIZED = r"""
import resource, sys, json, time
import numpy as np
from dse.engines import sweep as sw
kind, n, engine, cluster = sys.argv[1], int(float(sys.argv[2])), sys.argv[3], sys.argv[4]
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
spec = sw.SweepSpec.make(model="llama3-405b", cluster=cluster, plan={"gbs": 2048}, axes=axes, **kw)   # its default mode
r = sw.run_sweep(spec, engine=engine)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
# below 1e8 plans a loop is tens of milliseconds: four more runs of the loaded program, their median
again = sorted(sw.run_sweep(spec, engine=engine).seconds for _ in range(4)) if r.points < 1e8 else []
median = (again[1] + again[2]) / 2 if again else r.seconds
print(json.dumps({"fidelity": spec.fidelity, "points": r.points, "seconds": r.seconds, "cpu_s": r.cpu_s, "compile_s": r.compile_s,
                  "plans_per_s": r.points_per_s, "plans_per_cpu_s": r.points / r.cpu_s, "rss_gb": rss,
                  "median_s": median, "median_plans_per_s": r.points / median}))
"""


def child(args, env, code=None):
    """(stdout, CPU seconds) of one child process (user + system, its own threads included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = ([sys.executable, "-c", code] + args if code else [sys.executable] + args if code == ""
           else [sys.executable, "-m", "dse"] + args)
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"child failed: {cmd[:3]} {args}\n{p.stderr[-3000:]}")
    return p.stdout, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def fresh_env():
    """The environment of a cold process: an empty compile cache of its own, and no bytecode of
    dse's sources. Python's default is to cache bytecode (``__pycache__``, ignored by git), as a
    user's second run reads it; this sandbox sets PYTHONDONTWRITEBYTECODE=1, which makes every
    process compile dse's sources again (0.08-0.1 CPU s of ``dse plan``). So the benchmark runs
    with Python's default: the cold run compiles dse's sources and writes their bytecode, the warm
    run reads it (numpy's and jax's bytecode, written at their install, is read by both)."""
    for d in (ROOT / "dse").rglob("__pycache__"):
        shutil.rmtree(d, ignore_errors=True)
    env = dict(os.environ, DSE_CACHE_DIR=tempfile.mkdtemp(prefix="dse-bench-cache-"), PYTHONPATH=str(ROOT))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def phases(engines):
    print("\n(1) the main job, phase by phase, CPU s (cold: an empty compile cache; warm: a second process)")
    table = {}
    for engine in engines:
        env = fresh_env()
        for run in ("cold", "warm"):
            out, cpu = child([str(MAIN_JOB), engine], env, PHASES)
            table[(engine, run)] = dict(json.loads(out.strip().splitlines()[-1]), **{"child CPU s": cpu})
    cols = list(table)
    first = table[cols[0]]
    print(f"  {'phase':<42}" + "".join(f"{t[1] + ' (' + table[t]['_engine'] + ')':>14}" for t in cols))
    for k in first:
        if not k.startswith("_"):
            print(f"  {k:<42}" + "".join(f"{table[t][k]:>14.2f}" for t in cols))
    print(f"  {'peak RSS GB':<42}" + "".join(f"{table[t]['_rss_gb']:>14.2f}" for t in cols))
    print(f"  ({first['_points']:,} plans, {first['_rows']} reported rows; 'auto' chose {first['_engine']!r})")


def end_to_end():
    print("\n(2) end to end, CPU s of the child process (each pair: an empty cache, then warm)")
    # the floors as the dse command pays them: one BLAS thread (dse/__init__.py), then as any process does
    one = {**fresh_env(), "OPENBLAS_NUM_THREADS": "1"}
    for module, what in (("numpy", "host"), ("jax", "compiled")):
        _, floor = child(["-c", f"import {module}"], one, code="")
        env = fresh_env()
        env.pop("OPENBLAS_NUM_THREADS", None)
        _, default = child(["-c", f"import {module}"], env, code="")
        print(f"  {f'import {module} alone (the floor of a {what} command)':<53}{floor:6.2f} CPU s "
              f"({default:.2f} with a BLAS thread per core)")
    got = {}
    for what, argv in (("dse sweep, the main job", ["sweep", str(MAIN_JOB), "--json", "--quiet"]),
                       ("dse sweep, calculon's megatron-1T space", ["sweep", str(MEGATRON_1T), "--json", "--quiet"]),
                       ("dse plan, Llama 3 405B TP 8 PP 16", PLAN_ARGS)):
        env = fresh_env()
        for run in ("cold", "warm"):
            out, cpu = child(argv, env)
            got[(what, run)] = cpu
            extra = ""
            if argv[0] == "sweep":
                r = json.loads(out)
                extra = f"  ({r['points']:,} plans, {r['engine']}, {r['feasible']:,} feasible)"
            print(f"  {what:<42}{run:>5}: {cpu:6.2f} CPU s{extra}")
    mine = got[("dse sweep, calculon's megatron-1T space", "cold")]
    print("  megatron-1T space against calculon's published CPU time for it: "
          + ", ".join(f"{v / mine:,.0f}x faster than calculon {k} ({v:g} CPU s)" for k, v in CALCULON_CPU_S.items()))


def sizes(big: bool):
    print("\n(3) plans/s by size (the loop only: compile and the reported rows apart; wall and CPU time)")
    cases = [(k, n, "xla", "seed") for n in (1e6, 1e7, 1e8) for k in ("reduced", "pareto")]
    cases += [("dump", 1e6, "xla", "seed"), ("dump", 1e7, "xla", "seed")]
    cases += [(k, n, "host", "seed") for n in (1e6, 1e7) for k in ("reduced", "pareto")] + [("dump", 1e6, "host", "seed")]
    if big:
        cases += [(k, 1e9, "xla", c) for c in ("seed", "dgx-h100") for k in ("reduced", "pareto")]
    for kind, n, engine, cluster in cases:
        out, cpu = child([kind, str(n), engine, cluster], fresh_env(), SIZED)
        r = json.loads(out.strip().splitlines()[-1])
        print(f"  {engine:<5}{r['fidelity']:<11}{kind:<8}{r['points']:>14,} plans  {r['seconds']:7.3f} s  {r['plans_per_s']:9.3g} plans/s  "
              f"(median of 4 more: {r['median_s']:7.3f} s, {r['median_plans_per_s']:9.3g})  "
              f"{r['plans_per_cpu_s']:9.3g} plans/CPU-s  compile {r['compile_s']:5.2f} s  child {cpu:6.2f} CPU s  "
              f"peak RSS {r['rss_gb']:.2f} GB")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", action="store_true", help="also 1e9 plans (reduced and Pareto; minutes here)")
    ap.add_argument("--skip-sizes", action="store_true", help="only the main job, the megatron-1T space and dse plan")
    ap.add_argument("--skip-xla", action="store_true", help="the main job's phases on the host engine only")
    args = ap.parse_args()
    print(f"{load()} at start")
    phases(["auto"] if args.skip_xla else ["auto", "xla"])
    end_to_end()
    if not args.skip_sizes:
        sizes(args.big)
    print(f"\n{load()} at end")


if __name__ == "__main__":
    main()
