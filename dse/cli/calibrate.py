"""``dse calibrate [RUNS.csv]``: fit the calibrated mode's efficiencies, save them, report."""

from __future__ import annotations

from pathlib import Path

from dse import files
from dse.calibration import fit as calibrated, validate as validation
from dse.cli import common
from dse.inputs import checks, presets
from dse.inputs.fidelity import calibration_path


def register(sub):
    p = sub.add_parser("calibrate", help="fit the calibrated mode on published runs (optax through evaluate)")
    p.add_argument("runs", nargs="?", default=None,
                   help="CSV in the calibration_runs.csv layout (default: the shipped table, dse/data/validation)")
    p.add_argument("--kernels", default=None, help="kernel_microbenchmarks.csv layout (default: the shipped table)")
    p.add_argument("--collectives", default=None, help="collective_bandwidth.csv layout (default: the shipped table)")
    p.add_argument("--out", default=None, help="calibration file to write (default: calibration.toml in the user data folder, presets.user_dir; the shipped file is refitted with --out dse/data/calibration/default.toml)")
    p.add_argument("--steps", default="400", help="Adam steps per run fit (default 400)")
    p.add_argument("--no-loso", action="store_true",
                   help="skip the leave-one-source-out fits (one more fit per source; the parameters are the same)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    common.enable_x64()
    steps = int(checks.number("--steps", args.steps, integer=True, minimum=1))
    out = Path(args.out) if args.out else presets.user_dir("calibration") / "calibration.toml"
    if args.out:   # checked before the fit, not after it (dse/files.py)
        files.check_out_file(out, "--out")
    runs, skipped = validation.load_runs(args.runs)
    if len(runs) < 2:
        from dse.errors import InputError
        raise InputError(f"runs CSV: {len(runs)} runnable row(s); allowed: at least 2")
    fitted = validation.split_fitted(runs)
    kernels = validation.load_kernels(args.kernels)
    collectives = validation.load_collectives(args.collectives)
    alltoall = validation.load_alltoall(args.collectives)
    stream = validation.load_stream(args.kernels)
    attention = validation.load_attention(args.kernels)
    params, report = calibrated.calibrate(runs, fitted, kernels, stream, collectives, steps, attention, alltoall,
                                          loso=not args.no_loso)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = {"description": "Calibrated-mode parameters written by dse calibrate",
              "source": f"fitted on rows {' '.join(sorted(fitted))} of {args.runs or 'validation/calibration_runs.csv'}"
                        f" (every other runnable row of each source), the GEMM and FlashAttention rows of kernel_microbenchmarks.csv"
                        f" and the all-reduce and bulk MoE all-to-all rows of collective_bandwidth.csv"}
    calibrated.save_params(params, out, header, report)
    print(f"wrote {out}; use it with --calibration {out} (the shipped file is {calibration_path()})")
    print("fitted parameters:")
    for k, v in params.items():
        print(f"  {k:<20} {v:.6g}")
    k, c = report["kernels"], report["collectives"]
    print(f"HBM: {params.get('hbm_efficiency', 1.0):.3f} of the datasheet bandwidth on {len(stream)} STREAM rows")
    print(f"GEMM curve: median |error| {100 * k['median_abs_err']:.1f}%, max {100 * k['max_abs_err']:.1f}% "
          f"on {len(kernels)} cuBLASLt rows")
    if params.get("matmul_ceiling"):
        print(f"matmul ceiling: flops_efficiency is relative to {params['matmul_ceiling']:.3f} of the peak (the geometric "
              f"mean of the fitted runs' accelerators' measured ceilings; each preset's matmul_ceiling scales its own)")
    if params.get("flash_attn_share"):
        print(f"FlashAttention-2-generation kernels: their fused rate follows each GPU's measured share, relative to "
              f"{params['flash_attn_share']:.3f} (the fitted runs that use one)")
    a = report["fused_attention"]
    if a:
        print(f"fused attention: {params['fused_attn_efficiency']:.3f} of the 16-bit peak on {a['rows']} FlashAttention "
              f"rows (max |error| {100 * a['max_abs_err']:.1f}%: " + ", ".join(
                  f"{k[len('share_'):]} {v:.3f}" for k, v in a.items() if k.startswith("share_")) + ")")
    print(f"all-reduce: alpha_up {c['alpha_up_s'] * 1e6:.2f} us, alpha_out {c.get('alpha_out_s', float('nan')) * 1e6:.2f} us, "
          f"scale-up efficiency {c['bw_up_efficiency']:.3f} (rms log error {c['rmse_log_up']:.3f})")
    if "a2a_up_efficiency" in params or "a2a_out_efficiency" in params:
        print(f"all-to-all: {params.get('a2a_up_efficiency', float('nan')):.3f} of scale-up, "
              f"{params.get('a2a_out_efficiency', float('nan')):.3f} of scale-out on {len(alltoall)} dispatch/combine rows")
    print(f"runs: {len(fitted)} fitted rows, rms log error of iteration time {report['runs_rmse_log']:.4f}")
    if report["leave_one_source_out"]:
        print("leave one source out (fit on the other sources' fitted rows, judge all rows of the source):")
    for source, (med, mx, mean) in report["leave_one_source_out"].items():
        print(f"  {source:<18} median |error| {100 * med:5.1f}%   mean {100 * mean:5.1f}%   max {100 * mx:5.1f}%")
    if report.get("loso_pooled"):
        med, mx, mean = report["loso_pooled"]
        print(f"  {'all rows, pooled':<18} median |error| {100 * med:5.1f}%   mean {100 * mean:5.1f}%   max {100 * mx:5.1f}%")
    if skipped:
        print("not runnable: " + "; ".join(f"{rid} ({why})" for rid, why in skipped))
    return 0
