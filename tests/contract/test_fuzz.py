"""A fuzzer for the contract (issue 14): hypothesis over command lines and over mutated
contents of the shipped TOML, JSON, CSV and log files, run in-process against every
subcommand. Asserted on every example (tests/contract/harness.py): exit 0 or 2 (or a
verdict code), one line on stderr for 2, no traceback, strict JSON for ``--json``, no
temporary file left behind.

The engines behind sweep, codesign, suggest and the calibration fit are replaced by a stub
that stops the command once its inputs are accepted (those runs take seconds to minutes;
the catalog and the kill test run them for real): what is fuzzed is every check between
the input and the engine. Example counts are modest (2 CPU cores); derandomized so the
run is the same every time.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import ExitStack
from unittest import mock

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from tests.contract.harness import ROOT, check_contract, half_written, run

TRIED: dict[str, dict] = {}    # distinct inputs per test -> exit status, counted in test_zz_counts
MET: dict[str, int] = {}

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                phases=[Phase.explicit, Phase.generate] + ([] if os.environ.get("DSE_FUZZ_NOSHRINK") else [Phase.shrink]),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.filter_too_much])


class Accepted(BaseException):
    """Raised by a stubbed engine: the command accepted its inputs."""


def _accept(*a, **k):
    raise Accepted


STUBS = ("dse.cli.sweep.run_sweep", "dse.engines.codesign.run", "dse.ops.suggest.table", "dse.calibration.fit.calibrate")


def contract_run(kind, argv, key=None):
    """Run argv with the engines stubbed; check the contract; count the input."""
    with ExitStack() as stack:
        for target in STUBS:
            stack.enter_context(mock.patch(target, _accept))
        try:
            code, out, err = run(argv)
        except Accepted:
            code, out, err = 0, "", ""
    check_contract(argv, code, out, err)
    TRIED.setdefault(kind, {})[key if key is not None else tuple(map(str, argv))] = code
    MET[kind] = MET.get(kind, 0) + 1
    return code, out, err


# ---------------------------------------------------------------- command lines

HOSTILE = ["", " ", "0", "-1", "-0", "1.5", "3", "7", "1e15", "1e300", "1e-300", "nan", "inf", "-inf", "abc",
           "1,000", "0x10", "1_000", "9" * 40, "True", "[]", "{}", "none", "--json", "x" * 300, "é", "💥", "8;rm",
           "16x16x16", "0-3", "a:b", "localhost:0", "1e400"]
VALUE = st.one_of(st.sampled_from(HOSTILE),
                  st.integers(-2 ** 70, 2 ** 70).map(str),
                  st.floats(allow_nan=True, allow_infinity=True).map(repr),
                  st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12))

LOG = str(ROOT / "tests/fixtures/h200_all_reduce_perf.log")
TRANSPORT = str(ROOT / "tests/fixtures/seed001/nccl_transport.log")
BASES = {
    "plan": ["plan", "--preset", "llama3-8b", "--gpus", "64", "--tp", "8", "--pp", "2", "--gbs", "64", "--json"],
    "plan-moe": ["plan", "--preset", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--ep", "8", "--gbs", "64"],
    "check": ["check", "--preset", "llama3-8b", "--gpus", "64", "--tp", "8", "--gbs", "64", "--json"],
    "rankmap": ["rankmap", "--gpus", "32", "--tp", "8", "--pp", "2", "--ranks", "0-7", "--json"],
    "launch": ["launch", "--preset", "llama3-8b", "--gpus", "16", "--tp", "8", "--gbs", "16",
               "--rdzv-endpoint", "host:29500", "--json"],
    "suggest": ["suggest", "--preset", "llama3-8b", "--gpus", "64", "--gbs", "64", "--json"],
    "nccl-tests": ["nccl-tests", LOG, "--ranks", "8", "--json"],
    "nccl-log": ["nccl-log", TRANSPORT, "--gpus", "16", "--tp", "8", "--json"],
    "check-log": ["check-log", str(ROOT / "tests/fixtures/megatron_job.log"), "--gpus", "32", "--tp", "8", "--pp", "2",
                  "--json"],
    "sweep": ["sweep", str(ROOT / "sweeps/try-recompute.toml"), "--chunk", "64", "--json"],
    "codesign": ["codesign", str(ROOT / "sweeps/codesign_shape.toml"), "--no-exhaustive", "--json"],
    "validate": ["validate", "--fidelity", "seed", "--json"],
    "calibrate": ["calibrate", "--steps", "3"],
}
EXTRA_FLAGS = ["--tp", "--pp", "--cp", "--ep", "--vpp", "--mbs", "--gbs", "--zero", "--recompute", "--schedule",
               "--layers", "--hidden", "--heads", "--kv-heads", "--ffn", "--vocab", "--experts", "--topk", "--seq",
               "--gpus", "--domain", "--gpus-per-node", "--bw-up", "--bw-out", "--tflops", "--hbm", "--topology",
               "--island", "--oversub", "--torus", "--torus-bw", "--rank-order", "--torus-order", "--fidelity",
               "--grad-accum", "--megatron-args", "--busbw", "--ranks", "--chunk", "--steps", "--collective",
               "--link-GBps", "--first-node", "--node-digits", "--plot-format", "--cluster", "--preset"]


@st.composite
def command_lines(draw):
    name = draw(st.sampled_from(sorted(BASES)))
    argv = list(BASES[name])
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["value", "value", "flag", "drop"]))
        values = [i for i in range(2, len(argv)) if not argv[i].startswith("--") and argv[i - 1].startswith("--")]
        if op == "value" and values:
            argv[draw(st.sampled_from(values))] = draw(VALUE)
        elif op == "flag":
            argv += [draw(st.sampled_from(EXTRA_FLAGS)), draw(VALUE)]
        elif op == "drop" and len(argv) > 2:
            del argv[draw(st.integers(1, len(argv) - 1))]
    if argv[0] == "calibrate":   # a valid calibrate would fit for minutes: its --out is checked first
        argv += ["--out", "/missing-dse-folder/x.toml"]
    return argv


@settings(max_examples=90, **SETTINGS)
@given(command_lines())
def test_fuzz_command_lines(argv):
    contract_run("argv", argv)


# Every numeric flag of dse plan against values no flag may take (each must be exit 2).
NUMERIC_FLAGS = ["--tp", "--pp", "--cp", "--ep", "--vpp", "--mbs", "--gbs", "--zero", "--layers", "--hidden", "--heads",
                 "--kv-heads", "--ffn", "--vocab", "--experts", "--topk", "--seq", "--gpus", "--domain",
                 "--gpus-per-node", "--bw-up", "--bw-out", "--tflops", "--hbm", "--island", "--oversub", "--torus-bw"]
NEVER = ["", "nan", "inf", "-inf", "abc", "1e300", "-1", "1,000", "True", "[]", "💥", "9" * 40, "1e400", "-1e-300"]


@pytest.mark.parametrize("flag", NUMERIC_FLAGS)
def test_every_numeric_flag_refuses_hostile_values(flag):
    for value in NEVER:
        argv = ["plan", "--preset", "llama3-8b", "--gpus", "64", flag, value, "--json"]
        code, _, err = contract_run("grid", argv)
        assert code == 2 and (flag in err or flag[2:].replace("-", "_")[:4] in err), (argv, err)


# ---------------------------------------------------------------- file contents

TOKEN = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])|\"[^\"\n]*\"|\btrue\b|\bfalse\b")
REPLACEMENT = st.sampled_from(["0", "-1", "1e300", "1e-300", "nan", "inf", '"abc"', "[]", "{}", "true", '""',
                               "3", "1.5", "99999999999999999999", "[1, 2]", '{a = 1}', "null", "-0.0", "1e15"])


@st.composite
def mutated(draw, text: str):
    """``text`` changed 1-3 times: a value replaced, a line dropped, duplicated or cut, bytes inserted."""
    for _ in range(draw(st.integers(1, 3))):
        lines = text.split("\n")
        op = draw(st.sampled_from(["token", "token", "token", "drop", "dup", "cut", "bytes", "key"]))
        if op == "token":
            spans = [m.span() for m in TOKEN.finditer(text)]
            if spans:
                a, b = draw(st.sampled_from(spans))
                text = text[:a] + draw(REPLACEMENT) + text[b:]
        elif op == "drop" and len(lines) > 1:
            del lines[draw(st.integers(0, len(lines) - 1))]
            text = "\n".join(lines)
        elif op == "dup":
            i = draw(st.integers(0, len(lines) - 1))
            lines.insert(i, lines[i])
            text = "\n".join(lines)
        elif op == "cut":
            text = text[: draw(st.integers(0, len(text)))]
        elif op == "bytes":
            i = draw(st.integers(0, len(text)))
            text = text[:i] + draw(st.sampled_from(["\x00", "\xff", "\ufeff", "\r", "\t", "[", "=", ",", "#", "\\"])) + text[i:]
        elif op == "key":
            keys = re.findall(r"^(\w+)\s*=", text, re.M)
            if keys:
                k = draw(st.sampled_from(keys))
                text = re.sub(rf"^{k}\s*=", draw(st.sampled_from([f"{k}x =", "gpus =", "preset =", "tp ="])), text,
                              count=1, flags=re.M)
    return text


def _read(rel):
    return (ROOT / rel).read_text()


TOML_BASES = {   # file, and the command line that reads it ({f} = the mutated file)
    "cluster": ("dse/data/clusters/dgx-h100.toml", ["rankmap", "--cluster", "{f}", "--gpus", "16", "--tp", "8", "--json"]),
    "torus": ("dse/data/clusters/tpu-v4-torus.toml", ["plan", "--cluster", "{f}", "--preset", "llama3-8b", "--json"]),
    "model": ("dse/data/models/mixtral-8x7b.toml", ["plan", "--preset", "{f}", "--gpus", "64", "--ep", "8", "--json"]),
    "sweep": ("sweeps/try-moe-ep.toml", ["sweep", "{f}", "--json"]),
    "sweep-domain": ("sweeps/try-domain.toml", ["sweep", "{f}", "--json"]),
    "codesign": ("sweeps/codesign_ratio_moe.toml", ["codesign", "{f}", "--json"]),
    "calibration": ("dse/data/calibration/default.toml", ["validate", "--calibration", "{f}", "--json"]),
}


def _file_case(kind, base_rel, argv, text, tmp_path_factory, suffix):
    folder = tmp_path_factory.mktemp("fuzz")
    f = folder / f"input{suffix}"
    f.write_bytes(text.encode("utf-8", "surrogatepass"))
    contract_run(kind, [a.replace("{f}", str(f)) for a in argv], key=(kind, text))
    assert not half_written(folder)


@settings(max_examples=70, **SETTINGS)
@given(st.sampled_from(sorted(TOML_BASES)).flatmap(lambda k: st.tuples(st.just(k), mutated(_read(TOML_BASES[k][0])))))
def test_fuzz_toml_files(tmp_path_factory, case):
    kind, text = case
    _file_case(f"toml:{kind}", *TOML_BASES[kind], text, tmp_path_factory, ".toml")


HF = json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
                 "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 32,
                 "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256}, indent=1)


@settings(max_examples=40, **SETTINGS)
@given(mutated(HF))
def test_fuzz_json_config(tmp_path_factory, text):
    _file_case("json:config", None, ["plan", "--model-config", "{f}", "--gpus", "64", "--tp", "8", "--json"], text,
               tmp_path_factory, ".json")


CSV_BASES = {
    "runs": ("dse/data/validation/calibration_runs.csv", ["validate", "{f}", "--fidelity", "seed", "--json"]),
    "runs-calibrate": ("dse/data/validation/calibration_runs.csv", ["calibrate", "{f}", "--steps", "2"]),
    "kernels": ("dse/data/validation/kernel_microbenchmarks.csv", ["calibrate", "--kernels", "{f}", "--steps", "2"]),
    "collectives": ("dse/data/validation/collective_bandwidth.csv", ["calibrate", "--collectives", "{f}", "--steps", "2"]),
}


# Stratified: each CSV kind gets its own examples (a validate or calibrate run reads the whole
# table, ~1 CPU-s an example), where 40 drawn over the kinds gave each ~10 by chance.
@pytest.mark.parametrize("kind", sorted(CSV_BASES))
@settings(max_examples=6, **SETTINGS)
@given(data=st.data())
def test_fuzz_csv_files(tmp_path_factory, kind, data):
    text = data.draw(mutated(_read(CSV_BASES[kind][0])))
    _file_case(f"csv:{kind}", *CSV_BASES[kind], text, tmp_path_factory, ".csv")


LOG_BASES = {
    "nccl-tests": ("tests/fixtures/h200_all_reduce_perf.log", ["nccl-tests", "{f}", "--json"]),
    "nccl-tests-a2a": ("tests/fixtures/seed001/alltoall_perf.log", ["nccl-tests", "{f}", "--json"]),
    "nccl-log": ("tests/fixtures/seed001/nccl_transport.log", ["nccl-log", "{f}", "--gpus", "16", "--tp", "8", "--json"]),
    "check-log": ("tests/fixtures/megatron_job.log", ["check-log", "{f}", "--gpus", "32", "--tp", "8", "--pp", "2",
                                                      "--json"]),
    "check-log-titan": ("tests/fixtures/torchtitan_job.log", ["check-log", "{f}", "--gpus", "32", "--tp", "8",
                                                              "--json"]),
}


@settings(max_examples=50, **SETTINGS)
@given(st.sampled_from(sorted(LOG_BASES)).flatmap(lambda k: st.tuples(st.just(k), mutated(_read(LOG_BASES[k][0])))))
def test_fuzz_log_files(tmp_path_factory, case):
    kind, text = case
    _file_case(f"log:{kind}", *LOG_BASES[kind], text, tmp_path_factory, ".log")


STATE_SPEC = ('[model]\npreset = "llama3-8b"\n[cluster]\npreset = "seed"\ngpus = 64\n[plan]\ngbs = 128\n'
              '[axes]\ntp = [1, 2, 4, 8]\npp = [1, 2, 4]\nzero = [0, 3]\n[output]\ntop = 3\npareto = ["step_s", "memory_bytes"]\n')


@pytest.fixture(scope="module")
def saved_sweep(tmp_path_factory):
    """A sweep stopped after 2 of its chunks: its file and its state.json text."""
    import dse.engines.sweep as sw

    folder = tmp_path_factory.mktemp("state")
    spec = folder / "s.toml"
    spec.write_text(STATE_SPEC)
    sw.run_sweep(sw.load_spec(spec), chunk_points=4, out_dir=folder / "out", max_chunks=2)
    return spec, (folder / "out" / "state.json").read_text()


@settings(max_examples=30, **SETTINGS)
@given(st.data())
def test_fuzz_state_json(tmp_path_factory, saved_sweep, data):
    """--resume on a mutated state.json: resumed for real (the kernel is compiled once)."""
    spec, text = saved_sweep
    text = data.draw(mutated(text))
    out = tmp_path_factory.mktemp("resume")
    (out / "state.json").write_bytes(text.encode("utf-8", "surrogatepass"))
    code, _, _ = run_checked("json:state", ["sweep", str(spec), "--out", str(out), "--resume", "--json"], key=text)
    assert not half_written(out)


def run_checked(kind, argv, key):
    code, out, err = run(argv)
    check_contract(argv, code, out, err)
    TRIED.setdefault(kind, {})[key] = code
    MET[kind] = MET.get(kind, 0) + 1
    return code, out, err


def test_zz_counts():
    """The distinct inputs the fuzzer tried in this run (all met the contract, or a test above failed)."""
    if not TRIED:
        pytest.skip("run with the fuzz tests above")
    total = sum(len(v) for v in TRIED.values())
    refused = sum(c == 2 for v in TRIED.values() for c in v.values())
    print(f"\nfuzzer: {total} distinct inputs ({refused} refused with exit 2, the rest accepted), "
          f"{sum(MET.values())} runs, all met the contract: "
          + ", ".join(f"{k} {len(v)}" for k, v in sorted(TRIED.items())))
    if {k.split(":")[0] for k in TRIED} >= {"argv", "grid", "toml", "json", "csv", "log"}:   # the whole fuzzer ran
        assert refused >= 300
