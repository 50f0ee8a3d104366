"""Goodput: the share of wall-clock time that trains, once failures are counted.

A job on N accelerators, each failing at ``rate`` per second (independent, exponential),
is interrupted every M = 1 / (N rate) seconds on average. It writes a checkpoint of
``write_s`` every ``interval_s`` of training; a failure costs the restart ``restart_s``
plus, on average, half a segment of lost work. Young (1974), "A first order
approximation to the optimum checkpoint interval", CACM 17(9): the interval that
minimizes lost time is sqrt(2 write M); Daly (2006), FGCS 22(3), eq.(1)-(2) for the
same first-order waste. Llama 3 (Dubey et al. 2024, sec.3.3.4) logged 466
interruptions in 54 days on 16,384 GPUs and over 90% effective training time.

Elementwise jnp: broadcasts over sweep axes and differentiates (co-design counts a
larger N's failures through these functions).
"""

from __future__ import annotations

import jax.numpy as jnp

from dse.equations import steps

__all__ = ["job_mtbf_s", "interruptions", "young_daly_interval_s", "goodput",
           "time_to_train_s", "rate_from_interruptions", "LLAMA3_FAILURE_RATE_PER_GPU_S"]

SECONDS_PER_DAY = 86400.0


def rate_from_interruptions(count, days, gpus):
    """Per-accelerator failure rate (1/s) from an observed count on ``gpus`` over ``days``."""
    return count / (days * SECONDS_PER_DAY * gpus)


# Llama 3 sec.3.3.4 (Table 5): 466 interruptions in 54 days on 16,384 GPUs -> 6.1e-9 /GPU/s
# (one failure per GPU every ~5.2 years); planned interruptions included, as the paper counts them.
LLAMA3_FAILURE_RATE_PER_GPU_S = rate_from_interruptions(466.0, 54.0, 16384.0)


def job_mtbf_s(gpus, rate_per_gpu_s):
    """Mean time between interruptions of the whole job: 1 / (N rate) (independent failures)."""
    return 1.0 / (gpus * rate_per_gpu_s)


def interruptions(gpus, rate_per_gpu_s, seconds):
    """Expected interruptions in ``seconds`` of wall clock: N rate T."""
    return gpus * rate_per_gpu_s * seconds


def young_daly_interval_s(write_s, mtbf_s):
    """Young (1974) / Daly (2006) first-order optimum: sqrt(2 write M) of training between checkpoints."""
    return jnp.sqrt(2.0 * write_s * mtbf_s)


def goodput(gpus, rate_per_gpu_s, write_s, restart_s, interval_s=None, sharpness=None):
    """Effective training time fraction (Daly 2006 first order).

    Each segment is ``interval`` of training plus ``write`` of checkpoint; a failure
    (every M seconds) loses half a segment and the restart:
      goodput = interval / (interval + write) * max(0, 1 - (restart + (interval + write)/2) / M)
    ``interval_s`` None: the Young/Daly optimum.
    """
    M = job_mtbf_s(gpus, rate_per_gpu_s)
    tau = young_daly_interval_s(write_s, M) if interval_s is None else interval_s
    useful = tau / (tau + write_s)                                     # checkpoint overhead
    lost = (restart_s + 0.5 * (tau + write_s)) / M                     # rework + restart per failure
    return useful * steps.relu(1.0 - lost, sharpness)


def time_to_train_s(tokens, tokens_per_s, goodput_fraction):
    """Wall clock to train ``tokens``: tokens / throughput / goodput (infinite at zero goodput)."""
    return tokens / tokens_per_s / goodput_fraction
