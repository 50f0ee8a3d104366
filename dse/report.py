"""The Report: every figure ``evaluate`` returns, in SI units named in the field."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dse.equations.feasibility import REASON_BIT, REASONS

__all__ = ["PerDim", "Report", "REASONS", "WARNINGS", "reason_names", "warning_names", "DIM_NAMES"]

DIM_NAMES = ("tp", "cp", "ep", "pp", "dp")

# Why a plan is infeasible: bit k of ``Report.reasons`` is rule k of the one feasibility table
# (dse/equations/feasibility.py: REASONS, REASON_BIT).

# What a plan does that works but costs (seed 001, "Failure Modes"): bit k of ``Report.warnings``.
WARNINGS = (
    ("tp_crosses_domain", "the TP group leaves the scale-up domain"),
    ("cp_crosses_domain", "the CP group leaves the scale-up domain"),
    ("ep_crosses_domain", "the EP all-to-all leaves the scale-up domain"),
    ("few_microbatches", "fewer than 4 microbatches per pipeline stage (m < 4p)"),
    ("dp_exposed", "the DP all-reduce does not hide behind the backward pass"),
)
WARNING_BIT = {name: 1 << k for k, (name, _) in enumerate(WARNINGS)}


def _names(bits, table) -> list[str]:
    bits = int(np.asarray(bits))
    return [name for k, (name, _) in enumerate(table) if bits & (1 << k)]


def reason_names(bits) -> list[str]:
    return _names(bits, REASONS)


def warning_names(bits) -> list[str]:
    return _names(bits, WARNINGS)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PerDim:
    """One figure per parallel dimension."""

    tp: jax.Array
    cp: jax.Array
    ep: jax.Array
    pp: jax.Array
    dp: jax.Array

    def to_dict(self):
        return {k: getattr(self, k) for k in DIM_NAMES}

    def total(self):
        return self.tp + self.cp + self.ep + self.pp + self.dp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Report:
    """What one plan costs. Arrays broadcast like the inputs that made them."""

    dp: jax.Array                  # d = N / (t c p)
    microbatches: jax.Array        # m = B / (d b)
    params_total: jax.Array
    params_active: jax.Array
    params_per_rank: jax.Array
    weights_bytes: jax.Array
    grads_bytes: jax.Array
    optimizer_bytes: jax.Array
    activations_bytes: jax.Array
    other_bytes: jax.Array         # temporary buffers, fragmentation (0 in seed mode)
    memory_bytes: jax.Array        # total per accelerator
    fits: jax.Array                # 1.0 when memory_bytes <= HBM
    traffic_bytes: PerDim          # bytes sent per rank per step
    calls: PerDim                  # collective calls per step
    message_bytes: PerDim          # size of one call's buffer
    group_size: PerDim
    inside_domain: PerDim          # 1.0 when the group stays inside a scale-up domain
    wire_s: PerDim
    exposed_s: PerDim
    bubble_fraction: jax.Array     # (p-1)/(v m) of ideal compute
    bubble_s: jax.Array
    bubble_share: jax.Array        # share of the step spent in the bubble
    model_flops: jax.Array         # per step, 6 Psi_active B s + 12 L B s^2 h
    hardware_flops: jax.Array      # with recomputation
    compute_s: jax.Array
    step_s: jax.Array
    tokens_per_s: jax.Array
    mfu: jax.Array                 # model FLOPs / (N * peak * step)
    feasible: jax.Array            # 1.0 when no reason bit is set
    reasons: jax.Array             # bit flags, see REASONS
    warnings: jax.Array            # bit flags, see WARNINGS
    scale_up_bytes: PerDim         # bytes a rank sends a step on the scale-up fabric (torus: ICI)
    scale_out_bytes: PerDim        # bytes a rank sends a step on the scale-out network
    network_cost_usd: jax.Array    # capital cost of the whole network (dse/equations/cost.py)
    network_power_w: jax.Array     # its power draw

    def memory_dict(self):
        return {"weights": self.weights_bytes, "grads": self.grads_bytes,
                "optimizer": self.optimizer_bytes, "activations": self.activations_bytes,
                "other": self.other_bytes, "total": self.memory_bytes}

    def to_json(self) -> dict:
        """Plain-Python dict for one plan: SI units named in the keys, never rounded."""
        f = lambda x: float(np.asarray(x))  # noqa: E731
        per = lambda pd: {k: f(v) for k, v in pd.to_dict().items()}  # noqa: E731
        return {
            "dp": f(self.dp),
            "microbatches": f(self.microbatches),
            "params_total": f(self.params_total),
            "params_active": f(self.params_active),
            "params_per_rank": f(self.params_per_rank),
            "memory_bytes": {k: f(v) for k, v in self.memory_dict().items()},
            "fits": bool(f(self.fits)),
            "traffic_bytes": per(self.traffic_bytes),
            "calls_per_step": per(self.calls),
            "message_bytes": per(self.message_bytes),
            "group_size": per(self.group_size),
            "inside_domain": {k: bool(v) for k, v in per(self.inside_domain).items()},
            "wire_s": per(self.wire_s),
            "exposed_s": per(self.exposed_s),
            "bubble_fraction": f(self.bubble_fraction),
            "bubble_s": f(self.bubble_s),
            "bubble_share": f(self.bubble_share),
            "model_flops": f(self.model_flops),
            "hardware_flops": f(self.hardware_flops),
            "compute_s": f(self.compute_s),
            "step_s": f(self.step_s),
            "tokens_per_s": f(self.tokens_per_s),
            "mfu": f(self.mfu),
            "feasible": bool(f(self.feasible)),
            "infeasible_reasons": reason_names(self.reasons),
            "warnings": warning_names(self.warnings),
            "scale_up_bytes": per(self.scale_up_bytes),
            "scale_out_bytes": per(self.scale_out_bytes),
            "network_cost_usd": f(self.network_cost_usd),
            "network_power_w": f(self.network_power_w),
        }

    def __getitem__(self, idx):
        """Index a batched Report: report[i] is plan i (leaves that do not vary are broadcast)."""
        shape = jnp.shape(self.step_s)
        return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(jnp.asarray(x), shape)[idx], self)
