"""`dse plan --tokens N --price P`: a whole run's days, GPU-hours, cost and goodput; the same as sweep objectives."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import dse.engines.sweep as sw
from dse.cli import main
from dse.equations import goodput as gp

PLAN = ["plan", "--preset", "llama3-8b", "--cluster", "seed", "--gpus", "64", "--tp", "2", "--gbs", "128"]


def _json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_tokens_and_price_by_hand(capsys):
    d = _json(capsys, *PLAN, "--tokens", "1e12", "--price", "2.5")
    run, tps = d["run"], d["tokens_per_s"]
    # Daly (2006) first order, by hand: Llama 3's rate (466 in 54 days on 16,384 GPUs) on 64 GPUs,
    # M = 54*86400*16384 / (466*64) s; tau = sqrt(2*20*M); g = tau/(tau+20) * (1 - (180 + (tau+20)/2)/M)
    M = 54 * 86400 * 16384 / (466 * 64)
    tau = math.sqrt(2 * 20 * M)
    g = tau / (tau + 20) * (1 - (180 + (tau + 20) / 2) / M)
    assert run["goodput"] == pytest.approx(g, rel=1e-12) and 0.99 < g < 1.0
    t = 1e12 / tps / g
    assert run["time_to_train_s"] == pytest.approx(t, rel=1e-12)
    assert run["gpu_hours"] == pytest.approx(64 * t / 3600, rel=1e-12)
    assert run["cost_usd"] == pytest.approx(2.5 * 64 * t / 3600, rel=1e-12)
    assert run["interruptions"] == pytest.approx(t / M, rel=1e-12)
    assert run["checkpoint_interval_s"] == pytest.approx(tau, rel=1e-12)


def test_llama3_scale_goodput_by_hand():
    # 16,384 GPUs at Llama 3's rate: M = 54*86400/466 = 10,011.6 s, tau = sqrt(2*20*M) = 632.8 s,
    # g = 632.8/652.8 * (1 - (180 + 326.4)/10011.6) = 0.9203 (over 90%, as Llama 3 sec.3.3.4 reports)
    r = gp.training_run(1e12, 1e6, 16384.0)
    assert float(r["goodput"]) == pytest.approx(0.9203, abs=5e-4)


def test_text_view_and_errors(capsys):
    assert main([*PLAN, "--tokens", "2e12", "--price", "3"]) == 0
    out = capsys.readouterr().out
    assert "2.00T tokens:" in out and "GPU-hours" in out and "at $3/GPU-h" in out and "goodput" in out
    assert main([*PLAN, "--tokens", "-5"]) == 2
    assert "--tokens: '-5' is not allowed" in capsys.readouterr().err
    assert main([*PLAN, "--tokens", "1e12", "--price", "x"]) == 2
    assert "--price: 'x' is not a number" in capsys.readouterr().err


def test_run_figures_as_sweep_objectives(capsys):
    spec = sw.SweepSpec.make(model="llama3-8b", cluster="seed", plan={"gbs": 128},
                             axes={"gpus": [64, 128], "tp": [1, 2, 4]}, objective="cost_usd", top_k=6,
                             pareto=("time_to_train_s", "cost_usd"), run={"tokens": 1e12, "usd_per_gpu_hour": 2.0},
                             precision="float64")
    r = sw.run_sweep(spec)
    costs = [row["run"]["cost_usd"] for row in r.top]
    assert costs == sorted(costs) and len(costs) >= 3
    best = r.best
    d = _json(capsys, "plan", "--preset", "llama3-8b", "--cluster", "seed", "--gpus", str(best["point"]["gpus"]),
              "--tp", str(best["point"]["tp"]), "--gbs", "128", "--tokens", "1e12", "--price", "2")
    assert d["run"]["cost_usd"] == pytest.approx(best["run"]["cost_usd"], rel=1e-12)
    assert best["sweep_value"] == pytest.approx(best["run"]["cost_usd"], rel=1e-12)
    assert all(np.isfinite(p["run"]["time_to_train_s"]) for p in r.pareto) and r.pareto
    with pytest.raises(sw.InputError, match=r"needs a \[run\] table"):
        sw.SweepSpec.make(model="llama3-8b", plan={"gbs": 128}, axes={"tp": [1, 2]}, objective="cost_usd")
