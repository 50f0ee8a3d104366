"""Megatron-LM command lines both ways (issue 15 item 1): every model preset round trips, flags dse does
not model are listed, Megatron's argument constraints refuse what Megatron refuses."""

import json

import pytest

from dse.cli import main
from dse.errors import InputError
from dse.inputs import Plan, presets
from dse.ops import megatron

PRESETS = presets.list_presets("models")


def _plans(model: dict):
    """Plans that exercise every plan choice with a Megatron form, sized to the model."""
    moe = model["experts"] > 1
    L = model["layers"]
    vpp = next((v for v in (3, 2) if L % (4 * v) == 0), 1)
    # TP must divide the heads and the query groups (Megatron's constraint): 4, else 2
    tp = next(t for t in (4, 2, 1) if model["heads"] % t == 0 and model.get("kv_heads", model["heads"]) % t == 0)
    base = dict(tp=tp, pp=4, cp=2, ep=4 if moe else 1, mbs=1, gbs=512)
    yield dict(base, vpp=vpp, zero=1, recompute=2.0, sp=1, fp8=1, tp_comm_overlap=1, flash_attention=1, cp_ring=1,
               overlap_grad_reduce=1)
    yield dict(base, zero=0, recompute=0.0, sp=1, fp8=0, flash_attention=0, cp_ring=0, overlap_grad_reduce=0,
               rank_order=float(__import__("dse.equations.topology", fromlist=["x"]).rank_order_code("tp,cp,ep,dp,pp")))
    yield dict(base, pp=1, zero=3, grad_accum=1, recompute=1.0, sp=1, capacity_factor=1.25 if moe else 0.0)
    yield dict(base, zero=2, grad_accum=1, recompute=1.0, sp=1, vpp=vpp)
    # selective recompute's modules (--recompute-modules): the norms, the activation or the dense MLP, MLA's
    # up-projections and the shared experts where the model has them (Megatron refuses the others)
    modules = 1.0 + 2.0 + (4.0 if moe else 16.0) + (8.0 if model.get("kv_lora_rank") else 0.0) + (
        64.0 if model.get("shared_experts") else 0.0)
    yield dict(base, zero=1, recompute=1.0, sp=1, recompute_modules=modules)
    # every FP8 recipe (Megatron --fp8-recipe), FP8 parameters and a delayed-scaling amax history
    for code in (2.0, 3.0, 4.0):
        yield dict(base, zero=1, recompute=1.0, sp=1, fp8=code, fp8_param_gather=1)
    yield dict(base, zero=1, recompute=1.0, sp=1, fp8=1.0, fp8_amax_history=1024, ep_comm_overlap=1 if moe else 0)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_round_trips(name):
    # issue 15: flags -> line -> parse gives back every plan and model field dse models, for every preset
    model = megatron.model_dict(presets.load_model(name))
    for kw in _plans(model):
        plan = megatron.plan_dict(Plan.make(**kw))
        pairs, notes = megatron.flags(plan, model)
        back = megatron.parse("\n".join(megatron.torchrun_lines(64, 8, pairs)))
        assert back["cluster"] == {"gpus": 512, "gpus_per_node": 8}
        assert back["plan"] == plan, (name, kw)
        assert megatron.complete_model(back["model"]) == model, name
        assert back["unmodeled"] == []
        want = dict(megatron.arch_defaults(model), attention_backend="flash" if plan["flash_attention"] else "unfused")
        assert back["arch"] == want, name      # norm, positions, tied embeddings, biases, bf16, FP8 recipe


