"""Network topologies (issue 5): tiers, islands, rails, torus, hierarchical DP, node-limited MoE, cost."""

import jax.numpy as jnp
import numpy as np
import pytest

import dse
from dse.equations import collectives as col
from dse.equations import cost, topology
from dse.inputs import presets
from dse.inputs.fidelity import Fidelity

GB = 1e9


def _torus(n, bw=50 * GB, wrap=1.0):
    """A one-axis torus (ring) of n chips, b/w a link a direction."""
    return presets.load_cluster("seed").replace(gpus=n, topology=2.0, torus_x=n, torus_bw_x_bytes_per_s=bw,
                                                torus_wrap=wrap)


# ---------------------------------------------------------------- seed mode unchanged

def test_defaults_are_seed_rule():
    # seed 000 sec.6: t_X = volume / (450 GB/s inside a domain, 50 GB/s outside); default fields keep it.
    model, cluster = presets.load_model("gpt3-175b"), presets.load_cluster("seed")
    r = dse.evaluate(model, cluster, dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024))
    assert float(r.wire_s.tp) == float(r.traffic_bytes.tp) / (450 * GB)
    assert float(r.wire_s.pp) == float(r.traffic_bytes.pp) / (50 * GB)
    assert float(r.wire_s.dp) == float(r.traffic_bytes.dp) / (50 * GB)
    assert float(r.scale_out_bytes.dp) == float(r.traffic_bytes.dp)       # flat ring: all on scale-out
    assert float(r.scale_up_bytes.tp) == float(r.traffic_bytes.tp)


def test_rank_order_default_code_is_seed_order():
    assert topology.rank_order_names(0) == ["tp", "cp", "ep", "pp", "dp"]
    assert topology.rank_order_code("tp,cp,ep,pp,dp") == 0
    st = topology.strides(8.0, 2.0, 4.0, 3.0, 5.0, topology.rank_order_code("dp,tp"))
    assert [float(st[k]) for k in ("dp", "tp", "cp", "ep", "pp")] == [1, 5, 40, 80, 320]


# ---------------------------------------------------------------- torus rings

def test_ring_on_torus_axis_with_and_without_wraparound():
    # Ring all-reduce of S over n on a bidirectional ring: 2(n-1)/n S / (2B) (Ying et al. 2018 sec.3.3);
    # embedded in a line (no wraparound): 2(n-1)/n S / B.
    m = presets.load_model("gpt3-175b")
    plan = dse.Plan.make(tp=8, pp=1, mbs=1, gbs=1)
    wrap = dse.evaluate(m, _torus(8), plan)
    line = dse.evaluate(m, _torus(8, wrap=0.0), plan)
    S = float(wrap.traffic_bytes.tp)
    assert float(wrap.wire_s.tp) == pytest.approx(S / (2 * 50 * GB), rel=1e-12)
    assert float(line.wire_s.tp) == pytest.approx(S / (50 * GB), rel=1e-12)
    # TP 4 on an axis of 8 covers half of it: a line even though the axis wraps.
    half = dse.evaluate(m, _torus(8), plan.replace(tp=4))
    assert float(half.wire_s.tp) == pytest.approx(float(half.traffic_bytes.tp) / (50 * GB), rel=1e-12)


def test_multi_axis_all_reduce_is_per_axis_rs_then_ag():
    # 4x4 torus with wraparound, TP 16 over x*y: RS along x (S 3/4 at 2B), RS along y on S/4
    # (S/4 3/4 at 2B), then the two all-gathers: 2 (3/8 + 3/32) S / B (by hand).
    m = presets.load_model("gpt3-175b")
    cl = presets.load_cluster("seed").replace(gpus=16, topology=2.0, torus_x=4, torus_y=4,
                                              torus_bw_x_bytes_per_s=50 * GB, torus_bw_y_bytes_per_s=50 * GB)
    r = dse.evaluate(m, cl, dse.Plan.make(tp=16, pp=1, mbs=1, gbs=1))
    S = float(r.traffic_bytes.tp) / (2 * 15 / 16)             # buffer bytes
    assert float(r.wire_s.tp) == pytest.approx(2 * (3 / 8 + 3 / 32) * S / (50 * GB), rel=1e-12)


