"""SIGKILL a real sweep process at each stage of its work (start, the chunk loop, the merge of
the dump, the final outputs) and resume it: the result must be identical every time (issue 14,
"every kill resumable").

The sweep is tiny (Llama 3 8B on the seed cluster, 256 plans with a full dump, 8 plans a
chunk: 32 chunks; the host engine, as ``auto`` picks for it). What is killed is a process
running ``dse sweep`` (``dse.cli.main``), forked from a multiprocessing fork server that
imported dse, numpy and pyarrow once (no JAX backend is started before the fork), so a kill
costs the sweep's own work, not an interpreter and a JAX import each. Each kill waits for
the file that marks its stage, then a random few milliseconds. The Ctrl-C test runs
``python3 -m dse`` itself, the entry point a user types.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from dse.cli import main
from tests.contract.harness import ROOT, half_written, run

SPEC = ('[model]\npreset = "llama3-8b"\n[cluster]\npreset = "seed"\ngpus = 64\n[plan]\ngbs = 128\n'
        '[axes]\ntp = [1, 2, 4, 8]\npp = [1, 2, 4, 8]\nmbs = [1, 2]\nzero = [0, 1, 2, 3]\nrecompute = ["none", "full"]\n'
        '[output]\ntop = 5\npareto = ["step_s", "memory_bytes"]\ndump = true\n')
TIMING = ("seconds", "points_per_s", "compile_s", "cpu_s")
CHUNK = "8"
PRELOAD = ["dse.cli", "dse.cli.sweep", "dse.engines.sweep", "pyarrow", "pyarrow.parquet", "pyarrow.csv",
           "tests.contract.test_kill"]


def _result(out):
    """What a finished sweep wrote, less the timings (which differ run to run)."""
    res = json.loads((out / "result.json").read_text())
    for k in TIMING:
        res.pop(k)
    names = ("top.csv", "pareto.csv", "dump.csv", "top.parquet", "pareto.parquet", "dump.parquet")   # with pyarrow
    return {"result": res, **{n: (out / n).read_bytes() for n in names if (out / n).exists()},
            "leftover": sorted(p.name for p in out.iterdir() if p.name not in names + ("result.json", "state.json"))}


def _sweep_process(argv):
    """The body of a forked sweep process: ``dse sweep ...`` with its output thrown away."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    sys.exit(main(argv))


def _argv(spec, out):
    return ["sweep", str(spec), "--out", str(out), "--chunk", CHUNK, "--quiet"]


def _wait_for(cond, alive, limit=120.0):
    t0 = time.monotonic()
    while not cond() and alive() and time.monotonic() - t0 < limit:
        time.sleep(0.0005)


def _tmp_of(folder, name):
    """A temporary file of ``name`` (dse.files.atomic_open: .NAME.tmp-PID) exists in ``folder``."""
    return lambda: any(p.name.startswith(f".{name}.tmp-") for p in folder.iterdir()) if folder.is_dir() else False


@pytest.fixture()
def forkserver(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    yield ctx
    from multiprocessing import forkserver as fs   # stop the server: the next user starts one with its own env

    stop = getattr(fs._forkserver, "_stop", None)
    if stop is not None:
        stop()


@pytest.mark.slow
def test_sigkill_at_each_stage_resumes_identically(tmp_path, forkserver):
    spec = tmp_path / "tiny.toml"
    spec.write_text(SPEC)
    ref_out = tmp_path / "ref"   # the reference: one uninterrupted run
    code, _, err = run(_argv(spec, ref_out))
    assert code == 0, err
    ref = _result(ref_out)
    assert ref["leftover"] == [] and ref["result"]["points"] == 256
    chunks = json.loads((ref_out / "state.json").read_text())["next_chunk"]
    assert chunks == 32

    rng = random.Random(14)
    early, late = rng.randrange(1, chunks // 2), rng.randrange(chunks // 2, chunks - 1)
    # (stage, the file that marks it, extra milliseconds at most): one kill a stage
    moments = [
        ("start", lambda out: (out / "dump").is_dir(), 2.0),   # out/ prepared, before or at the first chunk
        ("chunk", lambda out: (out / "dump" / f"part-{early:08d}.csv").exists(), 2.0),
        ("chunk", lambda out: (out / "dump" / f"part-{late:08d}.csv").exists(), 2.0),
        ("last-chunk", lambda out: (out / "dump" / f"part-{chunks - 1:08d}.csv").exists(), 0.0),
        ("merging", lambda out: _tmp_of(out, "dump.csv")(), 0.0),   # dump.csv being written
        ("merged", lambda out: (out / "dump.csv").exists(), 3.0),   # renamed; stage saved; parts deleted
        ("outputs", lambda out: (out / "top.csv").exists() or _tmp_of(out, "top.csv")(), 3.0),
    ]
    seen = []
    for i, (stage, mark, ms) in enumerate(moments):
        out = tmp_path / f"k{i}"
        proc = forkserver.Process(target=_sweep_process, args=(_argv(spec, out),))
        proc.start()
        _wait_for(lambda: mark(out), proc.is_alive)
        time.sleep(rng.uniform(0, ms / 1000))
        proc.kill()
        proc.join()
        state = out / "state.json"
        saved = json.loads(state.read_text()) if state.exists() else {}
        killed = "killed" if proc.exitcode == -signal.SIGKILL else f"exit {proc.exitcode}"
        seen.append(f"{stage}:{saved.get('next_chunk', '-')}{'/merged' if saved.get('stage') == 'merged' else ''}"
                    f"({killed})")
        assert proc.exitcode in (-signal.SIGKILL, 0), seen
        was_saved = state.exists()   # else killed before its first chunk: the sweep starts again
        code, _, err = run(_argv(spec, out) + (["--resume"] if was_saved else []))
        assert code == 0, err
        assert not half_written(out)
        assert _result(out) == ref, seen
        if i == 0:   # a finished sweep resumed again reprints the same result
            code, _, err = run(_argv(spec, out) + ["--resume"])
            assert code == 0 and _result(out) == ref, err
    print(f"\nkills {len(moments)} ({chunks} chunks) at (stage:next_chunk saved) {' '.join(seen)}")


@pytest.mark.slow
def test_ctrl_c_is_one_line_saying_how_to_resume(tmp_path):
    """SIGINT to a real ``python3 -m dse sweep`` process: exit 130, one line naming --resume, no traceback."""
    # SPEC with three more axes (2,048 plans, 1,024 chunks of 2): the signal lands mid-sweep however
    # fast the host engine runs
    spec = tmp_path / "tiny.toml"
    spec.write_text(SPEC.replace('recompute = ["none", "full"]\n', 'recompute = ["none", "full"]\ncp = [1, 2]\nsp = [0, 1]\n'
                                 'vpp = [1, 2]\n'))
    out = tmp_path / "out"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    # ``python3 -m dse`` with Python's own SIGINT handler installed first: a shell's background job
    # starts its children with SIGINT ignored (a user's terminal does not), and a preexec_fn would
    # fork the multithreaded test process
    run_dse = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "sys.argv[0] = 'dse'; runpy.run_module('dse', run_name='__main__', alter_sys=True)")
    proc = subprocess.Popen([sys.executable, "-c", run_dse, "sweep", str(spec), "--out", str(out), "--chunk", "2",
                             "--quiet"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: (out / "dump").is_dir(), lambda: proc.poll() is None)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=300)[1]
    if proc.returncode == 0:   # finished before the signal arrived: nothing to check
        pytest.skip("the sweep finished before SIGINT")
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and "--resume" in err, err
    assert not half_written(out)