def test_architecture_flags_for_llama_and_gpt():
    # Llama (Touvron et al. 2023 sec.2.2): RMSNorm, SwiGLU, RoPE, untied, no biases; GPT-3: LayerNorm,
    # learned positions, tied embeddings, biases; both in bf16 with the vocabulary as given
    plan = megatron.plan_dict(Plan.make(tp=8, pp=1, mbs=1, gbs=64))
    llama, _ = megatron.flags(plan, megatron.model_dict(presets.load_model("llama3-70b")))
    f = dict(llama)
    assert f["--normalization"] == "RMSNorm" and f["--position-embedding-type"] == "rope"
    assert "--untie-embeddings-and-output-weights" in f and "--disable-bias-linear" in f and "--swiglu" in f
    assert f["--num-query-groups"] == 8 and f["--vocab-size"] == 128256 and "--bf16" in f
    gpt, _ = megatron.flags(plan, megatron.model_dict(presets.load_model("gpt3-175b")))
    g = dict(gpt)
    assert g["--normalization"] == "LayerNorm" and g["--position-embedding-type"] == "learned_absolute"
    # the gpt3-175b preset counts its output layer apart (ModelShape.tied_embeddings = 0), so the launch
    # unties them to build the model dse times (before issue 17's field: tied, as GPT-3 was trained)
    assert "--untie-embeddings-and-output-weights" in g and "--disable-bias-linear" not in g
    assert "--overlap-grad-reduce" in g and "--overlap-param-gather" in g     # dse models DP overlap on


def test_moe_fields_deepseek():
    # DeepSeek-V3 config.json: 3 dense layers then 58 MoE, one shared expert of width 2048, 4-node routing
    model = megatron.model_dict(presets.load_model("deepseek-v3"))
    plan = megatron.plan_dict(Plan.make(tp=1, pp=1, ep=64, mbs=1, gbs=4096))
    f = dict(megatron.flags(plan, model, gpus_per_node=8)[0])
    assert f["--moe-layer-freq"] == "([0]*3+[1]*58+[0]*0)"
    assert f["--moe-shared-expert-intermediate-size"] == 2048
    assert f["--moe-router-group-topk"] == 4 and f["--moe-router-num-groups"] == 8   # EP 64 / 8 a node
    back = megatron.parse(" ".join(f"{k} {v}" if v is not None else k for k, v in f.items()))["model"]
    assert back["dense_layers"] == 3 and back["moe_layer_freq"] == 1 and back["shared_experts"] == 1
    # Megatron's integer form: one MoE layer in 2
    assert megatron._moe_pattern("2", 10) == (0, 0.5)


def test_reads_what_the_issue_found_ignored():
    # issue 15: --recompute-activations became no recompute; --use-flash-attn, --fp8-format, --tp-comm-overlap
    # were ignored without a word
    line = ("torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 8 "
            "--sequence-parallel --recompute-activations --use-flash-attn --fp8-format hybrid --tp-comm-overlap "
            "--bf16 --lr 3e-4 --data-path /data/x --micro-batch-size 1 --global-batch-size 64")
    r = megatron.parse(line)
    p = r["plan"]
    assert p["recompute"] == "selective" and p["flash_attention"] == 1 and p["fp8"] == 1 and p["tp_comm_overlap"] == 1
    assert p["overlap_grad_reduce"] == 0          # Megatron's default: gradient sync after backward
    assert r["unmodeled"] == [("--lr", "3e-4"), ("--data-path", "/data/x")]     # listed, not dropped


def test_megatron_constraints():
    ok = megatron.plan_dict(Plan.make(tp=2, pp=1, ep=8, mbs=1, gbs=64, sp=1))
    megatron.check(ok, None)
    # issue 15: TP 2 x EP 8 without SP was emitted although Megatron requires SP there
    with pytest.raises(InputError, match="sequence parallelism"):
        megatron.flags(dict(ok, sp=0))
    with pytest.raises(InputError, match="--tp-comm-overlap"):
        megatron.flags(dict(ok, ep=1, sp=0, tp_comm_overlap=1))
    with pytest.raises(InputError, match="pipeline-model-parallel size > 1"):
        megatron.flags(dict(ok, ep=1, pp=1, vpp=2))
    megatron.flags(dict(ok, ep=1, pp=2, vpp=2))      # allowed: p2p overlap is Megatron's default
    model = megatron.model_dict(presets.load_model("llama3-8b"))
    with pytest.raises(InputError, match="2 x context-parallel-size"):
        megatron.check(dict(ok, ep=1, cp=3), dict(model, seq=4100))
    # read back, such a line is kept and flagged: Megatron would not start it
    r = megatron.parse("--tensor-model-parallel-size 2 --expert-model-parallel-size 8 --micro-batch-size 1 --bf16")
    assert r["plan"]["ep"] == 8 and any("would refuse" in n and "sequence parallelism" in n for n in r["notes"])
    notes = megatron.check(dict(ok, ep=1, schedule="dualpipe"), None)
    assert any("dualpipe" in n for n in notes)