def test_torus_all_to_all_is_bisection_bound():
    # 4-ring with wraparound: the bisection cuts 2 links a direction and carries S of the
    # all-to-all's 4 x S buffers a direction, so S/(2B) (Dally & Towles sec.3.3); bytes = 3/4 S.
    t = col.torus_all_to_all_time_per_byte(50 * GB, 4.0, 1.0, 1.0)
    assert float(t) == pytest.approx(0.5 / (50 * GB))


def test_torus_mappings_enumerate_and_broadcast():
    m = presets.load_model("llama3-8b")
    cl = presets.load_cluster("tpu-v4-torus").replace(gpus=64, torus_x=4, torus_y=4, torus_z=4)
    plan = dse.Plan.make(tp=4, pp=2, mbs=1, gbs=64)          # d = 8: DP must take 2 axes' worth
    maps = topology.torus_mappings(cl, plan)
    assert len(maps) == len({tuple(sorted(mp["axes"].items())) for mp in maps}) > 1
    assert {"tp": "x", "pp": "y2", "dp": "y2/2*z"} in [mp["axes"] for mp in maps]
    ro, to = topology.mapping_axes(maps)
    grid = dse.evaluate(m, cl, plan.replace(rank_order=ro, torus_order=to))
    assert np.all(np.asarray(grid.reasons) & dse.report.REASON_BIT["torus_mapping_invalid"] == 0)
    for i in (0, len(maps) - 1):                               # broadcast equals one-at-a-time
        one = dse.evaluate(m, cl, plan.replace(rank_order=maps[i]["rank_order"], torus_order=maps[i]["torus_order"]))
        assert float(one.step_s) == pytest.approx(float(grid.step_s[i]), rel=1e-12)


def test_torus_mapping_invalid_when_group_does_not_split():
    m = presets.load_model("gpt3-175b")
    cl = presets.load_cluster("seed").replace(gpus=24, topology=2.0, torus_x=4, torus_y=6,
                                              torus_bw_x_bytes_per_s=GB, torus_bw_y_bytes_per_s=GB)
    r = dse.evaluate(m, cl, dse.Plan.make(tp=3, pp=8, mbs=1, gbs=1))   # groups of 3 wrap rows of 4
    assert "torus_mapping_invalid" in dse.reason_names(r.reasons)
    ok = dse.evaluate(m, cl, dse.Plan.make(tp=8, pp=3, mbs=1, gbs=1))  # 8 = x * 2 of y; 3 = y/2
    assert "torus_mapping_invalid" not in dse.reason_names(ok.reasons)


def test_torus_coords_follow_fill_order():
    cl = presets.load_cluster("tpu-v4-torus")                          # 16x16x16
    plan = dse.Plan.make(tp=1, pp=1, mbs=1, gbs=1, torus_order=topology.torus_order_code("zyx"))
    assert [float(x) for x in topology.torus_coords(16 * 16 + 3, cl, plan)] == [1, 0, 3]
    assert [float(x) for x in topology.torus_coords(16 * 16 + 3, cl, plan.replace(torus_order=0))] == [3, 0, 1]


# ---------------------------------------------------------------- hierarchical all-reduce

