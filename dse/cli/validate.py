"""``dse validate [RUNS.csv]``: predicted vs published for every runnable row."""

from __future__ import annotations


from dse import files
from dse.calibration import validate as validation
from dse.cli import common
from dse.errors import InputError
from dse.inputs import fidelity, presets
from dse.inputs.fidelity import resolve


def register(sub):
    p = sub.add_parser("validate", help="compare predictions with published training runs")
    p.add_argument("runs", nargs="?", default=None,
                   help="CSV in the calibration_runs.csv layout (default: the shipped table, dse/data/validation)")
    p.add_argument("--fidelity", default="calibrated", help="seed|calibrated (default calibrated)")
    p.add_argument("--calibration", default=None, help="calibration file (default: the shipped one)")
    p.add_argument("--cluster", default=None,
                   help="run every row on this hardware preset instead of the one its gpu_type names")
    p.add_argument("--json", action="store_true", help="one JSON object: rows and summaries")
    p.add_argument("--plot", default=None, metavar="PNG", help="also save predicted vs published iteration time")
    p.add_argument("--all", action="store_true",
                   help="every shipped runs table at once (the calibration table and each judged_*.csv): one "
                        "summary line a table, and the judged rows outside the calibration table pooled")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    common.enable_x64()
    if args.fidelity not in common.FIDELITIES:  # validate defaults to calibrated
        raise InputError(f"--fidelity: unknown {args.fidelity!r}; allowed: {', '.join(common.FIDELITIES)}")
    if args.plot:
        from dse import plot

        plot.check_path(args.plot, "--plot")   # before the work (dse/files.py)
    calibrated_mode = args.fidelity == "calibrated"
    fid = fidelity.calibrated(args.calibration) if calibrated_mode else resolve(args.fidelity)
    fitted = fidelity.fitted_rows(args.calibration) if calibrated_mode else []
    if args.cluster:
        presets.load_cluster(args.cluster)   # an unknown preset is one InputError line
    loso = validation.loso_report(args.calibration) if calibrated_mode else {}
    if args.all:
        return _run_all(args, fid, fitted, loso)
    runs, skipped = validation.load_runs(args.runs, cluster=args.cluster)
    if not runs:
        if args.json:
            print(files.dumps({"rows": [], "summary": {}, "not_runnable": _skipped(skipped)}, indent=2))
        else:
            print("no runnable rows")
            _print_skipped(skipped, 0)
        return 0
    if args.plot:
        from dse import plot

        plot.check_path(args.plot, "--plot")
    table = validation.compare(runs, fid, fitted)
    table["not_runnable"] = _skipped(skipped)
    table["counts"] = {"rows": len(runs) + len(skipped), "runnable": len(runs), "not_runnable": len(skipped)}
    table["leave_one_source_out"] = _loso_json(loso)
    if args.plot:
        _plot(table["rows"], args)
    if args.json:
        print(files.dumps(table, indent=2))
        return 0
    print(f"fidelity {args.fidelity}; error = predicted / published - 1 of each source's headline metric "
          f"(rates scale as 1/t: t_published / t_predicted - 1; an iteration time as t_predicted / t_published - 1)")
    for which, title in (("judged", "judged rows (never fitted)"), ("fitted", "fitted rows (the calibration saw them)")):
        sel = [r for r in table["rows"] if r["set"] == which]
        if sel:
            print()
            print(f"{title}:")
            _print_rows(sel)
    memory = [r for r in table["rows"] if "memory_error" in r]
    if memory:   # per-GPU memory where the source prints it, as it measures it (stack memory_printed)
        print()
        print("per-GPU memory where the source prints it (GB; 'reserved': the caching allocator's peak, without "
              "the CUDA context and NCCL buffers):")
        print(f"  {'row':<6}{'measured as':<13}{'published':>10}{'predicted':>10}{'error':>8}")
        for r in memory:
            print(f"  {r['row_id']:<6}{r['memory_kind']:<13}{r['memory_published_gb']:>10.1f}"
                  f"{r['memory_predicted_gb']:>10.1f}{100 * r['memory_error']:>+7.1f}%")
    print()
    if loso:
        _print_loso(loso, "leave one source out (headline generalization figure: fit without the source, judge all "
                          "its rows; from the calibration file, dse calibrate):")
        print()
    _print_summary(table["summary"], 32)
    print()
    print("fitted rows: " + (" ".join(table["fitted_rows"]) or "none (no calibration file lists them)"))
    _print_skipped(skipped, len(runs))
    print()
    print("filled in where rows are silent (per row):")
    for r in table["rows"]:
        print(f"  {r['row_id']}: " + "; ".join(r["assumed"]))
    return 0


