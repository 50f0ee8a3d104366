"""One unit table: the units presets, flags and sweep axes are written in, and how SI names display.

``PRESET_UNITS``: a preset/flag/axis key -> (Cluster field, factor to SI, unit as written).
``SI_SUFFIXES``: the suffix of an SI field name -> (display unit, factor from SI), for tables
and plot axes (``hbm_bytes`` shows in GB, ``bw_up_bytes_per_s`` in GB/s). Factors are the
SI prefixes (1 GB = 1e9 bytes, 1 TFLOP/s = 1e12 FLOP/s, 1 us = 1e-6 s; BIPM SI Brochure, 9th ed.).
"""

from __future__ import annotations

__all__ = ["PRESET_UNITS", "SI_SUFFIXES", "unit", "to_si"]

PRESET_UNITS: dict[str, tuple[str, float, str]] = {
    "gpus": ("gpus", 1.0, "count"),
    "tflops": ("peak_flops_per_s", 1e12, "TFLOP/s"),
    "hbm_GB": ("hbm_bytes", 1e9, "GB"),
    "domain": ("domain", 1.0, "accelerators"),
    "gpus_per_node": ("gpus_per_node", 1.0, "accelerators"),
    "bw_up_GBps": ("bw_up_bytes_per_s", 1e9, "GB/s"),
    "bw_out_GBps": ("bw_out_bytes_per_s", 1e9, "GB/s"),
    "alpha_up_us": ("alpha_up_s", 1e-6, "us"),
    "alpha_out_us": ("alpha_out_s", 1e-6, "us"),
    "island_gpus": ("island_gpus", 1.0, "accelerators"),
    "oversubscription": ("oversubscription", 1.0, "ratio"),
    "topology": ("topology", 1.0, ""),            # a name from inputs.TOPOLOGIES or its code
    "torus_x": ("torus_x", 1.0, "accelerators"),
    "torus_y": ("torus_y", 1.0, "accelerators"),
    "torus_z": ("torus_z", 1.0, "accelerators"),
    "torus_bw_x_GBps": ("torus_bw_x_bytes_per_s", 1e9, "GB/s"),   # one link, one direction
    "torus_bw_y_GBps": ("torus_bw_y_bytes_per_s", 1e9, "GB/s"),
    "torus_bw_z_GBps": ("torus_bw_z_bytes_per_s", 1e9, "GB/s"),
    "torus_wrap": ("torus_wrap", 1.0, ""),
    "tflops_fp8": ("peak_fp8_flops_per_s", 1e12, "TFLOP/s"),
    "hbm_TBps": ("hbm_bw_bytes_per_s", 1e12, "TB/s"),
    "host_link_GBps": ("host_link_bytes_per_s", 1e9, "GB/s"),   # one accelerator to host memory, one direction
    "node_host_GB": ("node_host_bytes", 1e9, "GB"),              # host memory per node
    "node_host_bw_GBps": ("node_host_bw_bytes_per_s", 1e9, "GB/s"),   # host DRAM bandwidth per node
    "matmul_ceiling": ("matmul_ceiling", 1.0, "ratio"),          # measured best matmul / tflops (0: not measured)
    "matmul_ceiling_fp8": ("matmul_ceiling_fp8", 1.0, "ratio"),  # measured best FP8 matmul / tflops_fp8
    "flash_attn_share": ("flash_attn_share", 1.0, "ratio"),      # measured FlashAttention-2 fwd + bwd / tflops
    "fp8_scaling": ("fp8_scaling", 1.0, ""),     # a name from inputs.FP8_SCALINGS or its code
}

# longest suffix first: "_bytes_per_s" before "_bytes" and "_s"
SI_SUFFIXES: tuple[tuple[str, str, float], ...] = (
    ("_bytes_per_s", "GB/s", 1e-9), ("_flops_per_s", "TFLOP/s", 1e-12), ("_GBps", "GB/s", 1.0),
    ("_bytes", "GB", 1e-9), ("_flops", "PFLOP", 1e-15), ("_usd", "M$", 1e-6), ("_s", "s", 1.0), ("_w", "kW", 1e-3))


def unit(key: str) -> str:
    """The unit a preset key is written in ("" for names and switches, "count" for plain numbers)."""
    if key in PRESET_UNITS:
        return PRESET_UNITS[key][2]
    for suffix, u, _ in SI_SUFFIXES:
        if key.endswith(suffix):
            return u
    return ""


def to_si(key: str) -> tuple[str, float]:
    """(Cluster field, factor to SI) of a preset key."""
    field, factor, _ = PRESET_UNITS[key]
    return field, factor
