"""Arguments shared by subcommands: the model, the cluster and the plan."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from dse import backend
from dse.inputs import presets
from dse.equations import topology
from dse.errors import InputError
from dse.inputs import checks, stacks
from dse.inputs.fidelity import Fidelity, default_mode, resolve
from dse.inputs import RECOMPUTE, RECOMPUTE_NAMES, SCHEDULES, Cluster, ModelShape, Plan
from dse.inputs.base import field_comments
from dse.inputs.plan import SWITCHES as PLAN_SWITCHES
from dse.equations import feasibility
from dse.evaluate import derived

FIDELITIES = ("seed", "calibrated")


def enable_x64():
    """Single plans and validation run in float64 (DESIGN.md, Conventions), when jax is used."""
    backend.enable_x64()


def add_model_args(p: argparse.ArgumentParser):
    g = p.add_argument_group("model")
    g.add_argument("--preset", "--model", dest="preset", help=f"model preset: {', '.join(presets.list_presets('models'))}")
    g.add_argument("--model-config", help="Hugging Face config.json")
    for flag, field in (("--layers", "layers"), ("--hidden", "hidden"), ("--heads", "heads"),
                        ("--kv-heads", "kv_heads"), ("--ffn", "ffn_hidden"), ("--vocab", "vocab"),
                        ("--experts", "experts"), ("--topk", "topk"), ("--seq", "seq")):
        g.add_argument(flag, dest=f"m_{field}", type=str, default=None, help=f"model {field}")


def add_cluster_args(p: argparse.ArgumentParser):
    g = p.add_argument_group("cluster")
    g.add_argument("--cluster", default=None, help=f"cluster preset (default seed): {', '.join(presets.list_presets('clusters'))}")
    g.add_argument("--gpus", dest="c_gpus", default=None, help="accelerators N")
    g.add_argument("--domain", dest="c_domain", default=None, help="scale-up domain size U")
    g.add_argument("--gpus-per-node", dest="c_gpus_per_node", default=None, help="accelerators per server")
    g.add_argument("--bw-up", dest="c_bw_up_GBps", default=None, help="scale-up GB/s per accelerator")
    g.add_argument("--bw-out", dest="c_bw_out_GBps", default=None, help="scale-out GB/s per accelerator")
    g.add_argument("--tflops", dest="c_tflops", default=None, help="TFLOP/s per accelerator")
    g.add_argument("--hbm", dest="c_hbm_GB", default=None, help="GB of memory per accelerator")
    g.add_argument("--topology", dest="c_topology", default=None, help="fat-tree|rail-only|torus (dse/equations/topology.py)")
    g.add_argument("--island", dest="c_island_gpus", default=None, help="GPUs in a non-blocking island (0: one island)")
    g.add_argument("--oversub", "--oversubscription", dest="c_oversubscription", default=None, help="core oversubscription ratio between islands")
    g.add_argument("--host-link", dest="c_host_link_GBps", default=None,
                   help="GB/s a direction between an accelerator and host memory (PCIe Gen5 x16: 63)")
    g.add_argument("--host-mem", dest="c_node_host_GB", default=None, help="GB of host memory per node (offload)")
    g.add_argument("--host-bw", dest="c_node_host_bw_GBps", default=None,
                   help="GB/s of host DRAM bandwidth per node (the host-side Adam rate)")
    g.add_argument("--matmul-ceiling", dest="c_matmul_ceiling", default=None,
                   help="your measured best BF16 matmul / --tflops (mamf-finder.py; 0: not measured)")
    g.add_argument("--matmul-ceiling-fp8", dest="c_matmul_ceiling_fp8", default=None,
                   help="your measured best FP8 matmul / the FP8 peak (0: not measured)")
    g.add_argument("--torus", dest="net_torus", default=None, help="torus axis sizes, e.g. 16x16x16 or 8x8")
    g.add_argument("--torus-bw", dest="net_torus_bw", default=None, help="GB/s a torus link a direction, every axis")
    g.add_argument("--no-wrap", dest="net_wrap", action="store_false", default=True, help="torus axes without wraparound")


def add_plan_args(p: argparse.ArgumentParser):
    g = p.add_argument_group("plan")
    for flag, default, what in (("--tp", 1, "tensor-parallel degree t"), ("--pp", 1, "pipeline stages p"),
                                ("--cp", 1, "context-parallel degree c"), ("--ep", 1, "expert-parallel degree e"),
                                ("--vpp", 1, "interleaved chunks per stage v"), ("--mbs", 1, "microbatch b (sequences)"),
                                ("--gbs", None, "global batch B (sequences)")):
        g.add_argument(flag, dest=f"p_{flag[2:]}", default=default, help=what)
    g.add_argument("--zero", dest="p_zero", default=None, help="ZeRO stage 0..3 (default 1, or the --stack's)")
    g.add_argument("--recompute", dest="p_recompute", default=None, help="none|selective|full|op|qkv (op: torchtitan op-level; qkv: MaxText save_qkv_proj; default selective, or the --stack's)")
    g.add_argument("--no-sp", dest="p_sp", action="store_false", help="sequence parallelism off")
    g.add_argument("--sp", dest="p_sp_on", action="store_true",
                   help="sequence parallelism on where a --stack leaves it off (Megatron-LM's default)")
    g.add_argument("--fidelity", default=None,
                   help="seed|calibrated (default: calibrated on a hardware preset, seed on the seed cluster)")
    g.add_argument("--schedule", dest="p_schedule", default="1f1b", help="1f1b|zb1p|dualpipe (default 1f1b)")
    g.add_argument("--grad-accum", dest="p_grad_accum", default=None,
                   help="local (unsharded gradients, one reduce a step) | reduce (reduce-scatter every microbatch); "
                        "default local, or the --stack's")
    g.add_argument("--fp8", dest="p_fp8", nargs="?", const="delayed", default=None, metavar="RECIPE",
                   help="GEMMs in FP8 at the cluster's FP8 peak with an FP8 recipe: delayed (a bare --fp8, "
                        "Megatron's default) | tensorwise | mxfp8 | blockwise | none")
    g.add_argument("--flash-attention", dest="p_flash_attention", action="store_true",
                   help="fused attention: no s^2 scores stored or moved")
    g.add_argument("--cp-ring", dest="p_cp_ring", action="store_true", help="CP by ring attention instead of K/V all-gather")
    g.add_argument("--tp-overlap", dest="p_tp_comm_overlap", action="store_true", help="TP collectives overlapped with GEMMs")
    g.add_argument("--overlap-grad-reduce", dest="p_overlap_grad_reduce_on", action="store_true",
                   help="DP sync behind the backward pass where a --stack leaves it after (Megatron-LM's default)")
    g.add_argument("--no-overlap-grad-reduce", dest="p_overlap_grad_reduce", action="store_false",
                   help="DP gradient sync after the backward pass, not behind it")
    g.add_argument("--rank-order", dest="p_rank_order", default=None,
                   help="dimension order innermost first, e.g. tp,dp,pp (default tp,cp,ep,pp,dp)")
    g.add_argument("--torus-order", dest="p_torus_order", default=None, help="order ranks fill torus axes, e.g. yzx (default xyz)")
    g.add_argument("--hier-dp", dest="p_dp_hierarchical", action="store_true",
                   help="DP all-reduce: reduce-scatter in domain, all-reduce on rails, all-gather in domain")
    g.add_argument("--stack", dest="p_stack", default=None,
                   help=f"software stack whose defaults fill the switches not given: {', '.join(stacks.list_stacks())}")
    g.add_argument("--megatron-args", default=None, metavar="CMDLINE",
                   help="read the plan (and model shape, GPUs) from a Megatron-LM/torchrun command line; "
                        "flags given to dse win")
    g.add_argument("--torchtitan-config", default=None, metavar="TOML",
                   help="read the plan from a torchtitan job config (--gpus resolves a shard degree of -1); "
                        "flags given to dse win")
    add_field_flags(g)


# Plan fields with a flag of their own above; every other field gets one from add_field_flags.
HAND_FLAGS = ("tp", "pp", "cp", "ep", "vpp", "mbs", "gbs", "zero", "recompute", "sp", "schedule", "grad_accum", "fp8",
              "flash_attention", "cp_ring", "tp_comm_overlap", "overlap_grad_reduce", "rank_order", "torus_order",
              "dp_hierarchical")
FIELD_FLAGS = tuple(f.name for f in dataclasses.fields(Plan) if f.name not in HAND_FLAGS)


def field_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_field_flags(g) -> None:
    """One flag per Plan field that has no flag above, named after the field (--fp8-param-gather
    for fp8_param_gather), its help the field's comment: new fields reach the CLI without code
    here. Switches may stand alone (= 1) or take 0/1; values are checked by checks.plan_value."""
    comments = field_comments(Plan)
    for f in dataclasses.fields(Plan):
        if f.name not in FIELD_FLAGS:
            continue
        extra = dict(nargs="?", const="1", metavar="0|1") if f.name in PLAN_SWITCHES else dict(metavar="N")
        g.add_argument(field_flag(f.name), dest=f"p_{f.name}", default=None,
                       help=f"{comments.get(f.name, f.name)} (default {f.default:g})", **extra)


# dse's own plan defaults (add_plan_args): a value still at its default yields to --megatron-args.
_PLAN_DEFAULTS = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "vpp": 1, "mbs": 1, "gbs": None, "zero": None,
                  "recompute": None, "sp": True, "overlap_grad_reduce": True, "tp_comm_overlap": False,
                  "flash_attention": False, "cp_ring": False, "fp8": None, "grad_accum": None,
                  "rank_order": None, "schedule": "1f1b", "torus_order": None, "dp_hierarchical": False}
# Every other Plan field's flag comes from add_field_flags with default None (not given).


def apply_megatron_args(args) -> None:
    """Fill plan, model and cluster flags from ``--megatron-args`` (idempotent; dse flags win).

    The reading and the merge rule are dse.ops.megatron's; this only sets what it returns."""
    text, toml = getattr(args, "megatron_args", None), getattr(args, "torchtitan_config", None)
    if not (text or toml) or getattr(args, "_megatron_applied", False):
        return
    from dse.ops import megatron, torchtitan  # the parsers of outside formats live with the operator tools

    if text and toml:
        raise InputError("--megatron-args and --torchtitan-config: give one, not both")
    if toml:
        gpus, layers = getattr(args, "c_gpus", None), getattr(args, "m_layers", None)
        parsed = torchtitan.parse_file(toml, gpus=int(checks.number("--gpus", gpus, integer=True)) if gpus else None,
                                       layers=int(checks.number("--layers", layers, integer=True)) if layers else None)
    else:
        parsed = megatron.parse(text)
    vars(args).update(megatron.merge_into_flags(parsed, vars(args), _PLAN_DEFAULTS))
    said = [f"{f}{'' if v is None else ' ' + str(v)}" for f, v in parsed["unmodeled"]]
    if said:   # listed, never dropped without a word (issue 15)
        print(f"dse: note: {'--torchtitan-config' if toml else '--megatron-args'}: not modeled by dse: "
              f"{', '.join(said)}", file=sys.stderr)
    for n in parsed["notes"]:
        print(f"dse: note: {'--torchtitan-config' if toml else '--megatron-args'}: {n}", file=sys.stderr)
    args.megatron_layers_per_virtual_stage = parsed["plan"].get("layers_per_virtual_stage")
    args.megatron_parsed = parsed
    args._megatron_applied = True


