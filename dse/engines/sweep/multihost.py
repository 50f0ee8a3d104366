"""Several processes (hosts) in one sweep: ``jax.distributed`` set up from flags or the environment.

JAX 0.10's ``jax.distributed.initialize()`` reads only ``JAX_COORDINATOR_ADDRESS`` from the
environment; the process count and id must be passed as arguments unless a cluster
(SLURM, Open MPI, Kubernetes, ...) is auto-detected, else it raises "Number of processes
must be defined" (jax/_src/distributed.py, ``State.initialize``). ``initialize`` here reads
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` too and passes them. On CPU the processes
exchange the sweep's small reductions through gloo (``jax_cpu_collectives_implementation``).
"""

from __future__ import annotations

import os

from dse.errors import InputError

__all__ = ["initialize"]


def _int(name: str, value) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InputError(f"{name}: {value!r} is not an integer; allowed: an integer >= 0") from None


def initialize(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
               *, cpu_collectives: str = "gloo") -> None:
    """Join this process to a multi-process JAX job before ``run_sweep``.

    Arguments left ``None`` come from ``JAX_COORDINATOR_ADDRESS`` (host:port of process 0),
    ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``; all three left unset, JAX's cluster
    auto-detection decides (SLURM, MPI, ...). Every process then calls ``run_sweep`` on
    the same spec and gets the same result.
    """
    import jax

    coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
    n = _int("--num-processes", num_processes if num_processes is not None else os.environ.get("JAX_NUM_PROCESSES"))
    pid = _int("--process-id", process_id if process_id is not None else os.environ.get("JAX_PROCESS_ID"))
    given = [x is not None for x in (coordinator, n, pid)]
    if any(given) and not all(given):
        raise InputError("--coordinator/--num-processes/--process-id: give all three (or JAX_COORDINATOR_ADDRESS, "
                         "JAX_NUM_PROCESSES, JAX_PROCESS_ID), or none for the cluster's auto-detection")
    if n is not None and not 0 <= pid < n:
        raise InputError(f"--process-id: {pid} is not allowed; allowed: 0 .. {n - 1}")
    # only the CPU client reads it; asking the backend here would start XLA before initialize
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    if all(given):
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=n, process_id=pid)
    else:
        jax.distributed.initialize()
