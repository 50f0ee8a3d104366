"""The network cost model prices bandwidth: NVLink generations, NIC rates, optics by reach (dse/equations/cost.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dse.engines.compiled import COMPILE_FIRST, compile_lowered
from dse.equations import cost
from dse.inputs import presets


def test_dgx_h100_scale_out_by_hand():
    # 1,024 GPUs x one 400G NIC (50 GB/s): a two-tier fat tree of QM9700 (radix 64): 3 x 1024 / 64 = 48
    # switches; 2 x (1024 NIC-leaf + 1024 leaf-spine) short-reach optics. Prices: dse/data/network_cost.toml.
    cl = presets.load_cluster("dgx-h100")
    p = cost.params()["scale_out"]["400"]
    parts = cost.part_costs(cl)
    assert float(cost.network_parts(cl)["nics"]) == 1024
    assert float(parts["nics"][0]) == pytest.approx(1024 * p["nic_usd"], rel=1e-12)
    assert float(parts["out_switches"][0]) == pytest.approx(48 * p["switch_usd"], rel=1e-12)
    assert float(parts["transceivers"][0]) == pytest.approx(4 * 1024 * p["optic_sr_usd"], rel=1e-12)


def test_nvl72_has_18_nvswitch_chips():
    # Blackwell technical brief: GB200 NVL72 = 72 GPUs x 18 NVLink5 links (50 GB/s a direction), 18 NVSwitch chips
    cl = presets.load_cluster("dgx-h100").replace(gpus=72.0, domain=72.0, bw_up_bytes_per_s=900e9)
    opt = cost.scale_up_option(cl, cost.params()["scale_up"]["nvlink5"])
    assert float(opt["links_per_gpu"]) == 18 and float(opt["up_switches"]) == 18
    assert float(opt["up_links"]) == 72 * 18          # all copper: one rack


def test_cost_rises_with_bandwidth_and_steps_at_nic_rates():
    # exact cost is non-decreasing in each bandwidth; scale-out at 2x a NIC rate needs 2 NICs or a faster NIC
    cl = presets.load_cluster("dgx-h100")
    outs = np.array([6.25, 12.5, 25, 50, 75, 100, 150, 200]) * 1e9
    ups = np.array([50, 100, 450, 900, 1800]) * 1e9
    c_out = [float(cost.network_cost(cl.replace(bw_out_bytes_per_s=b))[0]) for b in outs]
    c_up = [float(cost.network_cost(cl.replace(bw_up_bytes_per_s=b))[0]) for b in ups]
    assert all(b >= a for a, b in zip(c_out, c_out[1:])) and c_out[-1] > 2 * c_out[0]
    assert all(b >= a for a, b in zip(c_up, c_up[1:])) and c_up[-1] > c_up[0]
    # 50 and 45 GB/s: both one 400G NIC a GPU, the same network (the cost is a step in bandwidth)
    assert c_out[3] == float(cost.network_cost(cl.replace(bw_out_bytes_per_s=45e9))[0])


def test_smooth_cost_is_differentiable_and_tends_to_exact():
    cl = presets.load_cluster("dgx-h100")
    f = lambda b, k: cost.network_cost(cl.replace(bw_out_bytes_per_s=b * 1e9, bw_up_bytes_per_s=300e9), sharpness=k)[0]  # noqa: E731
    # one compiled gradient program (COMPILE_FIRST, as co-design compiles its gradients), not eager jax.grad
    # op by op (64 compiles); the exact cost and the smooth ones of concrete inputs run in numpy
    g = compile_lowered(jax.jit(jax.grad(f), static_argnums=1).lower(jnp.asarray(60.0), 8.0), COMPILE_FIRST)(jnp.asarray(60.0))
    assert np.isfinite(float(g)) and float(g) > 0
    exact = float(cost.network_cost(cl.replace(bw_out_bytes_per_s=60e9, bw_up_bytes_per_s=300e9))[0])
    errs = [abs(float(f(jnp.asarray(60.0), k)) / exact - 1) for k in (10.0, 100.0, 1000.0)]
    assert errs[-1] < errs[0] and errs[-1] < 1e-3


def test_core_links_use_single_mode_optics():
    # h100-24k-3tier: the island uplinks and core links are priced at dr (single-mode), above sr
    cl = presets.load_cluster("h100-24k-3tier")
    p = cost.params()["scale_out"]["400"]
    n = float(cost.network_parts(cl)["transceivers"])
    usd = float(cost.part_costs(cl)["transceivers"][0])
    assert n * p["optic_sr_usd"] < usd < n * p["optic_dr_usd"]


def test_relaxed_report_cost_is_the_capped_smooth_cost():
    # one relaxed network cost (co-design's objective reads the report's): evaluate at sharpness k prices
    # the network at min(k, RELAXED_SHARPNESS = 8), so k = 50 gives the k = 8 cost and k = 4 its own
    import dse

    cl = presets.load_cluster("dgx-h100").replace(gpus=1024.0, bw_out_bytes_per_s=60e9)
    model = presets.load_model("llama3-70b")
    plan = dse.Plan.make(tp=8, pp=4, mbs=1, gbs=1024)
    assert cost.RELAXED_SHARPNESS == 8.0
    for k, at in ((50.0, 8.0), (4.0, 4.0)):
        r = dse.evaluate(model, cl, plan, "seed", sharpness=k)
        assert float(r.network_cost_usd) == float(cost.network_cost(cl, at)[0])
    assert float(dse.evaluate(model, cl, plan).network_cost_usd) == float(cost.network_cost(cl)[0])


def test_unpriced_evaluate_leaves_only_the_network_cost_out():
    # evaluate(..., network_cost=False), for callers that read neither figure (a sweep kernel whose
    # objectives do not name them, the calibration fit, co-design without network prices): cost and
    # power are NaN, every other field is the priced evaluation's, bit for bit
    import jax
    import dse

    cl = presets.load_cluster("dgx-h100").replace(gpus=1024.0)
    model = presets.load_model("llama3-70b")
    plan = dse.Plan.make(tp=np.array([4.0, 8.0]), pp=4, mbs=1, gbs=1024)
    priced, unpriced = (dse.evaluate(model, cl, plan, "calibrated", network_cost=on) for on in (True, False))
    assert np.isnan(unpriced.network_cost_usd) and np.isnan(unpriced.network_power_w)
    assert float(priced.network_cost_usd) > 0
    a, b = (dict(jax.tree_util.tree_flatten_with_path(r)[0]) for r in (priced, unpriced))
    differ = {jax.tree_util.keystr(k) for k in a if not np.array_equal(a[k], b[k])}
    assert differ == {".network_cost_usd", ".network_power_w"}


def test_a_sweep_prices_the_network_when_it_reads_the_cost():
    # the sweep's chunk figures (kernel._figures, host and kernel alike) ask evaluate for the network's
    # price only when an objective, the front or the dump names it: a front of step time against cost
    # (one sequence a GPU: at 256 the calibrated DP hides behind compute at every NIC rate, and the
    # cheapest network is also the fastest)
    from dse.engines import sweep as sw

    spec = sw.SweepSpec.make(model="llama3-8b", cluster="dgx-h100", plan={"gbs": 64}, top_k=3,
                             pareto=("step_s", "network_cost_usd"),
                             axes={"gpus": [64], "tp": [1, 8], "bw_out_GBps": [12.5, 25, 50, 100]})
    r = sw.run_sweep(spec, engine="host")
    costs = sorted({row["network_cost_usd"] for row in r.pareto})
    assert len(costs) >= 2 and all(np.isfinite(costs))     # the front trades step time for network cost
    cl = presets.load_cluster("dgx-h100").replace(gpus=64.0, bw_out_bytes_per_s=12.5e9)
    assert costs[0] == pytest.approx(float(cost.network_cost(cl)[0]), rel=1e-12)   # the cheapest NIC rate


def test_network_usd_is_the_network_costs_usd():
    # cost.network_usd (co-design's objective and budget: no power, no part counts) is network_cost's
    # first figure, bit for bit, exact and relaxed, on every topology's preset and a bandwidth grid
    for name in ("dgx-h100", "h100-24k-3tier", "gh200-rail-only", "tpu-v4-torus", "gb200-nvl72"):
        cl = presets.load_cluster(name).replace(bw_out_bytes_per_s=np.array([12.5e9, 50e9, 100e9])[:, None],
                                                bw_up_bytes_per_s=np.array([300e9, 900e9]))
        for k in (None, 4.0):
            assert np.array_equal(cost.network_usd(cl, k), cost.network_cost(cl, k)[0])
