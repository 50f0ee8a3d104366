"""The equations on the host: the same ``evaluate``, its ``jnp`` calls answered by numpy.

For one plan, or a grid of a few million, no XLA program pays for itself: tracing the model
costs about a second and compiling it several, where numpy runs every equation of one plan in
about 15 ms, and broadcasts over a sweep's axes as XLA does (each sub-expression once per
combination of the axes it depends on). ``numpy_mode()`` makes that so for the calls inside
it, in this thread: every dse module written against ``jax.numpy as jnp`` has its ``jnp``
bound, once a process, to a namespace that forwards to jax.numpy, or to numpy inside the
block. Nothing else changes: jit, grad and vmap anywhere else, and in other threads, see
jax.numpy. A function numpy lacks is still answered by jax (correct, only slower).

float64 numpy ops are IEEE operations like XLA:CPU's: ``evaluate`` in numpy equals the
compiled float64 program bit for bit (tests/engines/test_compiled.py).
"""

from __future__ import annotations

import contextlib
import sys
import threading

import jax
import jax.numpy as _jnp   # not ``jnp``: this module's own name is never rebound
import numpy as np

__all__ = ["numpy_mode", "active"]

_LOCAL = threading.local()
_BOUND: set = set()
_LOCK = threading.Lock()


class _Namespace:
    """``jnp`` of dse's modules: jax.numpy, or numpy inside ``numpy_mode()`` in this thread."""

    def __getattr__(self, name):
        return getattr(np if getattr(_LOCAL, "on", False) else _jnp, name)

    def __repr__(self):
        return f"<dse jnp: {'numpy' if active() else 'jax.numpy'}>"


_NAMESPACE = _Namespace()


def active() -> bool:
    """True inside ``numpy_mode()`` in this thread."""
    return getattr(_LOCAL, "on", False)


def _bind() -> None:
    """Bind ``jnp`` of every loaded dse module that imported jax.numpy to the namespace (new ones too)."""
    mods = [m for name, m in list(sys.modules.items())
            if (name == "dse" or name.startswith("dse.")) and name not in _BOUND]
    with _LOCK:
        for m in mods:
            if getattr(m, "jnp", None) is _jnp:
                m.jnp = _NAMESPACE
            _BOUND.add(m.__name__)


@contextlib.contextmanager
def numpy_mode():
    """Inside the block, this thread's calls into dse's equations compute in numpy (float64 by
    default: Python numbers become float64 arrays); floating-point warnings are off, as in XLA."""
    _bind()
    outer = active()
    _LOCAL.on = True
    try:
        with np.errstate(all="ignore"):
            yield
    finally:
        _LOCAL.on = outer


def to_numpy(tree):
    """Every leaf of ``tree`` as a numpy array (jax arrays copied to the host once, not per op)."""
    return jax.tree_util.tree_map(np.asarray, tree)