def test_two_phase_volumes_match_a_simulated_all_gather():
    # Simulate the two-phase all-gather chunk by chunk (x GPUs a domain, y domains, D bytes a domain)
    # and count bytes on each tier: seed 000's D(y-1)/x across a GPU and D(x-1) inside per domain of data.
    x, y, D = 4, 3, 120.0
    held = {(i, j): {(i, j)} for i in range(y) for j in range(x)}       # (domain, local rank) -> chunks
    across = {g: 0.0 for g in held}
    for (i, j) in held:                                               # phase 1: rails
        for i2 in range(y):
            if i2 != i:
                held[(i, j)] = held[(i, j)] | {(i2, j)}
                across[(i, j)] += D / x
    snapshot = {g: set(h) for g, h in held.items()}
    inside = 0.0
    for (i, j) in held:                                               # phase 2: inside the domain
        for j2 in range(x):
            if j2 != j:
                held[(i, j2)] |= snapshot[(i, j)]
                inside += len(snapshot[(i, j)]) * D / x
    assert all(len(h) == x * y for h in held.values())
    a, b = col.two_phase_all_gather_bytes(D, x, y)
    assert float(a) == pytest.approx(across[(0, 0)]) and float(a) == pytest.approx(D * (y - 1) / x)
    assert float(b) == pytest.approx(inside / y)                      # inside one domain
    assert float(b) / y == pytest.approx(D * (x - 1))                 # per domain's D of data


def test_hierarchical_all_reduce_across_is_rs_plus_two_phase_all_gather():
    # The all-gather half of the hierarchical all-reduce of S bytes is the two-phase all-gather
    # of a result S, each domain contributing D = S/y: D(y-1)/x a GPU across (seed 000).
    S, x, y = 1e9, 32.0, 16.0
    inside, across = col.hierarchical_all_reduce_bytes(S, x, y)
    ag_across, _ = col.two_phase_all_gather_bytes(S / y, x, y)
    assert float(across) == pytest.approx(2 * float(ag_across), rel=1e-12)
    assert float(inside) == pytest.approx(2 * S * (x - 1) / x, rel=1e-12)


def test_hierarchical_dp_moves_98_percent_onto_scale_up():
    # Rail-only (Wang et al. 2023), quoted by seed 000: GPT-1T on 4,096 GPUs in 256-GPU domains,
    # hierarchical all-reduce puts 98% of DP traffic on the scale-up fabric. With TP 8 and DP
    # next to TP in the rank order, 32 DP ranks share a domain and the group spans 2 domains:
    # 1 - (1/32)(1/2) / (31/32 + (1/32)(1/2)) = 98.4% (by hand); tolerance 1 point.
    model, cluster = presets.load_model("megatron-1t"), presets.load_cluster("gh200-rail-only")
    plan = dse.Plan.make(tp=8, pp=8, mbs=1, gbs=512, dp_hierarchical=1,
                         rank_order=topology.rank_order_code("tp,dp,pp"))
    r = dse.evaluate(model, cluster, plan)
    up, out = float(r.scale_up_bytes.dp), float(r.scale_out_bytes.dp)
    assert up / (up + out) == pytest.approx(0.98, abs=0.01)
    assert up / (up + out) == pytest.approx(62 / 63, rel=1e-12)
    flat = dse.evaluate(model, cluster, plan.replace(dp_hierarchical=0))
    assert float(flat.scale_out_bytes.dp) == float(flat.traffic_bytes.dp)
    assert float(r.wire_s.dp) < float(flat.wire_s.dp) / 5


# ---------------------------------------------------------------- three tiers and islands

def _moe512():
    return presets.load_model("gpt3-175b", experts=512)


def test_all_to_all_across_islands_slowed_by_oversubscription():
    # seed 001: the same 512-rank all-to-all runs at 61.42 GB/s packed in one island and 21.08
    # across islands (ratio 2.91). Core oversubscribed 3:1, nodes of 8 scattered over islands:
    # r (1 - 8/512) = 2.95 (by hand), 1.5% from the measured ratio.
    cl = presets.load_cluster("seed").replace(gpus=4096, oversubscription=3.0)
    plan = dse.Plan.make(tp=1, pp=8, ep=512, mbs=1, gbs=512)
    packed = dse.evaluate(_moe512(), cl.replace(island_gpus=512), plan)
    scattered = dse.evaluate(_moe512(), cl.replace(island_gpus=8), plan)
    two_tier = dse.evaluate(_moe512(), cl, plan)
    assert float(packed.wire_s.ep) == float(two_tier.wire_s.ep)           # not slowed in one island
    ratio = float(scattered.wire_s.ep) / float(packed.wire_s.ep)
    assert ratio == pytest.approx(3.0 * (1 - 8 / 512), rel=1e-12)
    assert ratio == pytest.approx(61.42 / 21.08, rel=0.02)


