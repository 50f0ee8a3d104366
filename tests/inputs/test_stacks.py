"""Software-stack profiles (dse/data/stacks): loading, resolution from source text, plans and sweeps."""

import argparse

import pytest

from dse.cli import common
from dse.engines.sweep.spec import SweepSpec
from dse.errors import InputError
from dse.inputs import RECOMPUTE, presets, stacks


def test_every_profile_loads_with_sources():
    names = stacks.list_stacks()
    for want in ("megatron-lm-2021", "deepspeed-megatron", "nemo-24.07", "nemo-24.12", "megatron-bridge",
                 "megatron-core", "torchtitan", "generic"):
        assert want in names
    for name in names:
        st = stacks.load_stack(name)
        assert st["source"] and st["description"] and st["pipeline_split"] and st["fp8_recipe"]
        # the recompute default names where it comes from, and is a mode of the one table (memory.RECOMPUTE_MODES)
        assert st["recompute_source"] and st["plan"]["recompute"] in st["recompute_source"]
        assert set(st["plan"]) == set(stacks.SWITCHES) | set(stacks.COUNTS)   # every profile states every switch


def test_profiles_state_what_the_frameworks_do():
    # Korthikanti et al. 2022 sec.6.3: Megatron-LM's gradient all-reduce "is not overlapped";
    # NeMo 24.07 recipes: distributed optimizer, TP comm overlap, SP, fused attention; Transformer
    # Engine all-gathers FP8 GEMM inputs under SP (module/base.py grad_output_preprocess), the 2021
    # Megatron-LM had no FP8.
    old, nemo = stacks.plan_fields("megatron-lm-2021"), stacks.plan_fields("nemo-24.07")
    assert old["overlap_grad_reduce"] == 0.0 and old["flash_attention"] == 0.0 and old["zero"] == 0.0
    assert old["fp8_tp_comm"] == 0.0
    assert nemo == {"flash_attention": 1.0, "tp_comm_overlap": 1.0, "overlap_grad_reduce": 1.0, "sp": 1.0,
                    "zero": 1.0, "recompute": RECOMPUTE["none"], "fp8_tp_comm": 1.0, "fp8_cache": 1.0,
                    "dp_bucket_copy": 0.0, "dp_bucket_params": 0.0, "loss_logit_bytes": 6.0, "zero3_live_params": 0.0,
                    "zero3_prefetch_params": 0.0, "zero3_gather_calls": 0.0, "zero3_reduce_calls": 0.0,
                    "grad_accum": 0.0, "zero3_rank_copies": 0.0, "attn_kernel_fa2": 0.0, "grad_bytes": 2.0,
                    "grad_reduce_bytes": 0.0, "caching_allocator": 1.0}
    # torchao's Float8Linear keeps the 16-bit input for backward (float8_linear.py save_for_backward(input_hp, ...))
    assert stacks.plan_fields("torchtitan")["fp8_cache"] == 0.0
    assert stacks.plan_fields("torchtitan")["zero"] == 3.0   # FSDP2 (Liang et al. 2024 sec.2.1)
    # Attention kernels: SDPA's flash backend is FlashAttention-2 (torchtitan); llm-foundry's Triton
    # FlashAttention runs on triton_pre_mlir (Ampere mma.sync tiles); Transformer Engine's is cuDNN's.
    for name, fa2 in (("torchtitan", 1.0), ("llm-foundry", 1.0), ("nemo-24.07", 0.0), ("megatron-core", 0.0)):
        assert stacks.plan_fields(name)["attn_kernel_fa2"] == fa2, name
    # DP buckets beside the gradients: PyTorch DDP copies every gradient into its buckets by default
    # (gradient_as_bucket_view=False); DeepSpeed reduces 5e8 elements at a time (reduce_bucket_size).
    assert stacks.plan_fields("generic")["dp_bucket_copy"] == 1.0
    assert stacks.plan_fields("deepspeed-megatron")["dp_bucket_params"] == 5e8
    assert stacks.plan_fields("deepspeed-megatron")["zero3_live_params"] == 1e9   # stage3_max_live_parameters
    assert stacks.plan_fields("deepspeed-megatron")["zero3_prefetch_params"] == 5e7   # stage3_prefetch_bucket_size
    # Gradients under accumulation: Megatron's schedules run all but the last microbatch under no_sync
    # (local main_grad buffer, one reduction a step); DeepSpeed ZeRO-3's per-parameter hooks and FSDP
    # (Composer enters no_sync only for DDP; FSDP2 syncs unless told not to) reduce-scatter every backward.
    for name in ("megatron-lm-2021", "megatron-core", "megatron-bridge", "nemo-24.07", "nemo-24.12", "generic"):
        assert stacks.plan_fields(name)["grad_accum"] == 0.0, name
    for name in ("deepspeed-megatron", "llm-foundry", "torchtitan"):
        assert stacks.plan_fields(name)["grad_accum"] == 1.0, name
    # Gradient width: Megatron-LM forces fp32 gradient accumulation and reduction with --bf16
    # (arguments.py: "bfloat16 requires gradient accumulation and all-reduce to be done in fp32"); MaxText
    # keeps fp32 weights (weight_dtype), so fp32 gradients; the 2021 fp16 stacks keep 16-bit ones.
    assert stacks.plan_fields("megatron-core")["grad_bytes"] == 4.0
    assert stacks.plan_fields("maxtext")["grad_bytes"] == 4.0
    # ... reduced in bf16: XLA's SPMD partitioner puts the reduce on the gradient dot's bf16 output and
    # converts the shard to fp32 (benchmarks/xla_fsdp_dtypes.py); every PyTorch stack reduces its buffer
    for name in stacks.list_stacks():
        assert stacks.plan_fields(name)["grad_reduce_bytes"] == (2.0 if name == "maxtext" else 0.0), name
    # XLA assigns a compiled step's buffers at compile time (no caching allocator): MaxText alone is 0
    for name in stacks.list_stacks():
        assert stacks.plan_fields(name)["caching_allocator"] == float(name != "maxtext"), name
    for name in ("megatron-lm-2021", "deepspeed-megatron", "generic"):
        assert stacks.plan_fields(name)["grad_bytes"] == 2.0, name


