"""Fidelity: the numeric knobs that separate seed mode from richer modes.

Seed mode (``Fidelity.seed()``) reproduces the simulator of seed 000 exactly:
Psi = 12 L h^2, top-2 routing over half-width experts, no embeddings, no latency,
sustained FLOP/s equal to the cluster's rate, TP/EP/CP/PP fully exposed and DP
hidden behind up to 2/3 of compute. Every knob is a float array, so a calibrated
mode can fit them by gradient through the same ``evaluate``; each richer effect sits
behind a knob whose seed value switches it off.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from importlib import resources
from pathlib import Path

from dse.backend import register_dataclass
from dse import files
from dse.inputs import checks
from dse.errors import InputError
from dse.inputs.base import Inputs

__all__ = ["Fidelity", "resolve", "calibrated", "SWITCHES", "MODES", "load_params", "fitted_rows",
           "calibration_path", "default_mode", "for_cluster"]


@register_dataclass
@dataclasses.dataclass(frozen=True)
class Fidelity(Inputs):
    """Knobs of the model. Defaults are seed mode."""

    flops_efficiency: jax.Array = 1.0   # sustained / peak FLOP/s (seed: the cluster's rate is sustained)
    dp_overlap: jax.Array = 2.0 / 3.0   # share of compute DP traffic hides behind (seed 000 sec.6)
    tp_overlap: jax.Array = 0.0         # share of TP wire time hidden (seed: exposed)
    cp_overlap: jax.Array = 0.0         # share of CP wire time hidden
    grad_over_cp: jax.Array = 0.0       # 1: gradients reduce and ZeRO shards over DP x CP (degrees.weight_replicas); 0: over DP (seed)
    cp_backward_gather: jax.Array = 0.0  # 1: CP backward gathers K/V again, one exchange a forward of the core (traffic.cp); 0: seed
    ep_overlap: jax.Array = 0.0         # share of EP wire time hidden (DualPipe: ~1)
    pp_overlap: jax.Array = 0.0         # share of PP wire time hidden
    latency: jax.Array = 0.0            # 1 adds alpha per ring step; 0 ignores latency (seed)
    real_shapes: jax.Array = 0.0        # 1: GQA, gated FFN, real experts, embeddings; 0: 12 L h^2
    seed_topk: jax.Array = 2.0          # seed's routing when real_shapes = 0
    seed_expert_width: jax.Array = 0.5  # seed's expert width relative to the 4h FFN
    memory_buffers: jax.Array = 0.0     # 1: logit temporaries, SP/ZeRO/DP buffers, NCCL buffers, CUDA context (memory.py)
    memory_fragmentation: jax.Array = 0.0  # share of the caching allocator's reserved memory left fragmented
    # ---- calibrated-mode knobs (seed values switch each effect off)
    gemm_shape: jax.Array = 0.0         # 1: GEMM efficiency falls with per-rank shape (compute.gemm_efficiency)
    gemm_knee: jax.Array = 1.0          # intensity / machine balance where GEMMs reach half their top rate
    gemm_exponent: jax.Array = 2.0      # sharpness of that knee (fitted on kernel_microbenchmarks.csv)
    gemm_overhead_s: jax.Array = 0.0    # fixed time per GEMM (launch, last partial wave)
    rank_copy_us: jax.Array = 0.0       # microseconds of one copy a collective's per-rank tensor list costs on its stream (Plan.zero3_rank_copies)
    fp8_efficiency: jax.Array = 1.0     # sustained FP8 GEMM rate / FP8 peak, relative to the 16-bit one
    matmul_ceiling: jax.Array = 0.0     # reference matmul ceiling flops_efficiency is relative to (compute.gemm_top_rates; 0: ceilings unused)
    flash_attn_share: jax.Array = 0.0   # reference FlashAttention-2 share the fused rate is relative to (compute.flash_attn_scale; 0: unused)
    attn_efficiency: jax.Array = 1.0    # unfused attention-core (s^2) rate relative to the GEMM rate
    fused_attn_efficiency: jax.Array = 0.0  # fused (FlashAttention) kernel rate / 16-bit peak on the FLOPs it computes (0: unfused rate)
    selective_attn_recompute: jax.Array = 0.0  # attention-core forwards re-run by selective recompute
    zero3_microbatch: jax.Array = 0.0   # 1: ZeRO-3 gathers weights every microbatch (FSDP); 0: once a step (seed)
    bw_up_efficiency: jax.Array = 1.0   # achieved / nominal scale-up bandwidth (bus bandwidth)
    bw_out_efficiency: jax.Array = 1.0  # achieved / nominal scale-out bandwidth
    a2a_up_efficiency: jax.Array = 1.0  # MoE dispatch/combine: achieved / nominal scale-up rate (bulk all-to-all rows)
    a2a_out_efficiency: jax.Array = 1.0  # MoE dispatch/combine: achieved / nominal scale-out rate
    tp_comm_overlap: jax.Array = 0.0    # share of TP wire time hidden when the plan turns TP overlap on
    elementwise_passes: jax.Array = 0.0  # HBM passes over a layer's activations by memory-bound ops (norms, GeLU, dropout, softmax)
    optimizer_step: jax.Array = 0.0     # 1: the Adam update's HBM traffic is added to the step
    hbm_efficiency: jax.Array = 1.0     # achieved / datasheet HBM bandwidth (STREAM)
    moe_imbalance: jax.Array = 1.0      # dropless MoE: busiest expert rank's tokens / mean
    fp8_recipe_terms: jax.Array = 0.0   # 1: an FP8 recipe's copies, FP8 activations, amax state, casts and FP8 TP gathers; 0: GEMM rate only (seed)
    a2a_local_peers: jax.Array = 0.0   # 1: a flat all-to-all's bytes for peers in the rank's own domain go over NVLink at once, only the rest cross the network; 0: all at the network's rate (seed)
    zero3_forward_window: jax.Array = 0.0  # 1: ZeRO-3's forward weight gathers hide behind the forward pass, the rest behind the backward; 0: all behind the backward (seed)

    @classmethod
    def seed(cls) -> "Fidelity":
        return cls.make()


def resolve(fidelity) -> Fidelity:
    """Accept a Fidelity or a mode name."""
    if isinstance(fidelity, Fidelity):
        return fidelity
    if fidelity == "seed":
        return Fidelity.seed()
    if fidelity == "calibrated":
        return calibrated()
    raise InputError(f"fidelity: unknown mode {fidelity!r}; allowed: seed, calibrated")


# ---------------------------------------------------------------- the calibrated mode

# Calibrated mode turns every modelled effect on; these are switches and literature
# values, not fitted.
SWITCHES = {
    "real_shapes": 1.0,               # GQA, gated FFN, experts, embeddings and logits
    "latency": 1.0,                   # alpha per ring step (alpha from the cluster preset)
    "gemm_shape": 1.0,                # GEMM rate falls with per-rank shape
    "selective_attn_recompute": 1.0,  # selective recompute re-runs the attention core forward once (Korthikanti sec.5)
    "zero3_microbatch": 1.0,          # FSDP gathers per microbatch (Zhao et al. 2023 sec.3.3)
    "tp_overlap": 0.0,                # Megatron TP all-reduces sit between dependent GEMMs (seed 000 sec.6)
    "memory_buffers": 1.0,            # the buffers that exist beside the states (dse/equations/memory.py)
    "memory_fragmentation": 0.15,     # GMLake (Guo et al. ASPLOS 2024): 15% of reserved memory fragmented on average
    "optimizer_step": 1.0,            # Adam's HBM traffic after the backward pass
    "grad_over_cp": 1.0,              # CP ranks hold the same weights (Megatron-Core dp-cp group)
    "cp_backward_gather": 1.0,        # CP backward re-gathers K/V (TransformerEngine context_parallel.py)
    "fp8_recipe_terms": 1.0,          # what an FP8 recipe keeps, moves and casts (memory/traffic/compute fp8_* terms)
    "zero3_forward_window": 1.0,      # ZeRO-3/FSDP prefetch the next unit's gather in forward too (Zhao et al. 2023 sec.3.4)
    "a2a_local_peers": 1.0,           # NCCL's all-to-all sends to in-node peers over P2P/NVLink beside the network sends
}
DATA_FILE = "default.toml"


def calibration_path() -> Path:
    return Path(str(resources.files("dse") / "data" / "calibration" / DATA_FILE))


def _load(path=None) -> dict:
    path = Path(path) if path else calibration_path()
    text = files.read_text(path, "calibration", "a file written by dse calibrate")
    try:
        d = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"calibration: {str(path)!r} is not valid TOML ({' '.join(str(exc).split())})") from None
    for table in ("fidelity", "report"):
        if not isinstance(d.get(table, {}), dict):
            raise InputError(f"calibration: [{table}] in {str(path)!r} is not a table; allowed: a file written by dse calibrate")
    return d


def load_params(path=None) -> dict:
    """The fitted parameters of a calibration file (its [fidelity] table)."""
    return dict(_params(str(path) if path else ""))


@functools.lru_cache(maxsize=8)
def _params(path: str) -> dict:
    raw = _load(path or None).get("fidelity", {})
    unknown = set(raw) - set(Fidelity.__dataclass_fields__)
    if unknown:
        raise InputError(f"calibration: unknown knob(s) {sorted(unknown)}; allowed: Fidelity fields")
    return {k: checks.number(f"calibration.{k}", v, minimum=-checks.MAX_MAGNITUDE) for k, v in raw.items()}


def fitted_rows(path=None) -> list[str]:
    """Row ids of calibration_runs.csv the calibration file was fitted on."""
    rows = _load(path).get("report", {}).get("fitted_rows", [])
    if not isinstance(rows, list) or not all(isinstance(r, str) for r in rows):
        raise InputError(f"calibration: report.fitted_rows {rows!r:.60} is not a list of row ids; allowed: a file "
                         f"written by dse calibrate")
    return list(rows)


def calibrated(path=None) -> Fidelity:
    """The calibrated Fidelity: SWITCHES, then the fitted parameters of ``path``."""
    values = dict(SWITCHES)
    values.update(load_params(path))
    return Fidelity.make(**values)




# ---------------------------------------------------------------- which mode by default

MODES = ("seed", "calibrated")


def default_mode(cluster_preset: str | None = None) -> str:
    """The mode a cluster is evaluated in when the user names none: the preset's ``fidelity``
    key (the seed's illustrative cluster says "seed"), else "calibrated" for hardware.

    ``None`` is the seed cluster. The Python API, ``dse plan``, sweeps and co-design all
    call this one function.
    """
    from dse.inputs import presets   # presets read data files; fidelity.py stays import-light

    name = cluster_preset or "seed"
    mode = presets.preset_fields("clusters", name).get("fidelity", "calibrated")
    if mode not in MODES:
        raise InputError(f"fidelity: unknown {mode!r} in cluster preset {name!r}; allowed: {', '.join(MODES)}")
    return mode


def for_cluster(cluster_preset: str | None = None, mode: str | None = None) -> Fidelity:
    """The Fidelity for ``cluster_preset``: ``mode`` when given, else ``default_mode``."""
    return resolve(mode or default_mode(cluster_preset))
