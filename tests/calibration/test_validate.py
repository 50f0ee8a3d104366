"""dse validate: rows read through their columns (stack, outcome forms, names), row checks, the report."""

import csv
import dataclasses
import json
import math

import numpy as np
import pytest

from dse.calibration import validate as validation
from dse.cli import main
from dse.inputs import RECOMPUTE, fidelity, presets


def _row(rid):
    return dict(next(r for r in validation.read_rows() if r["row_id"] == rid))


def _write(tmp_path, rows, name="runs.csv"):
    path = tmp_path / name
    fields = list(validation.read_rows()[0].keys())
    fields += sorted({k for r in rows for k in r} - set(fields))     # columns a test adds (plan_fields)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})
    return path


OUTCOME_COLUMNS = [c for c, _, _ in validation.OUTCOMES]


def _only(row, **outcome):
    """The row with every outcome column emptied but ``outcome``."""
    out = {**row, **{c: "" for c in OUTCOME_COLUMNS}, "derived_fields": ""}
    out.update({k: str(v) for k, v in outcome.items()})
    return out


def test_every_outcome_form_fixes_the_time(tmp_path):
    # Korthikanti et al. 2022 Table 5, GPT-3 175B, SP + selective, 64 A100s: 13.75 s, MFU 51.4%.
    # Each outcome form gives the time back through the global batch (64 x 2048 tokens):
    # tokens/s = B s / t; TFLOP/s = model FLOPs / (N t) (eq.(7), = dse's model FLOPs); MFU vs 312 TFLOP/s.
    row = _row("R026")
    B, s, N, t, L, h, V = 64, 2048, 64, 13.75, 96, 12288, 51200
    F = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    forms = {"iteration_time_s": t, "tokens_per_s_total": B * s / t, "tokens_per_s_per_gpu": B * s / (N * t),
             "tflops_per_gpu": F / (N * t) / 1e12, "mfu_pct": 100 * F / (N * t * 312e12)}
    rows = [{**_only(row, **{k: v}), "row_id": k, "tflops_kind": "model FLOPs"} for k, v in forms.items()]
    runs, skipped = validation.load_runs(_write(tmp_path, rows))
    assert not skipped
    for r in runs:
        assert r.time_s == pytest.approx(t, rel=1e-9), r.row_id
    # the error is on each row's own metric; a rate and a time err in opposite directions
    step_s, _ = validation.predict(runs)
    errs = {r.row_id: e for r, (_, e) in zip(runs, validation.metric_errors(runs, step_s))}
    ratio = float(step_s[0]) / t
    assert errs["iteration_time_s"] == pytest.approx(ratio - 1, rel=1e-9)
    for k in ("tokens_per_s_total", "tflops_per_gpu", "mfu_pct"):
        assert errs[k] == pytest.approx(1 / ratio - 1, rel=1e-9)


def test_headline_is_the_source_own_figure():
    runs, _ = validation.load_runs()
    by = {r.row_id: r for r in runs}
    # Narayanan Table 1 prints TFLOP/s (iteration time derived); Korthikanti prints MFU for
    # SP + selective (R026) and the time for the full-recompute baseline (R025, MFU derived).
    assert by["R001"].metric_name == "TFLOP/s/GPU"
    assert by["R026"].metric_name == "MFU %" and by["R025"].metric_name == "iteration s"


@pytest.mark.parametrize("change,reason", [
    ({"tp": "0"}, "tp: "),
    ({"tp": "nan"}, "tp: "),
    ({"tp": "two"}, "tp: 'two' is not a number"),
    ({"num_gpus": "60"}, "num_gpus: 60 is not a multiple of tp*cp*pp = 64"),
    ({"tp": "7", "num_gpus": "448"}, "tp: 7 does not divide heads = 96"),
    ({"global_batch_seqs": "65", "microbatch": "2"}, "global_batch_seqs: 65 is not a multiple of dp*mbs = 2"),
    ({"iteration_time_s": "nan", "mfu_pct": ""}, "iteration_time_s: "),
    ({"iteration_time_s": "-1"}, "iteration_time_s: "),
    ({"gpu_type": "a toaster"}, "gpu_type: no hardware preset matches 'a toaster'"),
    ({"stack": "nope"}, "stack: unknown 'nope'"),
    ({"zero_or_sharding": "hybrid sharding: FSDP 128 x data parallel 4"}, "zero_or_sharding: hybrid sharding"),
    ({"layers": "", "hidden": "", "model": "GPT 175B unnamed"}, "no layers, hidden columns and no preset"),
    ({"plan_fields": "nope=1"}, "plan_fields: 'nope=1' is not allowed; allowed: name=value of a Plan field"),
    ({"plan_fields": "tp=2"}, "plan_fields: 'tp=2' is not allowed"),           # the layout is the layout columns'
    ({"plan_fields": "ep_comm_overlap"}, "plan_fields: 'ep_comm_overlap' is not allowed"),
    ({"plan_fields": "ep_comm_overlap=2"}, "plan_fields.ep_comm_overlap: '2' is not allowed; allowed: 0, 1"),
])
def test_bad_rows_are_not_runnable(tmp_path, change, reason):
    rows = [_row("R026"), {**_row("R026"), "row_id": "BAD", **change}]
    runs, skipped = validation.load_runs(_write(tmp_path, rows))
    assert [r.row_id for r in runs] == ["R026"]
    assert skipped[0][0] == "BAD" and reason in skipped[0][1]


