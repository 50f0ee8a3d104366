"""Megatron-LM / Megatron-Core command lines, both ways, lossless for what dse models.

Forward (``flags``): a plan, a model and the stack's architecture choices become
Megatron-LM's flags (megatron/training/arguments.py, NVIDIA/Megatron-LM): parallel
sizes, virtual stages, SP, the distributed optimizer or FSDP, recompute granularity,
method and layers, ``--overlap-grad-reduce`` / ``--overlap-param-gather``, FP8 format
and recipe, ``--tp-comm-overlap``, the attention backend, precision, and the model
(normalization, activation, position embedding, tied embeddings, biases, GQA groups,
MoE and MLA fields). Megatron's own argument checks (``validate_args``) are applied
first (``check``), so a plan Megatron would refuse is refused here, in one line.

Reverse (``parse``): such a line (torchrun options and Megatron flags, dashes or
underscores, ``--flag=value`` or ``--flag value``) gives dse's plan, model and cluster
fields. What the line leaves out takes Megatron's default, not dse's (no
``--overlap-grad-reduce`` means the gradient sync runs after the backward pass; the
``auto`` attention backend of Transformer Engine is a fused kernel; ``--cp-comm-type``
defaults to ``p2p``, a ring). Every flag dse does not model is returned in
``unmodeled`` with its value, never dropped without a word.

Rank order: Megatron builds its groups in the order ``tp-cp-ep-dp-pp`` (PP outermost),
or ``tp-cp-ep-pp-dp`` with ``--use-tp-pp-dp-mapping`` (parallel_state.py,
initialize_model_parallel), which is dse's default [TP, CP, EP, PP, DP].
"""

from __future__ import annotations

import re
import shlex
from types import SimpleNamespace

import numpy as np

from dse.equations import schedule, topology, traffic
from dse.equations.degrees import hybrid_shard
from dse.errors import InputError
from dse.inputs import (FP8_NAMES, FP8_RECIPES, RECOMPUTE_NAMES, SCHEDULES, SELECTIVE_MODULES, ModelShape, Plan,
                        checks)
from dse.inputs.plan import module_names

__all__ = ["plan_dict", "model_dict", "arch_defaults", "check", "flags", "torchrun_lines", "expected_log",
           "parse", "complete_model", "uses_fsdp", "launch_env", "mcore_config", "mcore_flags", "merge_into_flags", "vpp_from_layers_per_stage", "MEGATRON_DEFAULTS", "MEGATRON_ORDER", "TP_PP_DP_ORDER"]

PLAN_FIELDS = tuple(Plan.__dataclass_fields__)
MODEL_FIELDS = tuple(ModelShape.__dataclass_fields__)
SCHEDULE_NAMES = {v: k for k, v in SCHEDULES.items()}
MEGATRON_ORDER = "tp,cp,ep,dp,pp"     # parallel_state order 'tp-cp-ep-dp-pp' (Megatron's default)
TP_PP_DP_ORDER = "tp,cp,ep,pp,dp"     # --use-tp-pp-dp-mapping: 'tp-cp-ep-pp-dp' (dse's default)
_INT_KEYS = ("tp", "pp", "mbs", "gbs", "cp", "ep", "zero", "vpp", "sp", "dp_hierarchical", "grad_accum", "fp8",
             "cp_ring", "overlap_grad_reduce", "tp_comm_overlap", "flash_attention", "keep_stage_outputs", "torus_order")

# Plan fields that are fractions (never written as ints)
_FLOAT_KEYS = ("capacity_factor", "offload_optimizer", "offload_activations")
# Plan fields a line leaves out take Megatron's defaults (arguments.py): no SP, no recompute, no
# distributed optimizer, gradient sync after backward, no TP overlap, TE's fused attention, CP by p2p ring.
MEGATRON_DEFAULTS = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "vpp": 1, "mbs": 1, "sp": 0, "recompute": "none", "recompute_modules": 1, "zero": 0,
                     "overlap_grad_reduce": 0, "tp_comm_overlap": 0, "flash_attention": 1, "cp_ring": 1, "fp8": 0,
                     "grad_accum": 0, "capacity_factor": 0.0, "rank_order": MEGATRON_ORDER, "schedule": "1f1b",
                     "dp_hierarchical": 0, "torus_order": 0, "keep_stage_outputs": 0, "first_stage_layers": 0,
                     "last_stage_layers": 0, "embedding_in_split": 0, "loss_in_split": 0, "ep_comm_overlap": 0,
                     "fp8_param_gather": 0, "fp8_tp_comm": 1, "fp8_cache": 1,
                     "fp8_amax_history": 1, "dp_bucket_params": 0, "dp_bucket_copy": 0, "offload_optimizer": 0.0,
                     "offload_gradients": 0, "offload_weights": 0, "offload_activations": 0.0, "offload_overlap": 1,
                     "loss_logit_bytes": 6, "zero3_live_params": 0, "zero3_prefetch_params": 0, "zero3_gather_calls": 0,
                     "zero3_reduce_calls": 0, "zero3_rank_copies": 0, "ep_fp8_dispatch": 0,
                     "attn_kernel_fa2": 0, "grad_bytes": 4, "grad_reduce_bytes": 0, "etp": 0, "ep_node_dedup": 0, "dp_shard": 0, "caching_allocator": 1}
# fp8_tp_comm, fp8_cache: Transformer Engine gathers FP8 inputs under SP and keeps FP8 inputs and weights for
# backward whenever FP8 is on (module/layernorm_linear.py, base.py grad_output_preprocess); Megatron has no
# flag for either, so a line always means 1. Buckets: Megatron-Core's are views of its grad buffer;
# its loss is the vocab-parallel cross-entropy (6 bytes a logit); its memory comes from PyTorch's caching allocator. Its DeepEP dispatcher sends 16-bit tokens
# (megatron/core/transformer/moe/fused_a2a.py: get_hidden_bytes = hidden x max(element size, 2)): no FP8 dispatch.
# Model fields a line leaves out, as Megatron builds the model (arguments.py): multi-head attention,
# dense, GeLU; the expert width is the FFN's (moe_ffn_hidden_size defaults to ffn_hidden_size).
MODEL_DEFAULTS = {"experts": 1, "topk": 1, "ffn_gated": 0, "expert_ffn_hidden": 0, "shared_experts": 0,
                  "moe_layer_freq": 1, "dense_layers": 0, "route_node_limit": 0, "route_groups": 0, "head_dim": 0, "tied_embeddings": 0,
                  "q_lora_rank": 0, "kv_lora_rank": 0, "qk_nope_head_dim": 0, "qk_rope_head_dim": 0, "v_head_dim": 0,
                  "dropout": 1, "window": 0, "window_layers": 0}     # --attention-dropout and --hidden-dropout default 0.1


# --------------------------------------------------------------------------- dse values as plain dicts

def plan_dict(plan: Plan) -> dict:
    """A scalar Plan as Python values: ints for degrees and switches, names for codes."""
    out = {}
    for k, v in plan.to_dict().items():
        x = float(np.asarray(v))
        if k == "recompute":
            out[k] = RECOMPUTE_NAMES[x]
        elif k == "schedule":
            out[k] = SCHEDULE_NAMES[x]
        elif k == "rank_order":
            out[k] = ",".join(topology.rank_order_names(x))
        elif k in _INT_KEYS or x == int(x) and k not in _FLOAT_KEYS:
            out[k] = int(x)
        else:
            out[k] = x
    return out


def model_dict(model: ModelShape) -> dict:
    """A scalar ModelShape as ints (fractions, e.g. moe_layer_freq, kept as floats), in canonical form."""
    out = {}
    for k, v in model.to_dict().items():
        x = float(np.asarray(v))
        out[k] = int(x) if x == int(x) else x
    return _canonical(out)


def _canonical(model: dict) -> dict:
    """One spelling per model: an expert width equal to the FFN's is dse's 0 ("the FFN's width"),
    Megatron's default for --moe-ffn-hidden-size."""
    if model.get("expert_ffn_hidden") and model["expert_ffn_hidden"] == model.get("ffn_hidden"):
        model["expert_ffn_hidden"] = 0
    return model


def arch_defaults(model: dict | None) -> dict:
    """Architecture choices dse does not time but a launch must state (so it builds the same model).

    A gated FFN (SwiGLU) marks the Llama family (Touvron et al. 2023, sec.2.2: RMSNorm, SwiGLU,
    RoPE, no biases, untied output layer); otherwise GPT-3 / Megatron GPT (Brown et al. 2020:
    LayerNorm, GeLU, learned absolute positions, biases, tied embeddings). A model with a
    ``tied_embeddings`` field says so itself.
    """
    gated = bool(model and model.get("ffn_gated"))
    arch = {"normalization": "RMSNorm" if gated else "LayerNorm",
            "position_embedding": "rope" if gated else "learned_absolute",
            "untie_embeddings": 1 if gated else 0, "bias_linear": 0 if gated else 1,
            "precision": "bf16", "fp8_format": "hybrid", "attention_backend": "flash"}
    if model and "tied_embeddings" in model:
        arch["untie_embeddings"] = 0 if model["tied_embeddings"] else 1
    return arch