def test_dp_ring_survives_oversubscription():
    # seed 001: DP "is the one dimension that can survive crossing an oversubscribed tier": a ring
    # with m >= r members an island sends one hop out per group, within the uplinks' share.
    cl = presets.load_cluster("seed").replace(gpus=4096, island_gpus=512, oversubscription=3.0)
    plan = dse.Plan.make(tp=8, pp=8, mbs=1, gbs=64)                         # DP stride 64: 8 an island
    m = presets.load_model("gpt3-175b")
    assert float(dse.evaluate(m, cl, plan).wire_s.dp) == float(dse.evaluate(m, cl.replace(island_gpus=0), plan).wire_s.dp)
    outer = plan.replace(rank_order=topology.rank_order_code("tp,dp,pp"))   # PP outermost, stride 512
    slow = dse.evaluate(m, cl, outer)
    fast = dse.evaluate(m, cl.replace(island_gpus=0), outer)
    assert float(slow.wire_s.pp) == pytest.approx(3.0 * float(fast.wire_s.pp), rel=1e-12)  # 1 an island: B/r


# ---------------------------------------------------------------- rail-only

def test_rail_only_all_to_all_overhead_in_paper_range():
    # Rail-only sec.5: forwarding cross-rail all-to-all through the domain costs 8.2-11.2%.
    # EP 64 over 8 DGX H100 domains: (64-8-7)/63 of bytes take one NVLink hop: 0.78 x 50/450 = 8.6%.
    cl = presets.load_cluster("dgx-h100")
    plan = dse.Plan.make(tp=1, pp=8, ep=64, mbs=1, gbs=128)
    m = presets.load_model("gpt3-175b", experts=64)
    fat = dse.evaluate(m, cl, plan)
    rail = dse.evaluate(m, cl.replace(topology=1.0), plan)
    overhead = float(rail.wire_s.ep) / float(fat.wire_s.ep) - 1
    assert overhead == pytest.approx(49 / 63 * 50 / 450, rel=1e-12)
    assert 0.082 <= overhead <= 0.112
    assert float(rail.wire_s.dp) == float(fat.wire_s.dp)                  # rings stay on their rail


def test_rail_only_network_cost_saving_in_paper_range():
    # Rail-only abstract: 38-77% lower network cost than a fat tree, same GPUs (scale-out parts).
    cl = presets.load_cluster("gh200-rail-only")
    rail = float(cost.network_cost(cl, parts=cost.SCALE_OUT_PARTS)[0])
    fat = float(cost.network_cost(cl.replace(topology=0.0), parts=cost.SCALE_OUT_PARTS)[0])
    assert 0.38 <= 1 - rail / fat <= 0.77


# ---------------------------------------------------------------- node-limited routing

def test_node_limited_routing_cuts_scale_out_bytes_as_limit_falls():
    # DeepSeek-V3 sec.3.2.2: a token crosses IB once per destination node, to at most M nodes.
    # EP 64 over 8 nodes, top-8: flat 8 x 63/64 copies; M = 4: 4 x 7/8 = 3.5 (by hand).
    model, cl = presets.load_model("deepseek-v3"), presets.load_cluster("h800")
    plan = dse.Plan.make(tp=1, pp=16, ep=64, mbs=1, gbs=4096)
    fid = Fidelity.make(real_shapes=1.0)
    out = {M: float(dse.evaluate(model.replace(route_node_limit=M), cl, plan, fid).scale_out_bytes.ep)
           for M in (0, 8, 4, 2, 1)}
    assert out[0] > out[8] > out[4] > out[2] > out[1] > 0
    assert out[4] / out[0] == pytest.approx(3.5 / (8 * 63 / 64), rel=1e-12)


