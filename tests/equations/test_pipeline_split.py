"""Uneven pipeline splits (issue 17 item 3): Megatron-Core's first/last-stage layer counts and
the embedding/loss counted in the split."""

import jax.numpy as jnp
import pytest

from dse.equations import schedule


def _f(x):
    return [float(v) for v in x]


def test_even_split_is_l_over_p():
    assert _f(schedule.stage_layers(jnp.float64(96.0), 8.0)) == [12.0, 12.0, 12.0, 0.0]


def test_llama3_405b_embedding_and_loss_in_the_split():
    # Dubey et al. 2024 sec.3.3.2: 126 layers on 16 stages, one layer fewer on the first and
    # last stages: (126 + 1 + 1)/16 = 8 units a stage, so 7, 8, ..., 8, 7 layers.
    f, mid, last, uneven = _f(schedule.stage_layers(jnp.float64(126.0), 16.0, embedding=1.0, loss=1.0))
    assert (f, mid, last, uneven) == (7.0, 8.0, 7.0, 1.0)
    assert bool(schedule.split_valid(126.0, 16.0, 2.0, f, mid, last))     # 8-layer stages: v = 2 chunks of 4


def test_first_and_last_stage_layers():
    # Megatron-Core --decoder-first/last-pipeline-num-layers: DeepSeek-V3's 61 layers on 16
    # stages as 3 + 14 x 4 + 2: the middle stages share 61 - 3 - 2 = 56 evenly.
    f, mid, last, _ = _f(schedule.stage_layers(jnp.float64(61.0), 16.0, first=3.0, last=2.0))
    assert (f, mid, last) == (3.0, 4.0, 2.0)
    assert bool(schedule.split_valid(61.0, 16.0, 2.0, f, mid, last))
    # Only the first set: the other 15 stages share 60.
    assert _f(schedule.stage_layers(jnp.float64(61.0), 16.0, first=1.0))[:3] == [1.0, 4.0, 4.0]
    # 61 layers evenly on 16 stages is not whole.
    f, mid, last, _ = schedule.stage_layers(jnp.float64(61.0), 16.0)
    assert not bool(schedule.split_valid(61.0, 16.0, 1.0, f, mid, last))


def test_fullest_and_slowest_stage():
    # Slowest stage: a middle stage's 8 layers (1 s each here) against the last stage's 7 +
    # the output layer (0.5 s): 8 s; with 1.5 s of logits the last stage is the slowest.
    even_s = 126.0 / 16.0   # L/p layers at 1 s
    assert float(schedule.slowest_stage_time(126.0, 16.0, 7.0, 8.0, 7.0, even_s, 0.5)) == pytest.approx(8.0)
    assert float(schedule.slowest_stage_time(126.0, 16.0, 7.0, 8.0, 7.0, even_s, 1.5)) == pytest.approx(8.5)


def test_concretely_even_only_when_known_as_the_program_is_built():
    # evaluate leaves an uneven split's terms untraced only when no end-stage count and neither the
    # embedding nor the loss is in the split, and that is known (not a tracer)
    import jax

    assert schedule.concretely_even() and schedule.concretely_even(0.0, 0.0, 0.0, 0.0)
    assert not schedule.concretely_even(7.0) and not schedule.concretely_even(0.0, 0.0, 1.0)
    seen = []
    jax.jit(lambda f: seen.append(schedule.concretely_even(f)) or f)(0.0)
    assert seen == [False]
