"""Inputs of the planner's model: the model shape, the cluster and the plan.

Each is a frozen dataclass registered as a JAX pytree whose every field is a float
array, integer degrees included, so one type holds one plan, a batch of plans (a
leading axis), or a grid of plans (arrays that broadcast against each other), and a
relaxed plan for co-design (non-integer degrees). Build them with ``make``, which
converts Python numbers to arrays; the plain constructor leaves its arguments as
given, as JAX's pytree machinery requires.

New fields go at the end with a default, so ``evaluate``'s signature never changes.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import linecache
import re
import sys
from typing import Any

import numpy as np

from dse import backend
from dse.backend import jnp, tree_leaves, tree_map


__all__ = ["Inputs", "broadcast_all", "stack", "field_comments"]


def _is_float_array(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and np.issubdtype(np.dtype(dtype), np.floating)


def _as_array(x: Any) -> jax.Array:
    """A float array: a traced value stays traced (jax's default float); anything concrete becomes
    a float64 numpy array, jax imported or not (jax converts it when it meets it, to float32 where
    x64 is off; dse/backend.py). Concrete inputs built as jax arrays cost a device op a field
    each time a sweep or a loop converted them (0.2 ms a field: 15 ms a plan of ~100 fields)."""
    if backend.on_host() or not backend.is_traced(x):
        return np.asarray(x, dtype=np.float64)
    return jnp.asarray(x, dtype=jnp.result_type(float))


@functools.cache
def field_comments(cls) -> dict[str, str]:
    """Each dataclass field's trailing ``# comment`` in ``cls``'s source (its meaning and units).

    The class's lines are found by its ``class`` line and indentation in its module's file
    (``inspect.getsource`` parses the whole module: a tenth of ``dse plan``'s CPU time)."""
    module = sys.modules.get(cls.__module__)
    lines = linecache.getlines(getattr(module, "__file__", None) or "")
    head = re.compile(rf"^class {re.escape(cls.__name__)}\b")
    start = next((i for i, line in enumerate(lines) if head.match(line)), None)
    if start is None:
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    out = {}
    for line in lines[start + 1:]:
        if line.strip() and not line[0].isspace() and not line.startswith(("#", ")")):
            break   # the class ends at the next top-level statement
        m = _FIELD_LINE.match(line.rstrip("\n"))
        if m and m.group(1) in names:
            out[m.group(1)] = m.group(2).strip()
    return out


_FIELD_LINE = re.compile(r"^\s+(\w+)\s*:\s*[\w.\[\], |]+(?:=\s*[^#]+)?#\s*(.*)$")


def make_doc(cls) -> str:
    """``cls.make``'s docstring: every field with its default and the comment beside it in the source."""
    comments = field_comments(cls)
    head = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else cls.__name__
    lines = [f"Build a {cls.__name__}: {head}", "",
             "Every argument is a number or an array (arrays broadcast against each other: a batch or",
             "a grid of inputs); all become float arrays. Units are SI and named in the field",
             "(_bytes, _s, _per_s, _flops); counts and degrees are plain numbers. Fields without a",
             "default are required.", "", "Fields:"]
    for f in dataclasses.fields(cls):
        default = "required" if f.default is dataclasses.MISSING else f"default {f.default:g}"
        lines.append(f"    {f.name} ({default}): {comments.get(f.name, '')}".rstrip())
    return "\n".join(lines)


def make_signature(cls) -> inspect.Signature:
    """Keyword-only parameters, one per field, with the field's default."""
    params = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation="ArrayLike",
                                default=inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)
              for f in dataclasses.fields(cls)]
    return inspect.Signature(params, return_annotation=cls.__name__)


class _Make:
    """``Cls.make``: a classmethod whose signature and docstring come from ``Cls``'s fields (never drift)."""

    def __get__(self, obj, cls):
        cls = cls if cls is not None else type(obj)
        cached = cls.__dict__.get("_make_bound")
        if cached is not None:
            return cached

        def make(**kwargs):
            return cls._make(**kwargs)

        make.__name__ = "make"
        make.__qualname__ = f"{cls.__name__}.make"
        make.__module__ = cls.__module__
        make.__doc__ = make_doc(cls)
        make.__signature__ = make_signature(cls)
        if dataclasses.is_dataclass(cls):   # the fields are known once the dataclass exists
            type.__setattr__(cls, "_make_bound", make)
        return make


class Inputs:
    """Shared helpers: ``make`` converts to float arrays; ``replace`` copies."""

    @classmethod
    def _make(cls, **kwargs):
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = set(kwargs) - set(names)
        if unknown:
            raise TypeError(f"{cls.__name__}: unknown field(s) {sorted(unknown)}; allowed: {names}")
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in kwargs:
                values[f.name] = _as_array(kwargs[f.name])
            elif f.default is not dataclasses.MISSING:
                values[f.name] = _as_array(f.default)
            else:
                raise TypeError(f"{cls.__name__}: missing field {f.name!r}")
        return cls(**values)

    make = _Make()

    def replace(self, **kwargs):
        """A copy with fields replaced; a float array keeps its dtype (a float32 sweep stays float32
        through the equations' own replaces), anything else becomes a float array (``_as_array``)."""
        return dataclasses.replace(self, **{k: v if _is_float_array(v) else _as_array(v) for k, v in kwargs.items()})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def broadcast_all(*trees):
    """Broadcast every leaf of every tree to one common shape (for ``vmap``)."""
    leaves = [leaf for t in trees for leaf in tree_leaves(t)]
    shape = jnp.broadcast_shapes(*[jnp.shape(x) for x in leaves])
    out = tuple(tree_map(lambda x: jnp.broadcast_to(x, shape), t) for t in trees)
    return out if len(out) > 1 else out[0]


@backend.host_when_concrete   # a host batch (validation's runs): numpy, not one eager XLA conversion a value
def stack(items):
    """Stack a list of same-type inputs into one batched input (leading axis)."""
    return tree_map(lambda *xs: jnp.stack(xs), *items)