# ---------------------------------------------------------------- cost

def test_fat_tree_cost_grows_with_tiers_past_radix_squared_over_two():
    # Al-Fares et al. 2008: two tiers hold R^2/2 endpoints; one more needs a third tier:
    # 3 -> 5 switch ports an endpoint (2L-1).
    R = 64.0
    assert float(cost.fat_tree_tiers(R * R / 2, R)) == 2 and float(cost.fat_tree_tiers(R * R / 2 + 1, R)) == 3
    assert float(cost.fat_tree(2048.0, R)["ports"]) / 2048 == 3
    assert float(cost.fat_tree(4096.0, R)["ports"]) / 4096 == 5
    cl = presets.load_cluster("dgx-h100")
    per_gpu = [float(cost.network_cost(cl.replace(gpus=n))[0]) / n for n in (1024, 2048, 4096)]
    assert per_gpu[0] == per_gpu[1] < per_gpu[2]


def test_network_cost_is_a_report_field_and_broadcasts():
    m = presets.load_model("gpt3-175b")
    cl = presets.load_cluster("seed").replace(gpus=jnp.array([1024.0, 4096.0]))
    r = dse.evaluate(m, cl, dse.Plan.make(tp=8, pp=8, mbs=1, gbs=4096))
    usd = np.asarray(r.network_cost_usd)
    assert usd.shape == (2,) and usd[1] / 4096 > usd[0] / 1024
    one = dse.evaluate(m, cl.replace(gpus=1024.0), dse.Plan.make(tp=8, pp=8, mbs=1, gbs=4096))
    assert one.to_json()["network_cost_usd"] == pytest.approx(usd[0], rel=1e-12)


def test_torus_cost_counts_links():
    cl = presets.load_cluster("tpu-v4-torus")
    parts = cost.network_parts(cl)
    assert float(parts["torus_links"]) == 3 * 4096 and float(parts["nics"]) == 0
    assert float(cost.network_parts(cl.replace(torus_wrap=0.0))["torus_links"]) == 3 * (4096 - 4096 / 16)


@pytest.mark.parametrize("name", ["h100-24k-3tier", "gh200-rail-only", "tpu-v4-torus"])
def test_cluster_presets_load_and_evaluate(name):
    cl = presets.load_cluster(name)
    assert presets.preset_info("clusters", name)["source"]
    r = dse.evaluate(presets.load_model("gpt3-175b"), cl, dse.Plan.make(tp=8, pp=8, mbs=1, gbs=float(cl.gpus) / 64))
    assert np.isfinite(float(r.step_s)) and float(r.network_cost_usd) > 0


# ---------------------------------------------------------------- transforms and CLI

@pytest.mark.parametrize("name", ["h100-24k-3tier", "gh200-rail-only", "tpu-v4-torus"])
def test_grad_through_topologies_is_finite(name):
    # Co-design relaxes degrees: the topology terms must give finite gradients when smooth.
    import jax

    m = presets.load_model("gpt3-175b", experts=64)
    cl = presets.load_cluster(name)
    plan = dse.Plan.make(tp=8.0, pp=8.0, ep=8.0, mbs=1.0, gbs=float(cl.gpus) / 8, dp_hierarchical=1.0)
    g = jax.grad(lambda tp: dse.evaluate(m, cl, plan.replace(tp=tp), sharpness=10.0).step_s)(8.0)
    assert np.isfinite(float(g))


