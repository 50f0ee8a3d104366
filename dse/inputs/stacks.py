"""Software-stack profiles as data: what a framework release does by default.

A profile (``dse/data/stacks/<name>.toml``, each with its sources) sets the Plan switches a
framework release turns on without being asked: fused attention, TP comm overlap, the
distributed optimizer (ZeRO stage), sequence parallelism with TP, grad-reduce overlap,
the recompute default, whether gradients are reduce-scattered every microbatch
(``grad_accum``: memory.gradient_mode) or accumulated locally until the step's last one, and the DP bucket buffers it keeps beside the gradients
(``dp_bucket_params``, ``dp_bucket_copy``: memory.dp_bucket_bytes; ``zero3_live_params``: memory.zero3_gather_bytes; ``zero3_prefetch_params``: schedule.unprefetched_gather; ``zero3_gather_calls``, ``zero3_reduce_calls``: traffic.dp's ring steps) and the loss's bytes a logit
(``loss_logit_bytes``: memory.logits_bytes) and whether its memory comes from PyTorch's CUDA caching allocator
(``caching_allocator``: memory.fragmentation_bytes; every PyTorch stack) or XLA's compile-time buffer assignment
(MaxText); it documents its FP8 recipe, pipeline-split convention and where its recompute default comes from
(``recompute_source``) as text, and how many layers apart its layer-level selective checkpointing
falls when a run names it without a number (``selective_layer_every``, Plan.recompute_every; its
source ``selective_layer_source``).

A plan names its stack (``--stack``, a sweep file's ``stack`` key, a CSV ``stack`` column);
a published run whose row names none is resolved from its source text (framework and
release, ``resolve``), else the documented ``generic`` fallback.
"""

from __future__ import annotations

import re
from importlib import resources

from dse import files
from dse.backend import jnp
from dse.errors import InputError
from dse.inputs import checks
from dse.inputs.plan import CHOICES, RECOMPUTE

__all__ = ["list_stacks", "load_stack", "plan_fields", "pipelined_fields", "pipelined", "pipelines", "resolve", "FALLBACK", "SWITCHES", "COUNTS"]

FALLBACK = "generic"
# The Plan fields a profile may set, with their allowed values.
SWITCHES = {"flash_attention": (0.0, 1.0), "tp_comm_overlap": (0.0, 1.0), "overlap_grad_reduce": (0.0, 1.0),
            "sp": (0.0, 1.0), "zero": (0.0, 1.0, 2.0, 3.0), "recompute": tuple(RECOMPUTE), "fp8_tp_comm": (0.0, 1.0),
            "fp8_cache": (0.0, 1.0), "dp_bucket_copy": (0.0, 1.0), "grad_accum": (0.0, 1.0),
            "zero3_rank_copies": (0.0, 1.0), "attn_kernel_fa2": (0.0, 1.0), "grad_bytes": tuple(CHOICES["grad_bytes"].values()),
            "grad_reduce_bytes": tuple(CHOICES["grad_reduce_bytes"].values()), "caching_allocator": (0.0, 1.0)}
# The Plan fields a profile may set to a count (checked >= 0): buffer sizes the framework chooses.
COUNTS = ("dp_bucket_params", "loss_logit_bytes", "zero3_live_params", "zero3_prefetch_params", "zero3_gather_calls",
          "zero3_reduce_calls")
_TEXT = ("description", "source", "framework", "release", "pipeline_split", "fp8_recipe", "recompute_source",
         "selective_layer_source", "pipelined_source", "memory_printed", "memory_source")


def _dir():
    return resources.files("dse") / "data" / "stacks"


def list_stacks() -> list[str]:
    return [p.name[:-5] for p in files.data_files(_dir())]


