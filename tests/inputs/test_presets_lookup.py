"""Hardware and model presets: one preset per hardware, lookup by the names published tables use."""

import pytest

import dse
from dse.inputs import presets


@pytest.mark.parametrize("text,want", [
    ("NVIDIA Ampere (A100 assumed)", "a100-80gb"),
    ("A100-SXM4-80GB", "a100-80gb"),
    ("A100-SXM4-40GB", "a100-40gb"),
    ("H100-SXM5-80GB (DGX H100)", "h100-sxm"),
    ("H100 PCIe", "h100-pcie"),
    ("H100 96GB HBM2e (Grand Teton; 500 W)", "h100-hbm2e"),   # torchtitan's H100s, not the 80 GB SXM part
    ("H800", "h800"),
    ("H200-141GB", "h200"),
    ("B200", "b200"),
    ("GB200 (NVL72)", "gb200-nvl72"),     # not the B200 inside the name
    ("AMD MI300X", "mi300x"),
    ("TPU v4", "tpu-v4-torus"),
    ("TPU v5p", "tpu-v5p-torus"),
    ("a toaster", None),
])
def test_gpu_names_match_anywhere(text, want):
    assert presets.cluster_for_gpu(text) == want


def test_hardware_presets_cite_datasheets():
    for name in ("a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h100-hbm2e", "h800", "h200", "b200", "gb200-nvl72",
                 "mi300x", "tpu-v4-torus", "tpu-v5p-torus"):
        assert presets.preset_info("clusters", name)["source"]
        presets.load_cluster(name)
    # GB200 NVL72: one NVLink domain of 72 GPUs (NVIDIA GB200 NVL72 datasheet)
    assert float(presets.load_cluster("gb200-nvl72").domain) == 72.0
    # MI300X datasheet: 1307.4 TFLOP/s BF16 dense, 192 GB
    mi = presets.load_cluster("mi300x")
    assert float(mi.peak_flops_per_s) == pytest.approx(1307.4e12, rel=1e-6) and float(mi.hbm_bytes) == pytest.approx(192e9, rel=1e-6)


@pytest.mark.parametrize("alias,target", [("dgx-a100", "a100-80gb"), ("dgx-h100", "h100-sxm")])
def test_one_preset_per_hardware(alias, target):
    a, b = presets.load_cluster(alias), presets.load_cluster(target)
    for f in a.__dataclass_fields__:
        assert float(getattr(a, f)) == float(getattr(b, f)), f
    model, plan = presets.load_model("gpt3-175b"), dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024)
    ra, rb = dse.evaluate(model, a, plan, "calibrated"), dse.evaluate(model, b, plan, "calibrated")
    assert float(ra.step_s) == float(rb.step_s)


@pytest.mark.parametrize("text,want", [
    ("LLAMA2-7B", "llama2-7b"), ("Llama 2 70B", "llama2-70b"), ("LLAMA3-70B", "llama3-70b"),
    ("Llama 3.1 405B", "llama3-405b"), ("GPT3-5B", "gpt3-5b"), ("Nemotron-340B", "nemotron4-340b"),
    ("Mixtral 8x22B", "mixtral-8x22b"), ("Qwen2.5-72B", "qwen2.5-72b"), ("Qwen3-235B-A22B", "qwen3-235b-a22b"),
    ("DeepSeek-V2", "deepseek-v2"), ("gpt-oss-120b", "gpt-oss-120b"), ("Gemma 2 27B", "gemma2-27b"),
    ("Phi-3-mini", "phi3-mini"), ("a model nobody published", None),
])
def test_model_names(text, want):
    assert presets.model_for_name(text) == want


def test_model_presets_from_published_configs():
    for name in presets.list_presets("models"):
        assert presets.preset_info("models", name)["source"]
        presets.load_model(name)
    # Touvron et al. 2023 Table 1 / config.json: Llama 2 70B has 80 layers, 8192 hidden, 8 KV heads.
    m = presets.load_model("llama2-70b")
    assert (float(m.layers), float(m.hidden), float(m.kv_heads), float(m.ffn_hidden)) == (80, 8192, 8, 28672)
    # NeMo-Framework-Launcher gpt3/5b.yaml: 24 layers, hidden 4096, 32 heads.
    g = presets.load_model("gpt3-5b")
    assert (float(g.layers), float(g.hidden), float(g.heads)) == (24, 4096, 32)
    # Qwen3-235B-A22B config.json: 128 experts, 8 a token.
    q = presets.load_model("qwen3-235b-a22b")
    assert (float(q.experts), float(q.topk)) == (128, 8)