def test_cli_network_flags_and_errors():
    import contextlib
    import io
    import json

    from dse.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["plan", "--preset", "gpt3-175b", "--tp", "8", "--pp", "8", "--gbs", "1024", "--gpus", "4096",
                     "--island", "512", "--oversub", "3", "--rank-order", "tp,dp,pp", "--hier-dp", "--json"])
    d = json.loads(buf.getvalue())
    assert code == 0 and d["plan"]["dp_hierarchical"] == 1 and d["network_cost_usd"] > 0
    assert d["plan"]["rank_order"] == topology.rank_order_code("tp,dp,pp")
    errs = io.StringIO()
    with contextlib.redirect_stderr(errs), contextlib.redirect_stdout(io.StringIO()):
        assert main(["plan", "--preset", "gpt3-175b", "--tp", "8", "--torus", "4x4"]) == 2
        assert main(["plan", "--preset", "gpt3-175b", "--tp", "8", "--topology", "mesh"]) == 2
        assert main(["plan", "--preset", "gpt3-175b", "--tp", "8", "--torus-order", "xx"]) == 2
        assert main(["plan", "--preset", "gpt3-175b", "--tp", "8", "--oversub", "0.5"]) == 2
    lines = errs.getvalue().strip().splitlines()
    assert len(lines) == 4 and all(x.startswith("dse: error: ") for x in lines)
    assert "oversubscription" in lines[3]
    assert "torus" in lines[0] and "topology" in lines[1] and "torus order" in lines[2]


def test_rank_map_shows_torus_coordinates_and_follows_rank_order():
    from dse.ops import rankmap

    # TP 16 fills x of a 16x16x16 torus: global 16 is tp 0, pp 1 at (0, 1, 0); global 256 is dp 2 at (0, 0, 1).
    rm = rankmap.rank_map(tp=16, pp=8, dp=32, gpus_per_node=4, torus=(16, 16, 16), torus_order=0)
    assert rm.entry(16)["torus"] == [0, 1, 0] and rm.entry(256)["torus"] == [0, 0, 1]
    assert rm.entry(256)["dp"] == 2 and "torus=(0,0,1)" in rankmap.format_line(rm.entry(256), rm)
    # A custom order uses topology.strides (one arithmetic with the model): DP next to TP.
    rm = rankmap.rank_map(tp=8, pp=4, dp=32, order=topology.rank_order_names(topology.rank_order_code("tp,dp,pp")))
    assert [rm.strides[k] for k in ("tp", "dp", "pp")] == [1, 8, 256]
    assert rm.entry(8)["dp"] == 1 and rm.entry(256)["pp"] == 1


def test_node_limited_routing_is_rail_aligned_on_rail_only():
    # DeepSeek-V3 sec.3.2.2: node-limited tokens go to the same in-node index, so a rail-only
    # fabric forwards nothing: the same EP time as on a fat tree.
    model, cl = presets.load_model("deepseek-v3"), presets.load_cluster("h800")
    plan = dse.Plan.make(tp=1, pp=16, ep=64, mbs=1, gbs=4096)
    fid = Fidelity.make(real_shapes=1.0)
    fat = dse.evaluate(model, cl, plan, fid)
    rail = dse.evaluate(model, cl.replace(topology=1.0), plan, fid)
    assert float(rail.wire_s.ep) == pytest.approx(float(fat.wire_s.ep), rel=1e-12)
    flat = model.replace(route_node_limit=0)
    assert float(dse.evaluate(flat, cl.replace(topology=1.0), plan, fid).wire_s.ep) > float(
        dse.evaluate(flat, cl, plan, fid).wire_s.ep)


def test_dse_check_follows_the_plans_rank_order():
    # seed 001's second question: with DP next to TP, PP is the dimension pushed across the core.
    from dse.ops import check

    m = presets.load_model("gpt3-175b")
    cl = presets.load_cluster("seed").replace(gpus=4096, island_gpus=512, oversubscription=3.0)
    plan = dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024)
    q2 = lambda p: check.four_questions(m, cl, p)["verdicts"][1]  # noqa: E731
    assert q2(plan).status == "PASS"
    moved = q2(plan.replace(rank_order=topology.rank_order_code("tp,dp,pp")))
    assert moved.status == "WARN" and "PP crosses" in moved.summary