def ceil_split_last(layers: int, pp: int) -> int | None:
    """The last stage's layers when L does not divide by p: dse times ceil(L/p) layers a stage (seed 000
    sec.2, memory.py), so p-1 stages of ceil(L/p) and the rest on the last (Megatron's
    --decoder-last-pipeline-num-layers). None when p divides L or the rest would be empty."""
    if pp <= 1 or layers % pp == 0:
        return None
    q = -(-layers // pp)
    last = layers - q * (pp - 1)
    return last if last >= 1 else None


def same_order(a: str, b: str, plan: dict) -> bool:
    """Whether two rank orders place this plan's ranks alike: dimensions of size 1 take no place."""
    size = {"tp": plan.get("tp", 1), "cp": plan.get("cp", 1), "ep": plan.get("ep", 1), "pp": plan.get("pp", 1)}

    def used(order):
        return [k for k in order.split(",") if size.get(k, 2) > 1]    # DP counted as used: its size needs N
    return used(a) == used(b)


# --------------------------------------------------------------------------- Megatron's argument checks

def check(plan: dict, model: dict | None = None) -> list[str]:
    """Megatron-LM's argument constraints (arguments.py validate_args) on a plan; notes for what it lacks.

    Raises InputError (one line, the field and the allowed values) where Megatron would refuse
    to start; returns notes for dse choices that have no Megatron flag.
    """
    t, p, c, e, v = plan["tp"], plan["pp"], plan.get("cp", 1), plan.get("ep", 1), plan.get("vpp", 1)
    sp = plan.get("sp", 0) and t > 1
    if e > 1 and t > 1 and not sp:
        # megatron/core/model_parallel_config.py __post_init__: "When using expert parallelism and tensor
        # parallelism, sequence parallelism must be used"
        raise InputError(f"--ep: TP {t} with EP {e} needs sequence parallelism in Megatron-Core "
                         f"(model_parallel_config: 'When using expert parallelism and tensor parallelism, sequence "
                         f"parallelism must be used'); allowed: drop --no-sp, or TP 1")
    if plan.get("tp_comm_overlap") and t > 1 and not sp:
        raise InputError("--tp-overlap: Megatron's --tp-comm-overlap needs --sequence-parallel "
                         "(arguments.py: 'Tensor parallel communication/GEMM overlap can happen only when sequence "
                         "parallelism is enabled'); allowed: with SP")
    if v > 1 and p <= 1:
        # arguments.py: the interleaved schedule needs pipeline-model-parallel size > 1 (> 2 only with
        # --no-overlap-p2p-communication, which dse never writes)
        raise InputError(f"--vpp: the interleaved schedule needs pipeline-model-parallel size > 1 "
                         f"(arguments.py); allowed: pp >= 2 with vpp {v}")
    if model is not None:
        L = model["layers"]
        units = split_units(L, plan)
        if v > 1 and units % (p * v) and not plan.get("first_stage_layers") and not plan.get("last_stage_layers"):
            raise InputError(f"--vpp: layers {L}{'' if units == L else f' + {units - L} (embedding, loss)'} is not a "
                             f"multiple of pp*vpp = {p * v}; allowed: divisors of layers/pp (or uneven first/last stages)")
        if v == 1 and units % p and ceil_split_last(L, p) is None and not plan.get("last_stage_layers") \
                and not plan.get("first_stage_layers"):
            raise InputError(f"--pp: layers {L} over {p} stages leaves the last stage empty at ceil(L/p) a stage; "
                             f"allowed: pp dividing layers, or fewer stages")
        if c > 1 and model["seq"] % (2 * c):
            raise InputError(f"--cp: seq-length {model['seq']} is not a multiple of 2 x context-parallel-size = "
                             f"{2 * c} (arguments.py); allowed: CP dividing seq/2")
        E = model.get("experts", 1)
        if e > 1 and (E <= 1 or E % e):
            raise InputError(f"--ep: {e} does not divide num-experts = {E} (arguments.py); allowed: divisors of experts")
        if model["heads"] % t:
            raise InputError(f"--tp: {t} does not divide num-attention-heads = {model['heads']}; allowed: divisors")
        if model.get("kv_heads", model["heads"]) % t:   # Attention: divide(num_query_groups, tp)
            raise InputError(f"--tp: {t} does not divide num-query-groups = {model['kv_heads']}; allowed: divisors")
    notes = []
    if plan.get("zero") == 3 and (p > 1 or e > 1):
        notes.append("ZeRO-3 is Megatron-FSDP (--use-megatron-fsdp, optim_grads_params); torch FSDP2 "
                     "(--use-torch-fsdp2) refuses PP > 1 and EP > 1 (arguments.py)")
    if plan.get("schedule", "1f1b") != "1f1b":
        notes.append(f"schedule {plan['schedule']}: Megatron-LM has no flag for it (its schedule is 1F1B, "
                     f"interleaved with virtual stages); torchtitan's pipeline_parallel_schedule has one")
    if plan.get("dp_hierarchical"):
        notes.append("hierarchical DP all-reduce: NCCL picks the algorithm (NCCL_ALGO), no Megatron flag")
    for k in ("offload_gradients", "offload_weights", "offload_activations"):
        if plan.get(k):
            notes.append(f"{k}: Megatron-LM has no flag for it (its CPU offload is the optimizer's: "
                         f"--optimizer-cpu-offload); DeepSpeed ZeRO-Offload/ZeRO-Infinity do it")
    if plan.get("offload_optimizer") and not plan.get("zero"):
        raise InputError("--offload-optimizer: Megatron's --optimizer-cpu-offload needs the distributed optimizer "
                         "(--use-distributed-optimizer); allowed: with --zero 1 or more")
    if plan.get("keep_stage_outputs"):
        notes.append("keep_stage_outputs: Megatron always deallocates pipeline outputs "
                     "(deallocate_pipeline_outputs=True); no flag keeps them")
    if plan.get("grad_reduce_bytes") and plan["grad_reduce_bytes"] != plan.get("grad_bytes", 4):
        notes.append(f"gradients kept at {plan.get('grad_bytes', 4):g} bytes and reduced at {plan['grad_reduce_bytes']:g} "
                     "(XLA's way): Megatron reduces its gradient buffer at the buffer's own width "
                     "(--grad-reduce-in-bf16 makes the buffer 16-bit too)")
    if plan.get("zero") == 2 and not plan.get("grad_accum"):
        notes.append("ZeRO-2 with local gradient accumulation keeps ZeRO-1's memory: written as the distributed "
                     "optimizer (--use-distributed-optimizer), read back as ZeRO-1")
    order = plan.get("rank_order", TP_PP_DP_ORDER)
    if not (same_order(order, MEGATRON_ORDER, plan) or same_order(order, TP_PP_DP_ORDER, plan)):
        notes.append(f"rank order {order}: Megatron builds groups as {MEGATRON_ORDER} or, with "
                     f"--use-tp-pp-dp-mapping, {TP_PP_DP_ORDER}; the job will not place ranks as planned")
    return notes


# --------------------------------------------------------------------------- forward

def _zero_flags(plan: dict) -> list:
    z, ga = plan.get("zero", 0), plan.get("grad_accum", 0)
    if z == 1 or (z == 2 and not ga):
        return [("--use-distributed-optimizer", None)]          # optimizer state sharded over DP (ZeRO-1)
    # Megatron-FSDP only saves fsdp_dtensor checkpoints (arguments.py asserts it)
    if z == 2:   # gradients reduce-scattered as they are made, state sharded (ZeRO-2)
        return [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", "optim_grads"),
                ("--ckpt-format", "fsdp_dtensor")]
    if z == 3:   # weights too (ZeRO-3)
        return [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", "optim_grads_params"),
                ("--ckpt-format", "fsdp_dtensor")]
    return []


def _optimizer_instances(plan: dict, dp, notes: list) -> int | None:
    """Megatron-Core's partial distributed optimizer for hybrid sharding: --num-distributed-optimizer-instances
    K = d / s, the optimizer state sharded within d / K ranks and gradients all-reduced across the K
    (the reading ``parse`` takes back); None, with a note, where the line cannot say it."""
    s = plan.get("dp_shard") or 0
    if not s or plan.get("zero", 0) < 1:
        return None
    if dp is None:
        notes.append(f"dp_shard {s:g} (hybrid sharding): Megatron-Core's form is --num-distributed-optimizer-instances "
                     f"d / {s:g}, which needs d (dse launch gives it); not written")
        return None
    if uses_fsdp(plan):
        notes.append(f"dp_shard {s:g} (hybrid sharding) under Megatron-FSDP (ZeRO-{plan['zero']:g}) has no flag dse "
                     f"writes; sharded over all of d = {dp:g}")
        return None
    h = hybrid_degrees(plan, dp)
    return None if h is None else h[1]


def exported_recompute(recompute: str, tool: str, notes: list) -> str:
    """The recompute mode a ``tool`` launch line writes for a dse mode: MaxText's qkv (save_qkv_proj) has
    no policy outside MaxText, so full recompute, with a note; every other mode as it is."""
    if recompute != "qkv":
        return recompute
    notes.append(f"recompute qkv (MaxText's save_qkv_proj) has no {tool} policy: written as full recompute "
                 f"(which also reruns the Q, K, V projections)")
    return "full"


def hybrid_degrees(plan: dict, dp: int) -> tuple[int, int] | None:
    """(s, r): the shard group and replica degrees a launch line writes for a plan dict's hybrid
    sharding (degrees.hybrid_shard, the rule evaluate reads: s = min(dp_shard, d) under ZeRO >= 1,
    r = d / s); None without it, or where s does not split d into whole groups. The Megatron and
    torchtitan exporters both write it."""
    h = hybrid_shard(dp, SimpleNamespace(dp_shard=float(plan.get("dp_shard", 0) or 0), zero=float(plan.get("zero", 1))))
    if h is None or float(h[1]) <= 1 or dp % int(h[0]):
        return None
    return int(h[0]), int(dp // int(h[0]))


def uses_fsdp(plan: dict) -> bool:
    """Whether the Megatron line runs Megatron-FSDP (ZeRO-2 with reduce-scatter, ZeRO-3)."""
    return plan.get("zero", 0) == 3 or (plan.get("zero", 0) == 2 and bool(plan.get("grad_accum")))


def launch_env(plan: dict) -> dict:
    """Environment Megatron checks at start-up (arguments.py): CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP > 1
    (Hopper and earlier) unless FSDP runs, which refuses 1; left unset there."""
    if uses_fsdp(plan):
        return {"CUDA_DEVICE_MAX_CONNECTIONS": None}
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if plan["tp"] > 1 or plan.get("cp", 1) > 1 else {}


def _moe_flags(model: dict, plan: dict, gpus_per_node: int) -> list:
    out = [("--num-experts", model["experts"]), ("--moe-router-topk", model["topk"])]
    width = model.get("expert_ffn_hidden") or model["ffn_hidden"]
    out.append(("--moe-ffn-hidden-size", width))
    if model.get("shared_experts"):   # "num_shared_experts * ffn_size_of_each_shared_expert" (arguments.py)
        out.append(("--moe-shared-expert-intermediate-size", int(model["shared_experts"] * width)))
    k, freq = model.get("dense_layers", 0), model.get("moe_layer_freq", 1)
    if k or freq != 1:
        L = model["layers"]
        n_moe = round((L - k) * freq)
        out.append(("--moe-layer-freq", f"([0]*{k}+[1]*{n_moe}+[0]*{L - k - n_moe})"))
    if model.get("route_node_limit"):   # node-limited routing: groups = nodes of the EP group (arguments.py help)
        groups = int(model.get("route_groups") or 0) or max(int(model["route_node_limit"]), -(-plan.get("ep", 1) // gpus_per_node))
        out += [("--moe-router-num-groups", groups), ("--moe-router-group-topk", int(model["route_node_limit"]))]
    if plan.get("capacity_factor"):
        out.append(("--moe-expert-capacity-factor", f"{plan['capacity_factor']:g}"))
    dispatcher, backend = dispatcher_of(plan)
    out.append(("--moe-token-dispatcher-type", dispatcher))
    if backend:
        out.append(("--moe-flex-dispatcher-backend", backend))
    out.append(("--moe-grouped-gemm", None))
    return out


_MLA = (("q_lora_rank", "--q-lora-rank"), ("kv_lora_rank", "--kv-lora-rank"), ("qk_nope_head_dim", "--qk-head-dim"),
        ("qk_rope_head_dim", "--qk-pos-emb-head-dim"), ("v_head_dim", "--v-head-dim"))


def _model_flags(model: dict, plan: dict, arch: dict, gpus_per_node: int) -> list:
    out = [("--num-layers", model["layers"]), ("--hidden-size", model["hidden"]),
           ("--num-attention-heads", model["heads"])]
    if model.get("kv_heads", model["heads"]) != model["heads"]:
        out += [("--group-query-attention", None), ("--num-query-groups", model["kv_heads"])]
    if model.get("head_dim"):
        out.append(("--kv-channels", model["head_dim"]))
    if model.get("kv_lora_rank"):
        out.append(("--multi-latent-attention", None))
        out += [(f, model[k]) for k, f in _MLA if model.get(k)]
    out += [("--ffn-hidden-size", model["ffn_hidden"]), ("--seq-length", model["seq"]),
            ("--max-position-embeddings", model["seq"]), ("--vocab-size", model["vocab"]),
            ("--make-vocab-size-divisible-by", 1)]      # the vocabulary as given, not padded to 128 x TP
    if model.get("ffn_gated"):
        out.append(("--swiglu", None))
    if not model.get("dropout", 1):      # Megatron drops out at 0.1 unless told otherwise
        out += [("--attention-dropout", 0.0), ("--hidden-dropout", 0.0)]
    out += [("--normalization", arch["normalization"]), ("--position-embedding-type", arch["position_embedding"])]
    if arch["untie_embeddings"]:
        out.append(("--untie-embeddings-and-output-weights", None))
    if not arch["bias_linear"]:
        out.append(("--disable-bias-linear", None))
    out += _window_flags(model)
    if model.get("experts", 1) > 1:
        out += _moe_flags(model, plan, gpus_per_node)
    return out


def _window_flags(model: dict) -> list:
    """Sliding-window attention: --window-size w,0 (w keys back, none ahead) and, where only some layers
    slide, --window-attn-skip-freq N (arguments.py: one full-attention layer after N - 1 window layers,
    so L - floor(L / N) of them slide; gpt-oss and Gemma 2: N = 2)."""
    w, L = int(model.get("window") or 0), int(model["layers"])
    if w <= 0:
        return []
    n = int(model.get("window_layers") or L)
    out = [("--window-size", f"{w},0")]
    if n < L:
        every = next((k for k in range(2, L + 1) if window_layers_of(L, k) == n), None)
        if every is None:
            raise InputError(f"model.window_layers: {n} of {L} layers has no --window-attn-skip-freq N "
                             f"(L - floor(L/N) window layers); allowed: such a count, or every layer")
        out.append(("--window-attn-skip-freq", every))
    return out


def flags(plan: dict, model: dict | None = None, arch: dict | None = None, *,
          gpus_per_node: int = 8, dp: int | None = None) -> tuple[list[tuple[str, object]], list[str]]:
    """Megatron-LM (flag, value) pairs for a plan (``plan_dict``), and notes for what has no flag.

    ``model`` (``model_dict``) adds the architecture; ``arch`` overrides ``arch_defaults(model)``.
    ``dp`` (d, the data-parallel degree the GPU count gives): hybrid sharding (``dp_shard`` s) under the
    distributed optimizer is written as Megatron-Core's --num-distributed-optimizer-instances d / s.
    ``plan["layers_per_virtual_stage"]`` (without a model) writes
    --num-layers-per-virtual-pipeline-stage; with a model that divides evenly the same flag
    is written as L/(p v) (seed 001's form), otherwise --num-virtual-stages-per-pipeline-rank.
    """
    notes = check(plan, model)
    instances = _optimizer_instances(plan, dp, notes)
    arch = {**arch_defaults(model), **(arch or {})}
    t, v = plan["tp"], plan.get("vpp", 1)
    out = [("--tensor-model-parallel-size", t), ("--pipeline-model-parallel-size", plan["pp"])]
    if plan.get("cp", 1) > 1:
        out += [("--context-parallel-size", plan["cp"]),
                ("--cp-comm-type", "p2p" if plan.get("cp_ring") else "allgather")]
    if plan.get("ep", 1) > 1:
        out.append(("--expert-model-parallel-size", plan["ep"]))
        if expert_tp_degree(plan) != t:   # MoE parallel folding: whole experts, EP over TP x CP x DP
            out.append(("--expert-tensor-parallel-size", expert_tp_degree(plan)))
    lpvs = plan.get("layers_per_virtual_stage")
    units = split_units(model["layers"], plan) if model is not None else None
    if units is not None and v > 1 and not units % (plan["pp"] * v):
        lpvs = units // (plan["pp"] * v)
    if lpvs:
        out.append(("--num-layers-per-virtual-pipeline-stage", lpvs))
    elif v > 1:
        out.append(("--num-virtual-stages-per-pipeline-rank", v))
    for field, flag in (("first_stage_layers", "--decoder-first-pipeline-num-layers"),
                        ("last_stage_layers", "--decoder-last-pipeline-num-layers")):
        if plan.get(field):
            out.append((flag, plan[field]))
    for field, flag in (("embedding_in_split", "--account-for-embedding-in-pipeline-split"),
                        ("loss_in_split", "--account-for-loss-in-pipeline-split"),
                        ("fp8_param_gather", "--fp8-param-gather"), ("ep_comm_overlap", "--overlap-moe-expert-parallel-comm")):
        if plan.get(field):
            out.append((flag, None))
    last = ceil_split_last(model["layers"], plan["pp"]) if units is not None and v == 1 and units % plan["pp"] else None
    if last is not None and not plan.get("last_stage_layers") and not plan.get("first_stage_layers"):
        out.append(("--decoder-last-pipeline-num-layers", last))
    out += [("--micro-batch-size", plan["mbs"]), ("--global-batch-size", plan["gbs"])]
    if same_order(plan.get("rank_order", TP_PP_DP_ORDER), TP_PP_DP_ORDER, plan):
        out.append(("--use-tp-pp-dp-mapping", None))             # dse's [TP, CP, EP, PP, DP]
    if plan.get("sp") and t > 1:
        out.append(("--sequence-parallel", None))
    rc = exported_recompute(plan.get("recompute", "none"), "Megatron-LM", notes)
    if rc in ("selective", "op"):
        out.append(("--recompute-granularity", "selective"))
        modules = exported_modules(plan, model, notes) if rc == "selective" else None
        if modules is not None:
            out.append(("--recompute-modules", modules))
        if rc == "op":
            notes.append("recompute op (torchtitan's op-level policy) has no Megatron-LM flag: written as "
                         "--recompute-granularity selective")
    elif rc == "full" and block_recompute_layers(plan, model, notes) is not None:   # one layer in N: block
        out += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                ("--recompute-num-layers", block_recompute_layers(plan, model, []))]
    elif rc == "full":   # every layer of a stage recomputed (Korthikanti'22 sec.5): uniform, recompute_layers a chunk
        out += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                ("--recompute-num-layers", int(plan.get("recompute_layers", 1)))]
    out += _zero_flags(plan)
    if instances:
        out.append(("--num-distributed-optimizer-instances", instances))
    if plan.get("overlap_grad_reduce", 1):
        out.append(("--overlap-grad-reduce", None))
        if plan.get("zero", 0) >= 1:   # needs the distributed optimizer or FSDP (arguments.py)
            out.append(("--overlap-param-gather", None))
    if plan.get("tp_comm_overlap") and t > 1:
        out.append(("--tp-comm-overlap", None))
    if plan.get("offload_optimizer"):   # Megatron-Core optimizer CPU offload (docs: needs the precision-aware optimizer)
        out += [("--optimizer-cpu-offload", None), ("--optimizer-offload-fraction", f"{plan['offload_optimizer']:g}"),
                ("--use-precision-aware-optimizer", None)]
        if plan.get("offload_overlap", 1):
            out.append(("--overlap-cpu-optimizer-d2h-h2d", None))
    out.append((f"--{arch['precision']}", None))
    reduce_w = float(traffic.grad_reduce_width(plan.get("grad_bytes", 4), plan.get("grad_reduce_bytes", 0)))
    if arch["precision"] == "bf16" and reduce_w == 2:    # a 16-bit gradient reduce, as dse timed it
        out.append(("--grad-reduce-in-bf16", None))
    if plan.get("fp8"):
        out += [("--fp8-format", arch["fp8_format"]), ("--fp8-recipe", FP8_NAMES[float(plan["fp8"])])]
    if plan.get("fp8_amax_history", 1) != 1:
        out.append(("--fp8-amax-history-len", plan["fp8_amax_history"]))
    out.append(("--attention-backend", arch["attention_backend"] if plan.get("flash_attention") else "unfused"))
    if model is not None:
        out += _model_flags(model, plan, arch, gpus_per_node)
    return out, notes


def dispatcher_of(plan: dict) -> tuple[str, str | None]:
    """(--moe-token-dispatcher-type, --moe-flex-dispatcher-backend or None) for a plan: DeepEP's internode
    dispatch, one copy a destination node (Plan.ep_node_dedup), is the flex dispatcher's deepep backend;
    otherwise NCCL's all-to-all, one copy a routed expert."""
    return ("flex", "deepep") if plan.get("ep_node_dedup") else ("alltoall", None)


def node_dedup_of(dispatcher, backend) -> int:
    """Plan.ep_node_dedup of a line's dispatcher: the flex dispatcher's DeepEP and HybridEP backends send a
    token once a destination node (``dispatcher_of`` the other way)."""
    return 1 if dispatcher == "flex" and backend in ("deepep", "hybridep") else 0


def exported_modules(plan: dict, model: dict | None, notes: list) -> list | None:
    """--recompute-modules for a selective plan (Plan.recompute_modules), None where it is Megatron's
    default ["core_attn"]. Megatron refuses mla_up_proj without MLA and moe_act without grouped GEMMs
    (TransformerConfig.__post_init__; dse writes --moe-grouped-gemm for every MoE model): with a model,
    modules it has nothing for are left out, with a note."""
    names = module_names(plan.get("recompute_modules", SELECTIVE_MODULES))
    if model is not None:
        dense = model.get("experts", 1) <= 1
        absent = {"mla_up_proj": not model.get("kv_lora_rank"), "moe": dense, "moe_act": dense,
                  "shared_experts": not model.get("shared_experts")}
        dropped = [n for n in names if absent.get(n)]
        if dropped:
            notes.append(f"--recompute-modules: {', '.join(dropped)} left out (the model has no "
                         f"{'MLA' if dropped == ['mla_up_proj'] else 'such module'}; Megatron refuses it)")
        names = [n for n in names if n not in dropped]
    return None if names == ["core_attn"] else names


def block_recompute_layers(plan: dict, model: dict | None, notes: list) -> int | None:
    """Megatron-LM --recompute-method block --recompute-num-layers k for full recompute of one layer
    in N (plan["recompute_every"] > 1; memory.recomputed_layers): block recomputes the first k layers
    of each chunk of C = L / (p v) layers, dse floor(layers / N) of a stage, so k = floor(C / N)
    (the same count when N divides C). None: every layer (N = 1), or no model to count layers."""
    every = int(plan.get("recompute_every", 1))
    if every <= 1:
        return None
    if model is None:
        notes.append(f"recompute full every {every}: --recompute-method block needs the layer count; "
                     f"written as every layer recomputed (give a model)")
        return None
    chunk = int(model["layers"]) // (int(plan["pp"]) * int(plan.get("vpp", 1)))
    if chunk % every:
        notes.append(f"recompute full every {every}: {chunk // every} of each chunk's {chunk} layers "
                     f"(--recompute-num-layers {chunk // every}, block)")
    return chunk // every


def block_recompute_every(k: int, layers, pp: int, vpp: int, notes: list) -> int:
    """plan.recompute_every for Megatron's --recompute-method block --recompute-num-layers k: the
    first k layers of each chunk of C = L / (p v) recomputed is one layer in N = C / k
    (memory.recomputed_layers: floor(C / N)); N = C // k where k does not divide C (a note says
    how many dse recomputes). Without the layer count: 1 (every layer), with a note."""
    if not layers:
        notes.append(f"--recompute-method block --recompute-num-layers {k}: no layer count; "
                     f"dse times full recompute of every layer")
        return 1
    chunk = int(layers) // (int(pp) * int(vpp))
    if k <= 0:
        notes.append("--recompute-method block --recompute-num-layers 0: no layer recomputed; "
                     f"dse times full recompute of one layer in {chunk + 1} (none)")
        return chunk + 1
    every = max(chunk // k, 1)
    if chunk // every != k:
        notes.append(f"--recompute-method block --recompute-num-layers {k}: dse recomputes one layer in "
                     f"{every}, {chunk // every} of each chunk's {chunk}")
    return every


def torchrun_lines(nnodes: int, nproc: int, pairs, script: str = "train.py",
                   rdzv: str = "${MASTER_ADDR}:${MASTER_PORT:-29500}") -> list[str]:
    """The launch as lines joined by `` \\``: one flag a line, batch sizes together (seed 001's layout).

    The head carries torchrun's c10d rendezvous (torch.distributed.run: --rdzv-backend,
    --rdzv-endpoint, --rdzv-id), so every node's agent meets the others; ``rdzv=None`` drops it.
    """
    head = f"torchrun --nnodes={nnodes} --nproc-per-node={nproc}"
    if rdzv:
        head += f" --rdzv-backend=c10d --rdzv-endpoint={rdzv} --rdzv-id=${{JOB_ID:-dse}}"
    lines = [f"{head} {script}"]
    pairs = list(pairs)
    joined = {"--micro-batch-size": 1, "--group-query-attention": 1, "--recompute-granularity": 2,
              "--fp8-format": 1, "--use-megatron-fsdp": 2}
    i = 0
    while i < len(pairs):
        f, v = pairs[i]
        text = f if v is None else f"{f} {_q(v)}"
        n = joined.get(f, 0) if not (f == "--recompute-granularity" and v != "full") else 0
        for f2, v2 in pairs[i + 1:i + 1 + n]:
            text += f" {f2}" if v2 is None else f" {f2} {_q(v2)}"
        lines.append("    " + text)
        i += 1 + n
    return [ln + " \\" for ln in lines[:-1]] + [lines[-1]]


def arg_tokens(pairs) -> list[str]:
    """A line's (flag, value) pairs as argv tokens: a flag alone, or with its value, or with each of a
    list's values (nargs='*' flags: --recompute-modules layernorm moe_act)."""
    out = []
    for f, v in pairs:
        out.append(f)
        if v is not None:
            out += [str(x) for x in v] if isinstance(v, (list, tuple)) else [str(v)]
    return out


def _q(v) -> str:
    if isinstance(v, (list, tuple)):
        return " ".join(_q(x) for x in v)
    s = str(v)
    return shlex.quote(s) if re.search(r"[^\w.,:/=+-]", s) else s


def expected_log(world: int, dp: int, vpp: int, plan: dict | None = None) -> list[str]:
    """What Megatron should say at start-up for this plan: seed 001's '>' lines and, given the plan,
    Megatron-LM's own summary lines (arguments.py validate_args), which ``dse check-log`` reads back."""
    out = [f"> world size {world}, data-parallel size {dp}"]
    if vpp > 1:
        out.append(f"> using interleaved pipeline schedule, virtual stages {vpp}")
    if plan is not None:
        out.append(f"using world size: {world}, data-parallel size: {dp}, context-parallel size: {plan.get('cp', 1)}, "
                   f"hierarchical context-parallel sizes: None, tensor-model-parallel size: {plan['tp']}, "
                   f"pipeline-model-parallel size: {plan['pp']}")
        out.append(f"Number of virtual stages per pipeline stage: {vpp if vpp > 1 else None}")
    return out


# --------------------------------------------------------------------------- reverse

_INT = {   # flag -> (where, field)
    "--tensor-model-parallel-size": ("plan", "tp"), "--pipeline-model-parallel-size": ("plan", "pp"),
    "--context-parallel-size": ("plan", "cp"), "--expert-model-parallel-size": ("plan", "ep"),
    "--num-virtual-stages-per-pipeline-rank": ("plan", "vpp"),
    "--num-layers-per-virtual-pipeline-stage": ("x", "layers_per_virtual_stage"),
    "--decoder-first-pipeline-num-layers": ("plan", "first_stage_layers"),
    "--decoder-last-pipeline-num-layers": ("plan", "last_stage_layers"),
    "--micro-batch-size": ("plan", "mbs"), "--global-batch-size": ("plan", "gbs"),
    "--fp8-amax-history-len": ("plan", "fp8_amax_history"),
    "--recompute-num-layers": ("x", "recompute_num_layers"),
    "--num-distributed-optimizer-instances": ("x", "dist_opt_instances"),
    "--expert-tensor-parallel-size": ("x", "expert_tp"),
    "--num-layers": ("model", "layers"), "--hidden-size": ("model", "hidden"),
    "--num-attention-heads": ("model", "heads"), "--num-query-groups": ("model", "kv_heads"),
    "--ffn-hidden-size": ("model", "ffn_hidden"), "--seq-length": ("model", "seq"),
    "--vocab-size": ("model", "vocab"), "--kv-channels": ("model", "head_dim"),
    "--num-experts": ("model", "experts"), "--moe-router-topk": ("model", "topk"),
    "--moe-ffn-hidden-size": ("model", "expert_ffn_hidden"),
    "--moe-shared-expert-intermediate-size": ("x", "shared_width"),
    "--moe-router-group-topk": ("model", "route_node_limit"), "--moe-router-num-groups": ("model", "route_groups"),
    "--max-position-embeddings": ("x", "max_position_embeddings"),
    "--make-vocab-size-divisible-by": ("x", "vocab_divisor"),
    **{f: ("model", k) for k, f in _MLA},
}
_CHOICE = {   # flag -> (where, field, allowed)
    "--recompute-granularity": ("plan", "recompute", ("full", "selective")),
    "--recompute-method": ("x", "recompute_method", ("uniform", "block")),
    "--fp8-format": ("arch", "fp8_format", ("e4m3", "hybrid")),
    "--fp8-recipe": ("arch", "fp8_recipe", ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")),
    "--attention-backend": ("arch", "attention_backend", ("flash", "fused", "unfused", "local", "auto")),
    "--normalization": ("arch", "normalization", ("LayerNorm", "RMSNorm")),
    "--position-embedding-type": ("arch", "position_embedding", ("learned_absolute", "rope", "mrope", "relative", "none")),
    "--cp-comm-type": ("x", "cp_comm_type", ("p2p", "a2a", "allgather", "a2a+p2p")),
    "--data-parallel-sharding-strategy": ("x", "fsdp_strategy", ("no_shard", "optim", "optim_grads", "optim_grads_params")),
    "--transformer-impl": ("x", "transformer_impl", ("local", "transformer_engine")),
    "--moe-layer-freq": ("x", "moe_layer_freq", None),
    "--attention-dropout": ("x", "attention_dropout", None), "--hidden-dropout": ("x", "hidden_dropout", None),
    "--moe-expert-capacity-factor": ("x", "capacity_factor", None),
    "--optimizer-offload-fraction": ("x", "offload_fraction", None),
    "--moe-token-dispatcher-type": ("x", "dispatcher", ("allgather", "alltoall", "flex")),
    "--window-size": ("x", "window_size", None), "--window-attn-skip-freq": ("x", "window_skip_freq", None),
    "--moe-flex-dispatcher-backend": ("x", "flex_backend", ("deepep", "hybridep")),
    "--ckpt-format": ("x", "ckpt_format", ("torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor")),
}
_SWITCH = {   # store_true flags -> (where, field)
    "--sequence-parallel": ("plan", "sp"), "--overlap-grad-reduce": ("plan", "overlap_grad_reduce"),
    "--tp-comm-overlap": ("plan", "tp_comm_overlap"), "--swiglu": ("model", "ffn_gated"),
    "--use-distributed-optimizer": ("x", "dist_opt"), "--use-torch-fsdp2": ("x", "fsdp2"),
    "--use-megatron-fsdp": ("x", "megatron_fsdp"), "--use-custom-fsdp": ("x", "megatron_fsdp"),
    "--overlap-param-gather": ("x", "overlap_param_gather"), "--use-flash-attn": ("x", "use_flash_attn"),
    "--recompute-activations": ("x", "recompute_activations"), "--group-query-attention": ("x", "gqa"),
    "--untie-embeddings-and-output-weights": ("arch", "untie_embeddings"),
    "--disable-bias-linear": ("x", "disable_bias"), "--bf16": ("x", "bf16"), "--fp16": ("x", "fp16"),
    "--multi-latent-attention": ("x", "mla"), "--use-tp-pp-dp-mapping": ("x", "tp_pp_dp"),
    "--use-rotary-position-embeddings": ("x", "rope"), "--moe-grouped-gemm": ("x", "grouped_gemm"),
    "--account-for-embedding-in-pipeline-split": ("plan", "embedding_in_split"),
    "--fp8-param-gather": ("plan", "fp8_param_gather"),
    "--overlap-moe-expert-parallel-comm": ("plan", "ep_comm_overlap"),
    "--account-for-loss-in-pipeline-split": ("plan", "loss_in_split"),
    "--optimizer-cpu-offload": ("x", "cpu_offload"), "--overlap-cpu-optimizer-d2h-h2d": ("x", "cpu_offload_overlap"),
    "--use-precision-aware-optimizer": ("x", "precision_aware_optimizer"),
    "--grad-reduce-in-bf16": ("x", "grad_reduce_in_bf16"),
}
_TORCHRUN = {"--nnodes": "nnodes", "--nproc-per-node": "nproc_per_node", "--nproc_per_node": "nproc_per_node"}
_TORCHRUN_OTHER = ("--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--node-rank", "--master-addr", "--master-port",
                   "--max-restarts", "--rdzv-conf", "--standalone", "--monitor-interval", "--redirects", "--tee")


def _int(flag: str, value: str) -> int:
    try:
        x = int(value)
    except (TypeError, ValueError):
        raise InputError(f"--megatron-args: {flag} {value!r} is not an integer; allowed: an integer >= 0") from None
    if x < 0:
        raise InputError(f"--megatron-args: {flag} {value!r} is not allowed; allowed: an integer >= 0")
    return x


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text.replace("\\\n", " "), comments=False)
    except ValueError as exc:
        raise InputError(f"--megatron-args: cannot split the command line ({exc})") from None


def _scan(toks: list[str]) -> tuple[dict, list]:
    """Flag values by kind; unknown flags with their values, in order."""
    got = {"plan": {}, "model": {}, "arch": {}, "x": {}, "launch": {}}
    unknown = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if not tok.startswith("--"):
            i += 1
            continue
        name, eq, val = tok.partition("=")
        name = name.replace("_", "-")
        has_next = i + 1 < len(toks) and not toks[i + 1].startswith("--")

        def value():
            nonlocal i
            if eq:
                return val
            if not has_next:
                raise InputError(f"--megatron-args: {name} needs a value")
            i += 1
            return toks[i]

        if name == "--recompute-modules":   # nargs='*': the names up to the next flag (arguments.py)
            names = val.replace(",", " ").split() if eq else []
            while not eq and i + 1 < len(toks) and not toks[i + 1].startswith("--"):
                i += 1
                names.append(toks[i])
            got["x"]["recompute_modules"] = names
        elif name in _TORCHRUN:
            got["launch"][_TORCHRUN[name]] = _int(name, value().split(":")[-1])
        elif name in _TORCHRUN_OTHER:
            got["launch"][name] = value() if (eq or has_next) and name != "--standalone" else True
        elif name in _INT:
            where, field = _INT[name]
            got[where][field] = _int(name, value())
        elif name in _CHOICE:
            where, field, allowed = _CHOICE[name]
            v = value()
            if allowed and v not in allowed:
                raise InputError(f"--megatron-args: {name} {v!r}; allowed: {', '.join(allowed)}")
            got[where][field] = v
        elif name in _SWITCH:
            where, field = _SWITCH[name]
            got[where][field] = 1
        else:
            unknown.append((name, value() if (eq or has_next) else None))
        i += 1
    return got, unknown


def _moe_pattern(text: str, layers: int | None) -> tuple[int, float] | None:
    """(leading dense layers, MoE share of the rest) from --moe-layer-freq: an int N (1 in N) or a list pattern."""
    if re.fullmatch(r"\d+", text.strip()):
        return 0, 1.0 / int(text)
    if re.search(r"[^,\d\[\]\(\)\+\*\s]", text):     # the characters arguments.py's _eval_pattern allows
        raise InputError(f"--megatron-args: --moe-layer-freq {text!r}; allowed: an integer or a list pattern")
    seq = []
    for part in re.findall(r"\[([01])\]\s*\*\s*(\d+)|\[([01](?:\s*,\s*[01])*)\]", text):
        if part[0]:
            seq += [int(part[0])] * int(part[1])
        else:
            seq += [int(x) for x in part[2].split(",")]
    m = re.search(r"\)\s*\*\s*(\d+)\s*$", text)
    if m and text.strip().startswith("("):
        seq *= int(m.group(1))
    if not seq:
        raise InputError(f"--megatron-args: --moe-layer-freq {text!r} names no layer")
    k = next((i for i, x in enumerate(seq) if x), len(seq))
    rest = seq[k:]
    return k, (sum(rest) / len(rest)) if rest else 0.0


# Flags dse reads and writes so a line launches, which change none of its figures (listed as "settings").
_SETTINGS = {"dispatcher": "--moe-token-dispatcher-type", "grouped_gemm": "--moe-grouped-gemm",
             "ckpt_format": "--ckpt-format", "transformer_impl": "--transformer-impl",
             "vocab_divisor": "--make-vocab-size-divisible-by", "max_position_embeddings": "--max-position-embeddings"}


def parse(text: str) -> dict:
    """A Megatron/torchrun command line -> plan, model, cluster, arch, unmodeled flags and notes.

    ``plan`` holds every plan field Megatron decides, at Megatron's defaults where the line is
    silent (MEGATRON_DEFAULTS); ``model`` and ``cluster`` only what the line says
    (``cluster["gpus"]`` = nnodes x nproc-per-node). ``unmodeled``: [(flag, value)] dse has no
    field for; ``settings``: flags a launch needs that change no dse figure; ``notes``: how a
    flag was read where Megatron and dse differ, and what Megatron's own checks would refuse.
    """
    got, unknown = _scan(_tokens(text))
    if not any(got[k] for k in ("plan", "model", "arch", "x")):
        raise InputError("--megatron-args: no Megatron-LM flag found (expected --tensor-model-parallel-size, "
                         "--pipeline-model-parallel-size, --micro-batch-size, ...)")
    notes = []
    plan = _plan_of(got, notes)
    model = _model_of(got, plan, notes)
    if plan["recompute"] == "full" and got["x"].get("recompute_method", "uniform") == "block":
        plan["recompute_every"] = block_recompute_every(int(got["x"].get("recompute_num_layers", 1)),
                                                        model.get("layers"), plan["pp"], plan["vpp"], notes)
    arch = _arch_of(got["arch"], got["x"], model, notes)
    if "layers" in model:   # the model states its embedding tie; Megatron ties unless told to untie
        model["tied_embeddings"] = 0 if arch.get("untie_embeddings") else 1
        rates = [got["x"].get(k, 0.1) for k in ("attention_dropout", "hidden_dropout")]   # arguments.py defaults
        model["dropout"] = 1 if any(float(r) > 0 for r in rates) else 0
    full = complete_model(model) if {"layers", "heads", "seq"} <= set(model) else None
    try:
        check(plan, full)
    except InputError as exc:      # read anyway, so the line can be looked at; say Megatron refuses it
        notes.append(f"Megatron-LM would refuse this line: {exc}")
    launch, cluster = got["launch"], {}
    if "nnodes" in launch and "nproc_per_node" in launch:
        cluster["gpus"] = launch["nnodes"] * launch["nproc_per_node"]
    instances = int(got["x"].get("dist_opt_instances", 1))
    if instances > 1:   # Megatron-Core's partial distributed optimizer: sharded within d / K ranks, K replicas
        if "gpus" in cluster and plan["zero"] >= 1:
            plan["dp_shard"] = cluster["gpus"] // (plan["tp"] * plan["cp"] * plan["pp"]) // instances
        else:
            notes.append(f"--num-distributed-optimizer-instances {instances}: hybrid sharding (dp_shard = d / "
                         f"{instances}) needs the GPU count (torchrun --nnodes and --nproc-per-node) and "
                         f"--use-distributed-optimizer; read as sharded over all of d")
    if "nproc_per_node" in launch:
        cluster["gpus_per_node"] = launch["nproc_per_node"]
    unmodeled = list(unknown)
    settings_extra = []
    if (plan.get("last_stage_layers") and not plan.get("first_stage_layers") and "layers" in model
            and plan.get("vpp", 1) == 1 and plan["last_stage_layers"] == ceil_split_last(model["layers"], plan["pp"])):
        # the split dse times (ceil(L/p) a stage, the rest last): a setting, not an unmodeled choice
        settings_extra.append(("--decoder-last-pipeline-num-layers", plan.pop("last_stage_layers")))
        plan["last_stage_layers"] = 0          # dse's 0: the split it times
    for k in [k for k in plan if k not in PLAN_FIELDS and k != "layers_per_virtual_stage"]:
        unmodeled.append((_flag_of("plan", k), plan.pop(k)))
    for k in [k for k in model if k not in MODEL_FIELDS]:
        unmodeled.append((_flag_of("model", k), model.pop(k)))
    settings = [(f, got["x"][k]) for k, f in _SETTINGS.items() if k in got["x"]] + settings_extra
    return {"plan": plan, "model": model, "cluster": cluster, "arch": arch, "unmodeled": unmodeled,
            "settings": settings, "notes": notes, "launch": launch}


def _plan_of(got: dict, notes: list) -> dict:
    """Plan fields from the scanned flags, Megatron's defaults for the rest."""
    x = got["x"]
    plan = {**MEGATRON_DEFAULTS, **got["plan"]}
    if x.get("recompute_activations"):          # arguments.py: --recompute-activations sets granularity selective
        plan["recompute"] = "selective"
    # selective's modules: the line's --recompute-modules, else Megatron's default ["core_attn"]
    plan["recompute_modules"] = int(SELECTIVE_MODULES)
    if "recompute_modules" in x:
        try:
            plan["recompute_modules"] = int(checks.plan_value("--recompute-modules", x["recompute_modules"]))
        except InputError as exc:
            raise InputError(f"--megatron-args: {exc}") from None
        if plan["recompute"] != "selective":
            notes.append("--recompute-modules without --recompute-granularity selective: Megatron ignores it")
    plan["recompute_layers"] = 1
    plan["recompute_every"] = 1
    if plan["recompute"] == "full" and x.get("recompute_method", "uniform") == "uniform":
        plan["recompute_layers"] = int(x.get("recompute_num_layers", 1))     # one checkpoint a chunk of N layers
    # block (the first k layers of each chunk): plan.recompute_every, once parse knows the layers and v
    plan["zero"], plan["grad_accum"] = _zero_of(x)
    plan["flash_attention"] = _flash_of(got["arch"], x)
    # the flex dispatcher's DeepEP and HybridEP backends send a token once a destination node
    plan["ep_node_dedup"] = node_dedup_of(x.get("dispatcher"), x.get("flex_backend"))
    # arguments.py: expert_tensor_parallel_size defaults to TP
    plan["etp"] = etp_of(x.get("expert_tp", plan["tp"]), plan["tp"], plan["ep"], "--expert-tensor-parallel-size",
                         "--tensor-model-parallel-size")
    cc = x.get("cp_comm_type", "p2p")
    plan["cp_ring"] = 1 if cc in ("p2p", "a2a+p2p") else 0
    if cc in ("a2a", "a2a+p2p"):
        notes.append(f"--cp-comm-type {cc}: dse times CP as a ring (p2p) or a K/V all-gather; read as "
                     f"{'ring' if plan['cp_ring'] else 'all-gather'}")
    recipe = got["arch"].pop("fp8_recipe", "delayed")   # a plan choice (the Plan's fp8 code), not architecture
    if "fp8_format" in got["arch"]:   # --fp8-format turns FP8 on; --fp8-recipe picks the recipe (default delayed)
        if recipe not in FP8_RECIPES or recipe == "none":
            notes.append(f"--fp8-recipe {recipe}: dse times delayed, tensorwise, mxfp8 and blockwise; read as delayed")
            recipe = "delayed"
        plan["fp8"] = int(FP8_RECIPES[recipe])
    # Gradient buffers: fp32 unless fp16 (arguments.py forces accumulate_allreduce_grads_in_fp32 with --bf16,
    # and fp32 training keeps fp32 gradients) or --grad-reduce-in-bf16
    plan["grad_bytes"] = 2 if x.get("fp16") or (x.get("bf16") and x.get("grad_reduce_in_bf16")) else 4
    plan["rank_order"] = TP_PP_DP_ORDER if x.get("tp_pp_dp") else MEGATRON_ORDER
    if "capacity_factor" in x:
        plan["capacity_factor"] = float(x["capacity_factor"])
    if x.get("cpu_offload"):   # --optimizer-offload-fraction defaults to 1.0 (arguments.py)
        plan["offload_optimizer"] = _fraction(x.get("offload_fraction", 1.0))
        plan["offload_overlap"] = 1 if x.get("cpu_offload_overlap") else 0
    return plan


def _fraction(value) -> float:
    """--optimizer-offload-fraction: a share 0..1 (checked like every plan share, dse/inputs/checks.py)."""
    try:
        return checks.plan_value("offload_optimizer", value)
    except InputError as exc:
        raise InputError(f"--megatron-args: --optimizer-offload-fraction {str(exc).split(': ', 1)[1]}") from None


def _model_of(got: dict, plan: dict, notes: list) -> dict:
    """Model fields the line states; virtual stages from layers per virtual stage once the layers are known."""
    x, model = got["x"], dict(got["model"])
    if "ffn_gated" in model:
        model["ffn_gated"] = 1
    if "kv_heads" in model and not x.get("gqa"):
        notes.append("--num-query-groups without --group-query-attention: Megatron ignores it (multi-head attention)")
        model.pop("kv_heads")
    _moe_fields(model, x, notes)
    _window_fields(model, x, notes)
    _canonical(model)
    lpvs = x.get("layers_per_virtual_stage")
    if lpvs and "layers" in model:
        plan["vpp"] = int(vpp_from_layers_per_stage(split_units(model["layers"], plan), plan["pp"], lpvs))
    elif lpvs:
        plan["layers_per_virtual_stage"] = lpvs
    return model


def window_layers_of(layers: int, skip_freq: int) -> int:
    """Layers that slide under --window-attn-skip-freq N (arguments.py: one full-attention layer after N - 1
    window layers): L - floor(L / N). ``_window_flags`` finds N for a count, ``_window_fields`` the count."""
    return layers - layers // skip_freq


def _window_fields(model: dict, x: dict, notes: list) -> None:
    """--window-size "w,0" (or "(w, 0)") and --window-attn-skip-freq N into window and window_layers
    (L - floor(L / N) layers slide; every layer without the skip flag)."""
    if "window_size" not in x:
        return
    nums = [int(v) for v in re.findall(r"-?\d+", str(x["window_size"]))]
    if len(nums) != 2 or nums[0] <= 0 or nums[1] != 0:
        raise InputError(f"--window-size: {x['window_size']!r} is not allowed; allowed: 'w,0' (w keys back, causal)")
    model["window"] = nums[0]
    skip = str(x.get("window_skip_freq", "")).strip()
    if not skip:
        return
    if not skip.isdigit() or int(skip) < 2:
        notes.append(f"--window-attn-skip-freq {skip}: dse reads an integer N >= 2 (one full layer after N - 1 "
                     f"window layers); read as every layer sliding")
    elif "layers" in model:
        model["window_layers"] = window_layers_of(int(model["layers"]), int(skip))


def complete_model(model: dict) -> dict:
    """A parsed model with Megatron's defaults for what the line leaves out (kv heads = heads, dense, ...)."""
    out = {**MODEL_DEFAULTS, **model}
    if "heads" in out:
        out.setdefault("kv_heads", out["heads"])
    if "hidden" in out and "ffn_hidden" not in out:   # arguments.py: 4h, or 2/3 of it rounded to 64 with SwiGLU
        h = out["hidden"]
        out["ffn_hidden"] = int((4 * h * 2 / 3) / 64) * 64 if out["ffn_gated"] else 4 * h
    return out


def _flag_of(where: str, field: str) -> str:
    for table in (_INT, _SWITCH):
        for f, spec in table.items():
            if spec[0] == where and spec[1] == field:
                return f
    return field


def _zero_of(x: dict) -> tuple[int, int]:
    """ZeRO stage and gradient mode from the optimizer/FSDP flags (arguments.py, distributed/)."""
    if x.get("fsdp2"):
        return 3, 1
    if x.get("megatron_fsdp"):
        s = x.get("fsdp_strategy", "optim_grads_params")   # Megatron-FSDP's default strategy
        return {"no_shard": (0, 0), "optim": (1, 0), "optim_grads": (2, 1), "optim_grads_params": (3, 1)}[s]
    return (1, 0) if x.get("dist_opt") else (0, 0)


def _flash_of(arch: dict, x: dict) -> int:
    """Fused attention unless the line picks the unfused or local path (TE's 'auto' picks flash or cuDNN fused)."""
    if x.get("transformer_impl") == "local" and "attention_backend" not in arch and not x.get("use_flash_attn"):
        return 0
    return 0 if arch.get("attention_backend", "auto") in ("unfused", "local") else 1


def _moe_fields(model: dict, x: dict, notes: list) -> None:
    if "moe_layer_freq" in x:
        k, share = _moe_pattern(x["moe_layer_freq"], model.get("layers"))
        model["dense_layers"] = k
        model["moe_layer_freq"] = int(share) if share == int(share) else share
    if "shared_width" in x:
        width = model.get("expert_ffn_hidden") or model.get("ffn_hidden")
        if not width:
            raise InputError("--megatron-args: --moe-shared-expert-intermediate-size needs --moe-ffn-hidden-size")
        n = x["shared_width"] / width
        model["shared_experts"] = int(n) if n == int(n) else n


def _arch_of(arch: dict, x: dict, model: dict, notes: list) -> dict:
    """Architecture choices at Megatron's defaults (LayerNorm, learned positions, tied, biases, fp32)."""
    out = {"normalization": "LayerNorm", "position_embedding": "learned_absolute", "untie_embeddings": 0,
           "bias_linear": 1, "precision": "fp32", "fp8_format": "hybrid",
           "attention_backend": "auto"}
    out.update({k: v for k, v in arch.items()})
    if x.get("rope"):
        out["position_embedding"] = "rope"
    if x.get("disable_bias"):
        out["bias_linear"] = 0
    if x.get("use_flash_attn") and "attention_backend" not in arch:
        out["attention_backend"] = "flash"
    if x.get("bf16"):
        out["precision"] = "bf16"
    elif x.get("fp16"):
        out["precision"] = "fp16"
    else:
        notes.append("no --bf16 or --fp16: Megatron trains in fp32; dse times 16-bit (or FP8) GEMMs")
    return out


def expert_tp_degree(plan: dict) -> int:
    """The expert tensor-parallel degree a plan's line states: 1 where EP folds over TP (Plan.etp), else
    TP (Megatron's --expert-tensor-parallel-size defaults to TP, torchtitan's expert_tensor_parallel_degree
    to 1: each exporter writes it where its default differs)."""
    return 1 if plan.get("etp") else int(plan["tp"])


def etp_of(degree, tp, ep, flag: str, tp_flag: str) -> int:
    """Plan.etp from a line's expert tensor-parallel degree: 1 for 1 under TP > 1 (folded EP), 0 for the
    TP size. dse times these two; with experts, any other is one line naming ``flag``."""
    degree = int(degree)
    if ep > 1 and degree not in (1, tp):
        raise InputError(f"{flag}: {degree} with {tp_flag} {tp}; allowed: 1 (MoE parallel folding) or the TP "
                         f"size (dse times these two)")
    return 1 if ep > 1 and tp > 1 and degree == 1 else 0


def split_units(layers, plan: dict):
    """The units a line's pipeline split shares out (schedule.split_units): the layers, and the embedding
    and the loss where --account-for-embedding/loss-in-pipeline-split count them."""
    return int(schedule.split_units(layers, int(bool(plan.get("embedding_in_split"))), int(bool(plan.get("loss_in_split")))))


def vpp_from_layers_per_stage(layers: float, pp: float, layers_per_virtual_stage: int) -> float:
    """v = L / (p x layers per virtual stage) (arguments.py), refusing a split that does not divide."""
    per = pp * layers_per_virtual_stage
    if float(layers) % per:
        raise InputError(f"--num-layers-per-virtual-pipeline-stage: {layers_per_virtual_stage} x pp does not divide "
                         f"layers = {float(layers):g}; allowed: divisors of layers/pp")
    return float(layers) / per


def merge_into_flags(parsed: dict, given: dict, dse_defaults: dict) -> dict:
    """dse flag values after a parsed line: a dse flag still at its default yields to the line.

    ``given``: {"p_tp": ..., "m_layers": ..., "c_gpus": ...} as the CLI holds them;
    returns the values to set (the caller owns its namespace). Plan switches become bools,
    names stay names, ZeRO a string like the flag's.
    """
    out = {}
    for k, v in parsed["plan"].items():
        key = f"p_{k}"
        if k == "layers_per_virtual_stage" or key not in given:
            continue
        if given[key] == dse_defaults.get(k):   # a flag add_field_flags made: None until given
            if k == "zero":
                v = str(v)
            elif k == "grad_accum":
                v = "reduce" if v else "local"
            elif isinstance(dse_defaults.get(k), bool):
                v = bool(v)
            out[key] = v
    for k, v in parsed["model"].items():
        if f"m_{k}" in given and given[f"m_{k}"] is None:
            out[f"m_{k}"] = v
    for k, v in parsed["cluster"].items():
        if given.get(f"c_{k}", "missing") is None:
            out[f"c_{k}"] = v
    return out



# --------------------------------------------------------------------------- Megatron-Core configs

# Megatron flag -> (Megatron-Core config, field). core_transformer_config_from_args (arguments.py) copies
# every argument whose dest names a TransformerConfig field; the exceptions are spelled out here.
_MCORE = {
    "--tensor-model-parallel-size": ("TransformerConfig", "tensor_model_parallel_size"),
    "--pipeline-model-parallel-size": ("TransformerConfig", "pipeline_model_parallel_size"),
    "--context-parallel-size": ("TransformerConfig", "context_parallel_size"),
    "--cp-comm-type": ("TransformerConfig", "cp_comm_type"),
    "--expert-model-parallel-size": ("TransformerConfig", "expert_model_parallel_size"),
    "--num-virtual-stages-per-pipeline-rank": ("TransformerConfig", "virtual_pipeline_model_parallel_size"),
    "--decoder-first-pipeline-num-layers": ("TransformerConfig", "num_layers_in_first_pipeline_stage"),
    "--decoder-last-pipeline-num-layers": ("TransformerConfig", "num_layers_in_last_pipeline_stage"),
    "--sequence-parallel": ("TransformerConfig", "sequence_parallel"),
    "--recompute-granularity": ("TransformerConfig", "recompute_granularity"),
    "--recompute-method": ("TransformerConfig", "recompute_method"),
    "--recompute-num-layers": ("TransformerConfig", "recompute_num_layers"),
    "--recompute-modules": ("TransformerConfig", "recompute_modules"),
    "--tp-comm-overlap": ("TransformerConfig", "tp_comm_overlap"),
    "--bf16": ("TransformerConfig", "bf16"), "--fp16": ("TransformerConfig", "fp16"),
    "--fp8-format": ("TransformerConfig", "fp8"), "--fp8-recipe": ("TransformerConfig", "fp8_recipe"),
    "--fp8-amax-history-len": ("TransformerConfig", "fp8_amax_history_len"),
    "--fp8-param-gather": ("DistributedDataParallelConfig", "fp8_param_gather"),
    "--overlap-moe-expert-parallel-comm": ("TransformerConfig", "overlap_moe_expert_parallel_comm"),
    "--account-for-embedding-in-pipeline-split": ("TransformerConfig", "account_for_embedding_in_pipeline_split"),
    "--account-for-loss-in-pipeline-split": ("TransformerConfig", "account_for_loss_in_pipeline_split"),
    "--attention-backend": ("TransformerConfig", "attention_backend"),
    "--num-layers": ("TransformerConfig", "num_layers"), "--hidden-size": ("TransformerConfig", "hidden_size"),
    "--num-attention-heads": ("TransformerConfig", "num_attention_heads"),
    "--num-query-groups": ("TransformerConfig", "num_query_groups"),
    "--kv-channels": ("TransformerConfig", "kv_channels"),
    "--ffn-hidden-size": ("TransformerConfig", "ffn_hidden_size"),
    "--swiglu": ("TransformerConfig", "gated_linear_unit"),
    "--attention-dropout": ("TransformerConfig", "attention_dropout"),
    "--hidden-dropout": ("TransformerConfig", "hidden_dropout"),
    "--normalization": ("TransformerConfig", "normalization"),
    "--disable-bias-linear": ("TransformerConfig", "add_bias_linear"),
    "--multi-latent-attention": ("TransformerConfig", "multi_latent_attention"),
    "--num-experts": ("TransformerConfig", "num_moe_experts"), "--moe-router-topk": ("TransformerConfig", "moe_router_topk"),
    "--moe-ffn-hidden-size": ("TransformerConfig", "moe_ffn_hidden_size"),
    "--moe-shared-expert-intermediate-size": ("TransformerConfig", "moe_shared_expert_intermediate_size"),
    "--moe-layer-freq": ("TransformerConfig", "moe_layer_freq"),
    "--moe-router-num-groups": ("TransformerConfig", "moe_router_num_groups"),
    "--moe-router-group-topk": ("TransformerConfig", "moe_router_group_topk"),
    "--moe-expert-capacity-factor": ("TransformerConfig", "moe_expert_capacity_factor"),
    "--moe-token-dispatcher-type": ("TransformerConfig", "moe_token_dispatcher_type"),
    "--moe-flex-dispatcher-backend": ("TransformerConfig", "moe_flex_dispatcher_backend"),
    "--moe-grouped-gemm": ("TransformerConfig", "moe_grouped_gemm"),
    "--window-size": ("TransformerConfig", "window_size"),            # (w, 0): a tuple in the config
    "--window-attn-skip-freq": ("TransformerConfig", "window_attn_skip_freq"),
    **{f: ("TransformerConfig", k.replace("qk_rope_head_dim", "qk_pos_emb_head_dim")) for k, f in _MLA},
    "--vocab-size": ("GPTModel", "vocab_size"), "--seq-length": ("GPTModel", "max_sequence_length"),
    "--position-embedding-type": ("GPTModel", "position_embedding_type"),
    "--untie-embeddings-and-output-weights": ("GPTModel", "share_embeddings_and_output_weights"),
    "--use-distributed-optimizer": ("DistributedDataParallelConfig", "use_distributed_optimizer"),
    "--overlap-grad-reduce": ("DistributedDataParallelConfig", "overlap_grad_reduce"),
    "--grad-reduce-in-bf16": ("DistributedDataParallelConfig", "grad_reduce_in_fp32"),
    "--overlap-param-gather": ("DistributedDataParallelConfig", "overlap_param_gather"),
    "--use-megatron-fsdp": ("DistributedDataParallelConfig", "use_megatron_fsdp"),
    "--data-parallel-sharding-strategy": ("DistributedDataParallelConfig", "data_parallel_sharding_strategy"),
    "--micro-batch-size": ("training", "micro_batch_size"), "--global-batch-size": ("training", "global_batch_size"),
    "--use-tp-pp-dp-mapping": ("training", "use_tp_pp_dp_mapping"),
    "--ckpt-format": ("training", "ckpt_format"),
}
_INVERTED = {"--disable-bias-linear", "--untie-embeddings-and-output-weights", "--grad-reduce-in-bf16"}   # the flag sets the field False
_MCORE_SKIP = {"--max-position-embeddings", "--make-vocab-size-divisible-by", "--group-query-attention",
               "--num-layers-per-virtual-pipeline-stage"}   # folded into other fields (see mcore_config)


def mcore_config(pairs, model: dict | None = None, plan: dict | None = None) -> dict:
    """Megatron-Core configs for a line's (flag, value) pairs: TransformerConfig, GPTModel arguments,
    DistributedDataParallelConfig and the training loop's batch sizes, as dicts of field names."""
    out = {"TransformerConfig": {}, "GPTModel": {}, "DistributedDataParallelConfig": {}, "training": {}}
    for f, v in pairs:
        if f in _MCORE_SKIP:
            if f == "--num-layers-per-virtual-pipeline-stage" and plan is not None:
                out["TransformerConfig"]["virtual_pipeline_model_parallel_size"] = plan["vpp"]
            continue
        if f not in _MCORE:
            raise InputError(f"mcore_config: {f} has no Megatron-Core field in dse's table")
        where, field = _MCORE[f]
        if f == "--window-size":      # TransformerConfig.window_size is (left, right)
            v = tuple(int(n) for n in str(v).split(","))
        out[where][field] = (False if f in _INVERTED else True) if v is None else v
    return out


def mcore_flags(config: dict) -> list[tuple[str, object]]:
    """The reverse of ``mcore_config``: (flag, value) pairs that ``parse`` reads."""
    back = {(where, field): f for f, (where, field) in _MCORE.items()}
    out = []
    tc = config.get("TransformerConfig", {})
    for where, fields in config.items():
        for field, v in fields.items():
            f = back.get((where, field))
            if f is None:
                raise InputError(f"mcore_flags: {where}.{field} is not a field dse reads")
            if isinstance(v, bool):
                if v != (f in _INVERTED):
                    out.append((f, None))
            elif f == "--num-virtual-stages-per-pipeline-rank" and v == 1:
                continue
            elif f == "--window-size":
                out.append((f, ",".join(str(int(n)) for n in v)))
            else:
                out.append((f, v))
    if tc.get("num_query_groups"):
        out.append(("--group-query-attention", None))
    return out