def test_fsdp_rows_hold_sharded_gradients():
    # R131 (llm-foundry, MPT-30B, FSDP FULL_SHARD on 8 GPUs, 21 microbatches a step): Composer
    # reduce-scatters every microbatch, so a GPU holds its 1/8 shard of the 16-bit gradients,
    # 2 bytes x params / 8 (6.97 GiB), not all 2 x 29.95e9 bytes (55.8 GiB) of local accumulation.
    import dse
    from dse.calibration import validate
    from dse.inputs.fidelity import calibrated

    run = next(r for r in validate.load_runs()[0] if r.row_id == "R131")
    rep = dse.evaluate(run.model, run.cluster, run.plan, calibrated())
    assert float(rep.microbatches) == 21.0 and float(rep.grad_reduce_per_microbatch) == 1.0
    assert float(rep.grads_bytes) == pytest.approx(2.0 * float(rep.params_total) / 8.0, rel=1e-12)
    local = dse.evaluate(run.model, run.cluster, run.plan.replace(grad_accum=0.0), calibrated())
    assert float(local.grads_bytes) == pytest.approx(2.0 * float(rep.params_total), rel=1e-12)


@pytest.mark.parametrize("text,want", [
    ("NVIDIA/NeMo docs/source/performance/performance_summary.md (container 24.07)", "nemo-24.07"),
    ("NeMo 24.12 performance summary", "nemo-24.12"),
    ("NeMo framework, release not given", "nemo-24.12"),          # no release: the latest profile
    ("Megatron-Bridge performance recipes", "megatron-bridge"),
    ("ZeRO-3 (DeepSpeed), no model parallelism", "deepspeed-megatron"),
    ("torchtitan Llama 3 8B benchmark", "torchtitan"),
    ("none (PTD-P, no ZeRO)", "megatron-lm-2021"),
    ("an in-house trainer", "generic"),
    ("", "generic"),
])
def test_resolve_from_source_text(text, want):
    name, why = stacks.resolve(text)
    assert name == want and why


