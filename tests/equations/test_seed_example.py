"""The seed's worked example (seed 000 sec.4): GPT-3 175B, t=8, p=8, d=16, b=1, m=64, N=1024."""

import pytest

import dse
from dse.inputs import presets


@pytest.fixture
def report():
    model = presets.load_model("gpt3-175b")
    cluster = presets.load_cluster("seed")
    plan = dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024, zero=1, recompute=1)
    return dse.evaluate(model, cluster, plan)


def test_tp_bytes_per_layer_per_microbatch():
    # seed 000 sec.4: 8 x 2048 x 12288 x 7/8 x 2 bytes ~ 352 MB per layer per microbatch
    cluster = presets.load_cluster("seed").replace(gpus=768)     # d = 1
    r = dse.evaluate(presets.load_model("gpt3-175b"), cluster,
                     dse.Plan.make(tp=8, pp=96, mbs=1, gbs=1))   # one layer a stage, m = 1
    assert float(r.traffic_bytes.tp) == pytest.approx(8 * 2048 * 12288 * 7 / 8 * 2, rel=1e-12)
    assert float(r.traffic_bytes.tp) == pytest.approx(352.3e6, rel=1e-3)


def test_worked_example_volumes(report):
    assert float(report.microbatches) == 64 and float(report.dp) == 16
    assert float(report.traffic_bytes.tp) == pytest.approx(270.6e9, rel=1e-3)   # seed: ~270 GB a step
    assert float(report.traffic_bytes.pp) == pytest.approx(0.805e9, rel=1e-3)   # seed: ~0.8 GB
    assert float(report.traffic_bytes.dp) == pytest.approx(10.19e9, rel=1e-3)   # seed: ~10 GB
    assert float(report.params_per_rank) == pytest.approx(2.72e9, rel=2e-3)     # seed: 2.72e9


def test_attention_term_is_80():
    # seed 000 sec.2 / Korthikanti sec.5: for GPT-3 the attention term 5as/h = 80 is larger than 34,
    # so selective recompute pays off. dse's per-layer activations (t = 1, SP form) without and with
    # selective recompute must differ by exactly that term: (none - selective) / (s b h) = 80.
    from dse.equations import memory
    m = presets.load_model("gpt3-175b")
    none = memory.activation_bytes_per_layer(m, 1.0, 1.0, 1.0, 0.0, 1.0)
    selective = memory.activation_bytes_per_layer(m, 1.0, 1.0, 1.0, 1.0, 1.0)
    sbh = float(m.seq) * float(m.hidden)
    assert float(none - selective) / sbh == pytest.approx(80.0, rel=1e-12)
    assert float(selective) / sbh == pytest.approx(34.0, rel=1e-12)
