"""Every Plan field reaches the CLI and the sweep keys through the field machinery (issue 17): the
fields added without flags (uneven split, split accounting, EP overlap, FP8 parameters) and the FP8
recipe, checked by dse.inputs.checks.plan_value everywhere."""

import dataclasses
import json

import pytest

from dse.cli import common
from dse.engines.sweep.spec import SweepSpec
from dse.errors import InputError
from dse.inputs import Plan
from tests.cli.test_plan import run

BASE = ("plan", "--preset", "llama3-70b", "--cluster", "h100-sxm", "--gpus", "64", "--tp", "8", "--pp", "4",
        "--gbs", "64", "--json")


def test_every_plan_field_has_a_flag():
    import argparse

    p = argparse.ArgumentParser()
    common.add_plan_args(p)
    dests = {a.dest for a in p._actions}
    assert all(f"p_{f.name}" in dests for f in dataclasses.fields(Plan))
    # the fields the previous round added without flags, by their field names
    flags = {s for a in p._actions for s in a.option_strings}
    assert {"--first-stage-layers", "--last-stage-layers", "--embedding-in-split", "--loss-in-split",
            "--ep-comm-overlap", "--fp8-param-gather", "--fp8-tp-comm", "--fp8-amax-history"} <= flags


def test_flags_set_the_fields():
    code, out, _ = run(*BASE, "--fp8", "blockwise", "--fp8-param-gather", "--first-stage-layers", "18",
                       "--last-stage-layers", "18", "--loss-in-split", "--fp8-amax-history", "16")
    plan = json.loads(out)["plan"]
    assert code == 0
    assert (plan["fp8"], plan["fp8_param_gather"], plan["first_stage_layers"], plan["last_stage_layers"],
            plan["loss_in_split"], plan["fp8_amax_history"]) == (4.0, 1.0, 18.0, 18.0, 1.0, 16.0)
    code, out, _ = run(*BASE, "--fp8")                       # a bare --fp8 is Megatron's default, delayed
    assert json.loads(out)["plan"]["fp8"] == 1.0 and json.loads(out)["plan"]["fp8_tp_comm"] == 1.0
    code, out, _ = run(*BASE, "--fp8", "--stack", "generic")  # the generic stack gathers in 16 bits
    assert json.loads(out)["plan"]["fp8_tp_comm"] == 0.0


@pytest.mark.parametrize("argv,field", [(("--fp8", "fp4"), "--fp8"), (("--ep-comm-overlap", "2"), "--ep-comm-overlap"),
                                        (("--first-stage-layers", "1.5"), "--first-stage-layers"),
                                        (("--fp8-amax-history", "0"), "--fp8-amax-history"),
                                        (("--recompute-every", "0"), "--recompute-every"),
                                        (("--recompute-every", "1.5"), "--recompute-every")])
def test_bad_values_one_line(argv, field):
    code, _, err = run(*BASE, *argv)
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1 and "allowed" in err


def test_sweep_keys():
    spec = SweepSpec.make(model="llama3-70b", cluster="h100-sxm", plan={"tp": 8, "pp": 4, "gbs": 64, "fp8_param_gather": True},
                          axes={"fp8": ["none", "delayed", "blockwise"], "ep_comm_overlap": [0, 1]})
    assert spec.axes[0].values == (0.0, 1.0, 4.0) and spec.plan["fp8_param_gather"] == 1.0
    with pytest.raises(InputError, match="axes.fp8: 'fp4' is not allowed; allowed: none, delayed"):
        SweepSpec.make(model="llama3-70b", plan={"gbs": 64}, axes={"fp8": ["fp4"]})
    with pytest.raises(InputError, match="plan.first_stage_layers: 2.5 is not allowed; allowed: integers >= 0"):
        SweepSpec.make(model="llama3-70b", plan={"gbs": 64, "first_stage_layers": 2.5}, axes={"tp": [1]})


def test_recompute_every_flag_and_sweep_key():
    # full recompute of every other layer (torchtitan selective_ac_option 2): the field's own flag and
    # sweep key, checked like recompute_layers (whole numbers >= 1)
    code, out, _ = run(*BASE, "--recompute", "full", "--recompute-every", "2")
    assert code == 0 and json.loads(out)["plan"]["recompute_every"] == 2.0
    code, out, _ = run(*BASE[:-1], "--recompute", "full", "--recompute-every", "2")
    assert code == 0 and "recompute=full every 2" in out
    spec = SweepSpec.make(model="llama3-70b", cluster="h100-sxm", plan={"tp": 8, "pp": 4, "gbs": 64, "recompute": "full"},
                          axes={"recompute_every": [1, 2, 4]})
    assert spec.axes[0].values == (1.0, 2.0, 4.0)
    with pytest.raises(InputError, match="recompute_every: 0 is not allowed; allowed: integers >= 1"):
        SweepSpec.make(model="llama3-70b", plan={"gbs": 64}, axes={"recompute_every": [0]})


def test_measured_matmul_ceiling_flag():
    # A user's own mamf-finder.py figure replaces the preset's (h100-sxm: 794.5 / 989 = 0.8033): every GEMM's
    # top rate scales by the ratio of the two (compute.gemm_top_rates), so a higher ceiling is a shorter step,
    # and the preset's own value through the flag is the preset.
    def step(*extra):
        code, out, err = run(*BASE, *extra)
        assert code == 0, err
        return json.loads(out)["step_s"]
    assert step("--matmul-ceiling", "0.8033") == step()
    assert step("--matmul-ceiling", "0.9") < step() < step("--matmul-ceiling", "0.7")
    code, _, err = run(*BASE, "--matmul-ceiling", "1.2")
    assert code == 2 and "matmul_ceiling" in err and len(err.strip().splitlines()) == 1