def load_stack(name: str) -> dict:
    """A profile: its text fields, ``match`` (lower-case words naming it) and ``plan`` (checked)."""
    path = _dir() / f"{name}.toml"
    if not path.is_file():
        raise InputError(f"stack: unknown {name!r}; allowed: {', '.join(list_stacks())}")
    raw = files.data_toml(path)      # shared: read, not modified
    plan = dict(raw.get("plan") or {})
    with_pp = dict(raw.get("plan_with_pp") or {})
    for table, fields in (("plan", plan), ("plan_with_pp", with_pp)):
        for k, v in fields.items():
            if k in COUNTS:
                checks.non_negative(f"stack {name}: {table}.{k}", v)
                continue
            if k not in SWITCHES:
                raise InputError(f"stack {name}: unknown {table} field {k!r}; allowed: {', '.join((*SWITCHES, *COUNTS))}")
            if (v if k == "recompute" else float(v)) not in SWITCHES[k]:
                raise InputError(f"stack {name}: {table}.{k} = {v!r}; allowed: {', '.join(map(str, SWITCHES[k]))}")
    out = {k: str(raw.get(k, "")) for k in _TEXT}
    if out["memory_printed"] not in ("", "device", "reserved"):
        raise InputError(f"stack {name}: memory_printed = {out['memory_printed']!r}; allowed: device, reserved")
    every = raw.get("selective_layer_every")
    if every is not None:
        every = checks.number(f"stack {name}: selective_layer_every", every, integer=True, minimum=1.0)
    out.update(name=name, match=[str(m).lower() for m in raw.get("match", [])], plan=plan, plan_with_pp=with_pp,
               selective_layer_every=every)
    return out


def plan_fields(name: str) -> dict:
    """The Plan fields a stack sets, as Plan.make keywords (recompute as its code)."""
    return _keywords(load_stack(name)["plan"])


def _keywords(table: dict) -> dict:
    """A profile's plan table as Plan.make keywords (recompute as its code)."""
    return {k: (RECOMPUTE[v] if k == "recompute" else float(v)) for k, v in table.items()}


def pipelined(plan, fields: dict):
    """``plan`` with a stack's pipeline fields (``pipelined_fields``) where it pipelines a sharded
    data-parallel plan (pp > 1 and ZeRO >= 1; plain replication, ZeRO-0, is left as it is), any array
    shape: a sweep's points each by its own pp and ZeRO; the plan itself where ``fields`` is empty.
    Every entry point that knows a run's stack applies it here: dse plan --stack, a sweep file's
    stack, dse validate."""
    if not fields:
        return plan
    on = pipelines(plan.pp, plan.zero)
    return plan.replace(**{k: jnp.where(on, v, getattr(plan, k)) for k, v in fields.items()})


def pipelines(pp, zero):
    """Where a stack's ``[plan_with_pp]`` applies: a pipeline (pp > 1) over sharded data parallelism
    (ZeRO >= 1). Numbers or arrays alike."""
    return (pp > 1) & (zero >= 1)


def pipelined_fields(name: str) -> dict:
    """The Plan fields a stack's pipeline (pp > 1) imposes on a sharded data-parallel plan over what
    the run asked for (``[plan_with_pp]``; torchtitan: FSDP under torch.distributed.pipelining runs as ZeRO-1).
    Empty when pipelining changes nothing."""
    return _keywords(load_stack(name)["plan_with_pp"])


def _word(needle: str, text: str) -> int:
    """Position of ``needle`` as a whole word (or phrase) in ``text``, -1 when absent."""
    m = re.search(r"(?<![a-z0-9])" + re.escape(needle) + r"(?![a-z0-9])", text)
    return m.start() if m else -1


def resolve(text: str) -> tuple[str, str]:
    """(stack name, why) for a run described by ``text`` (source reference and notes).

    A profile matches when one of its ``match`` words appears; one whose release also
    appears wins, then the one named first; a framework named without a release gets its
    latest profile; no framework named gives the generic fallback.
    """
    text = (text or "").lower()
    found = []
    for name in list_stacks():
        st = load_stack(name)
        pos = [p for p in (_word(m, text) for m in st["match"]) if p >= 0]
        if pos:
            named = bool(st["release"]) and _word(st["release"].lower(), text) >= 0
            found.append((not named, min(pos), _latest_key(st["release"]), name, st))
    if not found:
        return FALLBACK, "no framework named in the row: generic fallback"
    found.sort(key=lambda x: (x[0], x[1], x[2]))
    unnamed, _, _, name, st = found[0]
    if unnamed:   # no release named: the framework's latest profile
        same = [f for f in found if f[4]["framework"] == st["framework"]]
        name, st = max(same, key=lambda f: _latest_key(f[4]["release"]))[3:5]
        return name, f"source text names {st['framework']} (no release): its latest profile"
    return name, f"source text names {st['framework']} {st['release']}"


def _latest_key(release: str):
    return tuple(int(x) for x in re.findall(r"\d+", release))
