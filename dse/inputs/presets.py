"""Presets as data: model shapes and clusters in TOML under ``dse/data``, each with its source.

Preset files use the units people quote (GB/s, TFLOP/s, GB, microseconds); they are
converted to SI here, at the edge.
"""

from __future__ import annotations

import json
import os
import re
import copy
import functools
import tomllib
from importlib import resources
from pathlib import Path

from dse import files
from dse.errors import InputError
from dse.inputs import checks
from dse.inputs.units import PRESET_UNITS
from dse.inputs.checks import preset_value as _check
from dse.inputs import FP8_SCALINGS, TOPOLOGIES, Cluster, ModelShape

__all__ = ["list_presets", "load_model", "load_cluster", "model_from_hf_config", "cluster_for_gpu", "model_for_name",
           "cluster_from_fields", "model_from_fields", "preset_info", "preset_fields", "preset_dir", "user_dir", "read_toml", "MODEL_FIELDS", "CLUSTER_UNITS"]

MODEL_FIELDS = tuple(f for f in ModelShape.__dataclass_fields__)
# preset key -> (Cluster field, factor to SI): the one unit table, dse/inputs/units.py
CLUSTER_UNITS = {k: (field, factor) for k, (field, factor, _) in PRESET_UNITS.items()}
# fidelity: the mode a cluster defaults to; gpu_names / names: what published tables call it
# (cluster_for_gpu, model_for_name); alias: this preset is another one (one preset per hardware).
_META = ("description", "source", "fidelity", "gpu_names", "names", "alias")


def _dir(kind: str):
    return resources.files("dse") / "data" / kind


def list_presets(kind: str) -> list[str]:
    """Names of the presets of one kind ("models" or "clusters")."""
    folders = [_dir(kind)] + ([user_dir(kind)] if user_dir(kind).is_dir() else [])   # and what a user saved
    return sorted({p.name[:-5] for folder in folders for p in files.data_files(folder)})


def preset_dir(kind: str) -> Path:
    """The folder of one kind's shipped preset files (read-only: nothing writes into the package)."""
    return Path(str(_dir(kind)))


def user_dir(kind: str) -> Path:
    """Where dse writes what a user makes (``dse nccl-tests --save``, ``dse calibrate``):
    ``$DSE_HOME/<kind>``, else ``$XDG_DATA_HOME/dse/<kind>``, else ``~/.local/share/dse/<kind>``.
    Presets saved there are found by name after the shipped ones."""
    home = os.environ.get("DSE_HOME")
    if home:
        return Path(home) / kind
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "dse" / kind


def _is_path(name: str) -> bool:
    return name.endswith(".toml") or "/" in name or "\\" in name


def _read(kind: str, name: str) -> dict:
    if not isinstance(name, str) or not name:
        raise InputError(f"{kind[:-1]} preset: {name!r} is not a preset name; allowed: {', '.join(list_presets(kind))}")
    if _is_path(name):   # a preset file given by path, e.g. one ``dse nccl-tests --save`` wrote
        return read_toml(name, f"{kind[:-1]} preset")
    path = _dir(kind) / f"{name}.toml"
    if not path.is_file() and (user_dir(kind) / f"{name}.toml").is_file():
        return read_toml(user_dir(kind) / f"{name}.toml", f"{kind[:-1]} preset")
    if not path.is_file():
        allowed = ", ".join(list_presets(kind))
        raise InputError(f"{kind[:-1]} preset: unknown {name!r}; allowed: {allowed}")
    raw = copy.deepcopy(files.data_toml(path))
    if raw.get("alias"):   # the same hardware under another name: its numbers are the target's
        target = _read(kind, str(raw["alias"]))
        return {**target, **{k: raw[k] for k in ("description", "source") if k in raw}}
    return raw


def _shipped(kind: str):
    """(name, raw fields) of every shipped preset of one kind that is not an alias (read only)."""
    for p in files.data_files(_dir(kind)):
        raw = files.data_toml(p)
        if not raw.get("alias"):
            yield p.name[:-5], raw


@functools.lru_cache(maxsize=4096)
def _norm(x: str) -> str:
    return re.sub(r"[\s_\-]+", " ", x.lower()).strip()


@functools.lru_cache(maxsize=4096)
def _phrase(needle: str, text: str) -> bool:
    """``needle`` in ``text`` as a whole word or phrase (case-insensitive, '-' '_' ' ' alike)."""
    return re.search(r"(?<![a-z0-9])" + re.escape(_norm(needle)) + r"(?![a-z0-9])", _norm(text)) is not None