def model_from_args(args) -> ModelShape:
    apply_megatron_args(args)
    fields = {k[2:]: v for k, v in vars(args).items() if k.startswith("m_") and v is not None}
    for k, v in fields.items():
        fields[k] = checks.number(f"--{k.replace('_', '-')}", v, minimum=1.0)
    if args.preset and args.model_config:
        raise InputError("--preset and --model-config: give one, not both")
    if args.model_config:
        base = presets.model_from_hf_config(args.model_config, seq=fields.pop("seq", None))
        return base.replace(**fields) if fields else base
    if args.preset:
        return presets.load_model(args.preset, **fields)
    parsed = getattr(args, "megatron_parsed", None)
    if parsed and parsed.get("model") and not getattr(args, "torchtitan_config", None):
        # the line's model as Megatron builds it (its defaults for what it leaves out: megatron.complete_model),
        # fields without a dse flag of their own included (--swiglu, --moe-ffn-hidden-size, --kv-channels, MLA
        # ranks, ...); the dse flags given win
        from dse.ops import megatron

        fields = {**megatron.complete_model(parsed["model"]), **fields}
    if not {"layers", "hidden", "heads"} <= set(fields):
        raise InputError("model: give --preset NAME, --model-config PATH, or --layers, --hidden and --heads")
    fields.setdefault("seq", 2048)
    return presets.model_from_fields(fields)


