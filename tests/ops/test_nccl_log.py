"""NCCL transport lines against a plan (seed 001: ranks 3 -> 4 via NET is TP crossing the node with TP 8)."""

from pathlib import Path

import pytest

from dse.cli import main
from dse.errors import InputError
from dse.ops import nccl_log, rankmap

LOG = Path(__file__).resolve().parents[1] / "fixtures" / "seed001" / "nccl_transport.log"


def rows_for(tp, pp=4, gpus=1024):
    ch, nranks = nccl_log.parse(LOG.read_text(), "log")
    rm = rankmap.rank_map(tp=tp, pp=pp, dp=gpus // (tp * pp), gpus_per_node=8)
    nccl_log.check_ranks(ch, nranks, rm, "log")
    return {(r["src"], r["dst"]): r for r in nccl_log.classify(ch, rm)}


def test_seed_lines_parse():
    ch, nranks = nccl_log.parse(LOG.read_text())
    assert [(c.src, c.dst, c.kind) for c in ch] == [(2, 3, "P2P"), (3, 11, "NET"), (3, 4, "NET")]
    assert ch[0].via == "P2P/direct pointer" and ch[1].via == "NET/IB/3" and nranks is None


def test_tp8_flags_3_to_4():
    r = rows_for(8)
    # seed 001: "with a degree of 8 they are in the same group and should never touch the network"
    assert r[(3, 4)]["status"] == "FAIL" and r[(3, 4)]["dimension"] == "TP/SP"
    assert r[(2, 3)]["status"] == "PASS" and r[(3, 11)]["dimension"] == "PP"


def test_tp4_does_not_flag():
    r = rows_for(4)
    # seed 001: "Ranks 3 and 4 are in different tensor-parallel groups only if the degree is 4"
    assert r[(3, 4)]["status"] == "PASS" and "tp" in r[(3, 4)]["dimension"].lower() and "+" in r[(3, 4)]["dimension"]


def test_cli_exit(capsys):
    assert main(["nccl-log", str(LOG), "--tp", "8", "--pp", "4"]) == 3
    assert "FAIL: 1 TP pair over the network (line 3)" in capsys.readouterr().out
    assert main(["nccl-log", str(LOG), "--tp", "4", "--pp", "4"]) == 0


def test_real_nccl_prefixes_and_counts(tmp_path, capsys):
    text = ("node-0:1234:1290 [3] NCCL INFO comm 0x55d1 rank 3 nranks 16 cudaDev 3 busId 4c000 - Init COMPLETE\n"
            "node-0:1234:1290 [3] NCCL INFO Channel 02/0 : 3[4c000] -> 4[5d000] [send] via NET/IB/0/GDRDMA\n"
            "node-0:1234:1290 [3] NCCL INFO Channel 01/1 : 3[3] -> 2[2] via P2P/CUMEM/read\n")
    p = tmp_path / "nccl.log"
    p.write_text(text)
    ch, nranks = nccl_log.parse(text)
    assert nranks == 16 and ch[0].via == "NET/IB/0/GDRDMA" and ch[1].kind == "P2P"
    assert main(["nccl-log", str(p), "--tp", "8", "--gpus", "16"]) == 3
    capsys.readouterr()
    # rank count disagrees with the plan: one line, exit 2
    assert main(["nccl-log", str(p), "--tp", "8", "--gpus", "1024"]) == 2
    err = capsys.readouterr().err
    assert "largest communicator has 16 ranks but the plan has 1024" in err and err.count("\n") == 1
    p.write_text("NCCL INFO Channel 00/0 : 2000[0] -> 2001[1] via NET/IB/0\n")
    assert main(["nccl-log", str(p), "--tp", "8", "--gpus", "1024"]) == 2
    assert "names rank 2001" in capsys.readouterr().err


def test_foreign_log():
    with pytest.raises(InputError, match="no NCCL transport lines"):
        nccl_log.parse("all_reduce_perf\n  1 2 3\n")
