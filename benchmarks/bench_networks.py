"""Time evaluate on a broadcast grid with the network model (run by hand: python3 benchmarks/bench_networks.py).

Rates per group depend on degrees and the cluster only, so they broadcast over few axes;
the network adds compile time (torus and three-tier terms are always traced) but little
run time. Prints compile and run seconds for 120,000 plans on the seed cluster and on a
torus.
"""

import time

import jax
import jax.numpy as jnp

import dse
from dse.inputs import presets


def main():
    m = presets.load_model("gpt3-175b")
    plan = dse.Plan.make(tp=jnp.array([1., 2., 4., 8., 16.])[:, None, None, None],
                         pp=jnp.array([1., 2., 4., 8., 16., 32.])[None, :, None, None],
                         mbs=jnp.array([1., 2., 4., 8.])[None, None, :, None],
                         gbs=jnp.linspace(512., 8192., 1000)[None, None, None, :])
    for name in ("seed", "h100-24k-3tier", "tpu-v4-torus"):
        cl = presets.load_cluster(name)
        f = jax.jit(lambda p, cl=cl: dse.evaluate(m, cl, p).step_s)
        t0 = time.perf_counter()
        f(plan).block_until_ready()
        t1 = time.perf_counter()
        for _ in range(5):
            f(plan).block_until_ready()
        t2 = time.perf_counter()
        print(f"{name:18s} compile {t1 - t0:6.2f} s   run {(t2 - t1) / 5 * 1e3:7.2f} ms   (120,000 plans)")


if __name__ == "__main__":
    main()