def cluster_for_gpu(text: str) -> str | None:
    """The cluster preset whose hardware a published GPU description names, anywhere in the text.

    Each preset lists its ``gpu_names``; the longest name found wins ("A100-SXM4-40GB" is the
    40 GB part, "NVIDIA Ampere (A100 assumed)" the A100 preset, "GB200 (NVL72)" not "B200").
    """
    best = max(((len(n), name) for name, raw in _shipped("clusters") for n in raw.get("gpu_names", ())
                if _phrase(n, text or "")), default=None)
    return best[1] if best else None


def model_for_name(text: str) -> str | None:
    """The model preset a published model name refers to: its preset name or one of its ``names``,
    compared without case and punctuation ("LLAMA2-7B" is llama2-7b); None when none does."""
    key = lambda x: re.sub(r"[^a-z0-9.]", "", x.lower())   # noqa: E731
    want = key(text or "")
    if not want:
        return None
    for name, raw in _shipped("models"):
        if want in {key(name), *(key(n) for n in raw.get("names", ()))}:
            return name
    return None


def preset_fields(kind: str, name: str) -> dict:
    """A preset's raw fields, in the file's units (GB/s, TFLOP/s, GB, us), with description and source
    (not the lookup names: a preset saved from these fields is not the hardware they name)."""
    return {k: v for k, v in _read(kind, name).items() if k not in ("gpu_names", "names", "alias")}


def read_toml(path, what: str) -> dict:
    """A TOML file (sweep or co-design spec) as a dict; a missing or bad file is one InputError line."""
    path = Path(path)
    text = files.read_text(path, what, "a readable TOML file")   # missing, folder, binary: one line (dse/files.py)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{what}: {str(path)!r} is not valid TOML ({' '.join(str(exc).split())})") from None


def preset_info(kind: str, name: str) -> dict:
    """Description and source of a preset."""
    raw = _read(kind, name)
    return {k: raw.get(k, "") for k in ("description", "source", "fidelity")}


def model_from_fields(fields: dict) -> ModelShape:
    """A ModelShape from a dict of field values (validated); kv_heads defaults to heads."""
    fields = {k: v for k, v in fields.items() if k not in _META and v is not None}
    unknown = set(fields) - set(MODEL_FIELDS)
    if unknown:
        raise InputError(f"model: unknown field(s) {sorted(unknown)}; allowed: {', '.join(MODEL_FIELDS)}")
    fields.setdefault("kv_heads", fields.get("heads"))
    if "ffn_hidden" not in fields and "hidden" in fields:
        fields["ffn_hidden"] = 4 * _check("hidden", fields["hidden"])
    fields.setdefault("vocab", 51200)
    required = ("layers", "hidden", "heads", "seq")
    for r in required:
        if r not in fields or fields[r] is None:
            raise InputError(f"model: missing field {r!r}; required: {', '.join(required)}")
    fields = {k: _check(k, v) for k, v in fields.items()}
    checks.model_consistency(fields)
    return ModelShape.make(**fields)


def load_model(name: str, **overrides) -> ModelShape:
    raw = _read("models", name)
    raw.update({k: v for k, v in overrides.items() if v is not None})
    return model_from_fields(raw)


def cluster_from_fields(fields: dict) -> Cluster:
    """A Cluster from preset-unit fields (gpus, tflops, hbm_GB, domain, bw_up_GBps, ...)."""
    fields = {k: v for k, v in fields.items() if k not in _META and v is not None}
    unknown = set(fields) - set(CLUSTER_UNITS)
    if unknown:
        raise InputError(f"cluster: unknown field(s) {sorted(unknown)}; allowed: {', '.join(CLUSTER_UNITS)}")
    for r in ("gpus", "tflops", "hbm_GB", "domain", "bw_up_GBps", "bw_out_GBps"):
        if r not in fields:
            raise InputError(f"cluster: missing field {r!r}")
    fields.setdefault("gpus_per_node", min(8.0, _check("domain", fields["domain"])))
    _check_network(fields)
    out = {}
    for k, v in fields.items():
        name, factor = CLUSTER_UNITS[k]
        out[name] = _check(k, v) * factor
    return Cluster.make(**out)


