"""torchtitan job configs (TOML) both ways, and NeMo / Megatron-Bridge recipe overrides both ways.

torchtitan (pytorch/torchtitan, torchtitan/config/job_config.py and models/*/train_configs/*.toml):
``[parallelism]`` data_parallel_replicate_degree, data_parallel_shard_degree (-1: the rest),
fsdp_reshard_after_forward, tensor_parallel_degree, enable_async_tensor_parallel,
pipeline_parallel_degree, pipeline_parallel_schedule, pipeline_parallel_layers_per_stage,
pipeline_parallel_microbatch_size, context_parallel_degree, context_parallel_rotate_method,
expert_parallel_degree; ``[training]`` local_batch_size, global_batch_size, seq_len;
``[activation_checkpoint]`` mode; ``[model]`` converters = ["float8"]; ``[float8]``;
``[compile]`` enable. Older files put the degrees and ``compile`` under ``[training]`` and
call the batch ``batch_size``; both are read.

How dse's choices land there: ZeRO-3 is FSDP (parameters resharded after forward); ZeRO-2
is FSDP with ``fsdp_reshard_after_forward = "never"`` (parameters gathered once a step,
gradients and state sharded: ZeRO sec.5 P_os+g); ZeRO-0 is plain replication (DDP).
Without a pipeline torchtitan has no ZeRO-1: it is written as ZeRO-2 with a note. With one,
its FSDP is ZeRO-1 whatever the reshard setting (torch.distributed.pipelining keeps every
stage's parameters gathered and its gradients unsharded until the last microbatch: the
torchtitan stack's ``[plan_with_pp]``), so ZeRO-2/3 with pp > 1 is written with a note and
read back as ZeRO-1. torchtitan's device mesh is
["pp", "dp_replicate", "dp_shard", "cp", "tp"] outermost first (parallel_dims.py), dse's
order TP, CP, EP, DP, PP. CP passes K/V by all-gather ("allgather") or around a ring
("alltoall") (torch.distributed.tensor.experimental context_parallel, set_rotate_method).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from dse.errors import InputError
from dse.inputs import FP8_NAMES, FP8_RECIPES, checks, stacks
from dse.ops import megatron
from dse.ops.megatron import MEGATRON_ORDER, same_order

TENSORWISE = int(FP8_RECIPES["tensorwise"])   # torchao float8: tensorwise dynamic scaling (torchtitan docs/float8.md)

__all__ = ["to_toml", "parse_toml", "parse_file", "nemo_overrides", "parse_overrides", "TORCHTITAN_ORDER", "SCHEDULES"]

TORCHTITAN_ORDER = MEGATRON_ORDER     # tp innermost, pp outermost (device mesh pp, dp_replicate, dp_shard, cp, tp)
# dse schedule (and interleaving) -> torchtitan pipeline_parallel_schedule (torch.distributed.pipelining)
SCHEDULES = {("1f1b", False): "1F1B", ("1f1b", True): "Interleaved1F1B", ("zb1p", False): "ZBVZeroBubble",
             ("zb1p", True): "InterleavedZeroBubble", ("dualpipe", False): "DualPipeV", ("dualpipe", True): "DualPipeV"}
_SCHEDULE_BACK = {"1F1B": "1f1b", "Interleaved1F1B": "1f1b", "GPipe": "1f1b", "InterleavedZeroBubble": "zb1p",
                  "ZBVZeroBubble": "zb1p", "DualPipeV": "dualpipe", "LoopedBFS": "1f1b"}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return f"{v:g}" if isinstance(v, float) else str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dump(sections: dict) -> str:
    out = []
    for name, body in sections.items():
        out.append(f"[{name}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in body.items()]
        out.append("")
    return "\n".join(out)


def to_toml(plan: dict, model: dict | None, *, dp: int, name: str = "llama3", flavor: str = "custom",
            compile_model: bool = True) -> tuple[str, list[str]]:
    """A torchtitan job config for a plan (``megatron.plan_dict``); notes for what torchtitan lacks.

    ``dp``: the plan's d (``dse.evaluate.derived``), split into replicate x shard degrees.
    """
    notes = []
    t, p, c, e, v = plan["tp"], plan["pp"], plan.get("cp", 1), plan.get("ep", 1), plan.get("vpp", 1)
    d = int(dp)
    z = plan.get("zero", 1)
    piped = stacks.pipelined_fields("torchtitan") if stacks.pipelines(p, z) else {}
    if piped and z != piped["zero"]:
        notes.append(f"ZeRO-{z:g} with a pipeline has no torchtitan form: its FSDP under torch.distributed.pipelining "
                     f"keeps parameters gathered and gradients unsharded over the step (ZeRO-{piped['zero']:g}; "
                     f"the torchtitan stack's pipelined_source)")
    elif z == 1 and not piped:
        notes.append("ZeRO-1 has no torchtitan form: written as FSDP with parameters kept after forward (ZeRO-2)")
    # hybrid sharding: shard within s, replicate d / s (megatron.hybrid_degrees; torchtitan's degrees are whole)
    h = megatron.hybrid_degrees(dict(plan, zero=z), d)
    s = d if h is None else h[0]
    par = {"data_parallel_replicate_degree": d if z == 0 else d // s, "data_parallel_shard_degree": 1 if z == 0 else s}
    if piped:
        par["fsdp_reshard_after_forward"] = "default"     # not pp_enabled: kept after forward
    elif z in (1, 2):
        par["fsdp_reshard_after_forward"] = "never"
    elif z == 3:
        par["fsdp_reshard_after_forward"] = "always"
    par.update({"tensor_parallel_degree": t, "enable_async_tensor_parallel": bool(plan.get("tp_comm_overlap")),
                "pipeline_parallel_degree": p})
    if p > 1:
        par["pipeline_parallel_schedule"] = SCHEDULES[(plan.get("schedule", "1f1b"), v > 1)]
        if model is not None and v > 1:
            par["pipeline_parallel_layers_per_stage"] = model["layers"] // (p * v)
        elif v > 1:
            raise InputError("--vpp: torchtitan takes layers per stage; give a model (--preset or --layers)")
        par["pipeline_parallel_microbatch_size"] = plan["mbs"]
    par.update({"context_parallel_degree": c,
                "context_parallel_rotate_method": "alltoall" if plan.get("cp_ring") else "allgather",
                "expert_parallel_degree": e})
    if e > 1:   # torchtitan's ETP defaults to 1 (EP over dp_shard x cp x tp); dse's etp 0 is ETP = TP
        par["expert_tensor_parallel_degree"] = megatron.expert_tp_degree(plan)
    training = {"local_batch_size": plan["gbs"] // d if p > 1 else plan["mbs"], "global_batch_size": plan["gbs"],
                "seq_len": model["seq"] if model else 2048, "mixed_precision_param": "bfloat16"}
    mdl = {"name": name, "flavor": flavor}
    if plan.get("fp8"):
        mdl["converters"] = ["float8"]
        if plan["fp8"] != TENSORWISE:
            notes.append(f"fp8 recipe {FP8_NAMES[float(plan['fp8'])]}: torchtitan's float8 (torchao Float8Linear) "
                         f"scales tensorwise from the current amax; written as tensorwise")
    sections = {"job": {"description": "written by dse launch --format torchtitan"}, "model": mdl,
                "training": training, "parallelism": par,
                "activation_checkpoint": _ac_section(plan.get("recompute", "op"), notes,
                                                     int(plan.get("recompute_every", 1))),
                "compile": {"enable": bool(compile_model), "components": ["model", "loss"]}}
    if plan.get("fp8"):
        gather = bool(plan.get("fp8_param_gather")) and (z >= 2 or bool(piped))    # FSDP all-gathers FP8 weights (dse fp8_param_gather)
        sections["float8"] = {"enable_fsdp_float8_all_gather": gather, "precompute_float8_dynamic_scale_for_fsdp": gather,
                              "filter_fqns": ["output"]}
    if not same_order(plan.get("rank_order", TORCHTITAN_ORDER), TORCHTITAN_ORDER, plan):
        notes.append(f"rank order {plan['rank_order']}: torchtitan's device mesh places ranks as {TORCHTITAN_ORDER}")
    if not plan.get("flash_attention", 1):
        notes.append("flash_attention 0: torchtitan's attention is SDPA (flash); the plan's unfused attention has no form")
    if model is not None:
        notes.append(f"the model shape is torchtitan's [model] {name}/{flavor} (its flavors live in code): "
                     f"L {model['layers']}, h {model['hidden']}, heads {model['heads']}, vocab {model['vocab']}")
    return _dump(sections), notes


# [parallelism] keys parse_toml reads (torchtitan/config/job_config.py Parallelism)
_READ = {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
         "tensor_parallel_degree", "enable_async_tensor_parallel", "pipeline_parallel_degree",
         "pipeline_parallel_schedule", "pipeline_parallel_layers_per_stage", "pipeline_parallel_microbatch_size",
         "context_parallel_degree", "context_parallel_rotate_method", "expert_parallel_degree",
         "expert_tensor_parallel_degree"}


def _ac_section(recompute, notes, every=1):
    """torchtitan's [activation_checkpoint] for a dse recompute mode: "op" is its selective op-level
    policy; dse's "selective" (the attention core only) has no torchtitan policy of its own and is
    written as the op policy, with a note. Full recompute of one layer in ``every`` > 1
    (Plan.recompute_every) is its layer-level selective policy, selective_ac_option = N."""
    recompute = megatron.exported_recompute(recompute, "torchtitan", notes)
    if recompute == "full" and every > 1:
        return {"mode": "selective", "selective_ac_option": str(every)}
    if recompute == "selective":
        notes.append("recompute selective (Megatron's module recompute: the attention core by default) has no "
                     "torchtitan policy: written as selective_ac_option 'op' (dse recompute op)")
    mode = {"op": "selective", "selective": "selective"}.get(recompute, recompute)
    return {"mode": mode, "selective_ac_option": "op"}


def _get(cfg: dict, key: str, *sections, default=None):
    for s in sections:
        if key in cfg.get(s, {}):
            return cfg[s][key]
    return default


def _degrees(cfg: dict, gpus: int | None, source: str, notes: list) -> tuple:
    """(t, p, c, e, d, ZeRO stage, dp_shard) from [parallelism] (or the older [training]) degrees:
    replicate x shard degrees > 1 both are hybrid sharding (HSDP), Plan.dp_shard = the shard degree."""
    S = ("parallelism", "training")
    t, p, c, e = (int(_get(cfg, f"{k}_parallel_degree", *S, default=1)) for k in ("tensor", "pipeline", "context",
                                                                                  "expert"))
    rep = int(_get(cfg, "data_parallel_replicate_degree", *S, default=1))
    shard = int(_get(cfg, "data_parallel_shard_degree", *S, default=-1))
    if shard == -1:          # torchtitan: -1 takes the GPUs the other degrees leave
        if gpus is None:
            raise InputError(f"{source}: data_parallel_shard_degree = -1 needs the GPU count; allowed: --gpus N")
        shard = gpus // (t * c * p * rep)
    reshard = str(_get(cfg, "fsdp_reshard_after_forward", *S, default="default"))
    zero = 0 if shard == 1 else (2 if reshard == "never" else 3)
    piped = stacks.pipelined_fields("torchtitan") if stacks.pipelines(p, zero) else {}
    if piped:   # FSDP under torch.distributed.pipelining: gathered and unsharded over the step
        zero = int(piped["zero"])
        notes.append(f"FSDP with pipeline_parallel_degree {p}: ZeRO-{zero} (the torchtitan stack's pipelined_source: "
                     f"parameters stay gathered and gradients unsharded until the last microbatch)")
    hybrid = shard if rep > 1 and shard > 1 and zero >= 1 else 0
    return t, p, c, e, rep * shard, zero, hybrid


def parse_toml(text: str, *, gpus: int | None = None, layers: int | None = None,
               source: str = "torchtitan config") -> dict:
    """A torchtitan TOML -> {"plan", "model", "cluster", "unmodeled", "notes"} (dse field names).

    ``gpus`` resolves ``data_parallel_shard_degree = -1`` (the rest of the GPUs); ``layers``
    turns ``pipeline_parallel_layers_per_stage`` into stages a rank (dse's vpp).
    """
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{source}: not valid TOML ({exc})") from None
    if "parallelism" not in cfg and "data_parallel_shard_degree" not in cfg.get("training", {}):
        raise InputError(f"{source}: no [parallelism] table; expected a torchtitan job config")
    S = ("parallelism", "training")
    notes, unmodeled = [], []
    t, p, c, e, d, zero, hybrid = _degrees(cfg, gpus, source, notes)
    mbs_local = int(_get(cfg, "local_batch_size", "training", default=_get(cfg, "batch_size", "training", default=1)))
    gbs = int(_get(cfg, "global_batch_size", "training", default=-1))
    if gbs <= 0:
        gbs = mbs_local * d
    mbs = int(_get(cfg, "pipeline_parallel_microbatch_size", *S, default=1)) if p > 1 else mbs_local
    sched = str(_get(cfg, "pipeline_parallel_schedule", *S, default="1F1B"))
    if sched not in _SCHEDULE_BACK:
        raise InputError(f"{source}: pipeline_parallel_schedule {sched!r}; allowed: {', '.join(_SCHEDULE_BACK)}")
    model = {}
    seq = _get(cfg, "seq_len", "training")
    if seq:
        model["seq"] = int(seq)
    lps = _get(cfg, "pipeline_parallel_layers_per_stage", *S)
    vpp = 1
    if lps and layers:      # stages a rank = L / (p x layers a stage)
        if layers % (p * int(lps)):
            raise InputError(f"{source}: pipeline_parallel_layers_per_stage {lps} x pp {p} does not divide "
                             f"layers {layers}; allowed: divisors of layers/pp")
        vpp = layers // (p * int(lps))
    elif lps:
        unmodeled.append(("parallelism.pipeline_parallel_layers_per_stage", int(lps)))   # v needs the layer count
    ac = str(cfg.get("activation_checkpoint", {}).get("mode", "selective"))
    if ac not in ("none", "selective", "full"):
        raise InputError(f"{source}: activation_checkpoint.mode {ac!r}; allowed: none, selective, full")
    every = 1
    if ac == "selective":
        option = str(cfg.get("activation_checkpoint", {}).get("selective_ac_option", "op"))
        if option == "op":
            ac = "op"                     # torchtitan's op-level policy: dse recompute "op" (memory.RECOMPUTE_MODES)
        elif option.isdigit():            # every N-th block fully checkpointed (0: every block): Plan.recompute_every
            ac, every = "full", max(int(option), 1)
        else:
            raise InputError(f"{source}: activation_checkpoint.selective_ac_option {option!r}; allowed: op, "
                             f"an integer N >= 0 (every N-th layer)")
    converters = _get(cfg, "converters", "model", default=[]) or []
    rotate = str(_get(cfg, "context_parallel_rotate_method", *S, default="allgather"))
    etp = megatron.etp_of(_get(cfg, "expert_tensor_parallel_degree", *S, default=1), t, e,   # job_config.py: 1 or tp
                          f"{source}: expert_tensor_parallel_degree", "tensor_parallel_degree")
    plan = {"tp": t, "pp": p, "cp": c, "ep": e, "vpp": vpp, "mbs": mbs, "gbs": gbs, "zero": zero, "dp_shard": hybrid,
            "etp": etp,
            "grad_accum": 1 if zero >= 2 else 0, "recompute": ac, "recompute_every": every,
            "sp": 1 if t > 1 else 0,
            "tp_comm_overlap": 1 if _get(cfg, "enable_async_tensor_parallel", *S, default=False) else 0,
            "fp8": TENSORWISE if "float8" in converters else 0, "fp8_cache": 0,   # torchao re-casts in backward
            "cp_ring": 1 if rotate == "alltoall" else 0,
            "fp8_param_gather": 1 if "float8" in converters and _get(cfg, "enable_fsdp_float8_all_gather", "float8",
                                                                      default=False) else 0,
            "schedule": _SCHEDULE_BACK[sched], "overlap_grad_reduce": 1, "flash_attention": 1,
            "rank_order": TORCHTITAN_ORDER}
    comp = cfg.get("compile", {}).get("enable", _get(cfg, "compile", "training", default=False))
    unmodeled.append(("compile.enable", bool(comp)))
    for k, val in cfg.get("parallelism", {}).items():     # every other parallelism key: listed, not dropped
        if k not in _READ:
            unmodeled.append((f"parallelism.{k}", val))
    for k in ("name", "flavor"):
        if k in cfg.get("model", {}):
            unmodeled.append((f"model.{k}", cfg["model"][k]))
    return {"plan": plan, "model": model, "cluster": {"gpus": t * c * p * d}, "unmodeled": unmodeled,
            "notes": notes, "layers_per_stage": int(lps) if lps else None}


def parse_file(path, *, gpus: int | None = None, layers: int | None = None) -> dict:
    """``parse_toml`` of a file; a missing or unreadable one is one InputError line."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"--torchtitan-config: {str(path)!r} does not exist; allowed: a readable TOML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--torchtitan-config: {str(path)!r} is not readable ({exc.__class__.__name__})") from None
    return parse_toml(text, gpus=gpus, layers=layers, source=str(path))


# --------------------------------------------------------------------------- NeMo 2 / Megatron-Bridge

# dse field -> (Megatron-Bridge ConfigContainer path, NeMo 2 recipe path); values as Megatron's.
_OVERRIDES = {
    "tp": ("model.tensor_model_parallel_size", "trainer.strategy.tensor_model_parallel_size"),
    "pp": ("model.pipeline_model_parallel_size", "trainer.strategy.pipeline_model_parallel_size"),
    "vpp": ("model.virtual_pipeline_model_parallel_size", "trainer.strategy.virtual_pipeline_model_parallel_size"),
    "cp": ("model.context_parallel_size", "trainer.strategy.context_parallel_size"),
    "ep": ("model.expert_model_parallel_size", "trainer.strategy.expert_model_parallel_size"),
    "sp": ("model.sequence_parallel", "trainer.strategy.sequence_parallel"),
    "mbs": ("train.micro_batch_size", "data.micro_batch_size"),
    "gbs": ("train.global_batch_size", "data.global_batch_size"),
    "recompute": ("model.recompute_granularity", "model.config.recompute_granularity"),
    "zero": ("ddp.use_distributed_optimizer", "trainer.strategy.ddp.use_distributed_optimizer"),
    "overlap_grad_reduce": ("ddp.overlap_grad_reduce", "trainer.strategy.ddp.overlap_grad_reduce"),
    "tp_comm_overlap": ("comm_overlap.tp_comm_overlap", "model.config.tp_comm_overlap"),
    "fp8": ("model.fp8", "trainer.plugins.fp8"),
    "fp8_recipe": ("model.fp8_recipe", "trainer.plugins.fp8_recipe"),
    "cp_ring": ("model.cp_comm_type", "model.config.cp_comm_type"),
    "flash_attention": ("model.attention_backend", "model.config.attention_backend"),
    # MoE: the experts' TP degree (Plan.etp: 1 folds EP over TP) and the dispatcher (Plan.ep_node_dedup:
    # Megatron-Core's flex dispatcher with DeepEP), TransformerConfig's fields as Bridge recipes set them
    # (cfg.model.expert_tensor_parallel_size, moe_token_dispatcher_type, moe_flex_dispatcher_backend)
    "etp": ("model.expert_tensor_parallel_size", "trainer.strategy.expert_tensor_parallel_size"),
    "dispatcher": ("model.moe_token_dispatcher_type", "model.config.moe_token_dispatcher_type"),
    "flex_backend": ("model.moe_flex_dispatcher_backend", "model.config.moe_flex_dispatcher_backend"),
}


def nemo_overrides(plan: dict, model: dict | None = None, *, style: str = "bridge") -> tuple[str, list[str]]:
    """Command-line overrides for a Megatron-Bridge (``style="bridge"``) or NeMo 2 (``"nemo"``) recipe.

    Bridge takes ``key=value`` after the recipe script; NeMo 2 ``recipe.<path>=value`` on
    ``nemo llm pretrain``. ZeRO-3 is Megatron-FSDP (``ddp.data_parallel_sharding_strategy``).
    """
    if style not in ("bridge", "nemo"):
        raise InputError(f"style: unknown {style!r}; allowed: bridge, nemo")
    col = 0 if style == "bridge" else 1
    prefix = "" if style == "bridge" else "recipe."
    notes = []
    vals = {"tp": plan["tp"], "pp": plan["pp"], "vpp": plan.get("vpp", 1) if plan.get("vpp", 1) > 1 else None,
            "cp": plan.get("cp", 1), "ep": plan.get("ep", 1), "sp": bool(plan.get("sp") and plan["tp"] > 1),
            "mbs": plan["mbs"], "gbs": plan["gbs"],
            "recompute": None if plan.get("recompute", "none") == "none" else plan["recompute"],
            "zero": plan.get("zero", 0) >= 1, "overlap_grad_reduce": bool(plan.get("overlap_grad_reduce", 1)),
            "tp_comm_overlap": bool(plan.get("tp_comm_overlap")), "fp8": "hybrid" if plan.get("fp8") else None,
            "fp8_recipe": FP8_NAMES[float(plan["fp8"])] if plan.get("fp8") else None,
            "cp_ring": ("p2p" if plan.get("cp_ring") else "allgather") if plan.get("cp", 1) > 1 else None,
            "flash_attention": "flash" if plan.get("flash_attention", 1) else "unfused"}
    if plan.get("ep", 1) > 1:   # the same rules as the Megatron lines (megatron.expert_tp_degree, the dispatcher)
        vals["etp"] = megatron.expert_tp_degree(plan)
        vals["dispatcher"], backend = megatron.dispatcher_of(plan)
        if backend:
            vals["flex_backend"] = backend
    out = []
    for k, v in vals.items():
        path = _OVERRIDES[k][col]
        out.append(f"{prefix}{path}={'null' if v is None else _ov(v)}")
    modules = megatron.exported_modules(plan, model, notes) if plan.get("recompute") == "selective" else None
    if modules is not None:   # TransformerConfig.recompute_modules, a list
        base = _OVERRIDES["recompute"][col].rsplit(".", 1)[0]
        out.append(f"{prefix}{base}.recompute_modules=[{','.join(modules)}]")
    if plan.get("recompute") == "full":   # one layer in N (plan.recompute_every): Megatron's block method
        base = _OVERRIDES["recompute"][col].rsplit(".", 1)[0]
        k = megatron.block_recompute_layers(plan, model, notes)
        out += ([f"{prefix}{base}.recompute_method=uniform", f"{prefix}{base}.recompute_num_layers=1"] if k is None
                else [f"{prefix}{base}.recompute_method=block", f"{prefix}{base}.recompute_num_layers={k}"])
    if plan.get("zero", 0) >= 2:
        ddp = _OVERRIDES["zero"][col].rsplit(".", 1)[0]
        strategy = "optim_grads_params" if plan["zero"] == 3 else "optim_grads"
        out += [f"{prefix}{ddp}.use_megatron_fsdp=true", f"{prefix}{ddp}.data_parallel_sharding_strategy={strategy}"]
    if plan.get("zero", 0) >= 1 and plan.get("overlap_grad_reduce", 1):
        out.append(f"{prefix}{_OVERRIDES['zero'][col].rsplit('.', 1)[0]}.overlap_param_gather=true")
    if plan.get("schedule", "1f1b") != "1f1b":
        notes.append(f"schedule {plan['schedule']}: no recipe override (Megatron's schedule is 1F1B)")
    return "\n".join(out) + "\n", notes


def _ov(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def parse_overrides(text: str, layers: int | None = None) -> dict:
    """Overrides (one ``key=value`` a line or space-separated, Bridge or NeMo 2 paths) -> dse plan fields.
    ``layers`` reads recompute_method=block (the first k layers of each chunk) as plan.recompute_every
    (megatron.block_recompute_every); without it block is read as every layer recomputed."""
    items = {}
    for tok in re.split(r"\s+", text.strip()):
        if not tok or "=" not in tok:
            continue
        k, v = tok.split("=", 1)
        items[k.removeprefix("recipe.").removeprefix("--")] = v
    plan = {}
    back = {path: field for field, paths in _OVERRIDES.items() for path in paths}

    def boolean(v):
        return v.lower() in ("true", "1", "yes")

    ddp_fsdp, strategy = False, None
    for k, v in items.items():
        if k.endswith("use_megatron_fsdp"):
            ddp_fsdp = boolean(v)
        elif k.endswith("data_parallel_sharding_strategy"):
            strategy = v
        elif k.endswith("recompute_method") or k.endswith("recompute_num_layers") or k.endswith("overlap_param_gather"):
            continue
        elif k.endswith("recompute_modules"):
            plan["recompute_modules"] = int(checks.plan_value(f"overrides: {k}", v.strip("[]")))
        elif k in back:
            f = back[k]
            if f in ("tp", "pp", "vpp", "cp", "ep", "mbs", "gbs"):
                plan[f] = 1 if v == "null" else int(v)
            elif f == "recompute":
                plan[f] = "none" if v == "null" else v
            elif f in ("etp", "dispatcher", "flex_backend"):
                plan[f] = v              # read with the plan's TP and EP below
            elif f == "fp8":
                plan[f] = 0 if v == "null" else plan.get(f) or 1     # delayed unless fp8_recipe says otherwise
            elif f == "fp8_recipe":
                if v != "null" and v not in FP8_RECIPES:
                    raise InputError(f"overrides: {k}={v!r}; allowed: {', '.join(FP8_RECIPES)}")
                if v != "null" and plan.get("fp8", 1):
                    plan["fp8"] = int(FP8_RECIPES[v])
            elif f == "cp_ring":
                plan[f] = 1 if v in ("p2p", "a2a+p2p", "null") else 0
            elif f == "flash_attention":
                plan[f] = 0 if v in ("unfused", "local") else 1
            elif f == "zero":
                plan[f] = 1 if boolean(v) else 0
            else:
                plan[f] = 1 if boolean(v) else 0
        else:
            raise InputError(f"overrides: {k!r} is not a key dse writes; allowed: {', '.join(sorted(back))}")
    dispatcher, backend = plan.pop("dispatcher", None), plan.pop("flex_backend", None)
    if "etp" in plan:   # the expert TP degree: 1 folds EP over TP (megatron.etp_of, the Megatron lines' rule)
        plan["etp"] = megatron.etp_of(plan["etp"], plan.get("tp", 1), plan.get("ep", 1),
                                      "overrides: expert_tensor_parallel_size", "tensor_model_parallel_size")
    if dispatcher is not None:   # the flex dispatcher's DeepEP and HybridEP send a token once a node
        plan["ep_node_dedup"] = megatron.node_dedup_of(dispatcher, backend)
    if ddp_fsdp:
        plan["zero"] = 3 if strategy in (None, "optim_grads_params") else 2
        plan["grad_accum"] = 1
    method = next((v for k, v in items.items() if k.endswith("recompute_method")), "uniform")
    if plan.get("recompute") == "full" and method == "block" and layers:
        k = int(next(v for kk, v in items.items() if kk.endswith("recompute_num_layers")))
        plan["recompute_every"] = megatron.block_recompute_every(k, layers, plan.get("pp", 1), plan.get("vpp", 1), [])
    return plan
