"""``dse sweep FILE``: every plan of a sweep file, reduced on the device; a table or ``--json``."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from dse.text import fmt
from dse.cli import common
from dse.errors import InputError
from dse.inputs import checks, stacks
from dse.report import REASONS
from dse import files
from dse.engines.sweep import load_spec, run_sweep
from dse.engines.sweep.spec import DEFAULT_CHUNK, DUMP_CHUNK, confirm_size


def register(sub):
    p = sub.add_parser("sweep", help="evaluate every plan of a sweep file (TOML) and keep the best")
    p.add_argument("file", help="sweep file, e.g. sweeps/llama3-405b-16k.toml")
    p.add_argument("--json", action="store_true",
                   help="print points, feasible, seconds, points_per_s, best, top, pareto, infeasible_by_reason")
    p.add_argument("--out", default=None, help="directory for state.json (saved as it runs), top.csv, pareto.csv, dump.csv")
    p.add_argument("--resume", action="store_true", help="continue the sweep saved in --out")
    p.add_argument("--chunk", default=None, help=f"points per device per step (memory bound; default {DEFAULT_CHUNK}, {DUMP_CHUNK} with a full dump)")
    p.add_argument("--engine", default="auto",
                   help="auto|host|xla: numpy on this CPU (float64, no compile) or the compiled kernel on every "
                        "device (default auto: the host up to 8.4 million plans)")
    p.add_argument("--quiet", action="store_true", help="no progress (bar on a terminal, status lines otherwise)")
    p.add_argument("--progress-every", default="10", help="seconds between status lines when stderr is no terminal")
    p.add_argument("--yes", action="store_true", help="start a sweep estimated above ten minutes (or set max_points in the file)")
    common.add_plot_dir_args(p, "infeasibility counts, top plans, Pareto front, heatmap (with dump)")
    g = p.add_argument_group("several processes (jax.distributed; dse/engines/sweep/multihost.py)")
    g.add_argument("--coordinator", default=None, help="host:port of process 0 (or JAX_COORDINATOR_ADDRESS)")
    g.add_argument("--num-processes", default=None, help="processes in the job (or JAX_NUM_PROCESSES)")
    g.add_argument("--process-id", default=None, help="this process, 0 .. n-1 (or JAX_PROCESS_ID)")
    g.add_argument("--distributed", action="store_true",
                   help="join a jax.distributed job from the environment or the cluster's auto-detection")
    p.set_defaults(func=run)
    return p


class Progress:
    """Progress on stderr: a tqdm bar on a terminal, else one status line every ``every`` seconds
    (and the last one), which a log file keeps. The ETA is the library's, from measured chunk rates."""

    def __init__(self, stream=None, tty=None, every: float = 10.0):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every = every
        self.last = None
        self.bar = None
        self.lines = 0

    def __call__(self, done, total, elapsed_s, eta_s):
        if self.tty:
            return self._bar(done, total, eta_s)
        now = time.monotonic()
        if self.last is not None and now - self.last < self.every and done < total:
            return
        self.last = now
        eta = "-" if eta_s == float("inf") else f"{eta_s:.0f} s"
        rate = done / elapsed_s if elapsed_s > 0 else 0.0
        self.stream.write(f"dse sweep: {done:,}/{total:,} plans ({100 * done / total:.0f}%)  "
                          f"{elapsed_s:.1f} s elapsed  {rate:.3g} plans/s  ETA {eta}\n")
        self.stream.flush()
        self.lines += 1

    def _bar(self, done, total, eta_s):
        try:
            from tqdm import tqdm
        except ImportError:   # tqdm is a dependency; without it, the line status on the terminal too
            self.tty = False
            return self(done, total, 0.0, eta_s)
        if self.bar is None:
            self.bar = tqdm(total=total, unit="plan", unit_scale=total >= 100_000, file=self.stream,
                            dynamic_ncols=True, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} plans [{elapsed}{postfix}]")
        self.bar.n = done
        self.bar.set_postfix_str("ETA -" if eta_s == float("inf") else f"ETA {eta_s:.0f} s", refresh=False)
        self.bar.refresh()

    def close(self):
        if self.bar is not None:
            self.bar.close()


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


