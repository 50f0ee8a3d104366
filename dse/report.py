"""The Report: every figure ``evaluate`` returns, in SI units named in the field."""

from __future__ import annotations

import dataclasses

import numpy as np

from dse.backend import host_when_concrete, jnp, register_dataclass, tree_leaves, tree_map
from dse.equations.feasibility import REASON_BIT, REASONS, RULES

__all__ = ["PerDim", "Report", "REASONS", "WARNINGS", "reason_names", "warning_names", "DIM_NAMES", "flatten",
           "REASON_SHORT"]

DIM_NAMES = ("tp", "cp", "ep", "pp", "dp")

# Why a plan is infeasible: bit k of ``Report.reasons`` is rule k of the one feasibility table
# (dse/equations/feasibility.py: REASONS, REASON_BIT); its short column labels heatmap cells and bars.
REASON_SHORT = {r.name: r.short for r in RULES}

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


@register_dataclass
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


@register_dataclass
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
    grads_sharded: jax.Array = 0.0               # 1.0 when gradients are kept sharded over DP (ZeRO-2/3)
    grad_reduce_per_microbatch: jax.Array = 0.0  # 1.0: reduce-scatter every microbatch; 0: once a step
    # other_bytes, part by part (dse/equations/memory.py; 0 in seed mode)
    logits_bytes: jax.Array = 0.0          # logits of a microbatch on the output-layer stage (fp32 + 16-bit temporaries)
    tp_buffer_bytes: jax.Array = 0.0       # sequence-parallel all-gather buffer
    dp_buffer_bytes: jax.Array = 0.0       # ZeRO-3 gathered units, DP buckets beyond the gradients
    nccl_bytes: jax.Array = 0.0            # NCCL's own buffers (outside the caching allocator)
    context_bytes: jax.Array = 0.0         # the CUDA context (outside the caching allocator)
    fragmentation_bytes: jax.Array = 0.0   # reserved by the caching allocator, not usable
    host_bytes: jax.Array = 0.0            # host memory one rank's offload keeps (dse/equations/offload.py)
    node_host_bytes: jax.Array = 0.0       # host memory the node's ranks keep together (<= the cluster's node_host_bytes)
    offload_s: jax.Array = 0.0             # step time the offload adds (host Adam, host-link transfers not hidden)
    host_optimizer_s: jax.Array = 0.0      # seconds of the host-side Adam step (part of offload_s)

    def memory_dict(self):
        return {"weights": self.weights_bytes, "grads": self.grads_bytes,
                "optimizer": self.optimizer_bytes, "activations": self.activations_bytes,
                "other": self.other_bytes, **{p: getattr(self, f"{p}_bytes") for p in BUFFER_PARTS},
                "total": self.memory_bytes}

    def to_json(self, *inputs, varying_only: bool = True):
        """Plain Python, SI units named in the keys, never rounded, derived from the fields.

        One plan: one dict. A batch or grid (any shape): a list of dicts, one per element in
        row-major order, each with ``index`` (its position in the grid) and ``point`` (the
        values of the given ``inputs``, e.g. ``to_json(model, cluster, plan)``, that vary over
        the grid; every field with ``varying_only=False``).
        """
        shape, leaves = self._broadcast()
        if shape == () and not inputs:
            return _json_rows(shape, leaves)[0]
        point = _input_columns(inputs, shape, varying_only)
        rows = []
        for at, fields in zip(np.ndindex(*shape), _json_rows(shape, leaves)):
            row = {"index": [int(i) for i in at]} if shape else {}
            row["point"] = {k: float(v[at]) for k, v in point.items()}
            row.update(fields)
            rows.append(row)
        return rows if shape else rows[0]

    def json_rows(self) -> list[dict]:
        """``to_json``'s figures of every plan (row-major), without ``index`` or ``point``: the
        fields broadcast once for the batch, not once a plan (a sweep's reported rows)."""
        return _json_rows(*self._broadcast())

    def to_columns(self, *inputs, varying_only: bool = True) -> dict[str, np.ndarray]:
        """Flat columns, one value per plan (row-major): the varying ``inputs``' fields, then
        every figure under the name ``to_json`` gives it (nested ones dotted: ``memory_bytes.total``,
        ``traffic_bytes.tp``), reason and warning names joined by ``;``."""
        shape, leaves = self._broadcast()
        cols = {k: v.reshape(-1) for k, v in _input_columns(inputs, shape, varying_only).items()}
        for key, (kind, value) in _json_layout(leaves).items():
            if kind == "names":
                table = REASONS if key == "infeasible_reasons" else WARNINGS
                bits = value.reshape(-1).astype(np.int64)
                cols[key] = np.array([";".join(_names(b, table)) for b in bits], dtype=object)
            elif kind == "bool":
                cols[key] = value.reshape(-1) > 0.5
            else:
                cols[key] = value.reshape(-1).astype(np.float64)
        return cols

    def to_frame(self, *inputs, varying_only: bool = True):
        """A pandas DataFrame of ``to_columns`` (pandas is optional: ``pip install dse[frame]``)."""
        try:
            import pandas as pd
        except ImportError as exc:   # pragma: no cover - depends on the environment
            raise ImportError("Report.to_frame needs pandas: pip install 'dse[frame]'") from exc
        return pd.DataFrame(self.to_columns(*inputs, varying_only=varying_only))

    def _broadcast(self):
        """(shape, {field: numpy array of that shape}); PerDim fields as {dim: array}."""
        leaves = tree_leaves(self)
        shape = tuple(np.broadcast_shapes(*[np.shape(x) for x in leaves]))
        b = lambda x: np.broadcast_to(np.asarray(x), shape)  # noqa: E731
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = {k: b(x) for k, x in v.to_dict().items()} if isinstance(v, PerDim) else b(v)
        return shape, out

    @host_when_concrete   # a concrete Report in numpy (eager jax dispatched three XLA ops a field)
    def __getitem__(self, idx):
        """Index a batched Report: report[i] is plan i (leaves that do not vary are broadcast)."""
        shape = jnp.shape(self.step_s)
        return tree_map(lambda x: jnp.broadcast_to(jnp.asarray(x), shape)[idx], self)