def cluster_from_args(args) -> Cluster:
    apply_megatron_args(args)
    fields = {k[2:]: v for k, v in vars(args).items() if k.startswith("c_") and v is not None}
    torus = getattr(args, "net_torus", None)
    if torus is not None:
        parts = str(torus).lower().split("x")
        if not 1 <= len(parts) <= 3:
            raise InputError(f"--torus: {torus!r} is not allowed; allowed: 1-3 axis sizes such as 16x16x16")
        for axis, n in zip("xyz", parts + ["1"] * (3 - len(parts))):
            fields[f"torus_{axis}"] = checks.number("--torus", n, integer=True)
        fields.setdefault("topology", "torus")
    if getattr(args, "net_torus_bw", None) is not None:
        bw = checks.number("--torus-bw", args.net_torus_bw, minimum=1e-9)
        fields.update({f"torus_bw_{a}_GBps": bw for a in "xyz"})
    if not getattr(args, "net_wrap", True):
        fields["torus_wrap"] = 0.0
    if "topology" in fields and fields["topology"] not in presets.TOPOLOGIES:
        raise InputError(f"--topology: unknown {fields['topology']!r}; allowed: {', '.join(presets.TOPOLOGIES)}")
    return presets.load_cluster(args.cluster or "seed", **fields)


