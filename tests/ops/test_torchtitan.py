"""torchtitan job configs and NeMo / Megatron-Bridge overrides, both ways (issue 15 item 2)."""

import pytest

from dse.cli import main
from dse.errors import InputError
from dse.inputs import Plan, presets
from dse.ops import megatron, torchtitan

# the choices torchtitan can express (ZeRO-0 DDP, ZeRO-2/3 FSDP without a pipeline, ZeRO-1 FSDP with one:
# torch.distributed.pipelining keeps a stage's parameters gathered and its gradients unsharded over the
# step; its rank order; flash attention). torchtitan's float8 is torchao's tensorwise dynamic scaling
# (fp8 = 2; docs/float8.md)
PLANS = [dict(tp=8, pp=4, cp=2, ep=1, vpp=2, mbs=1, gbs=256, zero=1, grad_accum=0, recompute=2.0, fp8=2,
              fp8_param_gather=1,
              tp_comm_overlap=1, cp_ring=1, schedule=0.0),
         dict(tp=2, pp=1, cp=1, mbs=2, gbs=64, zero=0, recompute=0.0, cp_ring=0),
         dict(tp=4, pp=2, cp=1, mbs=1, gbs=128, zero=1, grad_accum=0, recompute=3.0, schedule=1.0),
         dict(tp=4, pp=4, cp=1, mbs=1, gbs=128, zero=1, grad_accum=0, recompute=3.0, schedule=2.0),
         dict(tp=4, pp=1, cp=2, mbs=1, gbs=128, zero=3, grad_accum=1, recompute=3.0, cp_ring=0),
         dict(tp=2, pp=1, cp=1, mbs=2, gbs=128, zero=2, grad_accum=1, recompute=2.0)]


def _plan(kw):
    from dse.equations import topology

    return megatron.plan_dict(Plan.make(**kw, flash_attention=1, overlap_grad_reduce=1, fp8_cache=0,
                                        sp=1.0 if kw["tp"] > 1 else 0.0,
                                        rank_order=float(topology.rank_order_code(torchtitan.TORCHTITAN_ORDER))))


