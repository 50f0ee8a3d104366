"""In which dtype XLA's FSDP moves weights and gradients when the weights are fp32 and the math bf16.

MaxText keeps its weights in float32 (``weight_dtype``) and casts each to bfloat16 where a layer
uses it (``DenseGeneral``: ``kernel = jnp.asarray(kernel, self.dtype)``); with the weights sharded
over the ``fsdp`` mesh axis and the batch over it too, XLA's SPMD partitioner inserts the
collectives. This script builds that pattern (two layers, fp32 weights sharded on their input
dimension over 8 devices, a bf16 batch sharded over the same axis), takes the gradient, and prints
each collective the partitioner placed, with its dtype, read from the HLO right after the
``spmd-partitioning`` pass (the pass is the same on every backend; the CPU backend's later passes
widen bf16 all-reduces to f32, which a GPU does not, so the compiled CPU program is not the
evidence). dse's maxtext stack reads it as ``grad_reduce_bytes = 2`` with ``grad_bytes = 4``.

Run by hand (CPU only, a few seconds; the tests never need it):

    python3 benchmarks/xla_fsdp_dtypes.py

Measured with jax 0.10.2 on this machine: the weight all-gathers are bf16 (the cast runs on the
shard, before the gather) and the weight gradient is all-reduced in bf16 on the gradient dot's
output, then sliced to the shard (a reduce-scatter once the GPU pipeline combines the two) and
converted to fp32 there.
"""

from __future__ import annotations

import glob
import os
import re
import sys
import tempfile

DUMP = tempfile.mkdtemp(prefix="dse-xla-dump-")
os.environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count=8 --xla_dump_to={DUMP} "
                           "--xla_dump_hlo_pass_re=spmd-partitioning")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402


def layer(w, x):
    return x @ w.astype(jnp.bfloat16)          # fp32 weight, bf16 math (MaxText DenseGeneral)


def loss(params, x):
    h = jax.nn.relu(layer(params["w1"], x))
    return jnp.sum(jnp.square(layer(params["w2"], h).astype(jnp.float32)))


def main() -> int:
    mesh = Mesh(jax.devices(), ("fsdp",))
    shard_in = NamedSharding(mesh, P("fsdp", None))     # a weight sharded on its input dimension
    params = {k: jax.device_put(jnp.ones((1024, 1024), jnp.float32), shard_in) for k in ("w1", "w2")}
    x = jax.device_put(jnp.ones((256, 1024), jnp.bfloat16), NamedSharding(mesh, P("fsdp", None)))
    step = jax.jit(jax.grad(loss), out_shardings={"w1": shard_in, "w2": shard_in})
    step.lower(params, x).compile()
    after = sorted(glob.glob(os.path.join(DUMP, "*after_spmd-partitioning*")))
    if not after:
        print("no HLO dump after spmd-partitioning found in", DUMP, file=sys.stderr)
        return 1
    print(f"jax {jax.__version__}; HLO after the spmd-partitioning pass ({os.path.basename(after[-1])}):")
    pattern = re.compile(r"%(\S+) = (\w+)\[([\d,]*)\]\S* (all-gather|all-reduce|reduce-scatter)\(")
    for line in open(after[-1]):
        m = pattern.search(line)
        if m:
            what = "a weight" if m.group(3) == "1024,1024" else "activations"
            op = re.search(r'op_name="([^"]*)"', line)
            print(f"  {m.group(4):11s} {m.group(2):5s}[{m.group(3)}]  {what:12s} {op.group(1) if op else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