def fidelity_name(args) -> str:
    """--fidelity, or its default: calibrated on a hardware preset, seed on the seed cluster."""
    name = getattr(args, "fidelity", None)
    if name is None:
        name = default_mode(getattr(args, "cluster", None))
    return name


def fidelity_from_args(args) -> Fidelity:
    name = fidelity_name(args)
    if name not in FIDELITIES:
        raise InputError(f"--fidelity: unknown {name!r}; allowed: {', '.join(FIDELITIES)}")
    return resolve(name)


def plan_from_args(args, model: ModelShape | None, cluster: Cluster) -> Plan:
    """The plan from flags, checked against the cluster (and the model's heads/experts when given)."""
    apply_megatron_args(args)
    lpvs = getattr(args, "megatron_layers_per_virtual_stage", None)
    if lpvs and str(args.p_vpp) == "1" and model is not None:   # Megatron gives layers per virtual stage
        from dse.ops import megatron

        args.p_vpp = megatron.vpp_from_layers_per_stage(
            model.layers, checks.number("--pipeline-model-parallel-size", args.p_pp, integer=True), lpvs)
    stack = stacks.plan_fields(args.p_stack) if getattr(args, "p_stack", None) else {}
    # a stack's defaults stand in for dse's own where a flag is not given (an explicit --recompute
    # selective or --zero 1 is the user's, not a default to override)
    args.p_recompute = _given(args.p_recompute, stack, "recompute", "selective", lambda v: RECOMPUTE_NAMES[v])
    args.p_zero = _given(args.p_zero, stack, "zero", "1", lambda v: str(int(v)))
    rc = str(args.p_recompute)
    if rc not in RECOMPUTE:
        raise InputError(f"--recompute: unknown {rc!r}; allowed: {', '.join(RECOMPUTE)}")
    if getattr(args, "p_recompute_modules", None) is not None and rc != "selective":   # as Megatron, ignored
        print(f"dse: note: --recompute-modules is what selective recompute recomputes; with --recompute {rc} "
              f"it changes nothing", file=sys.stderr)
    zero = checks.number("--zero", args.p_zero, integer=True, minimum=0)
    if zero > 3:
        raise InputError(f"--zero: {args.p_zero!r} is not allowed; allowed: 0, 1, 2, 3")
    vals = {k: checks.number(f"--{k}", getattr(args, f"p_{k}"), integer=True) for k in ("tp", "pp", "cp", "ep", "vpp", "mbs")}
    t, c, p, e, b = vals["tp"], vals["cp"], vals["pp"], vals["ep"], vals["mbs"]
    d, _, _ = derived(cluster, Plan.make(tp=t, pp=p, cp=c, ep=e, mbs=b, gbs=1.0))
    # default: one microbatch per replica (checked below with the other structural rules)
    B = checks.number("--gbs", args.p_gbs, integer=True) if args.p_gbs is not None else float(d) * b
    net = {}
    if getattr(args, "p_rank_order", None):
        net["rank_order"] = topology.rank_order_code(args.p_rank_order)
    if getattr(args, "p_torus_order", None):
        net["torus_order"] = topology.torus_order_code(args.p_torus_order)
    if getattr(args, "p_dp_hierarchical", False):
        net["dp_hierarchical"] = 1.0
    sched = str(getattr(args, "p_schedule", "1f1b"))
    if sched not in SCHEDULES:
        raise InputError(f"--schedule: unknown {sched!r}; allowed: {', '.join(SCHEDULES)}")
    # FSDP and DeepSpeed ZeRO-3 stacks reduce every microbatch
    ga = str(_given(getattr(args, "p_grad_accum", None), stack, "grad_accum", "local",
                    lambda v: "reduce" if v >= 1 else "local"))
    if ga not in GRAD_ACCUM:
        raise InputError(f"--grad-accum: unknown {ga!r}; allowed: {', '.join(GRAD_ACCUM)}")
    flag = lambda name, default=False: 1.0 if getattr(args, name, default) else 0.0  # noqa: E731
    fp8 = getattr(args, "p_fp8", None)
    fields = {"fp8": checks.plan_value("--fp8", fp8) if fp8 is not None else 0.0}
    for name in FIELD_FLAGS:   # the flags add_field_flags made, where given (else a stack's value)
        value = getattr(args, f"p_{name}", None)
        value = stack.get(name) if value is None else value
        if value is not None:
            fields[name] = checks.plan_value(field_flag(name), value)
    try:
        checks.offload_consistency({**fields, "zero": zero})
    except InputError as exc:
        raise InputError(f"--offload-weights: {str(exc).split(': ', 1)[1]}") from None
    # on-switches: the flag or the stack turns them on; off-switches (--no-sp, --no-overlap-grad-reduce) win
    on = lambda name, key: max(flag(name), stack.get(key, 0.0))  # noqa: E731
    kept = lambda name, key: flag(name, True) * stack.get(key, 1.0)  # noqa: E731
    for yes, no, what in (("p_sp_on", "p_sp", "sp"), ("p_overlap_grad_reduce_on", "p_overlap_grad_reduce", "overlap-grad-reduce")):
        if getattr(args, yes, False) and not getattr(args, no, True):
            raise InputError(f"--{what} and --no-{what}: both given; allowed: one of them")
    forced = lambda yes, name, key: 1.0 if getattr(args, yes, False) else kept(name, key)  # noqa: E731
    plan = Plan.make(tp=t, pp=p, cp=c, ep=e, vpp=vals["vpp"], mbs=b, gbs=B, zero=zero,
                     recompute=RECOMPUTE[rc], sp=forced("p_sp_on", "p_sp", "sp"), **net,
                     schedule=SCHEDULES[sched], grad_accum=GRAD_ACCUM[ga], **fields,
                     cp_ring=flag("p_cp_ring"), overlap_grad_reduce=forced("p_overlap_grad_reduce_on", "p_overlap_grad_reduce", "overlap_grad_reduce"),
                     tp_comm_overlap=on("p_tp_comm_overlap", "tp_comm_overlap"),
                     flash_attention=on("p_flash_attention", "flash_attention"))
    if stack:   # what the stack's pipeline does to the sharding asked for (torchtitan: FSDP under PP is ZeRO-1)
        piped = stacks.pipelined_fields(args.p_stack)
        new = stacks.pipelined(plan, piped)
        changed = {k: float(getattr(new, k)) for k in piped if float(getattr(new, k)) != float(getattr(plan, k))}
        if changed:
            print(f"dse: stack {args.p_stack} with pp {p:g}: " + ", ".join(f"{k}={v:g}" for k, v in sorted(changed.items()))
                  + " (as the stack runs a pipeline: dse/data/stacks, pipelined_source)", file=sys.stderr)
        plan = new
    refuse_structural(model, cluster, plan)
    return plan


