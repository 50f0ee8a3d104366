"""Real model shapes: GQA with head_dim, tied embeddings, GeGLU, MLA and fine-grained MoE
(issue 17 items 1 and 6). Parameter counts pinned to the published figures."""

from pathlib import Path

import pytest

from dse.equations import memory
from dse.inputs import RECOMPUTE_MODULES, presets
from dse.inputs.fidelity import resolve

DATA = Path(__file__).resolve().parents[1] / "data"
FID = resolve("calibrated")   # real_shapes = 1


def _counts(model):
    total, active, _, _ = memory.param_counts(model, FID)
    return float(total), float(active)


@pytest.mark.parametrize("name,total_b,active_b,rel", [
    # Brown et al. 2020 Table 2.1: 175.0B (untied preset: 12 L h^2 + 2 V h = 175.2B).
    ("gpt3-175b", 175.0, 175.0, 0.01),
    # Dubey et al. 2024 Table 3 / model cards: 405B, 70B (70.6B), 8B (8.03B).
    ("llama3-405b", 405.0, 405.0, 0.01),
    ("llama3-70b", 70.6, 70.6, 0.01),
    ("llama3-8b", 8.03, 8.03, 0.01),
    # Narayanan et al. 2021 Table 1: 1008B.
    ("megatron-1t", 1008.0, 1008.0, 0.01),
    # Jiang et al. 2024 sec.2: 46.7B total, 12.9B active (47B / 13B in the abstract).
    ("mixtral-8x7b", 46.7, 12.9, 0.01),
    # DeepSeek-V3 report abstract: 671B total, 37B activated. By hand from config.json (MLA
    # 187.1M a layer x 61, 3 dense FFNs, 58 x (256 + 1) experts of 44.04M, 2 V h): 670.9B and
    # 37.45B; 37B is the report's rounding, so the active count is pinned at 1.5%.
    ("deepseek-v3", 671.0, 37.0, 0.015),
    # DeepSeek-V2 (arXiv:2405.04434) abstract: 236B total, 21B activated; by hand from its config
    # (MLA as V3's at h 5120): 235.7B and 21.3B (+1.6%: 21B is the paper's rounding).
    ("deepseek-v2", 236.0, 21.0, 0.02),
])
def test_preset_parameter_counts(name, total_b, active_b, rel):
    total, active = _counts(presets.load_model(name))
    assert total / 1e9 == pytest.approx(total_b, rel=0.01)
    assert active / 1e9 == pytest.approx(active_b, rel=rel)


def test_mla_attention_params_by_hand():
    # DeepSeek-V2 sec.2.1.2 with DeepSeek-V3's config: q down 7168 x 1536, q up 1536 x 128 x 192,
    # kv down 7168 x (512 + 64), kv up 512 x 128 x (128 + 128), out 128 x 128 x 7168.
    m = presets.load_model("deepseek-v3")
    want = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert float(memory.attention_params(m)) == want


def test_gemma2_9b_from_hf_config():
    # Gemma 2 (Team et al. 2024) Table 1 / google/gemma-2-9b config.json: 42 layers, h 3584,
    # 16 heads of 256 (a d = 4096 != h), 8 KV heads, GeGLU FFN 14336, vocab 256000, tied
    # embeddings. Published: 9.24B parameters (model card).
    m = presets.model_from_hf_config(DATA / "gemma2_9b_config.json")
    assert float(m.head_dim) == 256 and float(m.tied_embeddings) == 1 and float(m.ffn_gated) == 1
    total, _ = _counts(m)
    assert total / 1e9 == pytest.approx(9.24, rel=0.01)


def test_deepseek_v3_from_hf_config_matches_preset():
    # Every field the model uses comes from config.json: MLA ranks and head widths, shared
    # experts, first dense layers, expert width, node-limited routing (topk_group of n_group).
    m = presets.model_from_hf_config(DATA / "deepseek_v3_config.json", seq=4096)
    p = presets.load_model("deepseek-v3")
    for f in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "ffn_gated", "expert_ffn_hidden", "vocab",
              "experts", "topk", "shared_experts", "dense_layers", "route_node_limit", "route_groups", "q_lora_rank",
              "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "tied_embeddings",
              "moe_layer_freq"):
        assert float(getattr(m, f)) == float(getattr(p, f)), f
    assert _counts(m) == _counts(p)


def test_llama_config_without_tie_key_is_untied():
    # LlamaConfig defaults tie_word_embeddings to False (transformers); 2 V h counted.
    m = presets.model_from_hf_config(DATA / "llama3_8b_config.json")
    assert float(m.tied_embeddings) == 0


def test_cp_gathers_keys_and_values_of_the_real_width():
    # Llama 3 sec.3.3.2: CP all-gathers K and V. Gemma 2 9B: 8 KV heads of 256 (not h/a = 224),
    # so K + V are 2 x 8 x 256 = 4096 elements a token; at t = 2, b = 1, s = 8192, bf16:
    # 8192 x 4096 / 2 x 2 bytes = 33.5 MB gathered a layer.
    from dse.equations import traffic
    m = presets.model_from_hf_config(DATA / "gemma2_9b_config.json")
    v = traffic.cp(m, 2.0, 4.0, 1.0, 42.0, 1.0, 1.0)
    assert float(v["message"]) == 8192 * 4096 / 2 * 2


