"""Sliding-window attention (ModelShape.window, window_layers): a causal window of w < s keys costs
2 w/s - (w/s)^2 of full causal attention (query i attends min(i + 1, w) keys: s w - w^2/2 of the
s^2/2 causal blocks; Longformer sec.3.1, Mistral 7B sec.2) on the layers that use it. Gemma 2 (sec.2:
"local sliding window attention and global attention in every other layer", 4,096 tokens) and gpt-oss
(model card sec.2.1: alternating dense and 128-token banded attention) alternate."""

import json

import pytest

import dse
from dse.equations import compute
from dse.errors import InputError
from dse.inputs import fidelity, presets
from dse.ops import megatron

FID = fidelity.resolve("calibrated")


def test_the_attention_core_shrinks_by_the_window_share_by_hand():
    # gpt-oss-20b at 4,096 tokens: w/s = 1/32, a window layer keeps 2/32 - 1/1024 = 0.0615 of the causal
    # work; 12 of 24 layers slide: 1 - 0.5 x (1 - 0.0615) = 0.5308
    oss = presets.load_model("gpt-oss-20b")
    r = 128 / 4096
    assert float(compute.window_share(oss)) == pytest.approx(1 - 12 / 24 * (1 - (2 * r - r * r)), rel=1e-12)
    assert float(compute.window_share(oss)) == pytest.approx(0.5308, abs=1e-4)
    full = oss.replace(window=0.0, window_layers=0.0)
    assert float(compute.attention_flops(oss, 1.0, FID)) == pytest.approx(
        0.5308 * float(compute.attention_flops(full, 1.0, FID)), rel=1e-3)
    # Gemma 2 9B at 8,192 tokens: w/s = 1/2, 3/4 of the causal work on 21 of 42 layers: 0.875
    assert float(compute.window_share(presets.load_model("gemma2-9b"))) == pytest.approx(0.875, rel=1e-12)
    # a window as long as the sequence is full attention; 0 layers with a window means every layer
    assert float(compute.window_share(oss.replace(window=8192.0))) == 1.0
    assert float(compute.window_share(oss.replace(window_layers=0.0))) == pytest.approx(2 * r - r * r, rel=1e-12)
    # a step of gpt-oss-20b is cheaper by the attention it no longer does (the same plan, the window off)
    cluster, plan = presets.load_cluster("h100-sxm").replace(gpus=8.0), dse.Plan.make(tp=1, pp=1, mbs=1, gbs=8)
    slide, dense = (dse.evaluate(m, cluster, plan, "calibrated") for m in (oss, full))
    assert float(slide.compute_s) < float(dense.compute_s)
    assert float(dense.model_flops) - float(slide.model_flops) == pytest.approx(
        (1 - 0.5308) * float(compute.attention_flops(full, 8.0, FID)), rel=1e-3)


def test_config_json_says_which_layers_slide(tmp_path):
    def read(cfg):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({"num_hidden_layers": 24, "hidden_size": 2880, "num_attention_heads": 64,
                                    "vocab_size": 201088, "max_position_embeddings": 4096, **cfg}))
        m = presets.model_from_hf_config(path)
        return float(m.window), float(m.window_layers)

    alternate = ["sliding_attention", "full_attention"] * 12          # gpt-oss's layer_types
    assert read({"sliding_window": 128, "layer_types": alternate}) == (128, 12)
    assert read({"sliding_window": 4096, "model_type": "gemma2"}) == (4096, 12)     # Gemma 2: every other
    assert read({"sliding_window": 4096, "model_type": "mistral"}) == (4096, 24)    # Mistral 7B v0.1: all
    assert read({"sliding_window": 32768, "use_sliding_window": False, "model_type": "qwen2"}) == (0, 0)
    assert read({"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 20}) == (4096, 4)
    assert read({"sliding_window": None}) == (0, 0)
    m = presets.model_from_hf_config("tests/data/gemma2_9b_config.json")
    assert (float(m.window), float(m.window_layers)) == (4096, 21)


def test_megatron_lines_carry_the_window():
    # arguments.py: --window-size w,0 and --window-attn-skip-freq N (one full layer after N - 1 window layers)
    model = megatron.model_dict(presets.load_model("gpt-oss-20b"))
    pairs, _ = megatron.flags(megatron.plan_dict(dse.Plan.make(tp=1, pp=1, mbs=1, gbs=8)), model)
    assert ("--window-size", "128,0") in pairs and ("--window-attn-skip-freq", 2) in pairs
    line = " ".join(f"{f} {v}" if v is not None else f for f, v in pairs)
    back = megatron.parse(line)["model"]
    assert (back["window"], back["window_layers"]) == (128, 12)
    every = megatron.parse(line.replace(" --window-attn-skip-freq 2", ""))["model"]   # no skip flag: every layer
    assert every["window"] == 128 and megatron.complete_model(every)["window_layers"] == 0   # 0: every layer
    with pytest.raises(InputError, match="--window-size: '128,5' is not allowed"):
        megatron.parse(line.replace("128,0", "128,5"))
    with pytest.raises(InputError, match="model.window_layers: 5 of 24 layers has no --window-attn-skip-freq"):
        megatron.flags(megatron.plan_dict(dse.Plan.make(tp=1, pp=1, mbs=1, gbs=8)), dict(model, window_layers=5))


def test_a_window_on_more_layers_than_the_model_has_is_one_line():
    with pytest.raises(InputError, match="model.window_layers: 30 is above layers = 24; allowed: 0..layers"):
        presets.load_model("gpt-oss-20b", window_layers=30)
