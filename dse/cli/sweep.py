"""``dse sweep FILE``: every plan of a sweep file, reduced on the device; a table or ``--json``."""

from __future__ import annotations

import sys
import time

from dse.text import fmt
from dse.cli import common
from dse.errors import InputError
from dse.report import REASONS
from dse import files
from dse.engines.sweep import load_spec, run_sweep
from dse.engines.sweep.spec import confirm_size


def register(sub):
    p = sub.add_parser("sweep", help="evaluate every plan of a sweep file (TOML) and keep the best")
    p.add_argument("file", help="sweep file, e.g. sweeps/llama3-405b-16k.toml")
    p.add_argument("--json", action="store_true",
                   help="print points, feasible, seconds, points_per_s, best, top, pareto, infeasible_by_reason")
    p.add_argument("--out", default=None, help="directory for state.json (saved as it runs), top.csv, pareto.csv, dump.csv")
    p.add_argument("--resume", action="store_true", help="continue the sweep saved in --out")
    p.add_argument("--chunk", default=None, help="points per device per step (memory bound; default 4194304)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--yes", action="store_true", help="start a sweep estimated above ten minutes (or set max_points in the file)")
    common.add_plot_dir_args(p, "infeasibility counts, top plans, Pareto front, heatmap (with dump)")
    p.set_defaults(func=run)
    return p


class Progress:
    """A one-line bar on stderr: points done, plans/s, ETA (redrawn at most 10 times a second)."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.last = 0.0

    def __call__(self, done, total, seconds):
        now = time.monotonic()
        if now - self.last < 0.1 and done < total:
            return
        self.last = now
        rate = done / seconds if seconds > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else float("inf")
        width = 30
        full = int(width * done / total) if total else width
        self.stream.write(f"\r[{'#' * full}{'.' * (width - full)}] {done:,}/{total:,} plans"
                          f"  {rate:.3g} plans/s  ETA {eta:.0f} s ")
        self.stream.flush()

    def close(self):
        if self.last:
            self.stream.write("\n")
            self.stream.flush()


def _chunk(value) -> int:
    if value is None:
        return None
    try:
        n = int(value)
    except (ValueError, OverflowError):
        raise InputError(f"--chunk: {value!r} is not an integer; allowed: an integer >= 1") from None
    if n < 1:
        raise InputError(f"--chunk: {value!r} is not allowed; allowed: an integer >= 1")
    return n


def run(args) -> int:
    if args.plot is not None:
        from dse import plot  # matplotlib only when figures are asked for

        if f".{args.plot_format}" not in plot.FORMATS:
            raise InputError(f"--plot-format: {args.plot_format!r} is not allowed; allowed: png, svg")
        files.check_out_dir(args.plot, "--plot")
    spec = load_spec(args.file)
    chunk = _chunk(args.chunk)
    confirm_size(spec, args.yes)
    if args.out is not None:
        files.check_out_dir(args.out, "--out")
    bar = Progress() if (not args.quiet and sys.stderr.isatty()) else None
    kwargs = {} if chunk is None else {"chunk_points": chunk}
    try:
        result = run_sweep(spec, out_dir=args.out, resume=args.resume, progress=bar, **kwargs)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(files.dumps(result.to_json(), "sweep result", indent=1))
    else:
        print(text(result))
    if args.plot is not None:
        for name, fig in plot.sweep_figures(result).items():
            plot.save(fig, f"{args.plot}/{name}.{args.plot_format}")
    return 0


def _cell(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def text(result) -> str:
    """The table of top plans, the Pareto front and the infeasibility counts."""
    spec = result.spec
    lines = []
    axes = " x ".join(f"{a.name}({len(a)})" for a in spec.axes)
    lines.append(f"sweep {spec.name or '-'}: {result.points:,} plans = {axes}")
    lines.append(f"{result.feasible:,} feasible; {result.seconds:.2f} s on {result.devices} device(s), "
                 f"{result.points_per_s:.3g} plans/s (compile {result.compile_s:.2f} s)")
    direction = "maximize" if spec.maximize else "minimize"
    if result.top:
        lines.append("")
        lines.append(f"top {len(result.top)} by {spec.objective} ({direction}), re-evaluated in float64:")
        lines += _table(spec, result.top)
    else:
        lines.append("")
        lines.append(f"no feasible plan among {result.points:,}; why they fail (a plan can fail several ways):")
    if result.pareto:
        lines.append("")
        lines.append(f"Pareto front over {', '.join(spec.pareto)} ({len(result.pareto)} plans):")
        lines += _table(spec, result.pareto)
    infeasible = result.points - result.feasible
    if infeasible:
        if result.top:
            lines.append("")
            lines.append(f"infeasible: {infeasible:,} plans (a plan can fail several ways):")
        msg = dict(REASONS)
        for name, count in result.infeasible_by_reason.items():
            if count:
                lines.append(f"  {name:<28}{count:>14,}  {100 * count / result.points:5.1f}%  {msg[name]}")
    return "\n".join(lines)


def _table(spec, rows) -> list[str]:
    names = [a.name for a in spec.axes]
    head = ["#"] + names + ["step", "MFU", "tokens/s", "memory", "warnings"]
    body = []
    for i, r in enumerate(rows, 1):
        body.append([str(i)] + [_cell(r["point"][n]) for n in names]
                    + [fmt.seconds(r["step_s"]), f"{100 * r['mfu']:.1f}%", f"{r['tokens_per_s']:,.0f}",
                       fmt.bytes_(r["memory_bytes"]["total"]), ",".join(r["warnings"]) or "-"])
    widths = [max(len(h), *(len(b[j]) for b in body)) for j, h in enumerate(head)]
    fmt_row = lambda cells: "  ".join(c.rjust(w) if j < len(head) - 1 else c  # noqa: E731
                                      for j, (c, w) in enumerate(zip(cells, widths)))
    return [fmt_row(head)] + [fmt_row(b) for b in body]