@pytest.mark.parametrize("kw", PLANS)
def test_torchtitan_round_trip(kw):
    model = megatron.model_dict(presets.load_model("llama3-8b"))
    plan = _plan(kw)
    text, notes = torchtitan.to_toml(plan, model, dp=512 // (plan["tp"] * plan["cp"] * plan["pp"]))
    back = torchtitan.parse_toml(text, gpus=512, layers=model["layers"])
    assert back["cluster"] == {"gpus": 512}
    assert back["plan"] == {k: plan[k] for k in back["plan"]}
    assert back["model"] == {"seq": model["seq"]}
    assert ("compile.enable", True) in back["unmodeled"]   # listed, not modeled


def test_torchtitan_reads_its_own_405b_file():
    # pytorch/torchtitan torchtitan/models/llama3/train_configs/llama3_405b.toml (128 H100): the older layout
    # (batch_size and compile under [training]); FSDP over the rest, TP 8 async, full AC, float8
    text = """
[model]
name = "llama3"
flavor = "405B"
converters = ["float8"]
[training]
batch_size = 2
seq_len = 8192
compile = true
[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 8
enable_async_tensor_parallel = true
pipeline_parallel_degree = 1
context_parallel_degree = 1
[activation_checkpoint]
mode = "full"
"""
    r = torchtitan.parse_toml(text, gpus=128)
    p = r["plan"]
    assert (p["tp"], p["pp"], p["zero"], p["recompute"], p["fp8"], p["tp_comm_overlap"]) == (8, 1, 3, "full", 2, 1)
    assert p["mbs"] == 2 and p["gbs"] == 2 * 16          # 128 / 8 = 16 shards, 2 sequences each
    with pytest.raises(InputError, match="needs the GPU count"):
        torchtitan.parse_toml(text)
    # a parallelism key dse does not read is listed, not dropped
    more = torchtitan.parse_toml(text.replace("[parallelism]", "[parallelism]\ndisable_loss_parallel = true"),
                                 gpus=128)
    assert ("parallelism.disable_loss_parallel", True) in more["unmodeled"]


@pytest.mark.parametrize("zero,reshard", [(3, "default"), (3, "always"), (2, "never")])
def test_fsdp_under_a_pipeline_is_zero1(zero, reshard):
    # torchtitan parallelize_llama.py: fsdp_reshard_after_forward 'default' = not pp_enabled; and
    # torch.distributed.pipelining stage.py: an FSDP stage's backward runs without resharding or
    # gradient sync until the last microbatch. Whatever the reshard setting, a pipelined FSDP run
    # holds gathered parameters and unsharded gradients and syncs once a step: ZeRO-1, grad_accum 0.
    text = f"""
[training]
local_batch_size = 8
seq_len = 8192
[parallelism]
data_parallel_shard_degree = 8
fsdp_reshard_after_forward = "{reshard}"
tensor_parallel_degree = 8
pipeline_parallel_degree = 8
pipeline_parallel_microbatch_size = 1
"""
    out = torchtitan.parse_toml(text, gpus=512)
    assert (out["plan"]["zero"], out["plan"]["grad_accum"]) == (1, 0)
    assert any("pipeline_parallel_degree 8: ZeRO-1" in n for n in out["notes"])
    flat = torchtitan.parse_toml(text.replace("pipeline_parallel_degree = 8", "pipeline_parallel_degree = 1"), gpus=64)
    assert flat["plan"]["zero"] == zero
    # written back: ZeRO-3 with a pipeline says what torchtitan will do instead
    plan = _plan(dict(tp=8, pp=8, mbs=1, gbs=64, zero=3, grad_accum=1, recompute=2.0))
    toml, notes = torchtitan.to_toml(plan, None, dp=8)
    assert any("ZeRO-3 with a pipeline has no torchtitan form" in n for n in notes)
    assert torchtitan.parse_toml(toml, gpus=512)["plan"]["zero"] == 1


def test_zero1_has_no_torchtitan_form():
    plan = _plan(dict(tp=2, pp=1, mbs=1, gbs=64, zero=1))
    text, notes = torchtitan.to_toml(plan, None, dp=32)
    assert any("ZeRO-1" in n for n in notes) and 'fsdp_reshard_after_forward = "never"' in text


@pytest.mark.parametrize("style", ["bridge", "nemo"])
@pytest.mark.parametrize("kw", [dict(tp=8, pp=4, vpp=2, cp=2, ep=1, mbs=1, gbs=256, zero=1, recompute=2.0, fp8=3,
                                     tp_comm_overlap=1, cp_ring=0, overlap_grad_reduce=1, flash_attention=1),
                                dict(tp=1, pp=1, mbs=2, gbs=64, zero=3, grad_accum=1, recompute=0.0,
                                     overlap_grad_reduce=0, flash_attention=0),
                                dict(tp=2, pp=1, ep=4, mbs=1, gbs=64, zero=2, grad_accum=1, recompute=3.0),
                                # selective recompute's modules: model.recompute_modules=[layernorm,moe_act]
                                dict(tp=2, pp=2, ep=4, mbs=1, gbs=64, zero=1, recompute=1.0, recompute_modules=6.0),
                                # MoE folding and DeepEP's dispatch: expert_tensor_parallel_size=1, flex + deepep
                                dict(tp=2, pp=1, ep=8, mbs=1, gbs=64, zero=1, recompute=1.0, etp=1, ep_node_dedup=1)])
def test_nemo_bridge_round_trip(kw, style):
    plan = megatron.plan_dict(Plan.make(**kw))
    text, _ = torchtitan.nemo_overrides(plan, style=style)
    if style == "nemo":
        assert all(ln.startswith("recipe.") for ln in text.splitlines())
    if kw.get("recompute_modules"):
        assert "recompute_modules=[layernorm,moe_act]" in text
    if kw.get("etp"):
        assert "expert_tensor_parallel_size=1" in text and "moe_flex_dispatcher_backend=deepep" in text
    back = torchtitan.parse_overrides(text)
    for k, v in back.items():
        want = plan[k] if not (k == "sp" and plan["tp"] == 1) else 0
        if k == "cp_ring" and plan["cp"] == 1:
            continue                     # no CP: no cp_comm_type to write
        assert v == want, (k, v, want)
    assert set(back) >= {"tp", "pp", "cp", "ep", "mbs", "gbs", "zero", "recompute", "overlap_grad_reduce", "fp8"}


def test_cli_formats(capsys):
    assert main(["launch", "--preset", "llama3-8b", "--tp", "8", "--gpus", "64", "--gbs", "256", "--zero", "3",
                 "--format", "torchtitan"]) == 0
    out = capsys.readouterr().out
    assert "[parallelism]" in out and "tensor_parallel_degree = 8" in out
    assert main(["launch", "--preset", "llama3-8b", "--tp", "8", "--gpus", "64", "--gbs", "256",
                 "--format", "bridge"]) == 0
    assert "model.tensor_model_parallel_size=8" in capsys.readouterr().out
    assert main(["launch", "--preset", "llama3-8b", "--tp", "8", "--gpus", "64", "--gbs", "256",
                 "--format", "nemo"]) == 0
    assert "recipe.trainer.strategy.tensor_model_parallel_size=8" in capsys.readouterr().out


def test_plan_reads_a_torchtitan_config(tmp_path, capsys):
    import json

    model = megatron.model_dict(presets.load_model("llama3-8b"))
    plan = _plan(PLANS[2])
    text, _ = torchtitan.to_toml(plan, model, dp=8)
    path = tmp_path / "job.toml"
    path.write_text(text)
    assert main(["plan", "--preset", "llama3-8b", "--gpus", "64", "--json", "--torchtitan-config", str(path)]) == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert (out["plan"]["tp"], out["plan"]["pp"], out["plan"]["zero"], out["plan"]["schedule"]) == (4, 2, 1, 1)
    assert "not modeled by dse: compile.enable True" in cap.err      # listed, not dropped


def test_selective_is_written_as_the_op_policy_with_a_note():
    # torchtitan has op-level SAC (dse "op") and per-layer checkpointing, no attention-core-only policy
    model = megatron.model_dict(presets.load_model("llama3-8b"))
    plan = _plan(dict(tp=1, pp=1, mbs=1, gbs=64, zero=3, grad_accum=1, recompute=1.0))
    text, notes = torchtitan.to_toml(plan, model, dp=64)
    assert torchtitan.parse_toml(text, gpus=64, layers=model["layers"])["plan"]["recompute"] == "op"
    assert any("recompute selective (Megatron's module recompute" in n for n in notes)


def test_layer_level_selective_round_trip():
    # torchtitan's selective_ac_option N (an integer): every N-th block fully checkpointed
    # (_apply_ac_to_transformer_block: ptd_checkpoint_wrapper when count % N == 0), dse's full
    # recompute with recompute_every N; 0 wraps every block (full recompute of every layer).
    model = megatron.model_dict(presets.load_model("llama3-8b"))
    plan = _plan(dict(tp=1, pp=1, mbs=1, gbs=64, zero=3, grad_accum=1, recompute=2.0, recompute_every=2))
    text, _ = torchtitan.to_toml(plan, model, dp=64)
    assert 'mode = "selective"' in text and 'selective_ac_option = "2"' in text
    back = torchtitan.parse_toml(text, gpus=64, layers=model["layers"])["plan"]
    assert (back["recompute"], back["recompute_every"]) == ("full", 2)
    zero = torchtitan.parse_toml(text.replace('selective_ac_option = "2"', 'selective_ac_option = "0"'), gpus=64)
    assert (zero["plan"]["recompute"], zero["plan"]["recompute_every"]) == ("full", 1)
    with pytest.raises(InputError, match="selective_ac_option 'layer'; allowed: op, an integer"):
        torchtitan.parse_toml(text.replace('selective_ac_option = "2"', 'selective_ac_option = "layer"'), gpus=64)
    # NeMo / Bridge: Megatron's block method, the first k = 32 / 2 = 16 layers of the one chunk
    lines, _ = torchtitan.nemo_overrides(plan, model)
    assert "model.recompute_method=block" in lines and "model.recompute_num_layers=16" in lines
    assert torchtitan.parse_overrides(lines, layers=32)["recompute_every"] == 2
