"""Input checks shared by every entry point (flags, TOML and JSON files, CSV rows, logs).

Each check returns the value as a float or raises ``InputError`` with one line naming
the field and what is allowed; the CLI prints that line and exits 2.
"""

from __future__ import annotations

import math
import re

from dse.errors import InputError

__all__ = ["number", "positive", "non_negative", "preset_value", "NON_NEGATIVE_FIELDS", "MAX_MAGNITUDE",
           "MIN_MAGNITUDE", "model_consistency", "int_range", "choice", "plan_value", "offload_consistency"]

# Magnitude: every value entering dse lies in [2^-53, 2^53] (or is 0 where 0 is allowed).
# 2^53 is the largest float64 range of exact integers (IEEE 754-2008 binary64, 53-bit
# significand); a product or quotient of up to 9 such numbers stays below 2^477 << DBL_MAX
# (~2^1024), so no figure dse computes from checked inputs overflows float64 to inf/NaN.
MAX_MAGNITUDE = float(2 ** 53)
MIN_MAGNITUDE = float(2 ** -53)
# Tools that list every rank (rank maps, dse check's placement, NCCL log pairs) hold a few int64
# arrays of the world size: 2^24 ranks (16.8M, 1,024x the 16,384 GPUs of Llama 3 405B) is 128 MB each.
MAX_RANKS = float(2 ** 24)


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _float(field: str, value, allowed: str) -> float:
    """A float from a number or a numeric string; never a bool, list, dict or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) and not hasattr(value, "__float__"):
        raise InputError(f"{field}: {_show(value)} is not a number; allowed: {allowed}")
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{field}: {_show(value)} is not a number; allowed: {allowed}") from None
    if math.isfinite(x) and x != 0 and not MIN_MAGNITUDE <= abs(x) <= MAX_MAGNITUDE:
        raise InputError(f"{field}: {_show(value)} is too {'large' if abs(x) > 1 else 'small'} (figures would "
                         f"overflow float64); allowed: {allowed}, magnitude 2^-53..2^53")
    return x


def number(field: str, value, *, integer=False, minimum=1.0, maximum=None) -> float:
    """A finite number >= ``minimum`` (and <= ``maximum``; a whole number when ``integer``)."""
    kind = 'an integer' if integer else 'a number'
    allowed = kind if minimum <= -MAX_MAGNITUDE else f"{kind} >= {minimum:g}"
    x = _float(field, value, allowed)
    if maximum is not None:
        allowed += f" and <= {maximum:g}"
    if not math.isfinite(x) or x < minimum or (integer and x != int(x)) or (maximum is not None and x > maximum):
        raise InputError(f"{field}: {_show(value)} is not allowed; allowed: {allowed}")
    return x


def positive(field: str, value) -> float:
    """A positive finite number."""
    x = _float(field, value, "a positive number")
    if not math.isfinite(x) or x <= 0:
        raise InputError(f"{field}: {_show(value)} is not allowed; allowed: a positive finite number")
    return x


def non_negative(field: str, value) -> float:
    """A finite number >= 0."""
    x = _float(field, value, "a number >= 0")
    if not math.isfinite(x) or x < 0:
        raise InputError(f"{field}: {_show(value)} is not allowed; allowed: a finite number >= 0")
    return x


# Cluster fields that are a measured share of a datasheet peak: 0 (not measured) up to 1.
SHARE_FIELDS = frozenset({"matmul_ceiling", "matmul_ceiling_fp8", "flash_attn_share"})
# Preset and model fields that may be 0 (a switch, a count that may be absent, a latency).
NON_NEGATIVE_FIELDS = SHARE_FIELDS | frozenset({
    "island_gpus", "topology", "torus_wrap", "torus_bw_x_GBps", "torus_bw_y_GBps", "torus_bw_z_GBps", "ffn_gated",
    "expert_ffn_hidden", "shared_experts", "dense_layers", "route_node_limit", "route_groups", "alpha_up_s", "alpha_out_s",
    "alpha_up_us", "alpha_out_us", "head_dim", "tied_embeddings", "dropout", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "window", "window_layers", "host_link_GBps", "node_host_GB", "node_host_bw_GBps", "fp8_scaling"})

def offload_consistency(fields: dict) -> None:
    """Offload switches that need another: parameters go to the host only when ZeRO-3 shards them
    (ZeRO-Infinity sec.5; DeepSpeed: offload_param is valid with stage 3 only)."""
    if float(fields.get("offload_weights", 0) or 0) > 0 and float(fields.get("zero", 0) or 0) < 3:
        raise InputError("offload_weights: 1 needs zero = 3 (ZeRO-Infinity offloads ZeRO-3's parameter "
                         "partitions); allowed: 0, or 1 with zero 3")


def preset_value(field: str, value, where: str | None = None) -> float:
    """A preset or model field: >= 0 for the fields that may be 0, else positive; a measured share
    (SHARE_FIELDS) at most 1, a core oversubscription at least 1. Presets, flags and sweep axes
    all check through it; ``where`` names the value in the one-line error (default ``field``)."""
    where = where or field
    x = non_negative(where, value) if field in NON_NEGATIVE_FIELDS else positive(where, value)
    if field in SHARE_FIELDS and x > 1.0:
        raise InputError(f"{where}: {_show(value)} is not allowed; allowed: 0 (not measured) or the measured "
                         f"kernel rate / the peak, up to 1")
    if field == "oversubscription" and x < 1.0:
        raise InputError(f"{where}: {_show(value)} is not allowed; allowed: a number >= 1")
    return x


# Model fields that count whole things (a fractional layer or head is a typo, not a shape).
INTEGER_MODEL_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq", "experts", "topk",
                        "expert_ffn_hidden", "shared_experts", "dense_layers", "route_node_limit",
                        "route_groups", "window", "window_layers")


def model_consistency(fields: dict, where: str = "model") -> None:
    """Checked model fields that must agree: whole counts, kv_heads divides heads (grouped-query
    attention shares each K/V head among heads/kv_heads query heads, Ainslie et al. 2023, sec. 2),
    topk <= experts (a token is routed to k of E experts, Shazeer et al. 2017, sec. 2.1),
    dense_layers < layers, ffn_gated, moe_layer_freq and dropout within 0..1."""
    g = lambda k, d=None: float(fields[k]) if fields.get(k) is not None else d  # noqa: E731
    for k in INTEGER_MODEL_FIELDS:
        if g(k) is not None and g(k) != int(g(k)):
            raise InputError(f"{where}.{k}: {g(k):g} is not allowed; allowed: a whole number")
    heads, kv = g("heads"), g("kv_heads")
    if heads is not None and kv is not None and (kv > heads or heads % kv):
        raise InputError(f"{where}.kv_heads: {kv:g} does not divide heads = {heads:g}; allowed: divisors of heads")
    experts, topk = g("experts", 1.0), g("topk", 1.0)
    if topk > max(experts, 1.0):
        raise InputError(f"{where}.topk: {topk:g} is above experts = {experts:g}; allowed: 1..experts")
    layers, dense = g("layers"), g("dense_layers", 0.0)
    if layers is not None and dense >= layers and dense > 0:
        raise InputError(f"{where}.dense_layers: {dense:g} is not below layers = {layers:g}; allowed: 0..layers-1")
    window_layers = g("window_layers", 0.0)
    if layers is not None and window_layers > layers:
        raise InputError(f"{where}.window_layers: {window_layers:g} is above layers = {layers:g}; allowed: 0..layers")
    for k in ("ffn_gated", "moe_layer_freq", "dropout"):
        if g(k) is not None and g(k) > 1:
            raise InputError(f"{where}.{k}: {g(k):g} is not allowed; allowed: a number 0..1")


def int_range(field: str, lo, hi, limit: int) -> tuple[int, int]:
    """An inclusive range lo-hi of indices below ``limit``, checked before anything is expanded."""
    a = int(number(field, lo, integer=True, minimum=0))
    b = int(number(field, hi, integer=True, minimum=0))
    if a > b or b >= limit:
        raise InputError(f"{field}: {a}-{b} is not allowed; allowed: ranges lo-hi with lo <= hi < {limit}")
    return a, b


def choice(field: str, value, allowed) -> str:
    """One of ``allowed`` (strings)."""
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"{field}: {_show(value)} is not allowed; allowed: {', '.join(allowed)}")
    return value


def host_port(field: str, value) -> str:
    """HOST:PORT with a TCP port 1..65535 (RFC 793 ports are 16-bit; 0 is reserved); host and port
    may be shell expansions such as ${MASTER_ADDR}:${MASTER_PORT:-29500}, left to the shell."""
    text = str(value)
    shell = r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::-[^}\s]*)?\}|\$[A-Za-z_][A-Za-z0-9_]*"
    m = re.fullmatch(rf"((?:{shell}|[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.]+\])+):(\d+|{shell})", text)
    if m is None or (m.group(2).isdigit() and not 1 <= int(m.group(2)) <= 65535):
        raise InputError(f"{field}: {_show(value)} is not allowed; allowed: HOST:PORT with a port 1..65535")
    return text


def plan_value(field: str, value) -> float:
    """One Plan field's value as its float code, checked against what the field accepts
    (dse.inputs.plan: CHOICES by name or code, SWITCHES 0/1 or true/false, SHARES 0..1, WHOLE numbers, ZeRO
    stages, else a number >= 0). ``field`` names the field in the message (a flag, ``plan.x``)."""
    from dse.inputs import plan as P   # plan.py holds the tables; it imports nothing from here

    name = field.rsplit(".", 1)[-1].lstrip("-").replace("-", "_")
    if name in P.CHOICES:
        table = P.CHOICES[name]
        names = f"{', '.join(table)} (or {', '.join(f'{v:g}' for v in table.values())})"
        if isinstance(value, str) and value in table:
            return table[value]
        x = _float(field, value, names) if not isinstance(value, str) or _numeric(value) else None
        if x is None or x not in table.values():
            raise InputError(f"{field}: {_show(value)} is not allowed; allowed: {names}")
        return x
    if name in P.SETS:
        return _set_code(field, value, P.SETS[name])
    if name in P.SWITCHES:
        if isinstance(value, bool):
            return float(value)
        x = _float(field, value, "0, 1 (or true, false)") if not isinstance(value, str) or _numeric(value) else None
        if x is None and isinstance(value, str) and value.lower() in ("true", "false"):
            return 1.0 if value.lower() == "true" else 0.0
        if x not in (0.0, 1.0):
            raise InputError(f"{field}: {_show(value)} is not allowed; allowed: 0, 1 (or true, false)")
        return x
    if name in P.SHARES:
        x = _float(field, value, "a number >= 0 and <= 1")
        if not 0.0 <= x <= 1.0:
            raise InputError(f"{field}: {_show(value)} is not allowed; allowed: a number >= 0 and <= 1")
        return x
    if name in P.WHOLE:
        lo = P.WHOLE[name]
        x = _float(field, value, f"integers >= {lo}")
        if not math.isfinite(x) or x < lo or x != int(x):
            raise InputError(f"{field}: {_show(value)} is not allowed; allowed: integers >= {lo}")
        return x
    if name == "zero":
        x = _float(field, value, "0, 1, 2, 3")
        if x not in P.ZERO_STAGES:
            raise InputError(f"{field}: {_show(value)} is not allowed; allowed: 0, 1, 2, 3")
        return x
    return non_negative(field, value)


def _set_code(field: str, value, table: dict) -> float:
    """A set of ``table``'s names (a list, or one string of them split by commas or spaces; "" or
    "none": the empty set) or the sum of their codes, as that sum."""
    allowed = (f"any of {', '.join(table)} (a list, or names split by commas or spaces; none for no module), "
               f"or the sum of their codes ({', '.join(f'{v:g}' for v in table.values())})")
    if isinstance(value, (list, tuple)) or (isinstance(value, str) and not _numeric(value)):
        names = value if isinstance(value, (list, tuple)) else value.replace(",", " ").split()
        names = [str(n).strip() for n in names if str(n).strip() and str(n).strip() != "none"]
        unknown = [n for n in names if n not in table]
        if unknown:
            raise InputError(f"{field}: {unknown[0]!r} is not allowed; allowed: {allowed}")
        return float(sum(table[n] for n in dict.fromkeys(names)))
    x = _float(field, value, allowed)
    if not math.isfinite(x) or x != int(x) or not 0 <= x <= sum(table.values()):
        raise InputError(f"{field}: {_show(value)} is not allowed; allowed: {allowed}")
    return x


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
