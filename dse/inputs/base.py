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
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["Inputs", "broadcast_all", "stack"]


def _as_array(x: Any) -> jax.Array:
    return jnp.asarray(x, dtype=jnp.result_type(float))


class Inputs:
    """Shared helpers: ``make`` converts to float arrays; ``replace`` copies."""

    @classmethod
    def make(cls, **kwargs):
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

    def replace(self, **kwargs):
        return dataclasses.replace(self, **{k: _as_array(v) for k, v in kwargs.items()})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def broadcast_all(*trees):
    """Broadcast every leaf of every tree to one common shape (for ``vmap``)."""
    leaves = [leaf for t in trees for leaf in jax.tree_util.tree_leaves(t)]
    shape = jnp.broadcast_shapes(*[jnp.shape(x) for x in leaves])
    out = tuple(jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, shape), t) for t in trees)
    return out if len(out) > 1 else out[0]


def stack(items):
    """Stack a list of same-type inputs into one batched input (leading axis)."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *items)
