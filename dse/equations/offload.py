"""Offload to host memory: what moves to the host, what crosses the host link, and how long it takes.

Plan choices (dse/inputs/plan.py): the optimizer state with its host-side Adam step (ZeRO-Offload,
Ren et al. 2021; Megatron-Core --optimizer-cpu-offload with --optimizer-offload-fraction), the
gradient partition (ZeRO-Offload), the ZeRO-3 weight partition (ZeRO-Infinity, Rajbhandari et al.
2021) and a share of the stored activations (Megatron-Core activation offloading). The cluster
gives the host link per accelerator, host memory and host DRAM bandwidth per node.

Every function is elementwise in its array arguments; with every offload field at 0 each term is 0.
"""

from __future__ import annotations

from dse.backend import jnp
from dse.equations import memory, steps

# The host-side Adam step reads and writes the fp32 master weight, momentum and variance (3 x 4 x 2
# bytes), reads the 16-bit gradient and writes the 16-bit weight copy (2 + 2): ZeRO-Offload sec.4.1
# (Fig.2 data flow: fp16 gradients in, fp32 states updated on the CPU, fp16 parameters out). CPU Adam
# is bound by DRAM bandwidth at these 28 bytes a parameter (DeepSpeed's vectorized CPU-Adam, sec.5.1).
HOST_ADAM_BYTES_PER_PARAM = 3 * 4.0 * 2 + 2.0 + 2.0


def ranks_per_node(cluster):
    """Ranks that share one node's host memory, link-side DRAM and CPUs."""
    return jnp.minimum(cluster.gpus_per_node, cluster.gpus)


def host_adam_time(params, cluster):
    """Seconds of the host-side Adam step for ``params`` on one rank, the node's DRAM bandwidth shared
    by its ranks (all of them step at once after the backward pass)."""
    rate = steps.safe_div(cluster.node_host_bw_bytes_per_s, ranks_per_node(cluster) * HOST_ADAM_BYTES_PER_PARAM)
    return steps.safe_div(params, rate) + jnp.where((params > 0) & (rate <= 0), jnp.inf, 0.0)


def link_time(nbytes, cluster):
    """Seconds to move ``nbytes`` one way over the accelerator's host link (inf when there is none)."""
    return steps.safe_div(nbytes, cluster.host_link_bytes_per_s) + jnp.where(
        (nbytes > 0) & (cluster.host_link_bytes_per_s <= 0), jnp.inf, 0.0)


def owned_params(params_rank, shard, zero):
    """Parameters whose optimizer state this rank owns: 1/shard of its parameters under ZeRO >= 1."""
    return params_rank / jnp.where(zero >= 1, shard, 1.0)


def device_states(weights, grads, optim, plan):
    """(weights, gradients, optimizer) bytes that stay in HBM: the offloaded shares leave (weights only
    under ZeRO-3, whose partition is all a rank keeps; the gathered copies are memory.zero3_gather_bytes)."""
    w_off = jnp.where(plan.zero >= 3, plan.offload_weights, 0.0)
    return weights * (1.0 - w_off), grads * (1.0 - plan.offload_gradients), optim * (1.0 - plan.offload_optimizer)


def device_activations(acts, per_layer, plan):
    """Stored activations left in HBM: (1 - share) of them, plus two layers' worth being sent or
    fetched while the rest sits on the host (double buffering)."""
    a = plan.offload_activations
    return acts * (1.0 - a) + jnp.where(a > 0, jnp.minimum(2.0 * per_layer, acts), 0.0) * a


def host_bytes(weights, grads, optim, acts, owned, plan):
    """Host bytes one rank keeps: the offloaded shares of its optimizer state, gradient partition,
    ZeRO-3 weight partition and stored activations; the host-side Adam step needs the owned
    parameters' 16-bit gradients on the host too (ZeRO-Offload Fig.2: fp16 gradients on the CPU)."""
    w_off = jnp.where(plan.zero >= 3, plan.offload_weights, 0.0)
    grad_host = jnp.maximum(plan.offload_gradients * grads,
                            plan.offload_optimizer * memory.GRAD_BYTES * owned)
    return optim * plan.offload_optimizer + grad_host + weights * w_off + acts * plan.offload_activations


def times(owned, grad_bytes, weight_part, per_layer, layers, m, gathers, compute_s, w_bytes, plan, cluster, k=None):
    """Exposed seconds a step spends on offload, and the parts behind it (dict).

    - optimizer: the owned gradients go down (D2H) during the backward pass as their buckets finish
      (ZeRO-Offload sec.4.1), hidden behind up to the backward's 2/3 of compute (seed 000 sec.6);
      after it the host runs Adam and the 16-bit weights come back (H2D), pipelined chunk by chunk
      (``offload_overlap`` = 1: the longer of the two) or one after the other;
    - gradients kept on the host (``grad_bytes``: the rank's gradient buffer, sharded or not) go down
      every microbatch, since the host holds the accumulator (ZeRO-Offload sec.4.1);
    - ZeRO-3 weights on the host come up for every gather (``gathers`` a step), prefetched behind compute;
    - offloaded activations go down in the forward and come back for the backward (each direction
      its own link direction), overlapped with compute (Megatron-Core activation offloading).
    """
    f = plan.offload_optimizer
    w_off = jnp.where(plan.zero >= 3, plan.offload_weights, 0.0)
    grad_down = link_time(jnp.where(plan.offload_gradients > 0, plan.offload_gradients * grad_bytes * m,
                                    f * memory.GRAD_BYTES * owned), cluster)
    adam = host_adam_time(f * owned, cluster)
    weights_up = link_time(f * w_bytes * owned, cluster)
    after = jnp.where(plan.offload_overlap >= 1, jnp.maximum(adam, weights_up), adam + weights_up)
    params_up = link_time(w_off * w_bytes * weight_part * gathers, cluster)
    acts_move = link_time(plan.offload_activations * per_layer * layers * m, cluster)
    # what runs beside compute: gradient D2H behind the backward, weight and activation
    # transfers behind the whole of it (each hides until the link is busier than the compute)
    behind = (jnp.where(grad_down > 0, steps.relu(grad_down - 2.0 / 3.0 * compute_s, k), 0.0)
              + jnp.where(params_up + acts_move > 0, steps.relu(params_up + acts_move - compute_s, k), 0.0))
    return dict(optimizer_host_s=adam, grad_d2h_s=grad_down, weights_h2d_s=weights_up + params_up,
                activations_s=acts_move, exposed_s=jnp.where(f > 0, after, 0.0) + behind)