def _plot(rows, args):
    """Predicted against published iteration time, a point a row, coloured by source (--plot PNG)."""
    from dse import plot

    fig = plot.predicted_vs_published([r["time_published_s"] for r in rows], [r["time_predicted_s"] for r in rows],
                                      groups=[r["source"] for r in rows], fitted=[r["set"] == "fitted" for r in rows],
                                      labels=[r["row_id"] for r in rows], title=f"dse {args.fidelity} vs published runs")
    plot.save(fig, args.plot)


def _run_all(args, fid, fitted, loso) -> int:
    """``--all``: every shipped runs table, summaries only (each table's rows: dse validate TABLE)."""
    if args.runs:
        raise InputError("--all: runs every shipped table; allowed: --all without a RUNS.csv")
    paths = validation.shipped_run_tables()
    table, skipped = validation.compare_tables(paths, fid, fitted, cluster=args.cluster)
    if args.plot:
        _plot(table["rows"], args)
    table["not_runnable"] = _skipped(skipped)
    table["leave_one_source_out"] = _loso_json(loso)
    if args.json:
        print(files.dumps(table, indent=2))
        return 0
    print(f"fidelity {args.fidelity}; every shipped runs table (dse/data/validation); error = predicted / published - 1 "
          f"of each source's headline metric; a table's rows: dse validate dse/data/validation/TABLE")
    print()
    _print_summary(table["summary"], 44)
    if loso:
        print()
        _print_loso(loso, "leave one source out (fit without the source, judge all its rows; from the calibration file):")
    print()
    _print_skipped(skipped, len(table["rows"]))
    return 0


def _loso_json(loso) -> dict:
    return {k: dict(zip(("median_abs", "max_abs", "mean_abs"), v)) for k, v in loso.items()}


def _print_loso(loso, title):
    print(title)
    for source, (med, mx, mean) in loso.items():
        print(f"  {source:<26} median |error| {100 * med:5.1f}%   mean {100 * mean:5.1f}%   max {100 * mx:5.1f}%")


def _print_summary(summary, width):
    """One line a summary (validation.summary_of's rows, median, mean, max |error|)."""
    for name, s in summary.items():
        print(f"{name:<{width}} rows {s['rows']:>3}   median |error| {100 * s['median_abs']:5.1f}%"
              f"   mean {100 * s['mean_abs']:5.1f}%   max {100 * s['max_abs']:5.1f}%")


def _skipped(skipped):
    return [{"row_id": rid, "reason": why} for rid, why in skipped]


def _print_skipped(skipped, runnable: int):
    total = runnable + len(skipped)
    print(f"runnable: {runnable} of {total} rows; not runnable: {len(skipped)}")
    for rid, why in skipped:
        print(f"  {rid}: not runnable: {why}")


def _print_rows(rows):
    print(f"  {'row':<6}{'source':<17}{'model':<18}{'stack':<19}{'metric':<13}{'published':>10}{'predicted':>10}"
          f"{'error':>8}{'t_pub s':>9}{'t_pred s':>9}")
    for r in rows:
        print(f"  {r['row_id']:<6}{r['source'][:16]:<17}{r['model'][:17]:<18}{r['stack'][:18]:<19}{r['metric']:<13}"
              f"{r['published']:>10.4g}{r['predicted']:>10.4g}{100 * r['error']:>+7.1f}%"
              f"{r['time_published_s']:>9.2f}{r['time_predicted_s']:>9.2f}")
