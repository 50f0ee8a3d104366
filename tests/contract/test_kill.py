"""SIGKILL a real sweep process at random moments (the chunk loop, finalization) and resume it:
the result must be identical every time (issue 14, "every kill resumable").

The sweep is tiny (Llama 3 8B on the seed cluster, 256 plans with a full dump, 2 plans a
chunk: 128 chunks) to keep 20 kills to about two minutes of CPU on 2 cores (each process
imports JAX; the JAX compilation cache is shared by every process, and each resume runs in
this process, compiled once).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.contract.harness import ROOT, half_written, run

SPEC = ('[model]\npreset = "llama3-8b"\n[cluster]\npreset = "seed"\ngpus = 64\n[plan]\ngbs = 128\n'
        '[axes]\ntp = [1, 2, 4, 8]\npp = [1, 2, 4, 8]\nmbs = [1, 2]\nzero = [0, 1, 2, 3]\nrecompute = ["none", "full"]\n'
        '[output]\ntop = 5\npareto = ["step_s", "memory_bytes"]\ndump = true\n')
TIMING = ("seconds", "points_per_s", "compile_s", "cpu_s")
KILLS = 20


def _result(out):
    """What a finished sweep wrote, less the timings (which differ run to run)."""
    res = json.loads((out / "result.json").read_text())
    for k in TIMING:
        res.pop(k)
    names = ("top.csv", "pareto.csv", "dump.csv", "top.parquet", "pareto.parquet", "dump.parquet")   # with pyarrow
    return {"result": res, **{n: (out / n).read_bytes() for n in names if (out / n).exists()},
            "leftover": sorted(p.name for p in out.iterdir() if p.name not in names + ("result.json", "state.json"))}


def _start(spec, out, env):
    return subprocess.Popen([sys.executable, "-m", "dse", "sweep", str(spec), "--out", str(out), "--chunk", "2",
                             "--quiet"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for(cond, proc, limit=120.0):
    t0 = time.monotonic()
    while not cond() and proc.poll() is None and time.monotonic() - t0 < limit:
        time.sleep(0.0005)


@pytest.mark.slow
def test_sigkill_at_random_moments_resumes_identically(tmp_path):
    spec = tmp_path / "tiny.toml"
    spec.write_text(SPEC)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jaxcache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
           "PYTHONPATH": str(ROOT)}
    ref_out = tmp_path / "ref"   # the reference: one uninterrupted process (it also fills the compile cache)
    assert _start(spec, ref_out, env).wait(600) == 0
    ref = _result(ref_out)
    assert ref["leftover"] == [] and ref["result"]["points"] == 256
    chunks = json.loads((ref_out / "state.json").read_text())["next_chunk"]

    rng = random.Random(14)
    identical, resumed, moments = 0, 0, []
    for i in range(KILLS):
        out = tmp_path / f"k{i}"
        proc = _start(spec, out, env)
        kind = ("chunk", "chunk", "chunk", "finalization", "any")[i % 5]
        if kind == "chunk":            # just after a random chunk's part file is durable
            k = rng.randrange(chunks)
            _wait_for(lambda: (out / "dump" / f"part-{k:08d}.csv").exists(), proc)
            time.sleep(rng.uniform(0, 0.002))
        elif kind == "finalization":   # dump.csv renamed, part files being deleted, outputs written
            _wait_for(lambda: (out / "dump.csv").exists(), proc)
            time.sleep(rng.uniform(0, 0.005))
        else:                          # any moment from the start (import, compile, loop, rows)
            time.sleep(rng.uniform(0, 8.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        state = out / "state.json"
        saved = json.loads(state.read_text()) if state.exists() else {}
        moments.append(f"{kind}:{saved.get('next_chunk', '-')}{'/merged' if saved.get('stage') == 'merged' else ''}")
        was_saved = state.exists()   # else killed before its first chunk: the sweep starts again
        code, _, err = run(["sweep", spec, "--out", out, "--quiet", "--chunk", "2"] + (["--resume"] if was_saved else []))
        assert code == 0, err
        resumed += was_saved
        assert not half_written(out)
        identical += _result(out) == ref
        if i == 0:   # a finished sweep resumed again reprints the same result
            code, _, err = run(["sweep", spec, "--out", out, "--quiet", "--resume"])
            assert code == 0 and _result(out) == ref, err
    print(f"\nkills {KILLS} ({chunks} chunks), resumed from state.json {resumed}, identical {identical}; "
          f"killed at (kind:next_chunk) {' '.join(moments)}")
    assert identical == KILLS


@pytest.mark.slow
def test_ctrl_c_is_one_line_saying_how_to_resume(tmp_path):
    """SIGINT to a real sweep process: exit 130, one line naming --resume, no traceback."""
    spec = tmp_path / "tiny.toml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "dse", "sweep", str(spec), "--out", str(out), "--chunk", "2",
                             "--quiet"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: (out / "dump").is_dir(), proc)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=300)[1]
    if proc.returncode == 0:   # finished before the signal arrived: nothing to check
        pytest.skip("the sweep finished before SIGINT")
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and "--resume" in err, err
    assert not half_written(out)
