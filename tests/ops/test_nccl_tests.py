"""nccl-tests parsing, busbw and alpha-beta against seed 001's tables and a published sweep."""

from pathlib import Path

import numpy as np
import pytest

from dse.inputs import presets
from dse.cli import main
from dse.errors import InputError
from dse.ops import nccl_tests as nt

FIX = Path(__file__).resolve().parents[1] / "fixtures"
AR = FIX / "seed001" / "all_reduce_perf.log"
A2A = FIX / "seed001" / "alltoall_perf.log"
H200 = FIX / "h200_all_reduce_perf.log"


def runs(path, **kw):
    return nt.parse(path.read_text(), path.name, **kw)


def test_seed_all_reduce_table():
    (r,) = runs(AR)
    assert r.collective == "all_reduce" and r.ranks == 1024 and r.nodes == 128   # mpirun -np 1024 -N 8
    s = nt.summarize(r, 8 * 50e9)   # eight 400 Gb/s NICs = 400 GB/s a node (seed 001)
    # seed 001: busbw 147.34-148.13 GB/s, "roughly 37 percent of the 400 GB/s"; algbw ~79
    assert s["plateau"]["busbw_bytes_per_s"] == pytest.approx((147.34 + 147.79 + 148.13) / 3 * 1e9, rel=1e-12)
    assert s["link_share"] == pytest.approx(0.369, abs=0.001)
    assert s["plateau"]["algbw_bytes_per_s"] == pytest.approx(79e9, rel=0.005)
    # algbw = size / time: 536870912 B / 6821.4 us = 78.70 GB/s (printed 78.71)
    assert r.size_bytes[0] / r.time_s[0] == pytest.approx(r.algbw_bytes_per_s[0], rel=2e-4)
    # 2(n-1)/n for n = 1024 is 1.998; the seed's columns imply 1.8715 (n ~ 15.6): flagged, kept as printed
    assert s["factor"] == pytest.approx(2 * 1023 / 1024) and not s["factor_consistent"]
    assert s["implied_ranks"] == pytest.approx(15.6, abs=0.1)


def test_alpha_beta_fit_by_hand():
    (r,) = runs(AR)
    fit = nt.fit_alpha_beta(r)
    # by hand from the two end rows: slope (108530.2 - 6821.4) us / (8 GiB - 512 MiB) -> 79.18 GB/s,
    # intercept 6821.4 - 536870912 / 79.18e3 = 40.8 us; the weighted fit over 3 rows lands within 10%
    assert fit["algbw_bytes_per_s"] == pytest.approx(79.18e9, rel=2e-3)
    assert fit["alpha_s"] == pytest.approx(40.8e-6, rel=0.1)
    assert fit["alpha_per_step_s"] == pytest.approx(fit["alpha_s"] / 2046)   # 2(n-1) ring steps
    # exact synthetic line: alpha 20 us, 100 GB/s -> recovered exactly
    S = np.array([1e6, 1e7, 1e8, 1e9])
    t = 20e-6 + S / 100e9
    syn = nt.NcclTestsRun("all_gather", 8, 1, S, t, S / t, S / t * 7 / 8, None, "", "syn", "")
    f = nt.fit_alpha_beta(syn)
    assert f["alpha_s"] == pytest.approx(20e-6, rel=1e-9) and f["algbw_bytes_per_s"] == pytest.approx(100e9, rel=1e-9)


def test_seed_alltoall_two_runs(capsys):
    cross, packed = runs(A2A)
    assert cross.collective == "alltoall" and cross.ranks == 512 and len(cross.size_bytes) == 2
    assert "one island" in packed.label and len(packed.size_bytes) == 1
    # seed 001: 21 GB/s across islands vs 61 GB/s packed into one, "three times the throughput"
    b1 = nt.plateau(cross)["busbw_bytes_per_s"]
    b2 = nt.plateau(packed)["busbw_bytes_per_s"]
    assert b1 == pytest.approx(21.265e9) and b2 == pytest.approx(61.31e9)
    assert nt.busbw_factor("alltoall", 512) == pytest.approx(511 / 512)
    assert main(["nccl-tests", str(A2A)]) == 0
    assert "2.88x from placement alone" in capsys.readouterr().out


