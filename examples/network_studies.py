"""The README's two network studies (## Networks): a torus mapping study and a three-tier study.

Run from the repository root: python3 examples/network_studies.py
"""

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import dse  # noqa: E402
from dse.inputs import presets
from dse.equations import topology  # noqa: E402
from dse.inputs.fidelity import Fidelity  # noqa: E402


def torus_study():
    """GPT-3 175B on a TPU v4-like 16x16x16 torus: every valid mapping, best and worst."""
    m, cl = presets.load_model("gpt3-175b"), presets.load_cluster("tpu-v4-torus")
    for tp, pp in ((16, 8), (8, 16), (32, 4)):
        plan = dse.Plan.make(tp=tp, pp=pp, mbs=1, gbs=1024, zero=1)
        maps = topology.torus_mappings(cl, plan)
        ro, to = topology.mapping_axes(maps)
        r = dse.evaluate(m, cl, plan.replace(rank_order=ro, torus_order=to))
        st = np.asarray(r.step_s)
        best, worst = int(np.argmin(st)), int(np.argmax(st))
        print(f"TP {tp}, PP {pp}: {len(maps)} mappings")
        for tag, i in (("best ", best), ("worst", worst)):
            print(f"  {tag} {maps[i]['axes']}  step {st[i]:.3f} s  MFU {float(r.mfu[i]):.1%}"
                  f"  TP wire {float(r.wire_s.tp[i]):.3f} s")


def three_tier_study():
    """A 24K-GPU H100 three-tier cluster (Meta's AI Zones, Gangidi et al. 2024): what crosses the oversubscribed core, and the cost."""
    cl = presets.load_cluster("h100-24k-3tier")
    fid = Fidelity.make(real_shapes=1.0)
    m = presets.load_model("llama3-405b")
    plan = dse.Plan.make(tp=8, pp=16, mbs=1, gbs=3072, zero=1, recompute=1)
    for order in ("tp,cp,ep,pp,dp", "tp,dp,pp"):
        for o in (1.0, 3.0, 7.0):
            r = dse.evaluate(m, cl.replace(oversubscription=o), plan.replace(rank_order=topology.rank_order_code(order)), fid)
            print(f"405B order {order:15s} core {o:g}:1  step {float(r.step_s):.3f} s  PP wire {float(r.wire_s.pp):.3f} s"
                  f"  network ${float(r.network_cost_usd) / float(cl.gpus):,.0f}/GPU")
    ds = presets.load_model("deepseek-v3")
    plan = dse.Plan.make(tp=1, pp=16, ep=64, mbs=1, gbs=6144, zero=1, recompute=1)
    for order in ("tp,cp,ep,pp,dp", "tp,cp,pp,dp,ep"):
        for limit in (0, 4):
            for o in (1.0, 7.0):
                r = dse.evaluate(ds.replace(route_node_limit=limit), cl.replace(oversubscription=o),
                                 plan.replace(rank_order=topology.rank_order_code(order)), fid)
                print(f"DeepSeek-V3 order {order:15s} M={limit} core {o:g}:1  step {float(r.step_s):.3f} s"
                      f"  EP wire {float(r.wire_s.ep):.3f} s  EP scale-out {float(r.scale_out_bytes.ep) / 1e9:.1f} GB/rank")


if __name__ == "__main__":
    torus_study()
    three_tier_study()
