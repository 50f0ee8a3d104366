"""`dse plan`: the Expert view, --json, presets, config.json, and one-line errors (exit 2)."""

import contextlib
import io
import json
import math
import subprocess
import sys

import pytest

from dse.inputs import presets
from dse.cli import main

DATA = __import__("pathlib").Path(__file__).resolve().parents[1] / "data"


def run(*argv):
    """Run the CLI in this process (no interpreter, JAX import or compile per case): (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:   # argparse errors exit 2 through _Parser.error
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def run_subprocess(*argv):
    """Run the CLI in a subprocess, as a user would: (exit code, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "dse", *argv], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.slow
def test_as_a_user_runs_it():
    """The real command line: JSON on stdout, and a bad flag is one line on stderr with exit 2."""
    code, out, err = run_subprocess("plan", "--preset", "gpt3-175b", "--tp", "8", "--pp", "8", "--gbs", "1024", "--json")
    assert code == 0, err
    assert json.loads(out)["traffic_bytes"]["tp"] == 8 * 2048 * 12288 * 7 / 8 * 2 * 12 * 64   # seed 000 sec.4
    code, out, err = run_subprocess("plan", "--preset", "gpt3-175b", "--zero", "4")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--zero" in err and "Traceback" not in err
    # `dse plan` imports only what it needs: no sweep engine, co-design, optax or matplotlib
    probe = ("import sys, io, contextlib; from dse.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()): main(['plan', '--preset', 'gpt3-175b', '--tp', '8'])\n"
             "print(sorted(m for m in ('matplotlib', 'optax', 'dse.engines.sweep', 'dse.engines.codesign') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_only_the_named_subcommand_is_imported():
    from dse.cli import _command

    assert _command(["plan", "--tp", "8"]) == "plan" and _command(["nccl-tests", "x"]) == "nccl_tests"
    assert _command(["--help"]) is None and _command([]) is None and _command(["nope"]) is None


def test_json_fields_and_units():
    code, out, err = run("plan", "--preset", "gpt3-175b", "--tp", "8", "--pp", "8", "--gbs", "1024", "--json")
    assert code == 0, err
    d = json.loads(out)
    for key in ("memory_bytes", "traffic_bytes", "wire_s", "exposed_s", "inside_domain"):
        assert set(d[key]) >= {"tp", "cp", "ep", "pp", "dp"} or key == "memory_bytes"
    assert set(d["memory_bytes"]) >= {"weights", "grads", "optimizer", "activations", "total"}
    for key in ("bubble_fraction", "compute_s", "step_s", "mfu", "tokens_per_s", "feasible", "infeasible_reasons"):
        assert key in d
    # never rounded: the seed's worked example, exactly (seed 000 sec.4)
    assert d["traffic_bytes"]["tp"] == 8 * 2048 * 12288 * 7 / 8 * 2 * 12 * 64
    assert d["inside_domain"]["tp"] is True and d["inside_domain"]["dp"] is False


def test_expert_view_text():
    code, out, _ = run("plan", "--preset", "gpt3-175b", "--tp", "8", "--pp", "8", "--gbs", "1024")
    assert code == 0
    for needle in ("memory", "tp ", "pp ", "dp ", "bubble", "compute", "step", "MFU", "scale-up", "scale-out"):
        assert needle in out


def test_does_not_fit_is_not_an_error():
    code, out, _ = run("plan", "--preset", "gpt3-175b", "--tp", "1", "--pp", "1", "--zero", "0", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["feasible"] is False and d["infeasible_reasons"] == ["out_of_memory"]


@pytest.mark.parametrize("argv,field", [
    (["--tp", "8", "--pp", "3"], "--gpus"),                       # 1024 not a multiple of 24
    (["--tp", "8", "--pp", "8", "--gbs", "1000"], "--gbs"),        # not a multiple of d*b = 16
    (["--tp", "5", "--pp", "1", "--gpus", "1000"], "--tp"),        # 96 heads not a multiple of 5
    (["--tp", "0"], "--tp"),
    (["--tp", "-2"], "--tp"),
    (["--tp", "nan"], "--tp"),
    (["--mbs", "x"], "--mbs"),
    (["--zero", "4"], "--zero"),
    (["--recompute", "most"], "--recompute"),
    (["--fidelity", "best"], "--fidelity"),
    (["--cluster", "nope"], "cluster preset"),
    (["--bw-up", "0"], "bw_up_GBps"),
])
def test_bad_input_one_line_exit_2(argv, field):
    code, out, err = run("plan", "--preset", "gpt3-175b", *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert field in lines[0] and ("allowed" in lines[0] or "unknown" in lines[0])


def test_ep_must_divide_dp_and_experts():
    code, _, err = run("plan", "--preset", "mixtral-8x7b", "--gpus", "64", "--tp", "8", "--ep", "16")
    assert code == 2 and "--ep" in err and len(err.strip().splitlines()) == 1
    code, _, err = run("plan", "--preset", "gpt3-175b", "--ep", "2")
    assert code == 2 and "experts" in err


def test_unknown_model_preset():
    code, _, err = run("plan", "--preset", "gpt5")
    assert code == 2 and "gpt3-175b" in err and len(err.strip().splitlines()) == 1


def test_hf_config_import():
    m = presets.model_from_hf_config(DATA / "llama3_8b_config.json")
    assert float(m.layers) == 32 and float(m.hidden) == 4096 and float(m.kv_heads) == 8
    assert float(m.ffn_hidden) == 14336 and float(m.vocab) == 128256 and float(m.ffn_gated) == 1
    assert float(m.seq) == 8192
    moe = presets.model_from_hf_config(DATA / "mixtral_config.json", seq=4096)
    assert float(moe.experts) == 8 and float(moe.topk) == 2 and float(moe.seq) == 4096


def test_hf_config_cli_and_errors(tmp_path):
    code, out, err = run("plan", "--model-config", str(DATA / "llama3_8b_config.json"), "--gpus", "64",
                         "--tp", "8", "--json")
    assert code == 0, err
    assert json.loads(out)["params_active"] == 12 * 32 * 4096 ** 2   # seed mode: 12 L h^2
    bad = tmp_path / "config.json"
    bad.write_text("{ not json")
    code, _, err = run("plan", "--model-config", str(bad))
    assert code == 2 and "--model-config" in err and len(err.strip().splitlines()) == 1
    bad.write_text('{"hidden_size": 4096}')
    code, _, err = run("plan", "--model-config", str(bad))
    assert code == 2 and "num_hidden_layers" in err
    code, _, err = run("plan", "--model-config", str(tmp_path / "missing.json"))
    assert code == 2 and "does not exist" in err


def test_every_preset_loads_and_evaluates():
    import dse
    for name in presets.list_presets("models"):
        m = presets.load_model(name)
        assert presets.preset_info("models", name)["source"]
        r = dse.evaluate(m, presets.load_cluster("seed"), dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024))
        assert math.isfinite(float(r.step_s))
    for name in presets.list_presets("clusters"):
        assert presets.preset_info("clusters", name)["source"]
        presets.load_cluster(name)


def test_main_in_process_returns_2(capsys):
    assert main(["plan", "--preset", "gpt3-175b", "--zero", "9"]) == 2
    assert "--zero" in capsys.readouterr().err


def test_cite_prints_references():
    code, out, _ = run("plan", "--preset", "gpt3-175b", "--tp", "8", "--pp", "8", "--gbs", "1024", "--cite")
    assert code == 0 and "[zero] Rajbhandari" in out and "[korthikanti]" in out
