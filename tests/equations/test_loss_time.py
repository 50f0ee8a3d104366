"""The loss's memory-bound passes over the logits (compute.loss_time), pinned by hand."""

import pytest

import dse
from dse.equations import compute, memory
from dse.inputs import fidelity, presets


def _r083_like(loss_logit_bytes):
    # NeMo's Nemotron-8B row R083: 64 H100, TP 2, microbatch 4, global batch 256 (DP 32: 2 microbatches)
    model, cluster = presets.load_model("nemotron-8b"), presets.load_cluster("h100-sxm").replace(gpus=64.0)
    plan = dse.Plan.make(tp=2, pp=1, mbs=4, gbs=256, sp=1, flash_attention=1, loss_logit_bytes=loss_logit_bytes)
    return model, cluster, plan


def test_loss_passes_over_the_vocab_parallel_logits():
    # s b V / t = 4096 x 4 x 256000 / 2 = 2.097e9 logits a microbatch on a rank; at 6 bytes each
    # (fp32 logits + the 16-bit GEMM output, NeMo's loss) 12.58 GB, written twice a step (2 microbatches),
    # at elementwise_passes HBM passes and the achieved HBM rate (3.35 TB/s x hbm_efficiency).
    model, cluster, plan = _r083_like(6.0)
    fid = fidelity.calibrated()
    logits = 4096 * 4 * 256000 / 2
    assert float(memory.logits_bytes(model, 2.0, 1.0, 4.0, fid, 6.0)) == pytest.approx(6 * logits, rel=1e-12)
    want = float(fid.elementwise_passes) * 2 * 6 * logits / (float(cluster.hbm_bw_bytes_per_s) * float(fid.hbm_efficiency))
    got = float(compute.loss_time(memory.logits_bytes(model, 2.0, 1.0, 4.0, fid, 6.0), 2.0, cluster.hbm_bw_bytes_per_s, fid))
    assert got == pytest.approx(want, rel=1e-12)
    # Through evaluate: a stack whose loss keeps 12 bytes a logit (PyTorch cross_entropy on fp32 logits)
    # instead of 6 adds exactly those passes over 6 more bytes a logit to the step's compute (p = 1).
    a = dse.evaluate(*_r083_like(6.0), fid)
    b = dse.evaluate(*_r083_like(12.0), fid)
    assert float(b.compute_s) - float(a.compute_s) == pytest.approx(want, rel=1e-9)
    # seed mode has no elementwise passes (and no logits): nothing
    assert float(compute.loss_time(memory.logits_bytes(model, 2.0, 1.0, 4.0, dse.Fidelity.seed(), 6.0), 2.0,
                                   cluster.hbm_bw_bytes_per_s, dse.Fidelity.seed())) == 0.0


def test_uneven_pipeline_puts_the_loss_on_the_last_stage():
    # With an uneven split the last stage's time is its layers plus the output layer and the loss
    # (schedule.slowest_stage_time): a last stage of fewer layers absorbs the loss, so moving bytes
    # into the loss moves the step by the same loss time only while the last stage is the slowest.
    model, cluster, _ = _r083_like(6.0)
    fid = fidelity.calibrated()
    plans = [dse.Plan.make(tp=2, pp=4, mbs=4, gbs=256, sp=1, flash_attention=1, first_stage_layers=8, last_stage_layers=8,
                           loss_logit_bytes=lb) for lb in (6.0, 12.0)]
    a, b = (dse.evaluate(model, cluster, p, fid) for p in plans)
    extra = float(compute.loss_time(memory.logits_bytes(model, 2.0, 1.0, 4.0, fid, 6.0), float(a.microbatches),
                                    cluster.hbm_bw_bytes_per_s, fid))
    assert float(b.compute_s) - float(a.compute_s) == pytest.approx(extra, rel=1e-9)
