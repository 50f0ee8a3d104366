"""Input checks shared by every entry point (flags, TOML and JSON files, CSV rows, logs).

Each check returns the value as a float or raises ``InputError`` with one line naming
the field and what is allowed; the CLI prints that line and exits 2.
"""

from __future__ import annotations

import math

from dse.errors import InputError

__all__ = ["number", "positive", "non_negative", "preset_value", "NON_NEGATIVE_FIELDS"]


def _float(field: str, value, allowed: str) -> float:
    if isinstance(value, bool):
        raise InputError(f"{field}: {value!r} is not a number; allowed: {allowed}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"{field}: {value!r} is not a number; allowed: {allowed}") from None


def number(field: str, value, *, integer=False, minimum=1.0) -> float:
    """A finite number >= ``minimum`` (a whole number when ``integer``)."""
    allowed = f"{'an integer' if integer else 'a number'} >= {minimum:g}"
    x = _float(field, value, allowed)
    if not math.isfinite(x) or x < minimum or (integer and x != int(x)):
        raise InputError(f"{field}: {value!r} is not allowed; allowed: {allowed}")
    return x


def positive(field: str, value) -> float:
    """A positive finite number."""
    x = _float(field, value, "a positive number")
    if not math.isfinite(x) or x <= 0:
        raise InputError(f"{field}: {value!r} is not allowed; allowed: a positive finite number")
    return x


def non_negative(field: str, value) -> float:
    """A finite number >= 0."""
    x = _float(field, value, "a number >= 0")
    if not math.isfinite(x) or x < 0:
        raise InputError(f"{field}: {value!r} is not allowed; allowed: a finite number >= 0")
    return x


# Preset and model fields that may be 0 (a switch, a count that may be absent, a latency).
NON_NEGATIVE_FIELDS = frozenset({
    "island_gpus", "topology", "torus_wrap", "torus_bw_x_GBps", "torus_bw_y_GBps", "torus_bw_z_GBps", "ffn_gated",
    "expert_ffn_hidden", "shared_experts", "dense_layers", "route_node_limit", "alpha_up_s", "alpha_out_s",
    "alpha_up_us", "alpha_out_us"})


def preset_value(field: str, value) -> float:
    """A preset or model field: >= 0 for the fields that may be 0, else positive."""
    return non_negative(field, value) if field in NON_NEGATIVE_FIELDS else positive(field, value)