# Cluster fields given by name or code (a preset, a flag, a sweep axis): their tables.
NAMED_CLUSTER_FIELDS = {"topology": TOPOLOGIES, "fp8_scaling": FP8_SCALINGS}


def named_code(key: str, value, where: str | None = None) -> float:
    """A NAMED_CLUSTER_FIELDS value by name (a key of its table) or by code (one of its values), as
    its code; ``where`` names it in the one-line error (default ``key``)."""
    table, where = NAMED_CLUSTER_FIELDS[key], where or key
    codes = ", ".join(f"{v:g}" for v in table.values())
    if isinstance(value, str):
        if value not in table:
            raise InputError(f"{where}: unknown {value!r}; allowed: {', '.join(table)} (or {codes})")
        return float(table[value])
    x = float(_check(key, value, where))
    if x not in table.values():
        raise InputError(f"{where}: {value!r} is not allowed; allowed: {', '.join(table)} (or {codes})")
    return x


def check_islands(island, gpus, where: str = "island_gpus") -> None:
    """Equal non-blocking islands: ``island`` (0: one island) divides ``gpus``."""
    island, gpus = float(island), float(gpus)
    if island > 0 and gpus % island:
        raise InputError(f"{where}: {island:g} does not divide gpus = {gpus:g}; "
                         f"allowed: a divisor of gpus, or 0 for one island")


def _named_code(fields: dict, key: str, default: float) -> float:
    """``fields[key]`` (or ``default``) as its code, written back into ``fields``."""
    value = fields[key] = named_code(key, fields.get(key, default))
    return value


def _check_network(fields: dict) -> None:
    """Topology and FP8 scaling by name or code; a torus must hold every GPU and have bandwidth on its
    axes (each field's own range: checks.preset_value, in cluster_from_fields)."""
    topo = _named_code(fields, "topology", 0.0)
    _named_code(fields, "fp8_scaling", 3.0)
    check_islands(_check("island_gpus", fields.get("island_gpus", 0.0)), _check("gpus", fields["gpus"]))
    if float(topo) == TOPOLOGIES["torus"]:
        sizes = [_check(f"torus_{a}", fields.get(f"torus_{a}", 1)) for a in "xyz"]
        if sizes[0] * sizes[1] * sizes[2] != float(fields["gpus"]):
            raise InputError(f"torus: {sizes[0]:g}x{sizes[1]:g}x{sizes[2]:g} holds {sizes[0] * sizes[1] * sizes[2]:g} "
                             f"chips, not gpus = {float(fields['gpus']):g}; allowed: axis sizes whose product is gpus")
        for a, n in zip("xyz", sizes):
            if n > 1 and _check(f"torus_bw_{a}_GBps", fields.get(f"torus_bw_{a}_GBps", 0)) <= 0:
                raise InputError(f"torus_bw_{a}_GBps: missing or 0 on an axis of {n:g}; allowed: a positive GB/s a link")


def load_cluster(name: str, **overrides) -> Cluster:
    raw = _read("clusters", name)
    raw.update({k: v for k, v in overrides.items() if v is not None})
    return cluster_from_fields(raw)


# Hugging Face config.json keys -> ModelShape fields (first present wins).
HF_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "ffn_hidden": ("intermediate_size", "ffn_dim", "n_inner"),
    "vocab": ("vocab_size",),
    "experts": ("num_local_experts", "n_routed_experts", "num_experts"),
    "topk": ("num_experts_per_tok",),
    "expert_ffn_hidden": ("moe_intermediate_size",),
    "shared_experts": ("n_shared_experts",),
    "dense_layers": ("first_k_dense_replace",),
    "head_dim": ("head_dim",),
    "tied_embeddings": ("tie_word_embeddings",),
    "q_lora_rank": ("q_lora_rank",),            # MLA (DeepSeek-V2/V3 configs)
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "route_node_limit": ("topk_group",),        # node-limited routing: groups (nodes) a token may reach
    "route_groups": ("n_group",),               # ... out of this many expert groups
}
# Activations whose FFN is gated (GLU variants, Shazeer 2020), and model types whose MLP is a
# GLU whatever the activation's name (Gemma's GeGLU is "gelu_pytorch_tanh"; Team et al. 2024).
GATED_ACTS = ("silu", "swiglu", "geglu", "swish")
GATED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
                     "gemma2", "gemma3", "gemma3_text", "deepseek_v2", "deepseek_v3", "phi3", "olmo", "olmo2")
