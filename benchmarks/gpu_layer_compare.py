"""Sets benchmarks/gpu_layer.py's measured layer beside calibrated dse's compute time for it.

    python3 benchmarks/gpu_layer_compare.py benchmarks/results/h200_layer.json [--cluster NAME]

The cluster preset is the one whose names match the GPU's (presets.cluster_for_gpu, as validation
rows find theirs) unless ``--cluster`` names another.

dse's time for one layer is evaluate's compute time of the model with two layers minus that with
one (one GPU, or TP 8 for the 70B shard; one microbatch; no recompute; fused attention on a
FlashAttention-2-generation kernel, as torchtitan's SDPA flash backend), so the output layer,
loss and optimizer cancel. Runs on the host (no accelerator, no jax).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from dse.engines.compiled import evaluate_exact
from dse.inputs import presets
from dse.inputs.plan import Plan

# The layers gpu_layer.py times, by name: (model preset, tp, seq, batch). Their shapes are the presets'
# (dse/data/models), cut to one TP rank by ``rank_shape``.
MODELS = {"llama3-8b s8192 b1": ("llama3-8b", 1, 8192, 1),
          "llama3-70b s8192 b1 (tp 8 shard)": ("llama3-70b", 8, 8192, 1),
          "mpt-7b s2048 b8": ("mpt-7b", 1, 2048, 8),
          "mpt-1b s2048 b16": ("mpt-1b", 1, 2048, 16)}


def rank_shape(preset, tp=1):
    """(hidden, heads, kv_heads, head_dim, ffn, gated, vocab) of one TP rank's layer of a model preset."""
    m = presets.load_model(preset)
    heads, hidden = int(m.heads), int(m.hidden)
    head_dim = int(m.head_dim) or hidden // heads
    return (hidden, heads // tp, int(m.kv_heads) // tp, head_dim, int(m.ffn_hidden) // tp, bool(m.ffn_gated),
            int(m.vocab))


def layer_s(name, cluster_name, fa2=1.0):
    preset, tp, seq, b = MODELS[name]
    out = []
    for layers in (1, 2):
        model = presets.load_model(preset, layers=layers, seq=seq)
        cluster = presets.load_cluster(cluster_name, gpus=tp)
        plan = Plan.make(tp=tp, pp=1, mbs=b, gbs=b, zero=0, recompute=0, sp=0, flash_attention=1,
                         attn_kernel_fa2=fa2)
        out.append(float(np.asarray(evaluate_exact(model, cluster, plan, "calibrated").compute_s)))
    return out[1] - out[0]


def measured_and_cluster(doc):
    """(the measured JSON, the cluster preset's name) of a compare script's command line: the JSON file
    and ``--cluster``, by default the preset whose names match the measured GPU's (presets.cluster_for_gpu)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--cluster", help="a cluster preset (default: the one matching the measured GPU's name)")
    args = ap.parse_args()
    res = json.load(open(args.json))
    cluster = args.cluster or presets.cluster_for_gpu(res["device"])
    if cluster is None:
        raise SystemExit(f"no cluster preset matches {res['device']!r}: name one with --cluster")
    return res, cluster


def main():
    res, cluster_name = measured_and_cluster(__doc__)
    print(f"{res['device']} ({res['sms']} SMs), torch {res['torch']}, CUDA {res['cuda']}, cuDNN {res['cudnn']}; "
          f"dse preset {cluster_name}, calibrated")
    print(f"{'shape':<34}{'GEMMs TFLOP/s':>14}{'FA2 TFLOP/s':>12}{'cuDNN':>8}{'layer ms (flash)':>18}{'dse ms':>8}{'dse/measured':>14}")
    for name, row in res["shapes"].items():
        dse_ms = layer_s(name, cluster_name) * 1e3
        meas = row["layer_flash"]["s"] * 1e3
        print(f"{name:<34}{row['gemms_bf16']['tflops']:>14.0f}{row['attention_flash']['tflops']:>12.0f}"
              f"{row.get('attention_cudnn', {}).get('tflops', float('nan')):>8.0f}{meas:>18.2f}{dse_ms:>8.2f}{dse_ms / meas:>14.3f}")
    sus = res["sustained_8192_bf16"]
    rates = [s["tflops"] for s in sus]
    clocks = [s["sm_mhz_power_w_temp_c"][0] for s in sus]
    power = [s["sm_mhz_power_w_temp_c"][1] for s in sus]
    print(f"sustained 8192^3 BF16 matmul, {len(sus)} s: {min(rates):.0f}-{max(rates):.0f} TFLOP/s "
          f"(median {np.median(rates):.0f}), SM clock {min(clocks):.0f}-{max(clocks):.0f} MHz, "
          f"power {min(power):.0f}-{max(power):.0f} W")


if __name__ == "__main__":
    main()