def test_mla_activations_by_hand():
    # An MLA + MoE layer counted tensor by tensor (memory.layer_tensor_bytes; DeepSeek-V3 config:
    # h = 7168, 128 heads, d_qk = 192, d_v = 128, r_q = 1536, r_kv = 512, 8 routed + 1 shared expert of
    # 2048, SwiGLU, no dropout), selective recompute of the attention core and the up-projections
    # (recompute_modules core_attn + mla_up_proj, as DeepSeek-V3 sec.3.2.3: no Q, K, V and no scores),
    # SP at t = 1, b = 1, s = 4096, a token:
    # the two norm inputs 4h, the QKV input 2h, the latents 2 x 1536 + 2 x 512, the attention output
    # 2 x 128 x 128, the FFN input 2h with its 8 dispatched copies 16h, and gate, up and down inputs
    # 3 x 2 x (9 x 2048).
    m = presets.load_model("deepseek-v3")
    h = 7168
    per_token = 4 * h + 2 * h + 2 * 1536 + 2 * 512 + 2 * 128 * 128 + 2 * h + 16 * h + 6 * 9 * 2048
    up_proj = RECOMPUTE_MODULES["core_attn"] + RECOMPUTE_MODULES["mla_up_proj"]
    got = float(memory.activation_bytes_per_layer(m, 1.0, 1.0, 1.0, 1.0, 1.0, FID, 1.0, modules=up_proj))
    assert got == pytest.approx(float(m.seq) * per_token, rel=1e-12)
    # Megatron's default modules (core_attn alone) keep Q and K (2 x 128 x 192 each) and V (2 x 128 x 128).
    core = float(memory.activation_bytes_per_layer(m, 1.0, 1.0, 1.0, 1.0, 1.0, FID, 1.0))
    assert core - got == pytest.approx(float(m.seq) * (4 * 128 * 192 + 2 * 128 * 128), rel=1e-12)
    # Without recompute Q and K (2 x 128 x 192 each), V (2 x 128 x 128) and the logsumexp (4 x 128) come back.
    none = float(memory.activation_bytes_per_layer(m, 1.0, 1.0, 1.0, 0.0, 1.0, FID, 1.0))
    assert none - got == pytest.approx(float(m.seq) * (4 * 128 * 192 + 2 * 128 * 128 + 4 * 128), rel=1e-12)
    # Seed mode keeps Korthikanti's 34 s b h (selective) whatever the shape.
    seed = float(memory.activation_bytes_per_layer(m, 1.0, 1.0, 1.0, 1.0, 1.0, resolve("seed")))
    assert seed == pytest.approx(float(m.seq) * h * 34, rel=1e-12)


def test_tp_beyond_the_key_value_heads_is_refused():
    # Megatron-Core's Attention splits the GQA query groups over TP, num_query_groups_per_partition =
    # divide(num_query_groups, tp), which asserts divisibility: Llama 3 405B has 8 key/value heads (128
    # query heads), so TP 16 does not launch though 16 divides 128; Qwen3-235B-A22B has 4, so TP 8 does not.
    import dse
    from dse.errors import InputError
    from dse.ops import megatron

    cl = presets.load_cluster("h100-sxm", gpus=16384)
    for name, t, ok in (("llama3-405b", 8, True), ("llama3-405b", 16, False), ("qwen3-235b-a22b", 4, True),
                        ("qwen3-235b-a22b", 8, False), ("gpt3-175b", 16, True)):
        r = dse.evaluate(presets.load_model(name), cl, dse.Plan.make(tp=t, pp=8, mbs=1, gbs=2048), FID)
        assert ("kv_heads_not_divisible_by_tp" not in dse.reason_names(r.reasons)) is ok, (name, t)
    # the Megatron exporter refuses the same line (one rule each way: Megatron's own constraint)
    model = megatron.model_dict(presets.load_model("qwen3-235b-a22b"))
    with pytest.raises(InputError, match="num-query-groups = 4"):
        megatron.flags(megatron.plan_dict(dse.Plan.make(tp=8, pp=8, mbs=1, gbs=2048)), model)


def test_an_moe_models_dense_layers_keep_a_dense_layers_activations():
    # DeepSeek-V3's first 3 layers are dense (first_k_dense_replace 3): they keep no dispatched copies of the
    # FFN input (8 x 2h a token, 114,688 bytes; their SwiGLU of 18,432 is as wide as 8 routed + 1 shared
    # experts of 2,048, so the FFN tensors match). At PP 16 with DualPipe the first stage holds ceil(61/16) = 4
    # layers, those 3 of them dense, for p + 1 = 17 microbatches of 4,096 tokens (t = 1): 17 x 3 x 4,096 x
    # 114,688 bytes fewer than if every layer were an MoE layer
    import dse

    v3 = presets.load_model("deepseek-v3")
    cl = presets.load_cluster("h800", gpus=2048)
    plan = dse.Plan.make(tp=1, pp=16, ep=64, mbs=1, gbs=15360, zero=1, sp=1, flash_attention=1, schedule=2)
    dense_first = float(dse.evaluate(v3, cl, plan, FID).activations_bytes)
    all_moe = float(dse.evaluate(v3.replace(dense_layers=0.0), cl, plan, FID).activations_bytes)
    assert all_moe - dense_first == pytest.approx(17 * 3 * 4096 * 2 * 8 * 7168, rel=1e-9)
    assert float(memory.dense_layers_on_stage(v3, 4.0, 0.0, 1.0, FID)) == 3.0
    assert float(memory.dense_layers_on_stage(v3, 4.0, 1.0, 1.0, FID)) == 0.0      # later stages: MoE layers