# Dropout rates a config.json may set (Llama/Qwen/Mistral attention_dropout; GPT-2 resid_pdrop, attn_pdrop;
# OPT dropout): any above 0 stores dropout masks (memory.layer_tensor_bytes); none given: no dropout.
DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop", "dropout", "attention_probs_dropout_prob",
                "hidden_dropout_prob")
# transformers' default tie_word_embeddings for model types whose config.json may omit it
# (PretrainedConfig's True survives in these config classes; Llama, Mistral, DeepSeek default False).
TIED_BY_DEFAULT = ("gpt2", "gemma", "gemma2", "gemma3", "gemma3_text", "opt", "bloom")


# model types whose layers alternate a sliding window and full attention when config.json has no
# layer_types (transformers' Gemma2DecoderLayer: even layers slide; Gemma 2 sec.2 "every other layer")
ALTERNATE_WINDOW = ("gemma2",)


def _hf_window(cfg: dict, mtype: str, layers) -> dict:
    """Sliding-window attention from config.json: ``sliding_window`` and which layers use it, from
    ``layer_types`` ("sliding_attention"; gpt-oss, Gemma 3, newer Gemma 2), else the model type's rule
    (Gemma 2 alternates; Qwen2/3 slide only with ``use_sliding_window`` and from ``max_window_layers``
    on), else every layer (Mistral 7B v0.1). None or ``use_sliding_window: false``: full attention."""
    w = cfg.get("sliding_window")
    if not isinstance(w, (int, float)) or isinstance(w, bool) or w <= 0 or cfg.get("use_sliding_window") is False:
        return {}
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        n = sum(1 for t in types if str(t) == "sliding_attention")
    elif mtype in ALTERNATE_WINDOW:
        n = -(-int(layers) // 2)
    elif cfg.get("use_sliding_window") and isinstance(cfg.get("max_window_layers"), int):
        n = max(int(layers) - cfg["max_window_layers"], 0)
    else:
        n = int(layers)
    return {"window": w, "window_layers": n} if n > 0 else {}


def model_from_hf_config(path: str | Path, seq: float | None = None) -> ModelShape:
    """Read a Hugging Face ``config.json`` into a ModelShape."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"--model-config: {str(path)!r} does not exist; allowed: a readable config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"--model-config: {str(path)!r} is not readable JSON ({exc.__class__.__name__})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"--model-config: {str(path)!r} is not a JSON object")
    fields = {}
    for field, keys in HF_KEYS.items():
        for k in keys:
            if cfg.get(k) is not None:
                fields[field] = cfg[k]
                break
    for r in ("layers", "hidden", "heads"):
        if r not in fields:
            raise InputError(f"--model-config: {str(path)!r} lacks {HF_KEYS[r][0]!r} ({r}); "
                             f"required: {', '.join(HF_KEYS[x][0] for x in ('layers', 'hidden', 'heads'))}")
    act = str(cfg.get("hidden_act") or cfg.get("hidden_activation") or cfg.get("activation_function") or "").lower()
    mtype = str(cfg.get("model_type", "")).lower()
    fields["ffn_gated"] = 1.0 if any(g in act for g in GATED_ACTS) or mtype in GATED_MODEL_TYPES else 0.0
    fields["tied_embeddings"] = 1.0 if cfg.get("tie_word_embeddings", mtype in TIED_BY_DEFAULT) else 0.0
    rates = [cfg.get(k) for k in DROPOUT_KEYS]
    fields["dropout"] = 1.0 if any(isinstance(r, (int, float)) and r > 0 for r in rates) else 0.0
    freq = cfg.get("moe_layer_freq", cfg.get("decoder_sparse_step"))   # every k-th layer is MoE
    if fields.get("experts") is not None and isinstance(freq, (int, float)) and freq > 0:
        fields["moe_layer_freq"] = 1.0 / float(freq)
    if fields.get("route_node_limit") is not None and not cfg.get("n_group"):
        del fields["route_node_limit"]                                   # topk_group without groups: no limit
        fields.pop("route_groups", None)
    fields.update(_hf_window(cfg, mtype, fields["layers"]))
    if seq is None:
        seq = cfg.get("max_position_embeddings", 2048)
        seq = min(checks.number("--model-config max_position_embeddings", seq, integer=True), 8192.0)
    fields["seq"] = seq
    try:
        return model_from_fields(fields)
    except InputError as exc:
        raise InputError(f"--model-config {str(path)!r}: {exc}") from None
