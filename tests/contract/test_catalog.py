"""Issue 14's catalog: every bad input a hostile new user tried, one test each.

Each case is a command line (files made in a temporary folder: ``{name}`` is replaced by
the path of file ``name`` from FILES) with the exit status the contract demands and a piece
of the one-line message. Found by hand (issue 14, "Found"); the expected behaviour is the
contract: one line on stderr naming the field, exit 2, no traceback, nothing half-written.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.contract.harness import ROOT, contract, half_written, run

SWEEP = '[model]\npreset = "llama3-8b"\n[cluster]\npreset = "seed"\n[plan]\ngbs = 256\n'
HF = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1000,
      "intermediate_size": 1024, "max_position_embeddings": 512}
RUNS = (ROOT / "dse/data/validation/calibration_runs.csv").read_text().splitlines()


def _runs_with(column, value):
    head = RUNS[0].split(",")
    j = head.index(column)
    import csv
    import io

    rows = list(csv.reader(io.StringIO("\n".join(RUNS[:3]))))
    for r in rows[1:]:
        r[j] = value
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue()


FILES = {
    "binary": b"\x00\x01\xff\xfe PK\x03\x04" * 50,
    "hf_string": json.dumps({**HF, "hidden_size": "abc"}),
    "hf_list": json.dumps({**HF, "num_hidden_layers": [4]}),
    "hf_bool": json.dumps({**HF, "num_hidden_layers": True}),
    "hf_seq": json.dumps({**HF, "max_position_embeddings": "long"}),
    "hf_kv": json.dumps({**HF, "num_key_value_heads": 3}),
    "hf_array": "[1, 2]",
    "sweep_cluster5": SWEEP.replace('preset = "seed"', "preset = 5") + "[axes]\ntp = [1, 2]\n",
    "sweep_model5": "model = 5\n[cluster]\npreset = \"seed\"\n[plan]\ngbs = 256\n[axes]\ntp = [1, 2]\n",
    "sweep_objective_str": SWEEP + 'objective = "step_s"\n[axes]\ntp = [1, 2]\n'.replace('objective = "step_s"\n', "")
                           .replace("[axes]", 'objective = "step_s"\n[axes]') if False else
                           'objective = "step_s"\n' + SWEEP + "[axes]\ntp = [1, 2]\n",
    "sweep_axis_1e300": SWEEP + "[axes]\nbw_up_GBps = [1e300, 450]\n",
    "sweep_hidden_1e300": SWEEP + "[axes]\nhidden = [1e300]\n",
    "sweep_ceiling_above_peak": SWEEP.replace('preset = "seed"', 'preset = "h100-sxm"\nmatmul_ceiling = 1.5') + "[axes]\ntp = [1, 2]\n",
    "sweep_axis_ceiling_above_peak": SWEEP + "[axes]\nmatmul_ceiling = [0.7, 1.5]\n",
    "sweep_axis_oversubscription_below_1": SWEEP + "[axes]\noversubscription = [0.5, 2]\n",
    "sweep_axis_fp8_scaling_7": SWEEP + "[axes]\nfp8_scaling = [1, 7]\n",
    "sweep_axis_island_7": SWEEP + "[axes]\nisland_gpus = [7, 16]\n",
    "sweep_gpus_axis_island": SWEEP.replace('preset = "seed"', 'preset = "seed"\nisland_gpus = 16') + "[axes]\ngpus = [1024, 1000]\n",
    "sweep_axis_kv_heads_7": SWEEP + "[axes]\nkv_heads = [8, 7]\n",
    "sweep_axis_layers_half": SWEEP + "[axes]\nlayers = [32, 31.5]\n",
    "sweep_fa2_share_negative": SWEEP.replace('preset = "seed"', 'preset = "h100-sxm"\nflash_attn_share = -0.3') + "[axes]\ntp = [1, 2]\n",
    "sweep_pareto_str": SWEEP + '[axes]\ntp = [1, 2]\n[output]\npareto = "step_s"\n',
    "sweep_plan_list": "plan = [1]\n" + SWEEP.replace("[plan]\ngbs = 256\n", "") + "[axes]\ntp = [1, 2]\n",
    # 100^4 * 16^2 * 40 = 1.02e12 plans
    "sweep_huge": SWEEP + "[axes]\n" + "\n".join(f"{a} = [{', '.join(str(i + 1) for i in range(100))}]"
                                               for a in ("bw_up_GBps", "bw_out_GBps", "tflops", "hbm_GB"))
                  + "\n" + "\n".join(f"{a} = [{', '.join(str(1 << i) for i in range(16))}]" for a in ("tp", "pp"))
                  + f"\ngpus = [{', '.join(str(64 * (i + 1)) for i in range(40))}]\n",
    "sweep_huge_max": "max_points = 1000\n" + SWEEP + "[axes]\n" + "\n".join(
        f"{a} = [{', '.join(str(1 << i) for i in range(16))}]" for a in ("tp", "pp", "cp", "ep", "mbs", "vpp")),
    "sweep_ok": SWEEP + "[axes]\ntp = [1, 2]\npp = [1, 2]\n[output]\ntop = 2\n",
    "runs_layers_abc": _runs_with("layers", "abc"),
    "runs_tp_0": _runs_with("tp", "0"),
    "runs_tp_nan": _runs_with("tp", "nan"),
    "runs_tp_1e300": _runs_with("tp", "1e300"),
    "runs_no_outcome": "row_id,source_id,layers\nR1,x,4\n",
    "runs_header_only": RUNS[0] + "\n",
    "calib_text": "[fidelity]\nhbm_efficiency = \"fast\"\n",
    "calib_table": "fidelity = 3\n",
    "codesign_tp3": ('[model]\npreset = "llama3-8b"\n[cluster]\npreset = "seed"\ngpus = 64\n[plan]\ngbs = 64\n'
                     '[objective]\nkind = "step_time"\n[free]\ntp = {min = 3, max = 12}\n'),
    "codesign_levels": ('[model]\npreset = "llama3-8b"\n[cluster]\npreset = "seed"\ngpus = 64\n[plan]\ngbs = 64\n'
                        '[objective]\nkind = "step_time"\n[free]\nbw_up_GBps = {min = 1, max = 9, levels = 1e12}\n'),
    "nccl_empty": "",
    "state_corrupt": "{not json",
}
DIRS = ("folder",)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    paths = {}
    for name, content in FILES.items():
        p = root / (name + (".toml" if name.startswith(("sweep", "calib", "codesign")) else
                            ".csv" if name.startswith("runs") else ".json" if name.startswith(("hf", "state")) else ".log"))
        (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)
        paths[name] = p
    for d in DIRS:
        (root / d).mkdir()
        paths[d] = root / d
    paths["existing_file"] = paths["nccl_empty"]
    paths["root"] = root
    return paths


def expand(argv, files):
    return [a.format(**{k: str(v) for k, v in files.items()}) for a in argv]


P8 = ["plan", "--preset", "llama3-8b", "--gpus", "8"]
CASES = [
    # --- tracebacks before issue 14
    ("model-config string", ["plan", "--model-config", "{hf_string}", "--gpus", "8"], 2, "hidden"),
    ("model-config list", ["plan", "--model-config", "{hf_list}", "--gpus", "8"], 2, "layers"),
    ("model-config seq string", ["plan", "--model-config", "{hf_seq}", "--gpus", "8"], 2, "max_position_embeddings"),
    ("model-config array", ["plan", "--model-config", "{hf_array}", "--gpus", "8"], 2, "JSON object"),
    ("model-config binary", ["plan", "--model-config", "{binary}", "--gpus", "8"], 2, "--model-config"),
    ("model-config folder", ["plan", "--model-config", "{folder}", "--gpus", "8"], 2, "--model-config"),
    ("sweep cluster preset 5", ["sweep", "{sweep_cluster5}"], 2, "preset"),
    ("sweep model = 5", ["sweep", "{sweep_model5}"], 2, "model"),
    ("sweep objective string", ["sweep", "{sweep_objective_str}"], 2, "objective"),
    ("sweep plan list", ["sweep", "{sweep_plan_list}"], 2, "plan"),
    ("sweep pareto string", ["sweep", "{sweep_pareto_str}"], 2, "output.pareto"),
    ("sweep --out existing file", ["sweep", "{sweep_ok}", "--out", "{existing_file}"], 2, "--out"),
    ("sweep --out under a file", ["sweep", "{sweep_ok}", "--out", "{existing_file}/sub"], 2, "--out"),
    ("sweep --plot under a file", ["sweep", "{sweep_ok}", "--plot", "{existing_file}/figs"], 2, "--plot"),
    ("sweep binary file", ["sweep", "{binary}"], 2, "sweep file"),
    ("sweep folder", ["sweep", "{folder}"], 2, "sweep file"),
    ("validate binary", ["validate", "{binary}"], 2, "runs CSV"),
    ("validate folder", ["validate", "{folder}"], 2, "runs CSV"),
    ("validate layers abc", ["validate", "{runs_layers_abc}", "--fidelity", "seed"], None, None),
    ("validate --calibration binary", ["validate", "--calibration", "{binary}"], 2, "calibration"),
    ("validate --calibration folder", ["validate", "--calibration", "{folder}"], 2, "calibration"),
    ("validate --calibration text knob", ["validate", "--calibration", "{calib_text}"], 2, "hbm_efficiency"),
    ("validate --calibration fidelity not a table", ["validate", "--calibration", "{calib_table}"], 2, "table"),
    ("validate --plot missing folder", ["validate", "--plot", "/missing-dse-folder/x.png"], 2, "--plot"),
    ("plan --plot missing folder", P8 + ["--plot", "/missing-dse-folder/x.png"], 2, "--plot"),
    ("plan --plot bad extension", P8 + ["--plot", "{root}/x.txt"], 2, "--plot"),
    ("plan --plot a folder", P8 + ["--plot", "{folder}"], 2, "--plot"),
    ("calibrate --out missing folder", ["calibrate", "--out", "/missing-dse-folder/x.toml"], 2, "--out"),
    ("calibrate --out a folder", ["calibrate", "--out", "{folder}"], 2, "--out"),
    ("nccl-tests --save missing folder", ["nccl-tests", str(ROOT / "tests/fixtures/h200_all_reduce_perf.log"),
                                          "--save", "/missing-dse-folder/x.toml"], 2, "--save"),
    ("nccl-tests binary log", ["nccl-tests", "{binary}"], 2, "LOG"),
    ("nccl-tests folder", ["nccl-tests", "{folder}"], 2, "LOG"),
    ("nccl-log binary", ["nccl-log", "{binary}", "--gpus", "16", "--tp", "8"], 2, "LOG"),
    # --- accepted silently before issue 14
    ("topk 9 of 8 experts", ["plan", "--preset", "mixtral-8x7b", "--gpus", "8", "--topk", "9"], 2, "topk"),
    ("kv-heads 7 of 96", ["plan", "--preset", "gpt3-175b", "--gpus", "8", "--kv-heads", "7"], 2, "kv_heads"),
    ("kv-heads 3 of 8 in config.json", ["plan", "--model-config", "{hf_kv}", "--gpus", "8"], 2, "kv_heads"),
    ("layers true in config.json", ["plan", "--model-config", "{hf_bool}", "--gpus", "8"], 2, "layers"),
    ("validate tp 0", ["validate", "{runs_tp_0}", "--fidelity", "seed", "--json"], None, None),
    ("validate tp nan", ["validate", "{runs_tp_nan}", "--fidelity", "seed", "--json"], None, None),
    ("validate tp 1e300", ["validate", "{runs_tp_1e300}", "--fidelity", "seed", "--json"], None, None),
    ("validate without outcome column", ["validate", "{runs_no_outcome}", "--fidelity", "seed"], None, None),
    ("validate header only", ["validate", "{runs_header_only}", "--fidelity", "seed"], None, None),
    ("tp 3 on 32 GPUs", ["plan", "--preset", "llama3-8b", "--gpus", "32", "--tp", "3"], 2, "--gpus"),
    ("sweep axis 1e300", ["sweep", "{sweep_axis_1e300}"], 2, "axes.bw_up_GBps"),
    ("sweep hidden 1e300", ["sweep", "{sweep_hidden_1e300}"], 2, "axes.hidden"),
    # --- round 22's measured kernel shares: a share of the peak, 0..1
    ("cluster matmul_ceiling 1.5", ["sweep", "{sweep_ceiling_above_peak}"], 2, "matmul_ceiling"),
    ("cluster flash_attn_share -0.3", ["sweep", "{sweep_fa2_share_negative}"], 2, "flash_attn_share"),
    # a sweep axis of a cluster field is checked as the preset field is (checks.preset_value)
    ("axis matmul_ceiling 1.5", ["sweep", "{sweep_axis_ceiling_above_peak}"], 2, "axes.matmul_ceiling"),
    ("axis oversubscription 0.5", ["sweep", "{sweep_axis_oversubscription_below_1}"], 2, "axes.oversubscription"),
    ("axis fp8_scaling 7", ["sweep", "{sweep_axis_fp8_scaling_7}"], 2, "axes.fp8_scaling"),
    ("axis island_gpus 7", ["sweep", "{sweep_axis_island_7}"], 2, "axes.island_gpus"),
    ("gpus axis against the island", ["sweep", "{sweep_gpus_axis_island}"], 2, "cluster.island_gpus"),
    # model-field axes are models as a preset is (checks.model_consistency): llama3-8b has 32 heads
    ("axis kv_heads 7 of 32", ["sweep", "{sweep_axis_kv_heads_7}"], 2, "axes.kv_heads"),
    ("axis layers 31.5", ["sweep", "{sweep_axis_layers_half}"], 2, "axes.layers"),
    ("check --island 7", ["check", "--preset", "llama3-8b", "--gpus", "1024", "--island", "7"], 2, "island_gpus"),
    ("launch --rdzv-endpoint nohostport", ["launch", "--preset", "llama3-8b", "--gpus", "16", "--tp", "8",
                                           "--rdzv-endpoint", "nohostport"], 2, "--rdzv-endpoint"),
    ("launch --rdzv-endpoint port 99999", ["launch", "--preset", "llama3-8b", "--gpus", "16", "--tp", "8",
                                           "--rdzv-endpoint", "host:99999"], 2, "--rdzv-endpoint"),
    ("codesign tp min 3 max 12", ["codesign", "{codesign_tp3}"], 2, "power of two"),
    ("codesign levels 1e12", ["codesign", "{codesign_levels}"], 2, "levels"),
    ("1e12-point sweep asks first", ["sweep", "{sweep_huge}"], 2, "--yes"),
    ("sweep above max_points", ["sweep", "{sweep_huge_max}"], 2, "max_points"),
    # --- NaN in --json before issue 14
    ("plan --hidden 1e150", P8 + ["--hidden", "1e150", "--json"], 2, "--hidden"),
    ("plan --seq 1e200", P8 + ["--seq", "1e200", "--json"], 2, "--seq"),
    ("plan --gpus 1e300 --gbs 1e300", ["plan", "--preset", "llama3-8b", "--gpus", "1e300", "--gbs", "1e300", "--json"],
     2, "gpus"),
    ("plan --bw-up 1e-300", P8 + ["--bw-up", "1e-300", "--json"], 2, "bw_up"),
    ("plan --hidden nan", P8 + ["--hidden", "nan"], 2, "--hidden"),
    ("plan --hidden inf", P8 + ["--hidden", "inf"], 2, "--hidden"),
    ("plan --hidden -4096", P8 + ["--hidden", "-4096"], 2, "--hidden"),
    ("plan --tp 1.5", P8 + ["--tp", "1.5"], 2, "--tp"),
    ("plan --zero 7", P8 + ["--zero", "7"], 2, "--zero"),
    ("plan --hbm 0", P8 + ["--hbm", "0"], 2, "hbm_GB"),
    ("plan --tflops abc", P8 + ["--tflops", "abc"], 2, "tflops"),
    # --- memory before checking
    ("rankmap --ranks 0-3000000000", ["rankmap", "--gpus", "16", "--tp", "8", "--ranks", "0-3000000000"], 2, "--ranks"),
    ("rankmap --ranks 9-2", ["rankmap", "--gpus", "16", "--tp", "8", "--ranks", "9-2"], 2, "--ranks"),
    ("rankmap --ranks 99", ["rankmap", "--gpus", "16", "--tp", "8", "--ranks", "99"], 2, "--ranks"),
    # --- sweep state
    ("resume corrupt state.json", ["sweep", "{sweep_ok}", "--out", "{root}/corrupt", "--resume"], 2, "corrupt"),
    ("resume without state", ["sweep", "{sweep_ok}", "--out", "{root}/nostate", "--resume"], 2, "state.json"),
    ("chunk huge text", ["sweep", "{sweep_ok}", "--chunk", "1e999"], 2, "--chunk"),
    # --- argparse and plain mistakes
    ("unknown command", ["planx"], 2, "invalid choice"),
    ("unknown flag", ["plan", "--hiden", "4"], 2, "unrecognized"),
    ("no model", ["plan"], 2, "model"),
    ("unknown preset", ["plan", "--preset", "gpt-9"], 2, "model preset"),
    ("unknown cluster", P8 + ["--cluster", "dgx-z"], 2, "cluster preset"),
]


@pytest.mark.parametrize("argv, expect, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_catalog(files, argv, expect, needle):
    if "{root}/corrupt" in argv:
        (files["root"] / "corrupt").mkdir(exist_ok=True)
        (files["root"] / "corrupt" / "state.json").write_text(FILES["state_corrupt"])
    contract(expand(argv, files), expect, needle)
    assert not half_written(files["root"])


def test_calibrate_out_refused_before_the_fit(files):
    # issue 14: `dse calibrate --out /missing/x.toml` failed only after 189 s of fitting
    t = time.process_time()
    contract(["calibrate", "--out", "/missing-dse-folder/x.toml"], 2, "--out")
    assert time.process_time() - t < 30   # the fit (400 Adam steps a run) never started


def test_interrupt_is_one_line_saying_how_to_resume(monkeypatch, files):
    import dse.engines.sweep.run as sweep_run

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("dse.cli.sweep.run_sweep", interrupted)
    out = files["root"] / "interrupted"
    code, _, err = run(["sweep", files["sweep_ok"], "--out", out])
    assert code == 130 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "--resume" in err
    assert sweep_run   # the real engine is untouched


def test_internal_error_is_one_line_naming_command_and_file(monkeypatch, files):
    def broken(*a, **k):
        raise RuntimeError("a defect")

    monkeypatch.setattr("dse.cli.sweep.run_sweep", broken)
    code, _, err = run(["sweep", files["sweep_ok"]])
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "dse sweep" in err and "sweep_ok.toml" in err and "--debug" in err
    code, _, err = run(["--debug", "sweep", files["sweep_ok"]])
    assert code == 1 and "Traceback" in err and "RuntimeError: a defect" in err


def test_resume_of_a_finished_dump_sweep_reprints_it(files, tmp_path):
    # issue 14: --resume on any finished dump sweep failed on the missing part files
    spec = files["root"] / "dumped.toml"
    spec.write_text(SWEEP + "[axes]\ntp = [1, 2, 4]\npp = [1, 2]\n[output]\ntop = 3\ndump = true\n")
    out = tmp_path / "out"
    code, first, _ = contract(["sweep", spec, "--out", out, "--json", "--chunk", "2"], 0)
    dump = (out / "dump.csv").read_text()
    code, again, _ = contract(["sweep", spec, "--out", out, "--json", "--resume"], 0)
    strip = lambda s: {k: v for k, v in json.loads(s).items() if k not in ("seconds", "points_per_s", "compile_s",  # noqa: E731
                                                                           "cpu_s")}
    assert strip(first) == strip(again)
    assert (out / "dump.csv").read_text() == dump and not (out / "dump").exists()
    assert not half_written(out)
    assert os.path.isfile(out / "result.json") and os.path.isfile(out / "top.csv")
