"""Sets benchmarks/gpu_grouped_gemm.py's measured routed-expert GEMMs beside calibrated dse's rates.

    python3 benchmarks/gpu_grouped_compare.py benchmarks/results/h200_grouped_gemm.json [--cluster NAME]

dse's rate for a rank's routed-expert GEMMs is the one ``compute.layer_gemm_efficiency`` gives them
inside a step: the top 16-bit GEMM rate (``compute.gemm_rates``) x the fitted ``flops_efficiency`` x
``compute.gemm_efficiency`` at the expert GEMM's shape (m tokens an expert, n = up f_e, k = h: the
up projection's shape, as dse weights both projections), each expert's GEMM its own call (its fixed
time ``gemm_overhead_s`` paid once an expert). Two columns compare: the rate itself against each
way of running the GEMMs, and the shape's share (the rate over the same model's rate at the largest
m) against the measured grouped GEMM's share, which leaves out ``flops_efficiency`` (fitted on whole
steps, not kernels) and checks only how dse's efficiency falls with fewer tokens an expert.
The cluster preset is the one matching the GPU's name (presets.cluster_for_gpu) unless named.
"""

from __future__ import annotations

import numpy as np
from gpu_layer_compare import measured_and_cluster     # noqa: E402  (the command line both compare scripts take)

from dse.equations import compute
from dse.inputs import fidelity, presets


def dse_tflops(cluster, fid, h, fe, gated, m):
    """Calibrated dse's FLOP/s for one expert's GEMMs at m tokens (TFLOP/s)."""
    n, k = (2 if gated else 1) * fe, h
    top, _ = compute.gemm_rates(cluster, 0.0, fid)
    rate = float(top) * float(fid.flops_efficiency)
    balance = float(cluster.peak_flops_per_s) / float(cluster.hbm_bw_bytes_per_s)
    eff = compute.gemm_efficiency(compute.gemm_intensity(m, n, k, 2.0), balance, compute.FLOPS_PER_MAC * m * n * k,
                                  rate, fid)
    return rate * float(eff) / 1e12


def main():
    res, cluster_name = measured_and_cluster(__doc__)
    cluster = presets.load_cluster(cluster_name)
    fid = fidelity.calibrated()
    print(f"{res['device']} ({res['sms']} SMs), torch {res['torch']}, CUDA {res['cuda']}; dse preset {cluster_name}, "
          f"calibrated; TFLOP/s of forward + backward (3 x 2 m n k an expert)")
    print(f"{'experts (h, f_e) x G':<34}{'m':>6}{'grouped':>9}{'loop':>7}{'dense':>7}{'dse':>6}"
          f"{'dse/grouped':>12}{'share: measured':>17}{'dse':>6}")
    rate = lambda row, key: row[key]["tflops"] if "tflops" in row.get(key, {}) else float("nan")
    ratios, shares = [], []
    for (preset, G), rows in _by_case(res["cases"]).items():
        top_meas = max(rate(r, "grouped") for r in rows)
        top_dse = max(dse_tflops(cluster, fid, r["hidden"], r["expert_width"], r["gated"], r["tokens"]) for r in rows)
        for r in rows:
            d = dse_tflops(cluster, fid, r["hidden"], r["expert_width"], r["gated"], r["tokens"])
            g = rate(r, "grouped")
            label = f"{preset} ({r['hidden']}, {r['expert_width']}) x {G}"
            ratios.append(d / g)
            shares.append((g / top_meas, d / top_dse))
            print(f"{label:<34}{r['tokens']:>6}{g:>9.0f}{rate(r, 'loop'):>7.0f}{rate(r, 'dense'):>7.0f}{d:>6.0f}"
                  f"{d / g:>12.2f}{g / top_meas:>17.2f}{d / top_dse:>6.2f}")
    ratios = np.array(ratios)
    ok = np.isfinite(ratios)
    print(f"dse / measured grouped rate: median {np.median(ratios[ok]):.2f}, range {ratios[ok].min():.2f}-"
          f"{ratios[ok].max():.2f} over {ok.sum()} cases")


def _by_case(cases):
    out = {}
    for r in cases:
        out.setdefault((r["preset"], r["experts"]), []).append(r)
    return out


if __name__ == "__main__":
    main()
