"""EP all-to-all overlap: DualPipe and Megatron-Core's a2a overlap (issue 17, defect 2)."""

import pytest

import dse
from dse.inputs import presets

MODEL = presets.load_model("mixtral-8x7b")
CLUSTER = presets.load_cluster("h100-sxm").replace(gpus=256.0)
# EP 16 leaves the 8-GPU domain, so the all-to-all crosses the scale-out network.
BASE = dict(tp=1, pp=4, ep=16, mbs=1, gbs=256, zero=1, recompute=1)


def _r(**kw):
    return dse.evaluate(MODEL, CLUSTER, dse.Plan.make(**{**BASE, **kw}), "calibrated")


def test_1f1b_exposes_the_all_to_all():
    # Calibrated ep_overlap = 0: Megatron's 1F1B runs dispatch/combine between dependent GEMMs.
    r = _r()
    assert float(r.wire_s.ep) > 0 and float(r.exposed_s.ep) == pytest.approx(float(r.wire_s.ep), rel=1e-12)


def test_dualpipe_hides_ep_and_pp_behind_the_paired_chunk():
    # DeepSeek-V3 sec.3.2.1: a forward chunk's all-to-all and PP traffic run while the paired
    # backward chunk computes, so exposed = max(0, wire - compute) (before the fix: all of the
    # EP wire time, e.g. 9.2 s of DeepSeek-V3's 21.1 s step at PP 16, EP 64 on 2,048 H800).
    r = _r(schedule=2)
    ep, pp, comp = float(r.wire_s.ep), float(r.wire_s.pp), float(r.compute_s)
    assert float(r.exposed_s.ep) == pytest.approx(max(0.0, ep - comp), abs=1e-12)
    assert float(r.exposed_s.pp) == pytest.approx(max(0.0, pp - max(0.0, comp - ep)), abs=1e-12)
    assert float(r.exposed_s.ep) < float(_r().exposed_s.ep)


def test_megatron_a2a_overlap_is_a_plan_choice():
    # Megatron-Core --overlap-moe-expert-parallel-comm hides the all-to-all under 1F1B too.
    on, off = _r(ep_comm_overlap=1), _r()
    assert float(on.exposed_s.ep) == pytest.approx(max(0.0, float(on.wire_s.ep) - float(on.compute_s)), abs=1e-12)
    assert float(on.step_s) < float(off.step_s)
    assert float(on.exposed_s.pp) == pytest.approx(float(off.exposed_s.pp), rel=1e-12)   # PP unchanged
