"""One unit table (dse/inputs/units.py) behind presets, co-design text and plot axes; one recompute-name map."""

from __future__ import annotations

import dataclasses

from dse.inputs import RECOMPUTE, RECOMPUTE_NAMES, Cluster, presets, units
from dse.plot import figures
from dse.text import codesign_view

# SI prefixes (BIPM SI Brochure): the factor each written unit must carry
PREFIX = {"GB": 1e9, "GB/s": 1e9, "TB/s": 1e12, "TFLOP/s": 1e12, "us": 1e-6}


def test_every_preset_key_maps_to_a_cluster_field_with_the_unit_it_names():
    fields = {f.name for f in dataclasses.fields(Cluster)}
    for key, (field, factor, unit) in units.PRESET_UNITS.items():
        assert field in fields, key
        assert factor == PREFIX.get(unit, 1.0), (key, unit, factor)


def test_the_other_tables_are_views_of_it():
    assert presets.CLUSTER_UNITS == {k: (f, x) for k, (f, x, _) in units.PRESET_UNITS.items()}
    assert codesign_view.UNITS["bw_up_GBps"] == "GB/s" and codesign_view.UNITS["alpha_out_us"] == "us"
    assert set(codesign_view.UNITS) <= set(units.PRESET_UNITS)
    assert figures._SUFFIX is units.SI_SUFFIXES
    assert figures.metric("hbm_bw_bytes_per_s")[1:3] == ("GB/s", 1e-9)
    assert units.unit("tflops_fp8") == "TFLOP/s" and units.unit("memory_bytes") == "GB"


def test_recompute_names_invert_recompute():
    assert RECOMPUTE_NAMES == {0.0: "none", 1.0: "selective", 2.0: "full", 3.0: "op", 4.0: "qkv"}
    assert all(RECOMPUTE_NAMES[v] == k for k, v in RECOMPUTE.items()) and RECOMPUTE_NAMES[2] == "full"
