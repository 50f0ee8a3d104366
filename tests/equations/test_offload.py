"""Offload to host memory (dse/equations/offload.py): host bytes, host-link and host-Adam time, the
host-memory rule, and ZeRO-Offload's headline check. Numbers derived by hand from the plan."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dse
from dse.equations import offload
from dse.errors import InputError
from dse.inputs import checks, presets
from dse.report import reason_names

GiB = 2 ** 30


def _gpt3(**kw):
    model, cl = presets.load_model("gpt3-175b"), presets.load_cluster("h100-sxm")
    return model, cl, dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1536, **kw)


def test_optimizer_offload_host_bytes_and_adam_time():
    # GPT-3 175B, t = 8, p = 8 on 1,024 H100 (d = 16, ZeRO-1): a first-stage rank holds 2.80B
    # parameters and owns the optimizer of 1/16 of them, 175.2M. Offloading it all keeps
    # 12 B (fp32 master, momentum, variance) + 2 B (the 16-bit gradient on the host) a parameter
    # there: 2.45 GB a rank, x 8 ranks = 19.6 GB a node of DGX H100's 2 TB.
    # Host Adam: 28 bytes a parameter at the node's 614.4 GB/s DRAM shared by 8 ranks:
    # 175.2M x 28 x 8 / 614.4e9 = 63.9 ms; the 16-bit weights back over PCIe Gen5 (63 GB/s):
    # 0.35 GB / 63e9 = 5.6 ms, pipelined with it: the step grows by the 63.9 ms.
    model, cl, base = _gpt3()
    plan = base.replace(offload_optimizer=1.0)
    r0, r = dse.evaluate(model, cl, base, "calibrated"), dse.evaluate(model, cl, plan, "calibrated")
    owned = float(r.params_per_rank) / 16
    assert float(r.host_bytes) == pytest.approx(14 * owned, rel=1e-6)
    assert float(r.node_host_bytes) == pytest.approx(8 * 14 * owned, rel=1e-6)
    assert float(r.optimizer_bytes) == 0.0 and float(r0.optimizer_bytes) == pytest.approx(12 * owned, rel=1e-6)
    adam = owned * 28 * 8 / 614.4e9
    assert float(r.host_optimizer_s) == pytest.approx(adam, rel=1e-6)
    assert float(r.offload_s) == pytest.approx(adam, rel=1e-6)
    # not pipelined: Adam, then the copy back
    serial = dse.evaluate(model, cl, plan.replace(offload_overlap=0.0), "calibrated")
    assert float(serial.offload_s) == pytest.approx(adam + 2 * owned / 63e9, rel=1e-6)
    # the GPU's own Adam pass is gone from the step, the host's added
    assert float(r.step_s) < float(r0.step_s) + adam
    assert not reason_names(r.reasons)


def test_host_memory_rule():
    # The same plan on nodes of 10 GB host memory: 19.6 GB a node does not fit (host_out_of_memory);
    # a cluster that states no host memory holds nothing offloaded.
    model, cl, base = _gpt3(offload_optimizer=1.0)
    small = dse.evaluate(model, cl.replace(node_host_bytes=10e9), base, "calibrated")
    assert reason_names(small.reasons) == ["host_out_of_memory"]
    unknown = dse.evaluate(model, cl.replace(node_host_bytes=0.0), base, "calibrated")
    assert "host_out_of_memory" in reason_names(unknown.reasons)
    assert not reason_names(dse.evaluate(model, cl.replace(node_host_bytes=0.0), base.replace(offload_optimizer=0.0),
                                         "calibrated").reasons)


def test_activation_offload_time_and_memory():
    # All stored activations to the host: the device keeps two layers' worth (double buffer); every
    # microbatch's activations of the stage's 12 layers go down in the forward and come back in the
    # backward, one copy each way: 96 microbatches x 12 layers x per-layer bytes / 63 GB/s, hidden
    # while shorter than compute.
    model, cl, base = _gpt3()
    r0 = dse.evaluate(model, cl, base, "calibrated")
    r = dse.evaluate(model, cl, base.replace(offload_activations=1.0), "calibrated")
    per_layer = 34 / 8 * 2048 * 12288                     # Korthikanti eq.(6), SP + selective, t = 8
    assert float(r.activations_bytes) == pytest.approx(2 * per_layer, rel=1e-6)
    moved = 96 * 12 * per_layer / 63e9                     # 1.60 s, under the 6.2 s of compute
    assert moved < float(r.compute_s)
    assert float(r.offload_s) == 0.0
    assert float(r.memory_bytes) < float(r0.memory_bytes)
    # over a slow host link (1 GB/s) the transfer shows: 101 s - compute
    slow = dse.evaluate(model, cl.replace(host_link_bytes_per_s=1e9), base.replace(offload_activations=1.0),
                        "calibrated")
    assert float(slow.offload_s) == pytest.approx(96 * 12 * per_layer / 1e9 - float(slow.compute_s), rel=1e-6)


def test_weight_offload_zero3_gathers_from_host():
    # ZeRO-Infinity: the rank's 16-bit weight partition (params / d) comes up for every gather:
    # FSDP gathers forward and backward per microbatch (calibrated) = 2 x 96 gathers a step.
    model, cl, _ = _gpt3()
    plan = dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1536, zero=3, offload_weights=1.0,
                         offload_optimizer=1.0, offload_gradients=1.0)
    r = dse.evaluate(model, cl.replace(host_link_bytes_per_s=1e9), plan, "calibrated")
    part = float(r.params_per_rank) / 16
    assert float(r.weights_bytes) == 0.0 and float(r.grads_bytes) == 0.0 and float(r.optimizer_bytes) == 0.0
    up = 2 * part * 2 * 96 / 1e9
    # local accumulation keeps the rank's whole gradient buffer (2.80B x 2 B); on the host it is the
    # accumulator, so every microbatch's gradient goes down: 96 x 5.6 GB
    grads_down = 2 * float(r.params_per_rank) * 96 / 1e9
    exposed = max(up - float(r.compute_s), 0) + max(grads_down - 2 / 3 * float(r.compute_s), 0)
    host = 28 * part * 8 / 614.4e9
    after = max(host, 2 * part / 1e9)
    assert float(r.offload_s) == pytest.approx(exposed + after, rel=1e-6)


def test_zero_offload_13b_on_one_v100():
    # ZeRO-Offload (Ren et al. 2021, abstract and sec.6): a 13B-parameter GPT-2-style model trains on a
    # single 32 GB V100 with the optimizer and gradients on the host; without offload 16 B a
    # parameter (208 GB) cannot. DGX-2 host (the paper's testbed): V100 SXM3 32 GB, 125 TFLOP/s,
    # PCIe Gen3 x16 (15.75 GB/s a direction), 1.5 TB host memory, 2x Xeon Platinum 8168 with 6 channels
    # of DDR4-2666 each (256 GB/s). Model: 40 layers of h = 5120 (12 L h^2 = 12.6B + embeddings).
    model = dse.ModelShape.make(layers=40, hidden=5120, heads=40, kv_heads=40, ffn_hidden=20480, vocab=50257,
                                seq=1024)
    v100 = dse.Cluster.make(gpus=1, peak_flops_per_s=125e12, hbm_bytes=32 * GiB, domain=1, bw_up_bytes_per_s=150e9,
                            bw_out_bytes_per_s=12.5e9, gpus_per_node=1, host_link_bytes_per_s=15.75e9,
                            node_host_bytes=1.5e12, node_host_bw_bytes_per_s=256e9, hbm_bw_bytes_per_s=900e9)
    base = dse.Plan.make(tp=1, pp=1, mbs=1, gbs=8, zero=0, recompute=2, sp=0)
    no = dse.evaluate(model, v100, base, "calibrated")
    off = dse.evaluate(model, v100, base.replace(offload_optimizer=1.0, offload_gradients=1.0), "calibrated")
    assert reason_names(no.reasons) == ["out_of_memory"]
    assert not reason_names(off.reasons)
    assert float(off.memory_bytes) <= 32 * GiB < float(no.memory_bytes)
    # host: 14 bytes a parameter (12 optimizer + 2 gradient) of ~13B = ~182 GB of the 1.5 TB
    assert float(off.host_bytes) == pytest.approx(14 * float(off.params_total), rel=1e-6)
    # host Adam at 256 GB/s / 28 B = 9.1e9 parameters a second: 1.4 s for 13B
    assert float(off.host_optimizer_s) == pytest.approx(float(off.params_total) * 28 / 256e9, rel=1e-6)


def test_offload_fields_broadcast_in_a_sweep_grid():
    # New fields are arrays like every other: a grid over the optimizer share is one evaluate, and
    # equals a loop; memory falls and host bytes rise with the share.
    model, cl, base = _gpt3()
    shares = jnp.array([0.0, 0.5, 1.0])
    grid = jax.jit(lambda f: dse.evaluate(model, cl, base.replace(offload_optimizer=f), "calibrated"))(shares)
    loop = [float(dse.evaluate(model, cl, base.replace(offload_optimizer=float(f)), "calibrated").memory_bytes)
            for f in shares]
    np.testing.assert_allclose(np.asarray(grid.memory_bytes), loop, rtol=1e-6)
    assert np.all(np.diff(np.asarray(grid.memory_bytes)) < 0) and np.all(np.diff(np.asarray(grid.host_bytes)) > 0)


def test_offload_checks_are_one_line():
    assert checks.plan_value("offload_optimizer", 0.25) == 0.25
    with pytest.raises(InputError, match="offload_optimizer: 1.5 is not allowed; allowed: a number >= 0 and <= 1"):
        checks.plan_value("offload_optimizer", 1.5)
    with pytest.raises(InputError, match="offload_weights: 0.5 is not allowed; allowed: 0, 1"):
        checks.plan_value("offload_weights", 0.5)
    with pytest.raises(InputError, match="needs zero = 3"):
        checks.offload_consistency({"offload_weights": 1.0, "zero": 1.0})


def test_host_link_presets_are_datasheet_values():
    # PCIe Gen5 x16: 32 GT/s x 16 x 128/130 / 8 = 63.0 GB/s; Gen4: 31.5; NVLink-C2C 900 GB/s
    # bidirectional = 450 a direction (GH200); DGX H100 2 TB, DGX A100 640GB 2 TB, DGX A100 320GB 1 TB.
    assert 32e9 * 16 * 128 / 130 / 8 == pytest.approx(63e9, rel=2e-3)
    want = {"h100-sxm": (63e9, 2e12), "a100-80gb": (31.5e9, 2e12), "a100-40gb": (31.5e9, 1e12),
            "gh200-rail-only": (450e9, 8 * 480e9)}
    for name, (link, host) in want.items():
        c = presets.load_cluster(name)
        assert float(c.host_link_bytes_per_s) == pytest.approx(link) and float(c.node_host_bytes) == pytest.approx(host)
    assert float(offload.ranks_per_node(presets.load_cluster("h100-sxm"))) == 8.0
