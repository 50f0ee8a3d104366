"""Goodput (Young/Daly) pinned to Llama 3's failures; sensitivities by jax.grad."""

import json

import jax.numpy as jnp
import pytest

import dse
from dse.equations import goodput as gp
from dse.inputs import presets
from dse.engines import sensitivity
from dse.cli import main


def test_llama3_interruptions_and_effective_time():
    # Llama 3 sec.3.3.4 (seed 000): 466 interruptions in 54 days of 16,384-GPU training, >90%
    # effective training time. Rate from that count: 466 / (54 d * 16384) = 6.10e-9 per GPU-second.
    rate = gp.LLAMA3_FAILURE_RATE_PER_GPU_S
    assert rate == pytest.approx(6.096e-9, rel=1e-3)
    assert float(gp.interruptions(16384, rate, 54 * 86400)) == pytest.approx(466, rel=1e-12)
    M = float(gp.job_mtbf_s(16384, rate))
    assert M == pytest.approx(54 * 86400 / 466, rel=1e-12)            # 2.78 h between interruptions
    # Stated assumptions (not published): 20 s to write a checkpoint, 3 min to restart.
    # Young: sqrt(2 * 20 * 10012) = 632.8 s; goodput = 632.8/652.8 * (1 - (180 + 326.4)/10012) = 0.920
    assert float(gp.young_daly_interval_s(20.0, M)) == pytest.approx(632.8, rel=1e-3)
    g = float(gp.goodput(16384, rate, 20.0, 180.0))
    assert g == pytest.approx(0.9203, abs=5e-4) and g > 0.90


def test_young_daly_interval_is_the_optimum():
    # the first-order goodput is maximized at sqrt(2 write M) (Young 1974): nearby intervals do worse
    rate, write, restart = 1e-8, 60.0, 300.0
    M = float(gp.job_mtbf_s(8192, rate))
    tau = float(gp.young_daly_interval_s(write, M))
    best = float(gp.goodput(8192, rate, write, restart, tau))
    for f in (0.5, 0.8, 1.25, 2.0):
        assert float(gp.goodput(8192, rate, write, restart, f * tau)) < best


def test_more_accelerators_pay_for_their_failures():
    g = gp.goodput(jnp.array([1024.0, 16384.0, 131072.0]), gp.LLAMA3_FAILURE_RATE_PER_GPU_S, 20.0, 180.0)
    assert float(g[0]) > float(g[1]) > float(g[2])


@pytest.fixture
def worked_example():
    return (presets.load_model("gpt3-175b"), presets.load_cluster("seed"),
            dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024, zero=1, recompute=1))


def test_elasticities_sum_to_minus_one(worked_example):
    # the step is homogeneous of degree -1 in (FLOP/s, both bandwidths) (every term is work / rate,
    # and max(0, t_DP - 2/3 compute) keeps that), so by Euler's theorem the elasticities sum to -1
    s = sensitivity.sensitivities(*worked_example)
    total = sum(s[k]["elasticity"] for k in ("bw_up_bytes_per_s", "bw_out_bytes_per_s", "peak_flops_per_s"))
    assert total == pytest.approx(-1.0, rel=1e-9)
    assert s["hbm_bytes"]["d_step_dx"] == 0.0   # memory does not enter the step time


def test_sensitivity_equals_central_difference(worked_example):
    model, cluster, plan = worked_example
    s = sensitivity.sensitivities(model, cluster, plan)
    for field in ("bw_up_bytes_per_s", "bw_out_bytes_per_s", "peak_flops_per_s"):
        x = float(getattr(cluster, field))
        h = 1e-6 * x
        f = lambda v: float(dse.evaluate(model, cluster.replace(**{field: v}), plan).step_s)  # noqa: E731
        assert s[field]["d_step_dx"] == pytest.approx((f(x + h) - f(x - h)) / (2 * h), rel=1e-6)


def test_plan_sensitivity_flag(capsys):
    args = ["plan", "--preset", "gpt3-175b", "--tp", "8", "--pp", "8", "--gbs", "1024", "--sensitivity"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "scale-up bandwidth" in out and "elasticity" in out
    assert main(args + ["--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert set(js["sensitivity"]) == set(sensitivity.FIELDS)