def test_bad_rows_in_the_cli_exit_0_and_say_why(tmp_path, capsys):
    rows = [_row("R026"), {**_row("R026"), "row_id": "BAD", "tp": "0"}]
    assert main(["validate", str(_write(tmp_path, rows)), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["row_id"] for r in out["rows"]] == ["R026"]
    assert all(math.isfinite(r["error"]) for r in out["rows"])
    assert out["not_runnable"][0]["row_id"] == "BAD" and "tp" in out["not_runnable"][0]["reason"]


def test_row_stack_from_column_text_or_fallback(tmp_path):
    base = _row("R080")   # NeMo 24.07, LLAMA2-7B, 8 H100s
    rows = [{**base, "row_id": "TEXT"},
            {**base, "row_id": "COL", "stack": "megatron-lm-2021"},
            {**base, "row_id": "LATER", "source_ref": "NeMo 24.12 performance summary"},
            {**base, "row_id": "BRIDGE", "source_ref": "Megatron-Bridge performance summary"},
            {**base, "row_id": "NONE", "source_ref": "a blog post", "notes": ""}]
    runs, skipped = validation.load_runs(_write(tmp_path, rows))
    assert not skipped
    stack = {r.row_id: r.stack for r in runs}
    assert stack == {"TEXT": "nemo-24.07", "COL": "megatron-lm-2021", "LATER": "nemo-24.12",
                     "BRIDGE": "megatron-bridge", "NONE": "generic"}
    by = {r.row_id: r for r in runs}
    # A later NeMo release and Megatron-Bridge get the same switches as 24.07 (issue 12), the
    # source id (nemo_perf_2407 on every row here) plays no part.
    for rid in ("LATER", "BRIDGE"):
        for f in ("flash_attention", "overlap_grad_reduce", "zero"):
            assert float(getattr(by[rid].plan, f)) == float(getattr(by["TEXT"].plan, f))
    assert float(by["NONE"].plan.flash_attention) == 0.0 and float(by["COL"].plan.overlap_grad_reduce) == 0.0
    assert any("stack generic (no framework named" in a for a in by["NONE"].assumed)


def test_named_model_without_shape_columns_takes_its_preset():
    runs, _ = validation.load_runs()
    r = next(r for r in runs if r.row_id == "R076")   # NeMo GPT3-5B: the table gives no shape
    assert float(r.model.layers) == 24 and float(r.model.hidden) == 4096
    assert any("from model preset gpt3-5b" in a for a in r.assumed)


def test_both_a100_presets_agree_on_korthikanti():
    # Issue 12: dgx-a100 lacked HBM bandwidth and latency (10.0% mean error vs 4.6% for a100-80gb);
    # one preset per hardware: within 1% of each other (here identical).
    a, _ = validation.load_runs(cluster="a100-80gb")
    b, _ = validation.load_runs(cluster="dgx-a100")
    a = [r for r in a if r.source == "korthikanti2022"]
    b = [r for r in b if r.source == "korthikanti2022"]
    assert len(a) == len(b) >= 8
    ta, _ = validation.predict(a)
    tb, _ = validation.predict(b)
    for x, y in zip(ta, tb):
        assert float(y) == pytest.approx(float(x), rel=0.01)


def test_runnable_share_of_the_table():
    # Rows that give a model, a layout and one outcome form: at least 90% runnable (issue 12).
    rows = validation.read_rows()
    has = [r for r in rows if r["model"] and r["tp"] and r["pp"] and r["num_gpus"]
           and any((r.get(c) or "").strip() for c in OUTCOME_COLUMNS)]
    runs, skipped = validation.load_runs()
    ok = {r.row_id for r in runs}
    assert sum(r["row_id"] in ok for r in has) >= 0.9 * len(has)


def test_validate_report_sections(capsys):
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    for part in ("judged rows (never fitted):", "fitted rows (the calibration saw them):", "leave one source out",
                 "runnable: ", "not runnable: ", "filled in where rows are silent (per row):", "stack nemo-24.07"):
        assert part in out, part
    assert main(["validate", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert {"row_id", "error", "stack", "assumed"} <= set(js["rows"][0])
    assert js["counts"]["runnable"] == len(js["rows"]) and js["leave_one_source_out"]


def test_loso_report_reads_the_shipped_file():
    loso = validation.loso_report()
    fitted = set(fidelity.fitted_rows())
    assert fitted and set(loso) >= {"korthikanti2022", "narayanan2021", "nemo_perf_2407"}


@pytest.mark.slow
def test_shipped_calibration_is_what_dse_calibrate_writes(tmp_path):
    # Issue 12: the shipped parameters are exactly what `dse calibrate` fits from the in-repo
    # table (python3 -m dse calibrate --out dse/data/calibration/default.toml); a re-fit matches,
    # and so do its leave-one-source-out figures (runs of the main fit's compiled program, the
    # left-out source weighted 0: ~1 CPU-s more than --no-loso)
    out = tmp_path / "cal.toml"
    assert main(["calibrate", "--out", str(out)]) == 0
    shipped, refit = fidelity.load_params(), fidelity.load_params(out)
    assert set(refit) == set(shipped)
    for k, v in shipped.items():
        assert refit[k] == pytest.approx(v, rel=1e-6), k
    assert fidelity.fitted_rows(out) == fidelity.fitted_rows()
    loso, shipped_loso = validation.loso_report(out), validation.loso_report()
    assert set(loso) == set(shipped_loso) >= {"korthikanti2022", "mosaicml_llmfoundry_2023", "narayanan2021",
                                               "nemo_perf_2407"}
    for source, figures in shipped_loso.items():
        assert loso[source] == pytest.approx(figures, rel=1e-6), source


def test_judged_only_table_is_never_fitted():
    # dse/data/validation/judged_runs.csv (torchtitan docs/performance.md: 64 A100s, FSDP2, and the
    # 2024-12 H100 Float8 tables): all 15 rows runnable (the two 'selective layer' rows as full
    # recompute of every other layer: test_selective_layer_rows); the Float8 rows run torchao's
    # tensorwise recipe.
    path = validation.DEFAULT_DIR / "judged_runs.csv"
    runs, skipped = validation.load_runs(path)
    assert len(runs) == 15 and skipped == []
    assert all(r.stack == "torchtitan" and float(r.plan.zero) == (1.0 if float(r.plan.pp) > 1 else 3.0) for r in runs)
    assert {r.row_id for r in runs if float(r.plan.fp8) == 2.0} == {"R110", "R112", "R113", "R114", "R115"}
    assert not {r.row_id for r in runs} & set(fidelity.fitted_rows())
    # WPS is per GPU: MFU x 312e12 / (6 N + 12 L h s) FLOPs a token (torchtitan train.py) gives it back;
    # both outcome forms fix the same time within the printed rounding.
    r = next(r for r in runs if r.row_id == "R102")
    row = _row_in(path, "R102")
    t_wps = float(r.plan.gbs) * 8192 / (2973 * 64)
    assert r.time_s == pytest.approx(t_wps, rel=0.03)
    assert r.metric_name == "MFU %" and float(row["mfu_pct"]) == 58.2


def _row_in(path, rid):
    return next(r for r in validation.read_rows(path) if r["row_id"] == rid)


def test_tpu_row_runs_on_a_torus_slice(tmp_path):
    # A row naming "TPU v4" on 64 chips runs on the tpu-v4-torus preset as a 4x4x4 slice
    # (64 = 4^3, the TPU v4 cube: Jouppi et al. 2023 sec.2), the shape recorded as an assumption.
    row = {**_row("R026"), "row_id": "TPU", "gpu_type": "TPU v4", "nvlink_GBps_per_dir": "", "scaleout_Gbps_per_gpu": "",
           "gpus_per_node": "4"}
    runs, skipped = validation.load_runs(_write(tmp_path, [row]))
    assert not skipped
    c = runs[0].cluster
    assert (float(c.torus_x), float(c.torus_y), float(c.torus_z)) == (4.0, 4.0, 4.0)
    assert any("torus slice 4x4x4" in a for a in runs[0].assumed)


def test_row_shape_from_a_config_json(tmp_path):
    # A row whose model_config column names a Hugging Face config.json (next to the CSV) takes
    # its shape from it: tests/data/llama3_8b_config.json is Llama 3 8B (32 layers, 4096, 8 KV heads).
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).parents[1] / "data" / "llama3_8b_config.json", tmp_path / "cfg.json")
    base = {**_row("R086"), "row_id": "CFG", "model": "my fine-tune", "layers": "", "hidden": "", "heads": "",
            "kv_heads": "", "ffn_hidden": "", "vocab": "", "model_config": "cfg.json"}
    path = tmp_path / "runs.csv"
    fields = list(validation.read_rows()[0].keys()) + ["model_config"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerow({k: base.get(k, "") for k in fields})
        w.writerow({**{k: base.get(k, "") for k in fields}, "row_id": "MISSING", "model_config": "nope.json"})
    runs, skipped = validation.load_runs(path)
    m = runs[0].model
    assert (float(m.layers), float(m.hidden), float(m.kv_heads), float(m.ffn_gated)) == (32, 4096, 8, 1)
    assert float(m.seq) == 8192          # the row's seq_len wins over the config's
    assert skipped[0][0] == "MISSING" and "model_config" in skipped[0][1]


def test_judged_only_table_json_has_no_nan(capsys):
    assert main(["validate", str(validation.DEFAULT_DIR / "judged_runs.csv"), "--json"]) == 0
    text = capsys.readouterr().out
    assert "NaN" not in text and json.loads(text)["counts"] == {"rows": 15, "runnable": 15, "not_runnable": 0}


def test_no_prediction_depends_on_the_source_id(tmp_path):
    # Issue 12: no code branches on a source id. Renaming every row's source_id changes no plan
    # and no predicted time (one row of each source here).
    rows = [_row(k) for k in ("R001", "R011", "R026", "R080", "R085")]
    a, _ = validation.load_runs(_write(tmp_path, rows, "a.csv"))
    b, _ = validation.load_runs(_write(tmp_path, [{**r, "source_id": "anon"} for r in rows], "b.csv"))
    ta, _ = validation.predict(a)
    tb, _ = validation.predict(b)
    assert [float(x) for x in ta] == [float(x) for x in tb]
    assert [r.stack for r in a] == [r.stack for r in b] == ["megatron-lm-2021", "deepspeed-megatron", "megatron-lm-2021",
                                                            "nemo-24.07", "nemo-24.07"]


def test_selective_layer_rows(tmp_path, capsys):
    # R101 and R105 (torchtitan docs/performance.md at 0413364, 'selective layer' = every other layer
    # checkpointed, the notes column): full recompute of one layer in N, N = 2 from the torchtitan stack
    # profile's selective_layer_every (config_manager.py: selective_ac_option default '2'). Errors as
    # dse validate prints them with the shipped calibration (judged, never fitted): R101 +3.1%, R105 +3.5%
    # MFU, beside the op-policy rows of the same models, R102 +7.5% and R106 +9.2% (round 23, before
    # ZeRO-3's forward window: -6.3%, -9.6%, -6.4%, -7.7%).
    path = validation.DEFAULT_DIR / "judged_runs.csv"
    runs = {r.row_id: r for r in validation.load_runs(path)[0]}
    for rid in ("R101", "R105"):
        assert (float(runs[rid].plan.recompute), float(runs[rid].plan.recompute_every)) == (2.0, 2.0)
        assert any("recompute_every=2 (stack torchtitan" in a for a in runs[rid].assumed)
    assert main(["validate", str(path), "--json"]) == 0
    rows = {r["row_id"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["R101"]["error"] == pytest.approx(0.031, abs=0.001)
    assert rows["R105"]["error"] == pytest.approx(0.035, abs=0.001)
    # a stack profile without a layer-level default leaves such a row not runnable, saying why
    row = {**_row_in(path, "R101"), "row_id": "X", "stack": "megatron-core"}
    _, skipped = validation.load_runs(_write(tmp_path, [row]))
    assert skipped == [("X", "recompute: layer-level selective, and stack megatron-core gives no "
                              "selective_layer_every")]


def test_selective_op_rows_run_the_op_policy():
    # torchtitan's docs/performance.md calls op-level selective checkpointing 'selective op'
    # (judged_runs.csv notes: "'selective op' = op-level selective AC"; the torchtitan stack profile:
    # selective_ac_option 'op' is dse's op mode, memory.RECOMPUTE_MODES). Such a row read as
    # Korthikanti's selective recompute (every linear output kept, the attention core recomputed)
    # put Llama 3 8B on 128 H100s (R111: FSDP, local batch 2 x 8,192) at 121.5 GB a GPU and Llama 2
    # 70B on 64 A100s (R107) at 132.0 GB, runs that ran on 80 GB GPUs.
    path = validation.DEFAULT_DIR / "judged_runs.csv"
    runs = {r.row_id: r for r in validation.load_runs(path)[0]}
    op = {rid for rid, r in runs.items() if float(r.plan.recompute) == 3.0}
    assert op == {rid for rid in runs if _row_in(path, rid)["recompute"] == "selective op"}
    assert op == {"R102", "R106", "R107", "R109", "R110", "R111", "R112"}
    _, rep = validation.predict([runs["R111"], runs["R107"]])
    for i, rid in enumerate(("R111", "R107")):
        assert float(rep.memory_bytes[i]) <= float(runs[rid].cluster.hbm_bytes), rid


def test_grand_teton_rows_run_on_their_hbm2e_part():
    # torchtitan's H100 tables (docs/performance.md at eaea6f6) ran on Grand Teton's "H100 (96 GB
    # HBM2e, 2.4 TB/s HBM bandwidth, 500 W power limit)", which the rows' gpu_type names: the
    # h100-hbm2e preset, not the 80 GB HBM3 SXM part at 3.35 TB/s. On the SXM preset R109 and R110
    # (8 GPUs, local batch 2 x 8,192; 82.7 GB published) came out at 89.9 GB against 85.52 GB, out of
    # memory for runs that ran, and every H100 row 7-22% fast (tokens/s); the memory-bound passes
    # (elementwise, loss, optimizer) take 3.35 / 2.4 = 1.40x as long on HBM2e. Errors as dse validate
    # prints them with the shipped calibration (judged, never fitted): R109 +13.4% (was +19.2%), R110
    # +5.2% (was +14.8%).
    path = validation.DEFAULT_DIR / "judged_runs.csv"
    runs = [r for r in validation.load_runs(path)[0] if r.row_id >= "R109"]
    assert len(runs) == 7
    assert all(float(r.cluster.hbm_bw_bytes_per_s) == 2.4e12 and float(r.cluster.hbm_bytes) == 96e9 for r in runs)
    assert all(any("hardware preset h100-hbm2e" in a for a in r.assumed) for r in runs)
    times, rep = validation.predict(runs)
    assert all(float(f) == 1.0 for f in rep.fits)
    sxm = [dataclasses.replace(r, cluster=presets.load_cluster("h100-sxm").replace(gpus=r.cluster.gpus)) for r in runs[:2]]
    t_sxm, rep_sxm = validation.predict(sxm)
    assert all(float(m) > float(presets.load_cluster("h100-sxm").hbm_bytes) for m in rep_sxm.memory_bytes)
    assert float(times[0]) > float(t_sxm[0]) and float(times[1]) > float(t_sxm[1])
    errors = {r.row_id: r.time_s / float(t) - 1.0 for r, t in zip(runs, times)}   # tokens/s: rates scale as 1/t
    assert errors["R109"] == pytest.approx(0.134, abs=0.001)
    assert errors["R110"] == pytest.approx(0.052, abs=0.001)


def test_pipelined_fsdp_rows_run_as_zero1():
    # R115 (torchtitan docs/performance.md at eaea6f6: Llama 3.1 405B on 512 H100s, FSDP 8 x TP 8 x PP 8)
    # says FSDP2; with a pipeline torchtitan's FSDP keeps each stage's parameters gathered and its
    # gradients unsharded until the last microbatch (the torchtitan stack's [plan_with_pp] and its
    # pipelined_source: parallelize_llama.py, torch.distributed.pipelining stage.py): dse's ZeRO-1 with
    # local accumulation. Its 16-bit weights are then the stage's whole share, 2 bytes a parameter of
    # params_per_rank, not 1/8 of it; the published 88.6 GB (allocator reserved) is nearer. Those
    # unsharded gradients accumulate in fp32 (FSDP2 upcasts a no-sync gradient to torchtitan's fp32
    # reduce_dtype: FSDPParam.to_accumulated_grad_if_needed): 4 bytes a parameter of params_per_rank.
    path = validation.DEFAULT_DIR / "judged_runs.csv"
    runs = {r.row_id: r for r in validation.load_runs(path)[0]}
    r = runs["R115"]
    assert (float(r.plan.zero), float(r.plan.grad_accum)) == (1.0, 0.0)
    assert any(a.startswith("pp > 1 under stack torchtitan: grad_accum=0, grad_bytes=4, zero=1") for a in r.assumed)
    assert all(float(runs[k].plan.zero) == 3.0 for k in ("R111", "R113"))     # no pipeline: FSDP as stated
    _, rep = validation.predict([r])
    assert float(rep.weights_bytes[0]) == pytest.approx(2.0 * float(rep.params_per_rank[0]), rel=1e-9)
    assert float(rep.grads_bytes[0]) == pytest.approx(4.0 * float(rep.params_per_rank[0]), rel=1e-9)
    reserved = float(rep.memory_bytes[0] - rep.context_bytes[0] - rep.nccl_bytes[0]) / 1e9
    assert 53.0 < reserved < 88.6          # ZeRO-3's reading: 21.2 GB; 16-bit accumulation: 41.3 GB


def test_memory_is_compared_where_the_source_prints_it(capsys):
    # judged_runs.csv's H100 rows print per-GPU memory (torchtitan docs/performance.md, GiB x 1.0737),
    # which torchtitan logs as the caching allocator's peak reserved memory (the torchtitan stack's
    # memory_printed = "reserved"): dse's memory less the CUDA context and NCCL's buffers. R109:
    # published 82.7 GB. The calibration table prints none, so it has no memory rows.
    assert main(["validate", str(validation.DEFAULT_DIR / "judged_runs.csv"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["row_id"]: r for r in out["rows"]}
    assert {k for k, r in rows.items() if "memory_error" in r} == {"R109", "R110", "R111", "R112", "R113", "R114", "R115"}
    runs = {r.row_id: r for r in validation.load_runs(validation.DEFAULT_DIR / "judged_runs.csv")[0]}
    _, rep = validation.predict([runs["R109"]])
    by_hand = float(rep.memory_bytes[0] - rep.context_bytes[0] - rep.nccl_bytes[0]) / 1e9
    r = rows["R109"]
    assert (r["memory_kind"], r["memory_published_gb"]) == ("reserved", 82.7)
    assert r["memory_predicted_gb"] == pytest.approx(by_hand, rel=1e-9)
    assert r["memory_error"] == pytest.approx(by_hand / 82.7 - 1.0, rel=1e-9)
    assert out["summary"]["memory (rows that print it)"]["rows"] == 7
    assert main(["validate", "--json"]) == 0
    shipped = json.loads(capsys.readouterr().out)
    assert not any("memory_error" in r for r in shipped["rows"])
    assert "memory (rows that print it)" not in shipped["summary"]


def test_maxtext_rows_run_their_recipe():
    """NVIDIA's DGX Cloud MaxText recipe (judged_maxtext_h100.csv; README_70b.md at 741c886 and
    configure.sh at 0b71cfda): Llama 3 70B, pure FSDP over 128 or 256 H100s, 2 x 8,192 tokens a GPU,
    remat_policy save_qkv_proj (dse's qkv mode), cuDNN fused attention (not a FlashAttention-2
    kernel). Every row runs: the six from 512 GPUs up shard over 128 GPUs and replicate across 4-16
    groups (hybrid sharding, Plan.dp_shard 128; the rest shard over all their GPUs). The step is the published tokens: GBS x 8,192 / step time = the printed
    tokens/s (R141: 256 x 8,192 / 15.563 s = 134,752). MaxText keeps fp32 weights, so fp32 gradients
    (grad_bytes 4), but XLA reduces them in bf16 on the gradient dot's output (grad_reduce_bytes 2,
    benchmarks/xla_fsdp_dtypes.py). R146's DP wire by hand: two bf16 weight all-gathers and one bf16
    reduce-scatter, 6 bytes x 70.55e9 parameters x 127/128 over a 50 GB/s NIC at bw_out_efficiency
    0.974 = 8.62 s, plus 3 x 80 layers x 127 ring steps of alpha (2.4 us) = 0.07 s (11.57 s when the
    reduce-scatter was counted fp32). Calibrated dse is slow on them, as dse validate prints: R141 BF16
    17.00 s against 15.563 (+9.2%, compute-bound; 17.37 s, +11.6%, when save_qkv_proj was read as full
    recompute); R146 FP8 11.99 s against 9.074 (+32.1%; +54.0% with the fp32 reduce), 0.36 s of it
    the DP traffic dse's flat ring cannot hide behind the FP8 compute. XLA lays out its buffers at
    compile time (the stack's caching_allocator 0: no fragmentation share) and MaxText's loss holds 8
    bytes a logit, so every row fits the 85.5 GB of an H100 (82.8 GB at 128 GPUs, with the 26.8 GB of Q,
    K, V the policy keeps); under the PyTorch readings (15% fragmentation, 12 bytes) R141 took 105.4."""
    path = validation.DEFAULT_DIR / "judged_maxtext_h100.csv"
    runs, skipped = validation.load_runs(path)
    assert [r.row_id for r in runs] == [f"R{k}" for k in range(141, 151)] and not skipped
    assert [float(r.plan.dp_shard) for r in runs[:5]] == [0, 0, 128, 128, 128]
    r141 = runs[0]
    assert float(r141.plan.zero) == 3 and float(r141.plan.attn_kernel_fa2) == 0 and float(r141.plan.grad_bytes) == 4
    assert float(r141.plan.recompute) == RECOMPUTE["qkv"] and float(r141.plan.caching_allocator) == 0
    assert float(r141.plan.loss_logit_bytes) == 8
    assert 256 * 8192 / r141.time_s == pytest.approx(134752.43, rel=1e-6)
    times, rep = validation.predict(runs)
    errors = {r.row_id: float(t) / r.time_s - 1.0 for r, t in zip(runs, times)}
    assert errors["R141"] == pytest.approx(0.093, abs=0.002)
    assert errors["R146"] == pytest.approx(0.321, abs=0.002)
    assert float(r141.plan.grad_reduce_bytes) == 2
    alpha = 2.42e-6      # the shipped fit's scale-out alpha (default.toml, collectives__alpha_out_s)
    by_hand = 6 * 70.55e9 * 127 / 128 / (50e9 * 0.9741) + 3 * 80 * 127 * alpha
    assert float(np.ravel(rep.wire_s.dp)[5]) == pytest.approx(by_hand, rel=0.01)
    assert errors["R145"] == pytest.approx(0.069, abs=0.002)      # 2,048 GPUs: FSDP 128 x 16 replicas
    assert all(float(f) == 1 for f in rep.feasible)
    assert float(rep.memory_bytes[0]) / 1e9 == pytest.approx(82.8, abs=0.1)


def test_maxtext_llama2_single_node_rows():
    """MaxText's Llama 2 7B on one 8-GPU H100 node (judged_maxtext_llama2_h100.csv): NVIDIA JAX-Toolbox's
    table (R156: FSDP 8, 2 a GPU, GBS 16, step 0.721 s = 16 / 22.19 sequences/s) and Google's A3 table
    (R157: 4 a GPU, 492 TFLOP/s a chip). R157's step comes from dse's model FLOP count, by hand:
    6 (32 (4 h^2 + 3 h f) + V h) + 12 L s h = 46.1 GFLOP a token (h 4096, f 11008, V 32000, s 4096),
    x 32 x 4096 tokens / (8 x 492 TFLOP/s) = 1.535 s. remat_policy minimal_flash reads as selective.
    Calibrated dse (never fitted): R156 -0.1%, R157 +8.7% (TFLOP/s; fast): the maxtext stack on one
    node is at or below dse's pooled rate, where the DGX Cloud 70B rows are 7-10% above it."""
    path = validation.DEFAULT_DIR / "judged_maxtext_llama2_h100.csv"
    runs, skipped = validation.load_runs(path)
    assert [r.row_id for r in runs] == ["R156", "R157"] and not skipped
    L, h, f, V, s = 32, 4096, 11008, 32000, 4096
    per_token = 6 * (L * (4 * h * h + 3 * h * f) + V * h) + 12 * L * s * h
    assert per_token / 1e9 == pytest.approx(46.1, abs=0.05)
    assert runs[1].time_s == pytest.approx(per_token * 32 * 4096 / (8 * 492e12), rel=1e-9)
    assert runs[0].time_s == pytest.approx(0.721) and 16 / 0.721 == pytest.approx(22.19, abs=0.005)
    assert all(float(r.plan.recompute) == RECOMPUTE["selective"] and float(r.plan.zero) == 3 for r in runs)
    times, _ = validation.predict(runs)
    assert float(times[0]) / runs[0].time_s - 1 == pytest.approx(-0.001, abs=0.002)
    assert runs[1].time_s / float(times[1]) - 1 == pytest.approx(0.087, abs=0.002)


def test_flagperf_rows_run_megatron_core():
    """FlagPerf's Megatron-core 0.6.0 H100 rows (judged_flagperf_h100.csv; llama3_8B-megatron README at
    0e0fc76, llama3_70B-megatron at 61ac079): tokens/s/GPU as printed, memory printed in GiB and stored
    in GB (71 GiB = 76.24 GB), the stack's command-line defaults for what the run script does not pass.
    Megatron-LM keeps fp32 gradient buffers under --bf16 (the megatron-core stack's grad_bytes 4: R151
    holds 4e9 parameters a rank, 8 GB more than at 2 bytes). dse validate's judgement with the shipped
    calibration (never fitted): R151 (8 GPUs, TP 2, BF16) +7.3% in tokens/s, R155 (64 GPUs, TP 8 x PP 4)
    +5.2%; memory 18.0% and 6.9% under the printed device memory (28.6% and 14.5% at 2 bytes)."""
    path = validation.DEFAULT_DIR / "judged_flagperf_h100.csv"
    runs, skipped = validation.load_runs(path)
    assert [r.row_id for r in runs] == ["R151", "R152", "R153", "R154", "R155"] and not skipped
    r151 = runs[0]
    assert float(r151.plan.zero) == 1 and float(r151.plan.sp) == 1 and float(r151.plan.recompute) == RECOMPUTE["selective"]
    assert float(runs[1].plan.fp8) >= 1 and float(r151.plan.fp8) == 0
    assert r151.memory_gb == pytest.approx(71 * 1.073741824, abs=0.01)
    times, rep = validation.predict(runs)
    errors = {r.row_id: r.time_s / float(t) - 1.0 for r, t in zip(runs, times)}   # tokens/s: rates scale as 1/t
    assert errors["R151"] == pytest.approx(0.073, abs=0.002)
    assert errors["R155"] == pytest.approx(0.052, abs=0.002)
    memory = [float(m) / 1e9 for m in rep.memory_bytes]
    assert memory[0] / r151.memory_gb - 1.0 == pytest.approx(-0.180, abs=0.003)
    assert memory[4] / runs[4].memory_gb - 1.0 == pytest.approx(-0.069, abs=0.003)


def test_validate_all_pools_the_rows_outside_the_calibration_table(capsys, tmp_path):
    # dse validate --all: every shipped runs table at once; "outside the calibration table" pools the
    # judged rows of every judged_*.csv (issue 17's measure), each table's judged rows summarized by name.
    import json

    from dse.cli import main

    assert main(["validate", "--all", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [p.name for p in validation.shipped_run_tables()]
    assert names[0] == "calibration_runs.csv" and "judged_runs.csv" in names and len(names) >= 6
    summ = out["summary"]
    outside = [n for n in names[1:] if f"{n} (judged)" in summ]
    assert summ["outside the calibration table"]["rows"] == sum(summ[f"{n} (judged)"]["rows"] for n in outside)
    judged = [r["error"] for r in out["rows"] if r["set"] == "judged" and r["table"] != names[0]]
    med, mx, _ = validation.summary(judged)
    assert summ["outside the calibration table"]["median_abs"] == pytest.approx(med)
    assert summ["outside the calibration table"]["max_abs"] == pytest.approx(mx)
    assert summ["judged_runs.csv (judged)"]["rows"] == 15
    # no fitted row sits outside the calibration table
    assert not [r for r in out["rows"] if r["set"] == "fitted" and r["table"] != names[0]]
    png = tmp_path / "all.png"    # one figure of every row, coloured by source
    assert main(["validate", "--all", "--plot", str(png)]) == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["validate", "--all", "dse/data/validation/judged_runs.csv"]) == 2
    assert "--all: runs every shipped table; allowed: --all without a RUNS.csv" in capsys.readouterr().err
    path = validation.DEFAULT_DIR / "judged_runs.csv"
    from dse.errors import InputError

    with pytest.raises(InputError, match="row R101 in judged_runs.csv and judged_runs.csv"):
        validation.compare_tables([path, path], fidelity.resolve("calibrated"))


def test_a_row_states_plan_fields_its_columns_lack(tmp_path):
    # plan_fields: "name=value" items a row's source printed without a column of their own; they win
    # over the stack profile's defaults and are said among the row's filled-in values only when absent
    row = {**_row("R026"), "row_id": "X", "plan_fields": "tp_comm_overlap=1; loss_logit_bytes=12"}
    runs, skipped = validation.load_runs(_write(tmp_path, [row]))
    assert not skipped
    plan = runs[0].plan
    assert float(plan.tp_comm_overlap) == 1 and float(plan.loss_logit_bytes) == 12
    assert not any("loss_logit_bytes=" in a for a in runs[0].assumed)


def test_tables_of_mlperf_blackwell_and_fine_grained_moe_runs():
    """Judged-only rows from round 27 (dse/data/validation/README.md): MLPerf Training v4.0's GPT-3 175B
    on 11,616 and 10,752 H100 (10K+ GPUs, FP8), B200 FP8 runs from Google's gpu-recipes logs (Llama 3
    70B on 64, Qwen3-30B-A3B on 16 and 32, MaxText Llama 3.1 405B on 256), Qwen3-235B-A22B on 256 GB200
    (Megatron-MoE-ModelZoo) and Qwen3-30B-A3B on one H100 node (NeMo Automodel). Step times by hand:
    an MLPerf block is the tokens of its epoch_count, 53,526,528 = 9 steps x 2,904 x 2,048 (11,616 GPUs)
    and 55,050,240 = 10 x 2,688 x 2,048; the mean block takes 8.3037 s and 9.2075 s, so 0.9226 s and
    0.9207 s a step. The ModelZoo's 750 TFLOP/s is Megatron's count, 1.480e11 FLOPs a token (causal
    attention halved: 6 [94 (h (q + 2 kv) + q h + q s + 8 x 1536 x 3 h) + h V] with h 4096, q 8192, kv
    512, s 4096, V 151,936): 8,192 x 4,096 x 1.480e11 / (750e12 x 256) = 25.87 s."""
    by = {}
    for name in ("judged_mlperf_v40_h100.csv", "judged_blackwell_runs.csv", "judged_automodel_h100.csv",
                 "judged_moe_modelzoo_h100.csv"):
        runs, skipped = validation.load_runs(validation.DEFAULT_DIR / name)
        assert not skipped, name
        by.update({r.row_id: r for r in runs})
    assert 9 * 2904 * 2048 == 53526528 and 10 * 2688 * 2048 == 55050240
    assert by["R158"].time_s == pytest.approx(8.3037 / 9, abs=1e-4) and float(by["R158"].cluster.gpus) == 11616
    assert by["R159"].time_s == pytest.approx(9.2075 / 10, abs=1e-4)
    h, q, kv, s, V = 4096, 64 * 128, 4 * 128, 4096, 151936
    per_token = 6 * (94 * (h * (q + 2 * kv) + q * h + q * s + 8 * 1536 * 3 * h) + h * V)
    assert per_token == pytest.approx(1.480e11, rel=1e-3)
    assert by["R164"].time_s == pytest.approx(8192 * 4096 * per_token / (750e12 * 256), rel=2e-3)
    # what the rows state beyond the columns (plan_fields): the pipeline split's units, FP8 parameters,
    # delayed scaling's 1,024-long amax history, capacity 1.0 padded; the cluster each runs on
    assert (float(by["R164"].plan.embedding_in_split), float(by["R164"].plan.loss_in_split)) == (1, 1)
    assert float(by["R161"].plan.capacity_factor) == 1 and float(by["R161"].plan.fp8_amax_history) == 1024
    assert float(by["R164"].cluster.gpus_per_node) == 4 and float(by["R163"].plan.dp_shard) == 128
    # the ModelZoo's H100 layouts fold EP over TP (--expert-tensor-parallel-size 1) with DeepEP (one copy
    # a node) or NCCL's all-to-all; R169 splits 94 layers + embedding + loss = 96 units over 32 x 3 chunks
    assert all(float(by[k].plan.etp) == 1 for k in ("R166", "R167", "R168", "R169", "R170"))
    assert [float(by[k].plan.ep_node_dedup) for k in ("R166", "R169")] == [1, 0]
    assert (float(by["R169"].plan.pp) * float(by["R169"].plan.vpp), by["R169"].model.layers) == (96, 94)
    times, _ = validation.predict(list(by.values()))
    err = {k: float(t) / r.time_s - 1.0 for (k, r), t in zip(by.items(), times)}
    # calibrated dse (never fitted on these): within 9% on the 10K-GPU rows and the GB200 MoE row ...
    assert abs(err["R158"]) < 0.09 and abs(err["R164"]) < 0.05
    # ... and far off where the validation README's "Known gaps" says: Qwen3-30B-A3B in FP8 on B200
    # runs at about half the rate dse predicts, and the B200 405B FSDP row is slower than dse's flat
    # ring allows (its DP wire alone, 49.9 s, is longer than the published 28.3 s step)
    assert err["R161"] < -0.5 and err["R163"] > 0.8


def test_a_rows_recompute_text_states_selective_recomputes_modules(tmp_path):
    # What a row means comes from what it says: "--recompute-modules layernorm moe_act" in its recompute text
    # is Plan.recompute_modules (the Megatron-MoE-ModelZoo rows say so), as the CLI flag reads it; a name
    # Megatron does not have is one line, not a guess
    base = _row("R080")
    rows = [{**base, "row_id": "MODS", "recompute": "selective (--recompute-granularity selective "
                                                    "--recompute-modules layernorm moe_act)"},
            {**base, "row_id": "PLAIN", "recompute": "selective"}]
    runs, skipped = validation.load_runs(_write(tmp_path, rows))
    plans = {r.row_id: r.plan for r in runs}
    assert float(plans["MODS"].recompute_modules) == 6.0 and float(plans["PLAIN"].recompute_modules) == 1.0
    bad = [{**base, "row_id": "BAD", "recompute": "selective (--recompute-modules layernorm act)"}]
    runs, skipped = validation.load_runs(_write(tmp_path, bad, "bad.csv"))
    assert runs == [] and skipped[0][0] == "BAD" and "'act' is not allowed; allowed: any of core_attn" in skipped[0][1]
