"""Step primitives: every hard step of the model, with an optional sharpness.

``sharpness=None`` is exact (the hard step). A finite sharpness k gives a smooth
version that tends to the hard one as k grows; co-design optimizes through those.
The equations call these and nothing else for a kink or a jump, so one model serves
the sweep (exact) and the co-design (smooth).
"""

from __future__ import annotations

import math

import numpy as np

from dse.backend import is_traced, jnp, lax, nn


__all__ = ["relu", "minimum", "maximum", "ceil", "step", "le", "where", "never", "safe_div"]


def relu(x, sharpness=None):
    """max(0, x); softplus(k x)/k when smooth."""
    if sharpness is None:
        return jnp.maximum(x, 0.0)
    return nn.softplus(sharpness * x) / sharpness


def minimum(a, b, sharpness=None):
    """min(a, b) = a - max(0, a - b)."""
    return a - relu(a - b, sharpness)


def maximum(a, b, sharpness=None):
    """max(a, b) = a + max(0, b - a)."""
    return a + relu(b - a, sharpness)


def ceil(x, sharpness=None):
    """ceil(x); smooth: floor(x) + sigmoid(k (frac(x) - 1/sqrt(k)))."""
    if sharpness is None:
        return jnp.ceil(x)
    n = lax.stop_gradient(jnp.floor(x))
    return n + nn.sigmoid(sharpness * (x - n) - jnp.sqrt(sharpness))


def step(x, sharpness=None):
    """1 where x >= 0 else 0; sigmoid(k x) when smooth."""
    if sharpness is None:
        return jnp.where(x >= 0, 1.0, 0.0)
    return nn.sigmoid(sharpness * x)


# Smooth ``le`` puts its midpoint half a doubling above b, so a == b (a group exactly the
# size of its domain) tends to 1 as sharpness grows, and a = 2b (the next power of two) to 0.
LE_MARGIN = 0.5 * math.log(2.0)


def le(a, b, sharpness=None):
    """1 where a <= b, compared on a log scale (degrees and sizes are positive)."""
    if sharpness is None:
        return jnp.where(a <= b, 1.0, 0.0)
    return step(jnp.log(b) - jnp.log(a) + LE_MARGIN, sharpness)


def where(weight, a, b):
    """Blend: weight * a + (1 - weight) * b; exact select when weight is 0 or 1.

    A concrete weight of exactly 1 or 0 everywhere (a fidelity switch such as ``real_shapes``,
    known when the program is built) returns ``a`` or ``b`` itself: the same numbers, and the
    branch not taken is never traced (1,495 of the 13,291 equations of one ``evaluate`` were
    this blend, lowered and compiled into every program)."""
    if _everywhere(weight, 1.0):
        return a
    if _everywhere(weight, 0.0):
        return b
    return jnp.where(weight == 1.0, a, jnp.where(weight == 0.0, b, weight * a + (1.0 - weight) * b))


def never(cond) -> bool:
    """True when ``cond`` is concrete and false everywhere (a cluster that is not a torus, known
    when the program is built): what only it would select need not be traced."""
    return _everywhere(cond, False)


def _everywhere(x, value) -> bool:
    """Whether ``x`` is concrete (not a tracer) and equal to ``value`` at every element."""
    if isinstance(x, (bool, int, float)):   # a Python number (most switches): no array built
        return x == value
    if is_traced(x):
        return False
    x = np.asarray(x)
    # the array's own method, not np.all's dispatch wrapper: ~540 tests an ``evaluate``, and the
    # wrapper cost more than the test (a co-design polish's 36 host evaluations: 0.29 of 1.9 s)
    return bool(x.size) and bool((x == value).all())


def safe_div(num, den):
    """num / den with 0 where den == 0, finite gradients (the double where)."""
    ok = den != 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)