def test_full_format_columns():
    (r,) = runs(H200)
    # nccl-tests 2.x layout: redop, root, out-of-place and in-place groups; 8 '# Rank' lines on one host
    assert r.ranks == 8 and r.nodes == 1 and r.in_place is not None and len(r.size_bytes) == 20
    assert r.busbw_bytes_per_s[-1] == pytest.approx(480.7e9)     # C136 of collective_bandwidth.csv
    assert nt.busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert nt.summarize(r)["factor_consistent"]
    assert nt.implied_ranks(r) == pytest.approx(8, rel=1e-3)


def test_save_preset_round_trip(tmp_path, capsys):
    path = tmp_path / "measured.toml"
    assert main(["nccl-tests", str(AR), "--save", str(path)]) == 0
    assert "saved" in capsys.readouterr().out
    c = presets.load_cluster(str(path))
    assert float(c.bw_out_bytes_per_s) == pytest.approx(147.753e9, rel=1e-5)   # the plateau busbw
    assert float(c.bw_up_bytes_per_s) == 450e9 and float(c.gpus) == 1024       # the rest from the seed preset
    assert main(["plan", "--preset", "gpt3-175b", "--tp", "8", "--pp", "8", "--gbs", "1024",
                 "--cluster", str(path)]) == 0
    assert "plan" in capsys.readouterr().out
    assert main(["nccl-tests", str(AR), "--save", str(path)]) == 2        # exists: no silent overwrite


@pytest.mark.parametrize("text,what", [
    ("hello world\n", "cannot tell"),
    ("$ all_reduce_perf -b 8\n# nThread 1 nGpus 1\n", "no nccl-tests table"),
    (AR.read_text()[:-12] + "\n", "truncated"),
])
def test_bad_logs(tmp_path, capsys, text, what):
    p = tmp_path / "log.txt"
    p.write_text(text)
    assert main(["nccl-tests", str(p)]) == 2
    err = capsys.readouterr().err
    assert what in err and err.count("\n") == 1
    with pytest.raises(InputError):
        nt.parse(text, "log.txt")


def test_ranks_flag_must_agree(capsys):
    assert main(["nccl-tests", str(AR), "--ranks", "512"]) == 2
    assert "ran 1024 ranks but --ranks says 512" in capsys.readouterr().err


def test_save_by_name(tmp_path, monkeypatch, capsys):
    # --save NAME writes into the user's data folder (DSE_HOME here), never into the installed package;
    # dse plan --cluster NAME then finds it by name after the shipped presets
    monkeypatch.setenv("DSE_HOME", str(tmp_path))
    shipped = set(presets.list_presets("clusters"))
    assert main(["nccl-tests", str(AR), "--save", "measured-fabric"]) == 0
    assert "use --cluster measured-fabric" in capsys.readouterr().out
    assert (tmp_path / "clusters" / "measured-fabric.toml").is_file()
    assert not (presets.preset_dir("clusters") / "measured-fabric.toml").exists()
    assert set(presets.list_presets("clusters")) == shipped | {"measured-fabric"}
    c = presets.load_cluster("measured-fabric")
    assert float(c.bw_out_bytes_per_s) == pytest.approx(147.753e9, rel=1e-5)
    assert float(c.alpha_out_s) > 0          # the fit's alpha per ring step
    assert main(["nccl-tests", str(AR), "--save", "bad name!"]) == 2


def test_json(capsys):
    import json
    assert main(["nccl-tests", str(AR), "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["plateau"]["busbw_bytes_per_s"] == pytest.approx(147.753e9, rel=1e-5)
    assert run["link_share"] == pytest.approx(0.369, abs=1e-3)