@contextlib.contextmanager
def _stdout_to_stderr(on: bool):
    """Send file descriptor 1 to stderr for the block (what native libraries print), so --json stays JSON."""
    if not on:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run(args) -> int:
    distributed = args.distributed or any(x is not None for x in (args.coordinator, args.num_processes,
                                                                  args.process_id))
    if distributed:
        from dse.engines.sweep.multihost import initialize   # before anything starts the XLA backend

        initialize(args.coordinator, args.num_processes, args.process_id)
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
    every = checks.non_negative("--progress-every", args.progress_every)
    bar = None if args.quiet else Progress(every=every)
    kwargs = {} if chunk is None else {"chunk_points": chunk}
    kwargs["engine"] = args.engine
    try:
        with _stdout_to_stderr(distributed):   # gloo's C++ prints "[Gloo] Rank k is connected" on stdout
            result = run_sweep(spec, out_dir=args.out, resume=args.resume, progress=bar, **kwargs)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(files.dumps(result.to_json(), "sweep result", indent=1))
    else:
        print(text(result))
    if args.plot is not None:
        dump = None
        if result.dump is None and args.out is not None and (Path(args.out) / "dump.csv").is_file():
            from dse.engines.sweep.frames import read_dump_csv   # --out keeps the dump on disk: read it back

            dump = read_dump_csv(Path(args.out) / "dump.csv")
        for name, fig in plot.sweep_figures(result, dump=dump).items():
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
    if spec.pipelined:   # the stack's pipeline overrides the [plan] where a point has pp > 1
        lines.append("where pp > 1 and ZeRO >= 1 the stack runs " + ", ".join(f"{k}={v:g}" for k, v in spec.pipelined)
                     + " (dse/data/stacks, pipelined_source; * in the tables)")
    where = "the host (numpy, float64)" if result.engine == "host" else f"{result.devices} device(s)"
    lines.append(f"{result.feasible:,} feasible; {result.seconds:.2f} s on {where}, "
                 f"{result.points_per_s:.3g} plans/s "
                 + ("(no compile)" if result.engine == "host" else f"(compile {result.compile_s:.2f} s)"))
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


def _shown(spec, point, name):
    """An axis value as the plan ran it: where the stack's pipeline overrides it (stacks.pipelined:
    pp > 1 and ZeRO >= 1), the value it imposes, marked '*' (the header line says why)."""
    value = point[name]
    piped = dict(spec.pipelined)
    if name not in piped:
        return value
    get = lambda k: float(point[k]) if k in point else float(spec.plan.get(k, 1.0))  # noqa: E731
    return f"{piped[name]:g}*" if stacks.pipelines(get("pp"), get("zero")) and piped[name] != float(value) else value


def _table(spec, rows) -> list[str]:
    names = [a.name for a in spec.axes]
    head = ["#"] + names + ["step", "MFU", "tokens/s", "memory", "warnings"]
    body = []
    for i, r in enumerate(rows, 1):
        body.append([str(i)] + [_cell(_shown(spec, r["point"], n)) for n in names]
                    + [fmt.seconds(r["step_s"]), f"{100 * r['mfu']:.1f}%", f"{r['tokens_per_s']:,.0f}",
                       fmt.bytes_(r["memory_bytes"]["total"]), ",".join(r["warnings"]) or "-"])
    widths = [max(len(h), *(len(b[j]) for b in body)) for j, h in enumerate(head)]
    fmt_row = lambda cells: "  ".join(c.rjust(w) if j < len(head) - 1 else c  # noqa: E731
                                      for j, (c, w) in enumerate(zip(cells, widths)))
    return [fmt_row(head)] + [fmt_row(b) for b in body]
