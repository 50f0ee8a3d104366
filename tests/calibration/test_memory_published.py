"""Per-GPU memory against the figures sources print (issue 17 item 5: within 5% wherever printed).

The validation tables (dse/data/validation/*.csv) have no row with memory_per_gpu_gb today. The
sources checked here print per-GPU memory themselves:

- torchtitan docs/performance.md (pytorch/torchtitan commit eaea6f6, Dec 2024; torch 1963fc8):
  Llama 3.1 8B, FSDP2 (ZeRO-3), local batch 2, seq 8192, selective (op) activation checkpointing,
  BF16 without torch.compile or Float8, H100 96 GB HBM2e: Table 1, 8 GPUs: 82.4 GiB; Table 3,
  128 GPUs: 67.0 GiB. torchtitan logs the caching allocator's peak reserved memory (max_reserved),
  which holds fragmentation but neither the CUDA context nor NCCL's buffers.
- Korthikanti et al. 2022 App.B prints one figure, the 2.73 GB that output-tensor deallocation
  saves on the 530B first stage (tests/calibration/test_calibrated.py pins it).

The rows compile and Float8 change (torch.compile fuses, Float8 casts) are not checked: dse models
neither for memory.
"""

import pytest

import dse
from dse.inputs import presets, stacks

GiB = 2 ** 30

TORCHTITAN = [   # (GPUs, published GiB, where)
    (8, 82.4, "torchtitan docs/performance.md Table 1, FSDP row"),
    (128, 67.0, "torchtitan docs/performance.md Table 3, FSDP row"),
]


def _torchtitan(gpus):
    model = presets.load_model("llama3-8b").replace(seq=8192)            # Llama 3.1 8B: Llama 3 8B's shape
    cluster = presets.load_cluster("h100-sxm").replace(gpus=gpus, hbm_bytes=96e9)
    fields = {**stacks.plan_fields("torchtitan"), "sp": 0.0}             # TP 1: no SP
    plan = dse.Plan.make(tp=1, pp=1, mbs=2, gbs=2 * gpus, **fields)
    return dse.evaluate(model, cluster, plan, "calibrated")


def _reserved(r):
    """What torchtitan prints: the allocator's reserved memory (total less context and NCCL)."""
    return float(r.memory_bytes - r.context_bytes - r.nccl_bytes)


@pytest.mark.parametrize("gpus,published,where", TORCHTITAN)
def test_torchtitan_fsdp_states_and_buffers(gpus, published, where):
    # What dse derives for the row, part by part: 16 bytes a parameter sharded over d (FSDP2 keeps
    # fp32 sharded parameters, gradients and Adam state: 8.03B x 16 / d), the logits at the peak of
    # PyTorch's cross_entropy on fp32 logits (torchtitan's loss: s b V x 12 = 8192 x 2 x 128256 x 12 B
    # = 23.5 GiB), and the two gathered
    # units + one unsharded gradient of the largest unit, the 128256 x 4096 embedding (6 B each).
    r = _torchtitan(gpus)
    states = float(r.weights_bytes + r.grads_bytes + r.optimizer_bytes)
    assert states == pytest.approx(16 * float(r.params_total) / gpus, rel=1e-6)
    assert float(r.logits_bytes) / GiB == pytest.approx(8192 * 2 * 128256 * 12 / GiB, rel=1e-6)
    assert float(r.dp_buffer_bytes) == pytest.approx(6 * 128256 * 4096, rel=1e-6)


@pytest.mark.xfail(strict=True, reason="dse over-predicts torchtitan's reserved memory by 57% (8 GPUs: 129.1 GiB "
                                        "vs 82.4) and 68% (128 GPUs: 112.6 vs 67.0): Korthikanti's selective-recompute "
                                        "activations (34 sbh a layer, 68.3 GiB) are not torchtitan's op-level "
                                        "selective checkpointing, which keeps the layer input, the outputs of wq, wv, "
                                        "w1, w2 and of attention: about 15.5 sbh a layer (31 GiB)")
@pytest.mark.parametrize("gpus,published,where", TORCHTITAN)
def test_torchtitan_fsdp_memory_within_5_percent(gpus, published, where):
    assert _reserved(_torchtitan(gpus)) / GiB == pytest.approx(published, rel=0.05)