# ---------------------------------------------------------------- JSON and columns from the fields

# Memory parts that to_json groups under "memory_bytes" (with the total), as memory_dict does.
BUFFER_PARTS = ("logits", "tp_buffer", "dp_buffer", "nccl", "context", "fragmentation")   # other_bytes, part by part
_MEMORY_PARTS = {"weights_bytes": "weights", "grads_bytes": "grads", "optimizer_bytes": "optimizer",
                 "activations_bytes": "activations", "other_bytes": "other",
                 **{f"{p}_bytes": p for p in BUFFER_PARTS}, "memory_bytes": "total"}
_RENAME = {"calls": "calls_per_step", "reasons": "infeasible_reasons"}   # JSON names that differ from fields
_BOOLS = {"fits", "feasible", "inside_domain", "grads_sharded", "grad_reduce_per_microbatch"}   # 0/1 flags: true/false
_NAMES = {"reasons", "warnings"}                                        # bit flags shown as names


def _json_layout(leaves) -> dict:
    """Flat key -> (kind, array) in to_json's order: kind is "float", "bool" or "names"."""
    out = {}
    for f in dataclasses.fields(Report):
        v = leaves[f.name]
        if f.name in _MEMORY_PARTS:
            if f.name == "memory_bytes":
                for field, part in _MEMORY_PARTS.items():
                    out[f"memory_bytes.{part}"] = ("float", leaves[field])
            continue
        key = _RENAME.get(f.name, f.name)
        kind = "names" if f.name in _NAMES else "bool" if f.name in _BOOLS else "float"
        if isinstance(v, dict):
            for dim, x in v.items():
                out[f"{key}.{dim}"] = (kind, x)
        else:
            out[key] = (kind, v)
    return out


def _json_rows(shape, leaves) -> list[dict]:
    """One to_json dict of figures per element of ``shape`` (row-major), the layout built once."""
    layout = _json_layout(leaves)
    return [_json_row(layout, at) for at in np.ndindex(*shape)]


def _json_row(layout, at) -> dict:
    """One plan's to_json dict (nested where the key is dotted) from ``_json_layout``'s arrays."""
    row: dict = {}
    for key, (kind, value) in layout.items():
        x = value[at]
        if kind == "names":
            x = reason_names(x) if key == "infeasible_reasons" else warning_names(x)
        elif kind == "bool":
            x = bool(float(x) > 0.5)
        else:
            x = float(x)
        head, _, tail = key.partition(".")
        if tail:
            row.setdefault(head, {})[tail] = x
        else:
            row[head] = x
    return row


def _input_columns(inputs, shape, varying_only) -> dict[str, np.ndarray]:
    """The fields of ``inputs`` (ModelShape, Cluster, Plan, or plain dicts), broadcast to ``shape``."""
    cols: dict[str, np.ndarray] = {}
    for item in inputs:
        fields = item.to_dict() if hasattr(item, "to_dict") else dict(item)
        for name, v in fields.items():
            a = np.asarray(v, dtype=np.float64)
            if varying_only and (a.size <= 1 or np.all(a == a.reshape(-1)[0])):
                continue
            cols[name] = np.broadcast_to(a, shape)
    return cols


def flatten(row: dict, prefix: str = "") -> dict:
    """A nested JSON row as flat columns: ``a.b`` keys, lists joined by ``;`` (CSV, Parquet, frames)."""
    out = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            out[prefix + k] = ";".join(str(x) for x in v)
        else:
            out[prefix + k] = v
    return out
