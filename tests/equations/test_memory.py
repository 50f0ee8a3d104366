"""Memory: ZeRO model states and Korthikanti activations, pinned to the papers."""

import jax.numpy as jnp
import pytest

import dse
from dse.equations import memory
from dse.inputs import presets

GB = 1e9


@pytest.mark.parametrize("stage,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_figure_1(stage, expected_gb):
    # ZeRO (Rajbhandari et al. 2020) Fig. 1: 7.5B parameters, Nd = 64, K = 12.
    # Printed to 3 significant figures: 120, 31.4, 16.6, 1.88 GB.
    w, g, o = memory.model_state_bytes(jnp.float64(7.5e9), jnp.float64(64), jnp.float64(stage))
    assert float(w + g + o) / GB == pytest.approx(expected_gb, rel=5e-3)


def _gpt3():
    return presets.load_model("gpt3-175b")


@pytest.mark.parametrize("recompute,sp,coef", [
    # Korthikanti et al. 2022, Table 2, per layer, in units of s*b*h, t = 8, 5as/h = 80:
    (0, 0, 10 + 24 / 8 + 80 / 8),   # TP baseline, eq.(2)
    (0, 1, 34 / 8 + 80 / 8),        # TP + SP, eq.(4)
    (1, 0, 10 + 24 / 8),            # TP + selective recompute
    (1, 1, 34 / 8),                 # TP + SP + selective, eq.(6)
    (2, 0, 2.0),                    # full recompute: the layer input, 2sbh
    (2, 1, 2.0 / 8),                # full recompute, input sharded over the TP group
])
def test_korthikanti_table_2(recompute, sp, coef):
    m = _gpt3()
    got = memory.activation_bytes_per_layer(m, 8.0, 1.0, 1.0, jnp.float64(recompute), jnp.float64(sp))
    sbh = 2048 * 1 * 12288
    assert float(got) == pytest.approx(coef * sbh, rel=1e-12)


def test_no_parallelism_form():
    # Korthikanti eq.(1): s b h (34 + 5 a s / h) with t = 1, no SP, no recompute.
    m = _gpt3()
    got = memory.activation_bytes_per_layer(m, 1.0, 1.0, 1.0, jnp.float64(0), jnp.float64(0))
    assert float(got) == pytest.approx(2048 * 12288 * (34 + 80), rel=1e-12)


def test_first_stage_holds_min_p_m_microbatches():
    # seed 000 sec.2: first stage holds min(p, m) * ceil(L/p) layers of activations.
    m = _gpt3()
    per = float(memory.activation_bytes_per_layer(m, 8.0, 1.0, 1.0, jnp.float64(1), jnp.float64(1)))
    full = float(memory.activation_bytes(m, 8.0, 1.0, 8.0, 1.0, 64.0, 1.0, 1.0, 1.0))
    assert full == pytest.approx(8 * 12 * per, rel=1e-12)        # p = 8 microbatches in flight
    few = float(memory.activation_bytes(m, 8.0, 1.0, 8.0, 1.0, 2.0, 1.0, 1.0, 1.0))
    assert few == pytest.approx(2 * 12 * per, rel=1e-12)         # m = 2 < p: pipeline never fills
    odd = float(memory.activation_bytes(m, 8.0, 1.0, 7.0, 1.0, 64.0, 1.0, 1.0, 1.0))
    assert odd == pytest.approx(7 * 14 * per, rel=1e-12)         # ceil(96/7) = 14 layers


def test_interleave_activation_factor():
    # Korthikanti sec.4.2.3 / validation F08: x (1 + (p-1)/(p v)) with v chunks; none at v = 1.
    assert float(memory.interleave_factor(4.0, 2.0)) == pytest.approx(1 + 3 / 8)
    assert float(memory.interleave_factor(4.0, 1.0)) == 1.0


def test_seed_moe_parameters():
    # seed 000 sec.1: top-2 over half-width experts (4h^2 each): active = dense 12 L h^2,
    # total = L (4 + 4E) h^2; expert weights divided by e on a rank.
    m = _gpt3().replace(experts=64)
    fid = dse.Fidelity.seed()
    total, active, dense, experts = memory.param_counts(m, fid)
    h2L = 12288.0 ** 2 * 96
    assert float(active) == pytest.approx(12 * h2L, rel=1e-12)
    assert float(total) == pytest.approx((4 + 4 * 64) * h2L, rel=1e-12)
    d_r, e_r = memory.params_per_rank(m, fid, 1.0, 1.0, 8.0)
    assert float(d_r) == pytest.approx(4 * h2L, rel=1e-12)
    assert float(e_r) == pytest.approx(4 * 64 * h2L / 8, rel=1e-12)
