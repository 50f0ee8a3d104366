#!/usr/bin/env bash
# The sweep benchmark on an accelerator (run by hand on a GPU machine; the tests never need one).
# Installs nothing: needs a JAX with CUDA (pip install "jax[cuda12]") already in this Python.
# Prints the devices, then plans/s for reduced and Pareto sweeps (1e7, 1e8, 1e9 plans) and the
# main job's phase table, from benchmarks/time_to_answer.py; then, where this Python has PyTorch with
# CUDA, one transformer layer's kernels (benchmarks/gpu_layer.py, its JSON in $DSE_GPU_OUT, default
# the working directory) beside calibrated dse's layer (benchmarks/gpu_layer_compare.py), a whole
# training step of a 4-layer Llama 3 8B on one GPU beside dse's (benchmarks/gpu_step.py), and
# fine-grained MoE experts' grouped GEMMs beside dse's rate for them (benchmarks/gpu_grouped_gemm.py,
# gpu_grouped_compare.py).
#
#   bash benchmarks/gpu.sh            # 1e6-1e8 and the main job
#   bash benchmarks/gpu.sh --big      # also 1e9 plans
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"    # this checkout's dse, installed or not
python3 -c 'import jax; d = jax.devices(); print("devices:", d); assert d[0].platform != "cpu", "no accelerator: JAX sees only the CPU"'
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 benchmarks/time_to_answer.py "$@"
if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    out="${DSE_GPU_OUT:-.}/gpu_layer.json"
    python3 benchmarks/gpu_layer.py > "$out"
    python3 benchmarks/gpu_layer_compare.py "$out"
    python3 benchmarks/gpu_step.py > "${DSE_GPU_OUT:-.}/gpu_step.json"    # a whole step on one GPU, beside dse
    grouped="${DSE_GPU_OUT:-.}/gpu_grouped_gemm.json"
    python3 benchmarks/gpu_grouped_gemm.py > "$grouped"
    python3 benchmarks/gpu_grouped_compare.py "$grouped"
else
    echo "(no PyTorch with CUDA here: the layer check is skipped)"
fi
