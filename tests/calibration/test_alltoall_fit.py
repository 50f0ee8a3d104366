"""The all-to-all rates EP groups run at: fitted on the bulk MoE dispatch/combine rows of
collective_bandwidth.csv (calibration.fit.fit_alltoall)."""

import pytest

from dse.calibration import fit, validate


def test_alltoall_rates_fitted_from_the_bulk_dispatch_combine_rows():
    # collective_bandwidth.csv C157-C164 (deepseek-ai/DeepEP, normal kernels, H800): one node
    # 153 and 158 GB/s of NVLink 160 -> geometric mean 0.97175; 2-8 nodes 43, 43, 58, 57, 51,
    # 50 GB/s of IB 50 -> 0.99960. The low-latency and logical-bandwidth rows are left out.
    rows = validate.load_alltoall()
    assert sorted(r[0] for r in rows) == [f"C{i}" for i in range(157, 165)]
    params, report = fit.fit_alltoall(rows)
    assert params["a2a_up_efficiency"] == pytest.approx(0.971749, rel=1e-5)
    assert params["a2a_out_efficiency"] == pytest.approx(0.999601, rel=1e-5)
    assert report == {"a2a_up_rows": 2, "a2a_out_rows": 6}
