"""dse suggest: the seeds' procedures over one evaluated table, and the gap to the exhaustive best."""

import numpy as np
import pytest

import dse
from dse.inputs import presets
from dse.cli import main
from dse.ops import suggest


@pytest.fixture(scope="module")
def gpt3():
    model, cluster = presets.load_model("gpt3-175b"), presets.load_cluster("seed")
    return model, cluster, suggest.table(model, cluster, 1024, "seed")


def test_table_is_evaluate(gpt3):
    model, cluster, tab = gpt3
    i = tab.row(tp=8, pp=8, ep=1, vpp=1, mbs=1, recompute=1, zero=1)
    r = dse.evaluate(model, cluster, dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024, zero=1, recompute=1))
    assert tab.step_s[i] == pytest.approx(float(r.step_s), rel=1e-12)
    assert tab.space.size == len(tab.step_s)


def test_seed001_default(gpt3):
    model, cluster, tab = gpt3
    c = suggest.seed001(tab, model, cluster)
    pl = tab.plan(c.row)
    # TP = GPUs per node; PP the smallest power of two that fits 80 GB (PP 1 needs ~99 GB); m >= 4p
    assert pl["tp"] == 8 and pl["pp"] == 2 and tab.feasible[c.row]
    assert not tab.feasible[tab.row(tp=8, pp=1, ep=1, vpp=1, mbs=1, recompute=1, zero=1)]
    assert tab.microbatches[c.row] >= 4 * pl["pp"]


def test_seed000_and_best(gpt3):
    model, cluster, tab = gpt3
    c = suggest.seed000(tab, model, cluster)
    assert tab.plan(c.row)["tp"] <= float(cluster.domain) and tab.feasible[c.row]
    b, n = suggest.best(tab)            # dse.engines.sweep's best point
    ok = np.flatnonzero(tab.feasible & tab.distinct)   # repeats (every 2 without full recompute) left out
    assert n == len(ok) and tab.step_s[b] == tab.step_s[ok].min()
    assert tab.step_s[b] <= tab.step_s[c.row]


def test_moe_picks_ep_inside_domain():
    model, cluster = presets.load_model("mixtral-8x7b"), presets.load_cluster("seed")
    space = suggest.Space(tp=(1, 2, 4, 8), pp=(1, 2, 4, 8), ep=(1, 2, 4, 8), vpp=(1,), mbs=(1,), recompute=(1,),
                          zero=(1, 2))   # a small space keeps the test quick
    tab = suggest.table(model, cluster, 1024, "seed", space)
    c = suggest.seed000(tab, model, cluster)
    pl = tab.plan(c.row)
    assert pl["ep"] > 1 and pl["tp"] * pl["ep"] <= float(cluster.domain)   # seed 000 step 5


def test_cli(capsys):
    assert main(["suggest", "--preset", "gpt3-175b", "--gbs", "1024"]) == 0
    out = capsys.readouterr().out
    assert "seed 001 default: t=8 p=2" in out and "slower than the best" in out and "best of" in out
    assert main(["suggest", "--preset", "gpt3-175b", "--gbs", "1024", "--procedure", "x"]) == 2


def test_space_searches_every_recompute_mode(gpt3):
    # issue 17 item 2: none, selective, full, op (plan.RECOMPUTE) and full recompute of every other
    # layer (torchtitan's default selective_ac_option 2). The default GPT-3 space on the seed cluster
    # (t 1..16: 5, p 1..64: 7, e 1, v 3, b 4, ZeRO 4) had 5 x 7 x 3 x 4 x 3 x 4 = 5040 plans with
    # 3 recompute modes; 5 distinct options now: 5040 / 3 x 5 = 8400 of 5040 / 3 x 8 = 13440 grid points.
    model, cluster, tab = gpt3
    assert tab.space.recompute == (0, 1, 2, 3) and tab.space.recompute_options() == [
        (0, 1), (1, 1), (2, 1), (2, 2), (3, 1)]
    assert (tab.space.distinct, tab.space.size) == (8400, 13440)
    i = tab.row(tp=8, pp=8, ep=1, vpp=1, mbs=1, recompute=2, recompute_every=2, zero=1)
    r = dse.evaluate(model, cluster, dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024, zero=1, recompute=2,
                                                   recompute_every=2))
    assert tab.step_s[i] == pytest.approx(float(r.step_s), rel=1e-12)
    full = tab.row(tp=8, pp=8, ep=1, vpp=1, mbs=1, recompute=2, recompute_every=1, zero=1)
    assert tab.step_s[i] < tab.step_s[full]              # half the layers' forward runs again
    assert dse.recompute_name(2, 2) == "full every 2" and dse.recompute_name(3, 1) == "op"
    assert dse.recompute_name(1, 2) == "selective"      # every N changes full recompute only
