"""Sweeps: the Cartesian product of axes, evaluated on the device, reduced as it goes.

Each axis gets its own array dimension (shape ``(1, .., n_i, .., 1)``) and
``evaluate`` is called once on the broadcast inputs inside ``jit``, so XLA computes
a sub-expression once per combination of the axes it depends on, never per plan
(DESIGN.md, "broadcast over sweep axes"). The grid is never built on the host: the
flat index space (row-major, last axis fastest) is cut into contiguous chunks; a
chunk fixes the outer axes to one value each, takes a tile of one axis and all
values of the inner axes. Chunks run in groups of one per device (``shard_map``
over every device JAX sees) and each device returns only reductions:

* counts of points, feasible points and points per infeasibility reason (REASONS);
* the best ``top_k`` points of the objective, ties broken by flat index (exact:
  the best rows by (row minimum, row index), then a sort of those rows);
* Pareto candidates over 2-3 objectives: feasible points that no probe point (a
  few points of the front found so far) dominates, packed by rows; the host keeps
  the exact front, so the front never depends on chunking or device count;
* optionally every point's main outputs (the full dump, bounded by DUMP_LIMIT).

Two engines compute the same chunks (``run_sweep(engine=...)``): up to HOST_POINTS plans,
numpy on the host in float64 (dse/engines/host.py: the same ``evaluate`` on the same broadcast
axes, reduced by the host merges below, no compile), and above it the compiled kernel on
every device; "auto" chooses by the sweep alone, so a sweep file always gets the same engine.

The reported rows (top and Pareto) are evaluated again in float64, in one batched call
shared with ``dse plan`` (``compiled.evaluate_exact``, by numpy), and carry the
fields of ``dse plan --json`` plus their sweep coordinates. Compiled kernels are kept in
memory and in the cache directory (``$DSE_CACHE_DIR``), so a second process loads them. With
``out_dir`` the state is written atomically after every finished group of chunks,
and ``resume=True`` continues from it with exactly the same final result.

Multi-host: call ``multihost.initialize(coordinator, num_processes, process_id)`` (or
``dse sweep FILE --coordinator HOST:PORT --num-processes N --process-id I``) in every
process before ``run_sweep``; JAX 0.10's own ``jax.distributed.initialize()`` reads only
the coordinator from the environment. ``jax.devices()`` then lists every host's devices
and the chunks of one step are spread over all of them (tests/engines/test_multihost.py).
"""

from dse.engines.sweep.kernel import _inputs, pareto_mask
from dse.engines.sweep.run import SweepResult, run_sweep
from dse.engines.sweep.spec import (AXIS_NAMES, DEFAULT_CHUNK, DUMP_CHUNK, DUMP_FIELDS, DUMP_LIMIT, OBJECTIVES, Axis, SweepSpec,
                                    default_chunk, load_spec)
from dse.errors import InputError

__all__ = ["SweepSpec", "SweepResult", "Axis", "load_spec", "run_sweep", "pareto_mask",
           "AXIS_NAMES", "OBJECTIVES", "DUMP_FIELDS", "DUMP_LIMIT", "DEFAULT_CHUNK", "DUMP_CHUNK", "default_chunk",
           "InputError", "_inputs"]
