"""The equations on the host: the same ``evaluate``, its ``jnp`` calls answered by numpy.

For one plan, or a grid of a few million, no XLA program pays for itself: tracing the model
costs about a second and compiling it several, where numpy runs every equation of one plan in
about 15 ms, and broadcasts over a sweep's axes as XLA does (each sub-expression once per
combination of the axes it depends on). ``numpy_mode()`` makes that so for the calls inside
it, in this thread: dse's modules compute through ``dse.backend.jnp``, which forwards to
numpy inside the block and to jax.numpy elsewhere (jax is imported only then). Nothing else
changes: jit, grad and vmap anywhere else, and in other threads, see jax.numpy. A function
numpy lacks is still answered by jax (correct, only slower).

float64 numpy ops are IEEE operations like XLA:CPU's: ``evaluate`` in numpy equals the
compiled float64 program bit for bit (tests/engines/test_compiled.py).
"""

from __future__ import annotations

import contextlib

import numpy as np

from dse import backend

__all__ = ["numpy_mode", "active"]


def active() -> bool:
    """True inside ``numpy_mode()`` in this thread."""
    return backend.host_active()


@contextlib.contextmanager
def numpy_mode():
    """Inside the block, this thread's calls into dse's equations compute in numpy (float64 by
    default: Python numbers become float64 arrays); floating-point warnings are off, as in XLA."""
    with backend.numpy_mode():
        yield


def to_numpy(tree):
    """Every leaf of ``tree`` as a numpy array (jax arrays copied to the host once, not per op)."""
    return backend.tree_map(np.asarray, tree)
