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
    # issue 17 defect: before, bw_out was the whole-job plateau busbw, 147.753 GB/s, above the 50 GB/s NIC it
    # stands for. The 1,024-rank ring (-N 8) crosses each node on 8 NICs at once, so one GPU's scale-out rate
    # is 147.753 / 8 = 18.469 GB/s (37% of 50 GB/s, seed 001's own reading of this table).
    assert float(c.bw_out_bytes_per_s) == pytest.approx(147.753e9 / 8, rel=1e-4)
    # ... and alpha was fitted from >= 512 MB rows only (0.0185 us a step); this table has no latency-bound
    # row, so alpha stays the base preset's
    assert float(c.alpha_out_s) == float(presets.load_cluster("seed").alpha_out_s)
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
    assert float(c.bw_out_bytes_per_s) == pytest.approx(147.753e9 / 8, rel=1e-4)   # per GPU (issue 17), see above
    assert main(["nccl-tests", str(AR), "--save", "bad name!"]) == 2


def test_json(capsys):
    import json
    assert main(["nccl-tests", str(AR), "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["plateau"]["busbw_bytes_per_s"] == pytest.approx(147.753e9, rel=1e-5)
    assert run["link_share"] == pytest.approx(0.369, abs=1e-3)


B8 = FIX / "nccl_b8_16ranks.log"


def test_default_b8_rows_skipped_without_warnings(capsys):
    # issue 15: logs from the default -b 8 have algbw 0.00 rows that gave NaN notes and RuntimeWarnings
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (r,) = runs(B8)
        s = nt.summarize(r)
        assert main(["nccl-tests", str(B8)]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower() and "5 rows of 8 B-128 B print algbw 0.00" in out
    assert s["zero_rows"] == {"rows": 5, "from_size_bytes": 8.0, "to_size_bytes": 128.0}
    # the fixture is t = 30 us + S / 40 GB/s: the latency-bound rows give alpha back to the printed 0.01 us
    assert s["latency"]["alpha_s"] == pytest.approx(30e-6, abs=0.02e-6)
    assert s["implied_ranks"] == pytest.approx(16, rel=1e-3)
    # no rank count in the log: the ratio 15/16 gives n = 16, so alpha a ring step is 30 us / 15 steps
    assert r.ranks == 16 and "ranks from the busbw/algbw ratio" in r.how
    assert s["latency"]["alpha_per_step_s"] == pytest.approx(2e-6, abs=0.002e-6)


def test_collective_from_the_table():
    # no binary name, no rank lines: a (n-1)/n ratio with a reduction op is reduce_scatter
    (r,) = runs(B8)
    assert r.collective == "reduce_scatter" and r.how.startswith("columns")
    # seed 001's all-reduce table without its mpirun line: ratio 1.87 > 1 is only all-reduce
    text = "\n".join(ln for ln in AR.read_text().splitlines() if "mpirun" not in ln)
    (r,) = nt.parse(text, "log.txt")
    assert r.collective == "all_reduce"
    # all_gather and alltoall print the same columns and ratio: asked for, in one line
    text = "\n".join(ln for ln in A2A.read_text().splitlines() if "mpirun" not in ln)
    with pytest.raises(InputError, match="all_gather or alltoall"):
        nt.parse(text, "log.txt")


@pytest.mark.parametrize("coll,factor", [("broadcast", 1.0), ("reduce", 1.0), ("gather", 7 / 8), ("scatter", 7 / 8),
                                         ("hypercube", 7 / 8), ("sendrecv", 1.0), ("alltoall", 7 / 8)])
def test_every_nccl_tests_collective(coll, factor):
    # nccl-tests src/*.cu GetBw: busbw factors for n = 8
    assert nt.busbw_factor(coll, 8) == pytest.approx(factor)
    S = np.array([1e6, 1e8, 1e9])
    t = 10e-6 + S / 50e9
    rows = "\n".join(f"{int(x)} {int(x) // 4} float none 0 {y * 1e6:.2f} {x / y / 1e9:.2f} {x / y / 1e9 * factor:.2f}"
                     for x, y in zip(S, t))
    text = f"$ mpirun -np 8 {coll}_perf -b 1M -e 1G\n#  size count type redop root time algbw busbw\n{rows}\n"
    (r,) = nt.parse(text, "log")
    s = nt.summarize(r)
    assert r.collective == coll and s["factor_consistent"]


def test_factor_text_from_collectives():
    # the display formula is read off dse.equations.collectives.ring_fraction, not kept as a string
    assert nt.factor_text("all_reduce") == "2(n-1)/n" and nt.factor_text("all_gather") == "(n-1)/n"
    assert nt.factor_text("sendrecv") == "1"


def test_save_alpha_from_small_rows(tmp_path, capsys):
    # issue 17: alpha from the latency-bound rows, named in the file; H200 8 ranks (C117-C136): 32 KiB-512 KiB
    # rows take 17.9-19.0 us, busbw under half the plateau; their median excess over S/algbw is the call's alpha
    path = tmp_path / "h200.toml"
    assert main(["nccl-tests", str(H200), "--cluster", "h200", "--save", str(path)]) == 0
    out = capsys.readouterr().out
    text = path.read_text()
    assert "latency-bound rows 32768-" in text and "bw_up_GBps = plateau busbw" in text
    c = presets.load_cluster(str(path))
    (r,) = runs(H200)
    lat = nt.latency(r)
    assert 17e-6 < lat["alpha_s"] < 19e-6 and lat["ring_steps"] == 14            # 2(8-1) steps
    assert float(c.alpha_up_s) == pytest.approx(lat["alpha_s"] / 14, rel=1e-5)
    assert "alpha_up_us" in out
