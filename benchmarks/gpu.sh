#!/usr/bin/env bash
# The sweep benchmark on an accelerator (run by hand on a GPU machine; the tests never need one).
# Installs nothing: needs a JAX with CUDA (pip install "jax[cuda12]") already in this Python.
# Prints the devices, then plans/s for reduced and Pareto sweeps (1e7, 1e8, 1e9 plans) and the
# main job's phase table, from benchmarks/time_to_answer.py.
#
#   bash benchmarks/gpu.sh            # 1e6-1e8 and the main job
#   bash benchmarks/gpu.sh --big      # also 1e9 plans
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import jax; d = jax.devices(); print("devices:", d); assert d[0].platform != "cpu", "no accelerator: JAX sees only the CPU"'
export XLA_PYTHON_CLIENT_PREALLOCATE=false
exec python3 benchmarks/time_to_answer.py "$@"