def test_unknown_stack_is_one_line():
    with pytest.raises(InputError, match="stack: unknown 'nope'; allowed: "):
        stacks.load_stack("nope")


def _plan(argv):
    p = argparse.ArgumentParser()
    common.add_plan_args(p)
    args = p.parse_args(argv)
    cl = presets.load_cluster("h100-sxm").replace(gpus=64.0)
    return common.plan_from_args(args, presets.load_model("llama3-8b"), cl)


def test_plan_names_its_stack():
    plain = _plan(["--tp", "2", "--gbs", "64"])
    nemo = _plan(["--tp", "2", "--gbs", "64", "--stack", "nemo-24.07"])
    assert float(plain.flash_attention) == 0.0 and float(plain.tp_comm_overlap) == 0.0
    assert float(nemo.flash_attention) == 1.0 and float(nemo.tp_comm_overlap) == 1.0
    assert float(nemo.recompute) == RECOMPUTE["none"] and float(nemo.zero) == 1.0
    # flags given win over the stack: --no-sp, --recompute full, --zero 3
    over = _plan(["--tp", "2", "--gbs", "64", "--stack", "nemo-24.07", "--no-sp", "--recompute", "full", "--zero", "3"])
    assert float(over.sp) == 0.0 and float(over.recompute) == 2.0 and float(over.zero) == 3.0
    old = _plan(["--tp", "2", "--gbs", "64", "--stack", "megatron-lm-2021"])
    assert float(old.overlap_grad_reduce) == 0.0 and float(old.recompute) == 2.0 and float(old.zero) == 0.0


def test_sweep_file_stack_key():
    d = {"model": {"preset": "llama3-8b"}, "cluster": {"preset": "h100-sxm", "gpus": 64}, "stack": "nemo-24.07", "plan": {"gbs": 64, "sp": 0},
         "axes": {"tp": [1, 2]}}
    spec = SweepSpec.from_dict(d)
    assert spec.plan["flash_attention"] == 1.0 and spec.plan["tp_comm_overlap"] == 1.0
    assert spec.plan["sp"] == 0.0        # [plan] wins over the stack
    with pytest.raises(InputError, match="stack: unknown"):
        SweepSpec.from_dict({**d, "stack": "nope"})


