"""Two processes joined by ``jax.distributed`` (localhost coordinator, gloo on CPU) find what one finds."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dse.engines.sweep import multihost
from dse.errors import InputError

ROOT = Path(__file__).resolve().parents[2]

# 2*4*4*2*2 = 128 plans of Llama 3 8B on the seed cluster, feasible and infeasible (as tests/engines/test_sweep.py)
SWEEP = """
[model]
preset = "llama3-8b"
[cluster]
preset = "seed"
[plan]
gbs = 128
[axes]
gpus = [64, 96]
tp = [1, 2, 4, 8]
pp = [1, 2, 4, 8]
mbs = [1, 2]
recompute = ["none", "full"]
[objective]
minimize = "step_s"
[output]
top = 5
pareto = ["step_s", "memory_bytes"]
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _what_counts(out: dict) -> dict:
    """Counts, the chosen plans and their float64 figures (each row is re-evaluated exactly), the
    front as a set; not ``sweep_value``, the engine's own float32 or float64 ranking value."""
    rows = lambda rs: [{k: v for k, v in r.items() if k != "sweep_value"} for r in rs]  # noqa: E731
    return {"points": out["points"], "done": out["done"], "feasible": out["feasible"],
            "infeasible_by_reason": out["infeasible_by_reason"], "best": rows([out["best"]]),
            "top": rows(out["top"]), "pareto": sorted(rows(out["pareto"]), key=lambda r: r["index"])}


@pytest.mark.slow
def test_two_processes_equal_one(tmp_path, capsys):
    # the reference is one process on the host engine (numpy float64, every point, exact merges;
    # tests/engines/test_sweep.py checks the kernel against it on one and four devices), run here
    # in-process: a third child compiling the kernel cost ~5 CPU-s
    from dse.cli import main

    f = tmp_path / "small.toml"
    f.write_text(SWEEP)
    assert main(["sweep", str(f), "--json", "--quiet", "--engine", "host"]) == 0
    ref = json.loads(capsys.readouterr().out)
    base = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    cmd = [sys.executable, "-m", "dse", "sweep", str(f), "--json", "--quiet", "--engine", "xla"]   # the sharded kernel
    port = _port()
    # Each child writes to a file, not a pipe: the JSON passed 64 KiB (a pipe's buffer), and a process
    # blocked writing to the pipe nobody read yet kept the other at jax.distributed's shutdown barrier.
    logs = [(tmp_path / f"out{i}.json", tmp_path / f"err{i}.txt") for i in range(2)]
    procs = []
    for i, (out, err) in enumerate(logs):
        with open(out, "w") as so, open(err, "w") as se:
            procs.append(subprocess.Popen(cmd + ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                                                 "--process-id", str(i)], cwd=ROOT, env=base, stdout=so, stderr=se))
    outs = []
    for p, (out, err) in zip(procs, logs):
        p.wait(timeout=300)
        assert p.returncode == 0, err.read_text()[-2000:]
        outs.append(json.loads(out.read_text()))
    assert outs[0]["devices"] == outs[1]["devices"] == 4   # 2 hosts x 2 CPU devices
    assert 0 < ref["feasible"] < ref["points"] == 128 and len(ref["pareto"]) >= 2
    assert _what_counts(outs[0]) == _what_counts(ref)
    assert _what_counts(outs[1]) == _what_counts(ref)


def test_partial_settings_are_one_line_errors(monkeypatch):
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(InputError, match="give all three"):
        multihost.initialize("127.0.0.1:1234")
    with pytest.raises(InputError, match="allowed: 0 .. 1"):
        multihost.initialize("127.0.0.1:1234", 2, 2)
    with pytest.raises(InputError, match="not an integer"):
        multihost.initialize("127.0.0.1:1234", "two", 0)
