"""``dse validate [RUNS.csv]``: predicted vs published for every runnable row."""

from __future__ import annotations


from dse import files
from dse.calibration import validate as validation
from dse.cli import common
from dse.errors import InputError
from dse.inputs import fidelity
from dse.inputs.fidelity import resolve


def register(sub):
    p = sub.add_parser("validate", help="compare predictions with published training runs")
    p.add_argument("runs", nargs="?", default=None,
                   help="CSV in the calibration_runs.csv layout (default: the shipped table, dse/data/validation)")
    p.add_argument("--fidelity", default="calibrated", help="seed|calibrated (default calibrated)")
    p.add_argument("--calibration", default=None, help="calibration file (default: the shipped one)")
    p.add_argument("--json", action="store_true", help="one JSON object: rows and summaries")
    p.add_argument("--plot", default=None, metavar="PNG", help="also save predicted vs published iteration time")
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
    runs, skipped = validation.load_runs(args.runs)
    if not runs:   # nothing to compare is an input problem, with the reasons (issue 14)
        why = "; ".join(f"{rid}: {w}" for rid, w in skipped[:3]) + (" ..." if len(skipped) > 3 else "")
        raise InputError(f"runs CSV: {args.runs or 'calibration_runs.csv'!r} has no runnable row"
                         f"{' (' + why + ')' if why else ''}; allowed: rows with {', '.join(validation.RUN_COLUMNS)}")
    table = validation.compare(runs, fid, fitted)
    if args.plot:
        from dse import plot

        rows = table["rows"]
        fig = plot.predicted_vs_published([r["time_published_s"] for r in rows], [r["time_predicted_s"] for r in rows],
                                          groups=[r["source"] for r in rows], fitted=[r["set"] == "fitted" for r in rows],
                                          labels=[r["row_id"] for r in rows], title=f"dse {args.fidelity} vs published runs")
        plot.save(fig, args.plot)
    if args.json:
        print(files.dumps(table, indent=2))
        return 0
    print(f"fidelity {args.fidelity}; error = predicted / published - 1 of each source's headline metric "
          f"(= t_published / t_predicted - 1)")
    print(f"{'row':<6}{'set':<8}{'source':<17}{'model':<18}{'metric':<12}{'published':>10}{'predicted':>10}"
          f"{'error':>8}{'t_pub s':>9}{'t_pred s':>9}{'t err':>8}")
    for r in table["rows"]:
        print(f"{r['row_id']:<6}{r['set']:<8}{r['source']:<17}{r['model'][:17]:<18}{r['metric']:<12}"
              f"{r['published']:>10.1f}{r['predicted']:>10.1f}{100 * r['error']:>+7.1f}%"
              f"{r['time_published_s']:>9.2f}{r['time_predicted_s']:>9.2f}{100 * r['time_error']:>+7.1f}%")
    print()
    for name, s in table["summary"].items():
        print(f"{name:<28} rows {s['rows']:>3}   median |error| {100 * s['median_abs']:5.1f}%"
              f"   mean {100 * s['mean_abs']:5.1f}%   max {100 * s['max_abs']:5.1f}%")
    print()
    print("fitted rows: " + (" ".join(table["fitted_rows"]) or "none (no calibration file lists them)"))
    if skipped:
        print("not runnable: " + "; ".join(f"{rid} ({why})" for rid, why in skipped))
    assumed = sorted({a for r in table["rows"] for a in r["assumed"]})
    if assumed:
        print("filled in where rows are silent: " + "; ".join(assumed))
    return 0
