"""Goodput: the share of wall-clock time that trains, once failures are counted.

A job on N accelerators, each failing at ``rate`` per second (independent, exponential),
is interrupted every M = 1 / (N rate) seconds on average. It writes a checkpoint of
``write_s`` every ``interval_s`` of training; a failure costs the restart ``restart_s``
plus, on average, half a segment of lost work. Young (1974), "A first order
approximation to the optimum checkpoint interval", CACM 17(9): the interval that
minimizes lost time is sqrt(2 write M); Daly (2006), FGCS 22(3), eq.(1)-(2) for the
same first-order waste. Seed 000 ("Failures scale with N") quotes Meta's 466
interruptions in 54 days on 16,384 GPUs and over 90% effective training time.

Elementwise jnp: broadcasts over sweep axes and differentiates (co-design counts a
larger N's failures through these functions).
"""

from __future__ import annotations

from dse.backend import jnp
from dse.equations import steps

__all__ = ["job_mtbf_s", "interruptions", "young_daly_interval_s", "goodput",
           "time_to_train_s", "rate_from_interruptions", "LLAMA3_FAILURE_RATE_PER_GPU_S",
           "training_run", "RUN_FIGURES", "CHECKPOINT_WRITE_S", "RESTART_S"]

SECONDS_PER_DAY = 86400.0
SECONDS_PER_HOUR = 3600.0


def rate_from_interruptions(count, days, gpus):
    """Per-accelerator failure rate (1/s) from an observed count on ``gpus`` over ``days``."""
    return count / (days * SECONDS_PER_DAY * gpus)


# seed 000 ("Failures scale with N"): Meta logged 466 interruptions in 54 days on 16,384 GPUs -> 6.1e-9 /GPU/s
# (one failure per GPU every ~5.2 years); planned interruptions included, as the paper counts them.
LLAMA3_FAILURE_RATE_PER_GPU_S = rate_from_interruptions(466.0, 54.0, 16384.0)

# Assumed defaults, not measured figures (no source publishes them for a given job): the time
# to write one checkpoint and to restart after a failure. Set them per job (--checkpoint-write-s,
# --restart-s; co-design's [goodput] table); they are not fitted to any published run.
CHECKPOINT_WRITE_S = 20.0
RESTART_S = 180.0


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


# What training_run returns, in order (also the sweep objectives it adds).
RUN_FIGURES = ("goodput", "time_to_train_s", "gpu_hours", "cost_usd", "interruptions", "checkpoint_interval_s")


def training_run(tokens, tokens_per_s, gpus, rate_per_gpu_s=LLAMA3_FAILURE_RATE_PER_GPU_S,
                 write_s=CHECKPOINT_WRITE_S, restart_s=RESTART_S, usd_per_gpu_hour=0.0, sharpness=None) -> dict:
    """A whole run of ``tokens`` at the plan's throughput, failures counted (Daly 2006 first order).

    goodput: effective training fraction at the Young/Daly checkpoint interval (``goodput``);
    time_to_train_s: tokens / throughput / goodput (wall clock, restarts and rework included);
    gpu_hours: N x wall clock / 3600 (the allocation is held, and paid, the whole time);
    cost_usd: gpu_hours x ``usd_per_gpu_hour``; interruptions: N rate T expected failures;
    checkpoint_interval_s: sqrt(2 write M) (Young 1974).
    """
    g = goodput(gpus, rate_per_gpu_s, write_s, restart_s, sharpness=sharpness)
    t = time_to_train_s(tokens, tokens_per_s, g)
    gpu_hours = gpus * t / SECONDS_PER_HOUR
    return {"goodput": g, "time_to_train_s": t, "gpu_hours": gpu_hours, "cost_usd": gpu_hours * usd_per_gpu_hour,
            "interruptions": interruptions(gpus, rate_per_gpu_s, t),
            "checkpoint_interval_s": young_daly_interval_s(write_s, job_mtbf_s(gpus, rate_per_gpu_s))}
