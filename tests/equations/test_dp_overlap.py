"""What DP communication hides: ZeRO-3 weight gathers beyond a stack's prefetch buffer wait on
the compute stream (schedule.unprefetched_gather; DeepSpeed stage3_prefetch_bucket_size)."""

import pytest

from dse.equations import schedule
from dse.evaluate import evaluate
from dse.inputs import Plan, presets, stacks
from dse.inputs.fidelity import calibrated


def test_unprefetched_share_by_hand():
    # 10 s of DP wire, 2/3 of it the forward + backward gathers (3 Psi: AG, AG, RS), a 5e9-element
    # layer and DeepSpeed's 5e7 prefetch buffer: 1% of each gather starts early, 99% waits.
    waited, rest = schedule.unprefetched_gather(10.0, 2.0 / 3.0, 5e9, 5e7)
    assert float(waited) == pytest.approx(10.0 * 2.0 / 3.0 * 0.99)
    assert float(waited + rest) == pytest.approx(10.0)
    # FSDP (0: the whole next unit prefetched) and a buffer as large as the unit: nothing waits
    assert float(schedule.unprefetched_gather(10.0, 2.0 / 3.0, 5e9, 0.0)[0]) == 0.0
    assert float(schedule.unprefetched_gather(10.0, 2.0 / 3.0, 5e9, 5e9)[0]) == 0.0


def test_stacks_state_their_prefetch():
    # DeepSpeed config docs: stage3_prefetch_bucket_size default 5e7; FSDP prefetches a unit (0)
    assert stacks.plan_fields("deepspeed-megatron")["zero3_prefetch_params"] == 5e7
    assert stacks.plan_fields("torchtitan")["zero3_prefetch_params"] == 0.0
    assert stacks.plan_fields("llm-foundry")["zero3_prefetch_params"] == 0.0


def test_deepspeed_prefetch_exposes_gathers_in_evaluate():
    # Narayanan et al. 2021 Table 2 ZeRO-3 baseline layout: GPT 530B-like, 640 A100, no TP/PP
    model = presets.load_model("gpt3-175b")
    cluster = presets.load_cluster("a100-80gb").replace(gpus=384.0)
    kw = dict(tp=1, pp=1, mbs=4, gbs=1536, zero=3, recompute=2, sp=0, overlap_grad_reduce=1)
    fid = calibrated()
    fsdp = evaluate(model, cluster, Plan.make(**kw, zero3_prefetch_params=0.0), fid)
    ds = evaluate(model, cluster, Plan.make(**kw, zero3_prefetch_params=5e7), fid)
    # same traffic and compute; only what waits changes: the gathers (2/3 of the 3 Psi) less the 5e7 share
    assert float(ds.wire_s.dp) == pytest.approx(float(fsdp.wire_s.dp))
    assert float(ds.compute_s) == pytest.approx(float(fsdp.compute_s))
    assert float(ds.exposed_s.dp) > float(fsdp.exposed_s.dp)
    unit = float(ds.params_per_rank) / 96.0
    assert float(ds.exposed_s.dp) >= float(ds.wire_s.dp) * 2.0 / 3.0 * (1.0 - 5e7 / unit) * 0.99

