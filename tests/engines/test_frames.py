"""Reports and sweeps as JSON rows and DataFrames on any shape; typed CSV and Parquet files."""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

import dse
import dse.engines.sweep as sw
from dse.inputs import presets
from dse.report import Report

pd = pytest.importorskip("pandas")

MODEL = presets.load_model("llama3-8b")
SEED = presets.load_cluster("seed", gpus=64)
ev = dse.evaluate   # concrete inputs: numpy float64 (dse/backend.py host_when_concrete), no compile


def _grid():
    # 2 x 3 grid: tp along the first axis, pp along the second (broadcast, not built by hand)
    plan = dse.Plan.make(tp=jnp.array([1.0, 2.0])[:, None], pp=jnp.array([1.0, 2.0, 4.0])[None, :], mbs=1, gbs=128)
    return plan, ev(MODEL, SEED, plan, "seed")


def test_grid_to_json_rows_equal_one_plan_each():
    plan, rep = _grid()
    rows = rep.to_json(plan)
    assert len(rows) == 6 and rows[5]["index"] == [1, 2]
    assert rows[5]["point"] == {"tp": 2.0, "pp": 4.0}                 # only what varies over the grid
    one = ev(MODEL, SEED, dse.Plan.make(tp=2, pp=4, mbs=1, gbs=128), "seed").to_json()
    assert {k: v for k, v in rows[5].items() if k not in ("index", "point")} == one
    json.dumps(rows)                                                   # plain Python throughout


def test_json_rows_are_each_plans_to_json():
    # a sweep's reported rows: the batch broadcast once (Report.json_rows), each row what the plan's
    # own Report gives, in row-major order
    plan, rep = _grid()
    rows = rep.json_rows()
    assert len(rows) == 6
    for j, (t, p) in enumerate([(t, p) for t in (1, 2) for p in (1, 2, 4)]):
        assert rows[j] == ev(MODEL, SEED, dse.Plan.make(tp=t, pp=p, mbs=1, gbs=128), "seed").to_json()


def test_to_json_has_every_report_field():
    _, rep = _grid()
    row = rep[0, 0].to_json()
    shown = set(row) | {f"{k}_bytes" for k in row["memory_bytes"]} | {"calls", "reasons", "memory_bytes"}
    for f in dataclasses.fields(Report):
        assert f.name in shown or f.name.replace("_bytes", "") + "_bytes" in shown, f.name


def test_to_frame_has_axis_columns_and_typed_figures():
    plan, rep = _grid()
    df = rep.to_frame(plan)
    assert len(df) == 6 and list(df.columns[:2]) == ["tp", "pp"]
    assert df["tp"].tolist() == [1, 1, 1, 2, 2, 2] and df["pp"].tolist() == [1, 2, 4, 1, 2, 4]
    assert df["fits"].dtype == bool and df["step_s"].dtype == np.float64
    np.testing.assert_array_equal(df["step_s"].to_numpy(), np.asarray(rep.step_s).reshape(-1))
    np.testing.assert_array_equal(df["traffic_bytes.tp"].to_numpy(), np.asarray(rep.traffic_bytes.tp).reshape(-1))
    assert df["memory_bytes.total"].iloc[4] == pytest.approx(float(rep.memory_bytes[1, 1]), rel=0)


SMALL = dict(model="llama3-8b", cluster="seed", plan={"gbs": 128},
             axes={"gpus": [64, 96], "tp": [1, 2, 4], "recompute": ["none", "full"]},
             top_k=4, pareto=("step_s", "memory_bytes"))


def test_sweep_frames_and_typed_files(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    spec = sw.SweepSpec.make(**SMALL)
    r = sw.run_sweep(spec, out_dir=tmp_path)
    top = r.top_frame()
    assert list(top.columns[:5]) == ["index", "gpus", "tp", "recompute", "sweep_value"]
    assert top["sweep_value"].dtype == np.float64 and pd.api.types.is_string_dtype(top["recompute"])
    assert top["step_s"].tolist() == [row["step_s"] for row in r.top]
    par = r.pareto_frame()
    assert {"sweep_value.step_s", "sweep_value.memory_bytes"} <= set(par.columns)
    # Parquet keeps the types (sweep_value was a ';'-joined string before)
    t = pq.read_table(tmp_path / "pareto.parquet")
    assert str(t.schema.field("sweep_value.step_s").type) == "double"
    assert str(t.schema.field("gpus").type) == "int64" and str(t.schema.field("fits").type) == "bool"
    assert str(pq.read_table(tmp_path / "top.parquet").schema.field("sweep_value").type) == "double"
    csv_top = pd.read_csv(tmp_path / "top.csv")
    assert csv_top["index"].tolist() == top["index"].tolist()


def test_dump_frame_has_axis_columns():
    spec = sw.SweepSpec.make(**{**SMALL, "dump": True})
    r = sw.run_sweep(spec)
    df = r.dump_frame()
    assert len(df) == spec.points == 12
    # row-major, last axis fastest: point 5 = gpus 64, tp 4, recompute full
    assert df.loc[5, ["gpus", "tp", "recompute"]].tolist() == [64, 4, "full"]
    assert df["step_s"].dtype == np.float32 or df["step_s"].dtype == np.float64