def _given(value, stack: dict, key: str, default, name):
    """A plan flag's value: as given, else the --stack's (``name`` turns its code into the flag's
    form), else dse's own default."""
    if value is not None:
        return value
    return name(stack[key]) if key in stack else default


def refuse_structural(model: ModelShape | None, cluster: Cluster, plan: Plan) -> None:
    """A plan that cannot be laid out at all (the feasibility table's structural rules) is bad
    input: one line naming the flag. Memory and torus mapping stay infeasibility reasons."""
    d, _, m = derived(cluster, plan)
    shape = model if model is not None else ModelShape.make(layers=1, hidden=1, heads=1, kv_heads=1, ffn_hidden=1,
                                                            vocab=1, seq=1)
    q = feasibility.quantities(shape, cluster, plan, d, m, 0.0, False)
    err = feasibility.structural_error(q, model_known=model is not None)
    if err:
        field, msg = err
        raise InputError(f"--{field.replace('_', '-')}: {msg}")


GRAD_ACCUM = {"local": 0.0, "reduce": 1.0}




def add_plot_dir_args(p: argparse.ArgumentParser, what: str):
    """--plot DIR and --plot-format for commands that write several figures."""
    p.add_argument("--plot", metavar="DIR", default=None, help=f"write figures into DIR: {what}")
    p.add_argument("--plot-format", default="png", help="png|svg (default png)")
