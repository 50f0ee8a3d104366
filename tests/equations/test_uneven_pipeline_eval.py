"""Uneven pipelines through evaluate (issue 17 item 3): 126 layers on 16 interleaved stages is a
plan, and the bubble and memory use the slowest and the fullest stage."""

import pytest

import dse
from dse.inputs import presets
from dse.report import reason_names

MODEL = presets.load_model("llama3-405b")
CLUSTER = presets.load_cluster("h100-sxm").replace(gpus=16384.0)
BASE = dict(tp=8, pp=16, mbs=1, gbs=2048, zero=1, recompute=1, flash_attention=1)


def _r(**kw):
    return dse.evaluate(MODEL, CLUSTER, dse.Plan.make(**{**BASE, **kw}), "calibrated")


def test_llama3_405b_plan_is_expressible():
    # Dubey et al. 2024 sec.3.3.2: 126 layers, PP 16, interleaved, one layer fewer on the first and
    # last stages. Before: infeasible as layers_not_divisible_by_vpp (126 % 32 != 0).
    assert "layers_not_divisible_by_vpp" in reason_names(_r(vpp=2).reasons)
    r = _r(vpp=2, embedding_in_split=1, loss_in_split=1)
    assert "layers_not_divisible_by_vpp" not in reason_names(r.reasons)
    bad = _r(vpp=2, first_stage_layers=5, last_stage_layers=5)    # 116 / 14 is not whole
    assert "layers_not_divisible_by_vpp" in reason_names(bad.reasons)


def test_slowest_stage_sets_compute_and_bubble():
    # 7 + 8 x 14 + 7: a middle stage's 8 layers are the slowest (the last stage's 7 layers +
    # the output layer is less), so compute = 8/(126/16) of the even stage's layer time.
    even, split = _r(), _r(embedding_in_split=1, loss_in_split=1)
    assert float(split.compute_s) < float(even.compute_s)   # the even split puts all logits on 7.875 + 1 layers
    assert float(split.bubble_s) == pytest.approx(float(split.compute_s) * float(split.bubble_fraction), rel=1e-12)
    # Moving two layers onto the last stage (it also runs the logits) makes it the slowest.
    heavy = _r(first_stage_layers=7, last_stage_layers=14)       # middle: 105 / 14 = 7.5 -> not whole
    assert "layers_not_divisible_by_vpp" in reason_names(heavy.reasons)
    heavy = _r(first_stage_layers=6, last_stage_layers=8)        # middle: 112 / 14 = 8
    assert float(heavy.compute_s) > float(split.compute_s)


def test_fullest_stage_sets_memory():
    # 1F1B: stage 0 holds 16 microbatches of its layers, stage 1 holds 15. With 2 layers on the
    # first stage and 8 on the others, the second stage (15 x 8 = 120 layer-microbatches)
    # is fuller than the first (16 x 2 = 32): memory follows the second stage.
    r = _r(first_stage_layers=2, last_stage_layers=12)            # middle: 112 / 14 = 8
    per_layer_mb = float(_r().activations_bytes) / (16 * 8)       # even: ceil(126/16) = 8 layers x 16
    emb_free = float(r.activations_bytes)
    assert emb_free == pytest.approx(15 * 8 * per_layer_mb, rel=0.02)
