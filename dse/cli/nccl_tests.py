"""``dse nccl-tests LOG...``: read nccl-tests tables, busbw vs link rate, alpha-beta fit, ``--save``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dse import files
from dse.text import fmt
from dse.inputs import presets
from dse.cli import common
from dse.inputs import checks
from dse.errors import InputError
from dse.ops import nccl_tests as nt

def register(sub):
    p = sub.add_parser("nccl-tests", help="read nccl-tests output: busbw vs link rate, alpha-beta fit, --save a preset")
    p.add_argument("logs", nargs="+", metavar="LOG", help="output of any nccl-tests binary (all_reduce_perf, "
                                                          "all_gather_perf, alltoall_perf, sendrecv_perf, ...)")
    common.add_cluster_args(p)
    p.add_argument("--collective", default=None, help=f"which binary wrote the logs, when they do not say: "
                                                      f"{', '.join(nt.COLLECTIVES)}")
    p.add_argument("--ranks", default=None, help="ranks n of the run, when the log does not say (mpirun -np x -g)")
    p.add_argument("--link-GBps", dest="link_GBps", default=None,
                   help="capacity to compare busbw with, GB/s (default: the cluster's NIC capacity per node, "
                        "gpus_per_node x bw_out, for runs across nodes; bw_up for runs inside one)")
    p.add_argument("--save", default=None, metavar="PRESET",
                   help="write a cluster preset with the measured figures: a name (dse/data/clusters/NAME.toml, "
                        "then `dse plan --cluster NAME`) or a path ending in .toml")
    p.add_argument("--force", action="store_true", help="let --save overwrite an existing preset")
    p.add_argument("--json", action="store_true", help="print JSON (SI units)")
    p.set_defaults(func=run)
    return p


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"LOG: {path!r} does not exist; allowed: a readable nccl-tests output file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"LOG: {path!r} is not readable text ({exc.__class__.__name__})") from None


def _size(b: float) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= f and b % f == 0:
            return f"{b / f:g} {unit}"
    return fmt.bytes_(b)


def run(args) -> int:
    if args.collective and args.collective not in nt.COLLECTIVES:
        raise InputError(f"--collective: unknown {args.collective!r}; allowed: {', '.join(nt.COLLECTIVES)}")
    ranks = int(checks.number("--ranks", args.ranks, integer=True, minimum=2)) if args.ranks else None
    link = checks.number("--link-GBps", args.link_GBps) * 1e9 if args.link_GBps else None
    cluster = common.cluster_from_args(args)
    gpn = float(cluster.gpus_per_node)
    runs = [r for path in args.logs for r in nt.parse(_read(path), path, collective=args.collective, ranks=ranks)]
    summaries, lines = [], []
    for r in runs:
        s = nt.summarize(r)
        if link:
            cap, cap_text = link, f"{link / 1e9:g} GB/s (--link-GBps)"
        else:
            cap, tier = nt.link_capacity(s, gpn, cluster)
            name = args.cluster or "seed"
            cap_text = (f"{cap / 1e9:g} GB/s of NIC capacity a node ({gpn:g} x "
                        f"{float(cluster.bw_out_bytes_per_s) / 1e9:g} GB/s, cluster {name})" if tier == "out"
                        else f"{cap / 1e9:g} GB/s scale-up a GPU (cluster {name})")
        s["link_bytes_per_s"], s["link_share"] = cap, s["plateau"]["busbw_bytes_per_s"] / cap
        s["source"] = r.source
        s["command"] = r.command
        summaries.append(s)
        lines += _text(r, s, cap_text)
    lines += _compare(summaries)
    if args.save:
        lines.append(_save(args, summaries, gpn))
    if args.json:
        print(files.dumps({"runs": summaries}, indent=2, default=float))
        if args.save:
            print(lines[-1])
    else:
        print("\n".join(lines))
    return 0


def _text(r: nt.NcclTestsRun, s: dict, cap_text: str) -> list[str]:
    n = r.ranks
    where = f"{n} ranks" if n else "ranks unknown"
    if r.nodes:
        where += f" on {r.nodes} node{'s' if r.nodes > 1 else ''}"
    out = [f"{r.collective}_perf  {r.source}{'  [' + r.label + ']' if r.label else ''}: {where}, "
           f"{len(r.size_bytes)} size{'s' if len(r.size_bytes) > 1 else ''} {_size(r.size_bytes[0])}"
           + (f" - {_size(r.size_bytes[-1])}" if len(r.size_bytes) > 1 else "")]
    out.append(f"  {'size':>10} {'time':>11} {'algbw':>10} {'busbw':>10}" + ("   (out-of-place; in-place busbw)" if r.in_place else ""))
    for i in range(len(r.size_bytes)):
        row = (f"  {_size(r.size_bytes[i]):>10} {fmt.seconds(r.time_s[i]):>11} {r.algbw_bytes_per_s[i] / 1e9:>10.2f}"
               f" {r.busbw_bytes_per_s[i] / 1e9:>10.2f}")
        if r.in_place:
            row += f"   {r.in_place['busbw_bytes_per_s'][i] / 1e9:.2f}"
        out.append(row)
    fac = s["factor_text"]
    if r.how.startswith("columns"):
        out.append(f"  collective read from the table ({r.how[9:]})")
    z = s["zero_rows"]
    if z:
        out.append(f"  note: {z['rows']} row{'s' if z['rows'] > 1 else ''} of {_size(z['from_size_bytes'])}-"
                   f"{_size(z['to_size_bytes'])} print algbw 0.00 (two decimals): left out of the ratio and plateau, "
                   f"kept for the latency")
    if n:
        out.append(f"  algbw = size / time; busbw = algbw x {fac} = algbw x {s['factor']:.4f} for n = {n}: the bytes "
                   f"each rank moves, so busbw is what to hold against a link rate")
        if not s["factor_consistent"] and s["implied_ranks"]:
            out.append(f"  note: the printed busbw/algbw is {s['printed_ratio']:.4f}, which is {fac} for n = "
                       f"{s['implied_ranks']:.1f}, not {n}: the figures are reported as printed")
    elif s["implied_ranks"]:
        out.append(f"  algbw = size / time; busbw = algbw x {fac} (n unknown: the printed ratio implies n = "
                   f"{s['implied_ranks']:.1f})")
    else:
        out.append(f"  algbw = size / time; busbw = algbw x {fac}")
    pl = s["plateau"]
    out.append(f"  plateau busbw {pl['busbw_bytes_per_s'] / 1e9:.2f} GB/s (mean of {pl['rows']} row"
               f"{'s' if pl['rows'] > 1 else ''} within 5% of the best, from {_size(pl['from_size_bytes'])}); "
               f"algbw {pl['algbw_bytes_per_s'] / 1e9:.2f} GB/s")
    out.append(f"  against {cap_text}: {100 * s['link_share']:.1f}%")
    fit = s["fit"]
    if fit:
        step = (f" = {fit['alpha_per_step_s'] * 1e6:.3g} us a ring step over {fit['ring_steps']:g} steps"
                if "alpha_per_step_s" in fit else "")
        out.append(f"  alpha-beta fit t = alpha + size/bw: alpha {fit['alpha_s'] * 1e6:.1f} us a call{step}; "
                   f"algbw {fit['algbw_bytes_per_s'] / 1e9:.2f}, busbw {fit['busbw_bytes_per_s'] / 1e9:.2f} GB/s "
                   f"for large sizes; worst row off by {100 * fit['max_rel_error']:.1f}%")
    else:
        out.append("  alpha-beta fit: needs two sizes or more")
    lat = s["latency"]
    if lat:
        step = f" = {lat['alpha_per_step_s'] * 1e6:.3g} us a ring step" if "alpha_per_step_s" in lat else ""
        out.append(f"  latency: {lat['alpha_s'] * 1e6:.1f} us a call{step}, from the {lat['rows']} latency-bound rows "
                   f"{_size(lat['from_size_bytes'])}-{_size(lat['to_size_bytes'])}")
    return out


def _compare(summaries: list[dict]) -> list[str]:
    """Same collective and ranks, different runs: the ratio of plateaus (seed 001: 21 vs 61 GB/s)."""
    out = []
    groups = {}
    for s in summaries:
        groups.setdefault((s["collective"], s["ranks"]), []).append(s)
    for (c, n), ss in groups.items():
        if len(ss) < 2:
            continue
        bw = [x["plateau"]["busbw_bytes_per_s"] for x in ss]
        hi, lo = ss[int(np.argmax(bw))], ss[int(np.argmin(bw))]
        out.append(f"{c} over {n} ranks: {max(bw) / 1e9:.2f} GB/s{' [' + hi['label'] + ']' if hi['label'] else ''} vs "
                   f"{min(bw) / 1e9:.2f} GB/s{' [' + lo['label'] + ']' if lo['label'] else ''}: {max(bw) / min(bw):.2f}x "
                   f"from placement alone on the same hardware")
    return out


def _save(args, summaries, gpn) -> str:
    base_name = args.cluster or "seed"
    base = presets.preset_fields("clusters", base_name)
    base.update({k[2:]: v for k, v in vars(args).items() if k.startswith("c_") and v is not None})
    path, measured, notes = nt.save_preset(summaries, base, base_name, args.save, gpn, logs=args.logs, force=args.force)
    return (f"saved {path} ({', '.join(f'{k} = {v:g}' for k, v in measured.items())}); use --cluster {args.save}\n"
            + "\n".join(f"  {n}" for n in notes))
