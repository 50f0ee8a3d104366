"""The seed's placement rule: order [TP, CP, EP, PP, DP], inside iff stride * size <= U."""

import jax.numpy as jnp
import pytest

from dse.equations import topology


def place(t, c, e, p, d_rep, U):
    f = jnp.float64
    return {k: float(v) for k, v in topology.placement(f(t), f(c), f(e), f(p), f(d_rep), f(U)).items()}


@pytest.mark.parametrize("t,U,inside", [(8, 8, 1.0), (16, 8, 0.0), (8, 4, 0.0), (4, 8, 1.0)])
def test_tp_inside_when_t_le_U(t, U, inside):
    # seed 000: "TP stays inside when t <= U"
    assert place(t, 1, 1, 2, 4, U)["tp"] == inside


@pytest.mark.parametrize("t,e,U,inside", [(1, 8, 8, 1.0), (1, 64, 8, 0.0), (2, 4, 8, 1.0), (2, 8, 8, 0.0)])
def test_ep_inside_when_te_le_U(t, e, U, inside):
    # seed 000: "EP stays inside when t e <= U"
    assert place(t, 1, e, 1, 2, U)["ep"] == inside


def test_pp_crosses_once_te_ge_U():
    # seed 000: "PP neighbors cross domains once t e >= U"
    assert place(8, 1, 1, 4, 2, 8)["pp"] == 0.0
    assert place(2, 1, 1, 4, 2, 8)["pp"] == 1.0      # 2*4 = 8 ranks of a pipeline in one domain
    assert place(2, 1, 1, 8, 2, 8)["pp"] == 0.0


def test_dp_crosses_when_job_exceeds_domain():
    # seed 000: "DP, outermost, ... crosses whenever the job is larger than one domain"
    assert place(8, 1, 1, 1, 2, 8)["dp"] == 0.0
    assert place(2, 1, 1, 1, 4, 8)["dp"] == 1.0
    # MoE: dense DP spans EP x DP'; expert DP spans DP' only
    pl = place(1, 1, 8, 1, 1, 8)
    assert pl["dp"] == 1.0 and pl["dp_expert"] == 1.0


def test_cp_stride_is_t():
    assert place(4, 2, 1, 1, 1, 8)["cp"] == 1.0
    assert place(4, 4, 1, 1, 1, 8)["cp"] == 0.0


def test_strides_match_rank_formula():
    # seed 000: r = t_i + t (e_i + e (p_i + p d'_i)), CP between TP and EP (Llama 3).
    st = topology.strides(8.0, 2.0, 4.0, 16.0)
    assert (st["tp"], st["cp"], st["ep"], st["pp"], st["dp"]) == (1.0, 8.0, 16.0, 64.0, 1024.0)