def test_zero_stages_both_ways():
    base = megatron.plan_dict(Plan.make(tp=1, pp=1, mbs=1, gbs=8))
    for z, ga, want in ((0, 0, []), (1, 0, ["--use-distributed-optimizer"]),
                        (2, 1, ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--ckpt-format"]),
                        (3, 1, ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--ckpt-format"])):
        pairs, _ = megatron.flags(dict(base, zero=z, grad_accum=ga))
        assert [f for f, _ in megatron._zero_flags(dict(base, zero=z, grad_accum=ga))] == want
        back = megatron.parse(" ".join(megatron.arg_tokens(pairs)))["plan"]
        assert (back["zero"], back["grad_accum"]) == (z, ga)
    # torch FSDP2 is ZeRO-3
    assert megatron.parse("--micro-batch-size 1 --use-torch-fsdp2")["plan"]["zero"] == 3


def test_plan_from_a_llama70b_line_counts_flash_and_recompute(capsys):
    # issue 15: a Llama-70B line with --use-flash-attn --recompute-activations showed 282 GB of activations,
    # because both flags were dropped; read, they must shrink activations (flash: no s^2 scores kept)
    base = ("torchrun --nnodes 16 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 8 "
            "--pipeline-model-parallel-size 4 --sequence-parallel --micro-batch-size 1 --global-batch-size 256 "
            "--use-distributed-optimizer --bf16")
    acts = []
    for extra in ("--attention-backend unfused", "--use-flash-attn --recompute-activations"):
        assert main(["plan", "--preset", "llama3-70b", "--cluster", "h100-sxm", "--gpus", "128", "--json",
                     "--megatron-args", f"{base} {extra}"]) == 0
        out = json.loads(capsys.readouterr().out)
        acts.append(out["memory_bytes"]["activations"] if isinstance(out.get("memory_bytes"), dict)
                    else out["activations_bytes"])
    assert acts[1] < acts[0]


def test_launch_settings_are_listed_apart():
    # flags a launch needs that change no dse figure are returned as settings, not dropped and not unmodeled
    r = megatron.parse("--micro-batch-size 1 --moe-token-dispatcher-type alltoall --ckpt-format torch_dist --bf16")
    assert r["settings"] == [("--moe-token-dispatcher-type", "alltoall"), ("--ckpt-format", "torch_dist")]
    assert r["unmodeled"] == []


def test_rank_orders_megatron_can_build():
    # tp,dp,pp with CP = EP = 1 is Megatron's default tp-cp-ep-dp-pp: no mapping flag, no note;
    # dse's default tp,cp,ep,pp,dp is --use-tp-pp-dp-mapping; pp,tp,... has no Megatron form
    from dse.equations import topology

    def run(order):
        plan = megatron.plan_dict(Plan.make(tp=8, pp=4, mbs=1, gbs=64,
                                            rank_order=float(topology.rank_order_code(order))))
        pairs, notes = megatron.flags(plan)
        return "--use-tp-pp-dp-mapping" in dict(pairs), notes

    assert run("tp,dp,pp") == (False, [])
    assert run("tp,pp,dp") == (True, [])
    assert any("rank order" in n for n in run("pp,tp,dp")[1])


def test_layers_that_do_not_divide_by_pp():
    # DeepSeek-V3's 61 layers on PP 4: dse times ceil(61/4) = 16 layers a stage (memory.py), so Megatron
    # gets 3 stages of 16 and the last with 61 - 48 = 13 (--decoder-last-pipeline-num-layers); without it
    # Megatron refuses ("Number of layers should be divisible by the pipeline-model-parallel size")
    model = megatron.model_dict(presets.load_model("deepseek-v3"))
    plan = megatron.plan_dict(Plan.make(tp=1, pp=4, ep=8, mbs=1, gbs=64))
    f = dict(megatron.flags(plan, model)[0])
    assert f["--decoder-last-pipeline-num-layers"] == 13
    back = megatron.parse(" ".join(k if v is None else f"{k} {v}" for k, v in f.items()))
    assert ("--decoder-last-pipeline-num-layers", 13) in back["settings"] and back["unmodeled"] == []
    # another split is a plan dse now models (issue 17: uneven pipelines, Plan.last_stage_layers)
    other = megatron.parse("--pipeline-model-parallel-size 4 --num-layers 61 --decoder-last-pipeline-num-layers 10")
    assert other["plan"]["last_stage_layers"] == 10 and other["unmodeled"] == []
    assert megatron.ceil_split_last(10, 4) == 1 and megatron.ceil_split_last(9, 4) is None   # 3+3+3+0: empty


@pytest.mark.parametrize("name", PRESETS)
def test_megatron_core_configs_round_trip(name):
    # Megatron-Core's side: the same plan as TransformerConfig / GPTModel / DDP config fields and back
    model = megatron.model_dict(presets.load_model(name))
    for kw in _plans(model):
        plan = megatron.plan_dict(Plan.make(**kw))
        pairs, _ = megatron.flags(plan, model)
        cfg = megatron.mcore_config(pairs, model, plan)
        tc = cfg["TransformerConfig"]
        assert tc["num_layers"] == model["layers"] and tc["tensor_model_parallel_size"] == plan["tp"]
        assert cfg["GPTModel"]["vocab_size"] == model["vocab"]
        assert tc.get("gated_linear_unit", False) is bool(model["ffn_gated"])   # SwiGLU: gated, silu
        back = megatron.parse(" ".join(megatron.arg_tokens(megatron.mcore_flags(cfg))))
        assert back["plan"] == plan and megatron.complete_model(back["model"]) == model, (name, kw)


def test_fp8_recipe_flags_both_ways():
    # Megatron-LM arguments.py: --fp8-format {e4m3,hybrid} turns FP8 on, --fp8-recipe {tensorwise,delayed,
    # mxfp8,blockwise} (default delayed), --fp8-param-gather, --fp8-amax-history-len (default 1)
    line = ("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --micro-batch-size 1 "
            "--global-batch-size 64 --bf16 --fp8-format hybrid --fp8-recipe blockwise --fp8-param-gather "
            "--fp8-amax-history-len 16")
    plan = megatron.parse(line)["plan"]
    assert (plan["fp8"], plan["fp8_param_gather"], plan["fp8_amax_history"]) == (4, 1, 16)
    assert megatron.parse(line.replace(" --fp8-recipe blockwise", ""))["plan"]["fp8"] == 1   # delayed
    assert megatron.parse(line.replace("--fp8-format hybrid ", ""))["plan"]["fp8"] == 0      # no format: 16-bit
    pairs, _ = megatron.flags(megatron.plan_dict(Plan.make(tp=8, pp=1, mbs=1, gbs=64, fp8=3)), None)
    assert ("--fp8-recipe", "mxfp8") in pairs and ("--fp8-format", "hybrid") in pairs


def test_optimizer_cpu_offload_both_ways():
    # Megatron-Core optimizer CPU offload: --optimizer-cpu-offload with --optimizer-offload-fraction
    # (default 1.0) needs the distributed optimizer and the precision-aware optimizer;
    # --overlap-cpu-optimizer-d2h-h2d pipelines the copies with the host step.
    line = ("pretrain_gpt.py --tensor-model-parallel-size 8 --use-distributed-optimizer --optimizer-cpu-offload "
            "--optimizer-offload-fraction 0.5 --use-precision-aware-optimizer --micro-batch-size 1 --global-batch-size 64")
    plan = megatron.parse(line)["plan"]
    assert plan["offload_optimizer"] == 0.5 and plan["offload_overlap"] == 0 and plan["zero"] == 1
    plan = megatron.parse(line + " --overlap-cpu-optimizer-d2h-h2d")["plan"]
    assert plan["offload_overlap"] == 1
    full = megatron.parse(line.replace("--optimizer-offload-fraction 0.5 ", ""))["plan"]
    assert full["offload_optimizer"] == 1.0
    p = megatron.plan_dict(Plan.make(tp=8, pp=1, mbs=1, gbs=64, zero=1, offload_optimizer=0.5))
    flags, _ = megatron.flags(p)
    names = [f for f, _ in flags]
    assert ("--optimizer-offload-fraction", "0.5") in flags and "--optimizer-cpu-offload" in names
    assert "--use-precision-aware-optimizer" in names and "--overlap-cpu-optimizer-d2h-h2d" in names
    with pytest.raises(InputError, match="needs the distributed optimizer"):
        megatron.flags(megatron.plan_dict(Plan.make(tp=8, pp=1, mbs=1, gbs=64, zero=0, offload_optimizer=1.0)))
    with pytest.raises(InputError, match="--optimizer-offload-fraction"):
        megatron.parse(line.replace("0.5", "1.5"))


def test_full_recompute_chunks_round_trip():
    # Megatron --recompute-method uniform --recompute-num-layers 4: one checkpoint keeps one input for
    # each chunk of 4 layers (plan.recompute_layers, memory.activation_bytes_per_layer); block is timed
    # as full recompute of every layer, with a note.
    line = ("torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --recompute-granularity full "
            "--recompute-method uniform --recompute-num-layers 4 --micro-batch-size 1 --global-batch-size 64")
    p = megatron.parse(line)["plan"]
    assert p["recompute"] == "full" and p["recompute_layers"] == 4
    out, _ = megatron.flags(p)
    assert ("--recompute-num-layers", 4) in out and ("--recompute-method", "uniform") in out
    block = megatron.parse(line.replace("uniform", "block"))
    assert block["plan"].get("recompute_layers", 1) == 1 and any("block" in n for n in block["notes"])
    _, notes = megatron.flags({**p, "recompute": "op"})
    assert any("op" in n for n in notes)


def test_block_recompute_round_trip():
    # Megatron --recompute-method block --recompute-num-layers k: the first k layers of each chunk of
    # C = L / (p v) recomputed, the others none: plan.recompute_every = C // k. L 32, p 2: C = 16;
    # k = 8 -> every 2 (floor(16/2) = 8 again); k = 5 -> every 3 (floor(16/3) = 5); written back as block k.
    line = ("torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
            "--pipeline-model-parallel-size 2 --recompute-granularity full --recompute-method block "
            "--recompute-num-layers 8 --micro-batch-size 1 --global-batch-size 64")
    p = megatron.parse(line)["plan"]
    assert (p["recompute"], p["recompute_every"], p["recompute_layers"]) == ("full", 2, 1)
    assert megatron.parse(line.replace("--recompute-num-layers 8", "--recompute-num-layers 5"))["plan"][
        "recompute_every"] == 3
    model = megatron.model_dict(presets.load_model("llama3-8b"))          # 32 layers
    out, _ = megatron.flags(p, model)
    assert ("--recompute-method", "block") in out and ("--recompute-num-layers", 8) in out
    # every 3 of 16 does not divide: block 5 with a note
    out, notes = megatron.flags({**p, "recompute_every": 3}, model)
    assert ("--recompute-num-layers", 5) in out and any("5 of each chunk's 16" in n for n in notes)


def test_gradient_width_from_the_precision_flags():
    # Megatron-LM arguments.py: with --bf16, "bfloat16 requires gradient accumulation and all-reduce to be
    # done in fp32" (accumulate_allreduce_grads_in_fp32 forced on) unless --grad-reduce-in-bf16; fp16
    # keeps 16-bit gradients; fp32 training has fp32 ones. A dse plan at 2 bytes exports the flag back.
    base = "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --micro-batch-size 1 --global-batch-size 64"
    assert megatron.parse(base + " --bf16")["plan"]["grad_bytes"] == 4
    assert megatron.parse(base + " --bf16 --grad-reduce-in-bf16")["plan"]["grad_bytes"] == 2
    assert megatron.parse(base + " --fp16")["plan"]["grad_bytes"] == 2
    assert megatron.parse(base)["plan"]["grad_bytes"] == 4
    pairs, _ = megatron.flags(megatron.plan_dict(Plan.make(tp=8, pp=1, mbs=1, gbs=64, grad_bytes=2)), None)
    assert ("--grad-reduce-in-bf16", None) in pairs and ("--bf16", None) in pairs
    pairs, _ = megatron.flags(megatron.plan_dict(Plan.make(tp=8, pp=1, mbs=1, gbs=64, grad_bytes=4)), None)
    assert ("--grad-reduce-in-bf16", None) not in pairs
    # fp32 gradients reduced in bf16 (XLA's way, the maxtext stack): Megatron's nearest line reduces in
    # bf16 with a bf16 buffer, and says so
    pairs, notes = megatron.flags(megatron.plan_dict(Plan.make(tp=8, pp=1, mbs=1, gbs=64, grad_bytes=4,
                                                               grad_reduce_bytes=2)), None)
    assert ("--grad-reduce-in-bf16", None) in pairs and any("reduced at 2" in n for n in notes)


def test_partial_distributed_optimizer_is_hybrid_sharding():
    # Megatron-Core --num-distributed-optimizer-instances K: the distributed optimizer shards within
    # d / K ranks and keeps K copies (its gradients all-reduced across them): dse's dp_shard = d / K.
    # 32 GPUs at TP 2: d = 16, K = 2 -> shard groups of 8. Without the GPU count it is a note.
    line = ("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --micro-batch-size 1 "
            "--global-batch-size 64 --bf16 --use-distributed-optimizer --num-distributed-optimizer-instances 2")
    got = megatron.parse("torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py " + line)
    assert (got["plan"]["dp_shard"], got["plan"]["zero"]) == (8, 1)
    got = megatron.parse(line)
    assert got["plan"]["dp_shard"] == 0 and any("needs the GPU count" in n for n in got["notes"])
    plan = megatron.plan_dict(Plan.make(tp=2, pp=1, mbs=1, gbs=64, zero=1, dp_shard=8))
    pairs, notes = megatron.flags(plan, None)       # without d: a note, no flag
    assert any("--num-distributed-optimizer-instances" in n for n in notes)
    assert not any(f == "--num-distributed-optimizer-instances" for f, _ in pairs)
    # with d = 16 (dse launch gives it): K = 16 / 8 = 2, and the line reads back as the same plan
    pairs, notes = megatron.flags(plan, None, dp=16)
    assert ("--num-distributed-optimizer-instances", 2) in pairs and ("--use-distributed-optimizer", None) in pairs
    text = " ".join(megatron.arg_tokens(pairs))
    back = megatron.parse("torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py " + text)
    assert (back["plan"]["dp_shard"], back["plan"]["zero"]) == (8, 1)
    # Megatron-FSDP (ZeRO-3) has no flag dse writes for it: a note
    pairs, notes = megatron.flags(megatron.plan_dict(Plan.make(tp=2, pp=1, mbs=1, gbs=64, zero=3, dp_shard=8)), None,
                                  dp=16)
    assert not any(f == "--num-distributed-optimizer-instances" for f, _ in pairs)
    assert any("Megatron-FSDP" in n for n in notes)


def test_plan_from_a_line_keeps_the_model_fields_dse_has_no_flag_for(capsys):
    # a Qwen3-235B-A22B line without --preset: --swiglu, --moe-ffn-hidden-size, --kv-channels and
    # --untie-embeddings-and-output-weights have no dse flag; they were dropped (1.216T parameters: 128 plain
    # experts of the dense FFN's width), so the model is the line's with Megatron's defaults for the rest:
    # the preset's 235.04B (94 x (4096 x (8192 + 2 x 512) + 8192 x 4096 + 128 x 3 x 4096 x 1536) + 2 x 151936 x 4096)
    line = ("--num-layers 94 --hidden-size 4096 --num-attention-heads 64 --group-query-attention --num-query-groups 4 "
            "--kv-channels 128 --ffn-hidden-size 12288 --seq-length 4096 --num-experts 128 --moe-router-topk 8 "
            "--moe-ffn-hidden-size 1536 --swiglu --untie-embeddings-and-output-weights --vocab-size 151936 "
            "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --micro-batch-size 1 "
            "--global-batch-size 2048 --bf16")
    assert main(["plan", "--cluster", "h100-sxm", "--gpus", "256", "--json", "--megatron-args", line]) == 0
    out = json.loads(capsys.readouterr().out)
    by_hand = 94 * (4096 * (8192 + 2 * 512) + 8192 * 4096 + 128 * 3 * 4096 * 1536) + 2 * 151936 * 4096
    assert out["params_total"] == pytest.approx(by_hand, rel=1e-12)
    # a dse flag still wins over the line
    assert main(["plan", "--cluster", "h100-sxm", "--gpus", "256", "--json", "--megatron-args", line,
                 "--experts", "64"]) == 0
    assert json.loads(capsys.readouterr().out)["params_total"] < by_hand
