"""Rank maps (seed 001 'Rank ordering is the placement'; issue 5 item 5)."""

from pathlib import Path

import numpy as np
import pytest

from dse.equations import topology
from dse.cli import main
from dse.errors import InputError
from dse.ops import rankmap

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "seed001"


def seed_map(**kw):
    # seed 001: TP 8, PP 4, DP 32 on 128 nodes of 8 (1,024 GPUs)
    return rankmap.rank_map(tp=8, pp=4, dp=32, gpus_per_node=8, **kw)


def test_seed_coordinates():
    rm = seed_map()
    assert rm.world == 1024 and rm.nodes == 128
    e8, e256 = rm.entry(8), rm.entry(256)
    # seed 001: global 8 is tp 0, pp 1, dp 0 on the second node; global 256 is tp 0, pp 0, dp 8
    assert (e8["tp"], e8["pp"], e8["dp"], e8["node_index"], e8["local"]) == (0, 1, 0, 1, 0)
    assert (e256["tp"], e256["pp"], e256["dp"], e256["node_index"]) == (0, 0, 8, 32)
    assert rm.entry(255)["tp"] == 7 and rm.entry(255)["pp"] == 3 and rm.entry(255)["dp"] == 7


def test_strides_are_topologys():
    # one arithmetic: the rank map's strides are dse.equations.topology.strides (seed 000, rank layout)
    rm = rankmap.rank_map(tp=4, cp=2, ep=2, pp=4, dp=2, gpus_per_node=8)
    st = topology.strides(*(np.float64(x) for x in (4, 2, 2, 4)))
    assert rm.strides == {k: int(v) for k, v in st.items()}
    r = np.arange(rm.world)
    assert np.array_equal(rm.rank_of(**rm.coords(r)), r)
    # order dp,tp,cp,ep,pp by hand: dp 1, tp 2, cp 2*4 = 8, ep 8*2 = 16, pp 16*2 = 32
    rm2 = rankmap.rank_map(tp=4, cp=2, ep=2, pp=4, dp=2, gpus_per_node=8, order=["dp", "tp", "cp", "ep", "pp"])
    assert rm2.strides == {"dp": 1, "tp": 2, "cp": 8, "ep": 16, "pp": 32}
    assert np.array_equal(rm2.rank_of(**rm2.coords(r)), r)


def test_strides_once_a_map_in_numpy(monkeypatch):
    # coords() and groups() read the strides for every rank a check walks (check-log: ~1,000 calls a
    # log); they are computed once a map, in numpy even where jax is imported (the suite imports it)
    calls = []
    real = topology.strides
    monkeypatch.setattr(topology, "strides", lambda *a, **k: calls.append(1) or real(*a, **k))
    rm = rankmap.rank_map(tp=4, cp=2, pp=2, dp=2, gpus_per_node=8)
    for r in range(rm.world):
        rm.coords(r)
    rm.groups("pp")
    assert len(calls) == 1
    assert all(type(v) is int for v in rm.strides.values()) and rm.strides == {"tp": 1, "cp": 4, "ep": 8, "pp": 8, "dp": 16}


def test_torus_coordinates(capsys):
    # 4x4x4 torus, ranks fill x then y then z: rank 17 = 1 + 4*0 + 16*1 -> (1, 0, 1); rank 5 -> (1, 1, 0)
    assert main(["rankmap", "--gpus", "64", "--torus", "4x4x4", "--torus-bw", "50", "--gpus-per-node", "4",
                 "--tp", "4", "--pp", "4", "--ranks", "5,17"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("torus=(1,1,0)") and out[1].endswith("torus=(1,0,1)")
    # filling z first: rank 5 = 1 + 4*1 -> z=1, y=1, x=0
    assert main(["rankmap", "--gpus", "64", "--torus", "4x4x4", "--torus-bw", "50", "--gpus-per-node", "4",
                 "--tp", "4", "--pp", "4", "--ranks", "5", "--torus-order", "zyx"]) == 0
    assert capsys.readouterr().out.strip().endswith("torus=(0,1,1)")


def test_seed_lines_verbatim(capsys):
    # the five 'rank map:' lines of seed 001, character for character
    code = main(["rankmap", "--tp", "8", "--pp", "4", "--ranks", "0,7,8,255,256",
                 "--node-prefix", "gpu-node-", "--first-node", "417", "--node-digits", "4"])
    assert code == 0
    assert capsys.readouterr().out == (FIX / "rank_map.txt").read_text()


def test_groups_and_custom_order():
    rm = seed_map()
    assert list(rm.group_of(3, "tp")) == list(range(8))
    assert list(rm.group_of(3, "pp")) == [3, 11, 19, 27]          # ranks 8 apart: pipeline neighbours
    assert list(rm.group_of(0, "dp"))[:3] == [0, 32, 64]
    assert rm.groups("dp").shape == (32, 32)
    # DP innermost: ranks 0..31 are one DP group, TP neighbours are 32 apart
    rm2 = seed_map(order=["dp", "tp", "cp", "ep", "pp"])
    assert list(rm2.group_of(0, "tp"))[:2] == [0, 32]
    assert len(rm2.groups_spanning_nodes("tp")) == 32 * 4


def test_rank_order_flag(capsys):
    # --rank-order dp,tp (the plan's Plan.rank_order): TP neighbours 32 apart, every TP group spans nodes
    assert main(["rankmap", "--tp", "8", "--pp", "4", "--rank-order", "dp,tp", "--ranks", "1", "--check"]) == 3
    out = capsys.readouterr().out
    assert "global=1   node=node-0 local=1  tp=0 pp=0 dp=1" in out and "TP group 0,32,64" in out


def test_check_names_spanning_group(capsys):
    assert main(["rankmap", "--tp", "8", "--pp", "4", "--ranks", "0", "--check"]) == 0
    capsys.readouterr()
    # a scheduler dealing ranks out round-robin splits every TP group (seed 001, Failure Modes)
    assert main(["rankmap", "--tp", "8", "--pp", "4", "--ranks", "0", "--check", "--assign", "round-robin"]) == 3
    assert "FAIL: TP group 0-7 spans nodes" in capsys.readouterr().out
    # TP 16 on nodes of 8
    assert main(["rankmap", "--tp", "16", "--pp", "4", "--ranks", "0", "--check", "--json"]) == 3
    out = capsys.readouterr().out
    assert '"status": "FAIL"' in out and "above 8 GPUs per node" in out


def test_bad_input():
    with pytest.raises(InputError):
        seed_map().entry(1024)
    with pytest.raises(InputError):
        seed_map(order=["tp", "pp", "dp"])
    assert main(["rankmap", "--tp", "3", "--pp", "4"]) == 2
