"""``dse plan``: one plan, the seed's Expert view, or ``--json``."""

from __future__ import annotations


import numpy as np

from dse import files
from dse.cli import common
from dse.engines.compiled import evaluate_exact
from dse.engines.host import numpy_mode


def register(sub):
    p = sub.add_parser("plan", help="evaluate one training plan")
    common.add_model_args(p)
    common.add_cluster_args(p)
    common.add_plan_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (SI units)")
    p.add_argument("--cite", action="store_true", help="also print the references behind the figures")
    p.add_argument("--plot", metavar="FILE", default=None,
                   help="also write the memory and step-time breakdown as a figure (.png or .svg)")
    p.add_argument("--sensitivity", action="store_true",
                   help="d(step)/d(bandwidth, FLOP/s, HBM, latency) and elasticities, by jax.grad")
    g = p.add_argument_group("a whole training run (dse/equations/goodput.py: training_run)")
    g.add_argument("--tokens", default=None, help="tokens to train: print days, GPU-hours, cost and goodput")
    g.add_argument("--price", default="0", help="USD per GPU-hour (cost of the run)")
    g.add_argument("--failure-rate", default=None,
                   help="failures per GPU-hour (default: Llama 3's 466 in 54 days on 16,384 GPUs)")
    g.add_argument("--checkpoint-write-s", default=None, help="seconds to write one checkpoint (assumed default 20)")
    g.add_argument("--restart-s", default=None, help="seconds to restart after a failure (assumed default 180)")
    p.set_defaults(func=run)
    return p


def training_run(args, report, cluster) -> dict:
    """--tokens: the run's figures from the library (floats), with the failure model's inputs."""
    from dse.equations import goodput as gp
    from dse.inputs import checks

    rate_h = (checks.non_negative("--failure-rate", args.failure_rate) if args.failure_rate is not None
              else gp.LLAMA3_FAILURE_RATE_PER_GPU_S * gp.SECONDS_PER_HOUR)
    knobs = {"tokens": checks.positive("--tokens", args.tokens),
             "usd_per_gpu_hour": checks.non_negative("--price", args.price),
             "failure_rate_per_gpu_hour": rate_h,
             "checkpoint_write_s": gp.CHECKPOINT_WRITE_S if args.checkpoint_write_s is None
             else checks.non_negative("--checkpoint-write-s", args.checkpoint_write_s),
             "restart_s": gp.RESTART_S if args.restart_s is None else checks.non_negative("--restart-s", args.restart_s)}
    figs = gp.training_run(knobs["tokens"], report.tokens_per_s, cluster.gpus, rate_h / gp.SECONDS_PER_HOUR,
                           knobs["checkpoint_write_s"], knobs["restart_s"], knobs["usd_per_gpu_hour"])
    return {**knobs, **{k: float(np.asarray(v)) for k, v in figs.items()}}


def load(args):
    """(model, cluster, plan, fidelity) from parsed arguments, validated."""
    common.enable_x64()
    with numpy_mode():   # the inputs and their structural checks: a few scalar equations, no XLA dispatch
        model = common.model_from_args(args)
        cluster = common.cluster_from_args(args)
        plan = common.plan_from_args(args, model, cluster)
        fid = common.fidelity_from_args(args)
    return model, cluster, plan, fid


def run(args) -> int:
    if args.plot is not None:
        from dse import plot   # matplotlib only when a figure is asked for

        plot.check_path(args.plot, "--plot")
    model, cluster, plan, fid = load(args)
    report = evaluate_exact(model, cluster, plan, fid)   # `evaluate` in float64, by numpy (engines/host.py)
    out = report.to_json()
    out["plan"] = {k: float(np.asarray(v)) for k, v in plan.to_dict().items()}
    out["fidelity"] = common.fidelity_name(args)
    files.finite_or_error(out, "dse plan")   # an overflowing figure is an input error, never NaN
    if args.sensitivity:
        from dse.engines import sensitivity

        out["sensitivity"] = sensitivity.sensitivities(model, cluster, plan, fid)
    if args.tokens is not None:
        out["run"] = training_run(args, report, cluster)
    if args.json:
        print(files.dumps(out, "dse plan", strict=True, indent=2))
    else:
        from dse.text.plan_view import expert_view, run_view, sensitivity_view

        print(expert_view(model, cluster, plan, out))
        if args.sensitivity:
            print(sensitivity_view(out["sensitivity"], out["step_s"]))
        if "run" in out:
            print(run_view(out["run"]))
        if args.cite:
            from dse.text.references import citation

            print("\nsources:\n" + citation())
    if args.plot is not None:
        label = plot.plan_labels(plan, dp=out["dp"], gpus=cluster.gpus)
        fig = plot.plan_summary(report, cluster.hbm_bytes, label, title=plot_title(args))
        plot.save(fig, args.plot)
    return 0


def plot_title(args) -> str:
    what = args.preset or args.model_config or "custom model"
    return f"{what} on {args.cluster or 'seed'} ({common.fidelity_name(args)} mode)"