def test_a_stack_pipeline_sets_the_sharding_at_every_entry_point(capsys):
    # torchtitan's FSDP under torch.distributed.pipelining is ZeRO-1 with local accumulation (the
    # stack's [plan_with_pp], pipelined_source); without a pipeline the plan keeps what it asked.
    import json

    import numpy as np

    from dse.cli import main
    from dse.engines.sweep import kernel
    from dse.engines.sweep.spec import SweepSpec
    from dse.inputs import Plan

    piped = stacks.pipelined_fields("torchtitan")
    assert piped == {"zero": 1.0, "grad_accum": 0.0, "grad_bytes": 4.0} and stacks.pipelined_fields("megatron-core") == {}
    plan = stacks.pipelined(Plan.make(tp=8, pp=np.array([1.0, 2.0, 8.0, 8.0]), mbs=1, gbs=64,
                                      zero=np.array([3.0, 3.0, 2.0, 0.0]), grad_accum=1), piped)
    assert np.asarray(plan.zero).tolist() == [3.0, 1.0, 1.0, 0.0]           # DDP (ZeRO-0) stays replicated
    assert np.asarray(plan.grad_accum).tolist() == [1.0, 0.0, 0.0, 1.0]
    # dse plan --stack: the plan it evaluates, and a line saying so
    args = ["plan", "--preset", "llama3-70b", "--cluster", "h100-sxm", "--gpus", "256", "--tp", "8", "--gbs", "256",
            "--zero", "3", "--stack", "torchtitan", "--json"]
    assert main(args + ["--pp", "4"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["plan"]["zero"] == 1 and "stack torchtitan with pp 4: grad_accum=0, grad_bytes=4, zero=1" in cap.err
    assert main(args + ["--pp", "1"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["plan"]["zero"] == 3 and "stack torchtitan" not in cap.err
    # without a pipeline the stack's FSDP reduce-scatters every microbatch (grad_accum 1: the flag's default,
    # local, had been taking the stack's place); an explicit --grad-accum is the user's
    assert json.loads(cap.out)["plan"]["grad_accum"] == 1
    assert main(args + ["--pp", "1", "--grad-accum", "local"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["grad_accum"] == 0
    # a sweep file naming the stack: each point by its own pp
    spec = SweepSpec.from_dict({"stack": "torchtitan", "model": {"preset": "llama3-70b"},
                                "cluster": {"preset": "h100-sxm", "gpus": 256},
                                "plan": {"tp": 8, "gbs": 256, "zero": 3}, "axes": {"pp": [1, 2, 4]}})
    assert spec.pipelined == (("grad_accum", 0.0), ("grad_bytes", 4.0), ("zero", 1.0))
    _, _, swept = kernel._inputs(spec, {"pp": np.array([1.0, 2.0, 4.0])}, np.float64)
    assert np.asarray(swept.zero).tolist() == [3.0, 1.0, 1.0]
    # its table shows a zero axis value the stack overrides as the value run, starred
    from dse.cli import sweep as sweep_cli

    spec = SweepSpec.from_dict({"stack": "torchtitan", "model": {"preset": "llama3-70b"},
                                "cluster": {"preset": "h100-sxm", "gpus": 256},
                                "plan": {"tp": 8, "gbs": 256}, "axes": {"pp": [1, 4], "zero": [0, 3]}})
    assert [sweep_cli._shown(spec, {"pp": p, "zero": z}, "zero") for p, z in ((1, 3), (4, 3), (4, 0))] == [3, "1*", 0]


def test_a_flag_given_wins_over_the_stack(capsys):
    # A stack's recompute and ZeRO defaults stand in only for flags not given: an explicit
    # --recompute selective or --zero 1 (dse's own defaults) was once read as "not given" and replaced
    # by the stack's (maxtext: qkv, ZeRO-3).
    import json

    from dse.cli import main

    args = ["plan", "--preset", "llama2-7b", "--cluster", "h100-sxm", "--gpus", "8", "--gbs", "16", "--mbs", "2",
            "--stack", "maxtext", "--json"]
    got = {}
    for extra in ([], ["--recompute", "selective"], ["--zero", "1"], ["--recompute", "none", "--zero", "3"]):
        assert main(args + extra) == 0
        plan = json.loads(capsys.readouterr().out)["plan"]
        got[" ".join(extra)] = (plan["recompute"], plan["zero"])
    assert got == {"": (RECOMPUTE["qkv"], 3), "--recompute selective": (RECOMPUTE["selective"], 3),
                   "--zero 1": (RECOMPUTE["qkv"], 1), "--recompute none --zero 3": (RECOMPUTE["none"], 3)}
    assert main(["plan", "--preset", "llama2-7b", "--cluster", "h100-sxm", "--gpus", "8", "--gbs", "16", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert (plan["recompute"], plan["zero"]) == (RECOMPUTE["selective"], 1)   # no stack: dse's defaults


def test_switches_a_stack_leaves_off_can_be_turned_on(capsys):
    # megatron-core states Megatron-LM's defaults: no SP, the gradient reduce after the backward; --sp and
    # --overlap-grad-reduce turn them on over the stack (as the --no- forms turn a stack's on off)
    import json

    from dse.cli import main

    args = ["plan", "--preset", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2", "--gbs", "64",
            "--stack", "megatron-core", "--json"]
    plan = lambda extra: (main(args + extra), json.loads(capsys.readouterr().out)["plan"])[1]   # noqa: E731
    assert (plan([])["sp"], plan([])["overlap_grad_reduce"]) == (0, 0)
    assert plan(["--sp"])["sp"] == 1 and plan(["--overlap-grad-reduce"])["overlap_grad_reduce"] == 1
    assert main(args + ["--sp", "--no-sp"]) == 2
    assert "--sp and --no-sp: both given" in capsys.readouterr().err
