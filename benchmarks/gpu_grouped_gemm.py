"""What a fine-grained MoE layer's routed-expert GEMMs run at on this GPU, in PyTorch.

Run by hand on a CUDA machine with PyTorch (not a dse dependency; the tests never need it):

    PYTHONPATH=$PWD python3 benchmarks/gpu_grouped_gemm.py > grouped.json
    python3 benchmarks/gpu_grouped_compare.py grouped.json        # beside dse's rates (no GPU needed)

For each expert shape of a dse model preset (hidden h, expert FFN width f_e, gated or not) and
each count G of experts on one rank, times the forward + backward in BF16 (CUDA events, median of
20 after 5 warm-ups) of the rank's routed-expert GEMMs, the up (and gate) projection h x up f_e
and the down projection f_e x h, at m tokens an expert (m = T k e / E, dse's
``compute.tokens_per_expert``), three ways:

- ``grouped``: one grouped GEMM a projection, ``torch._grouped_mm`` (CUTLASS on Hopper and
  Blackwell; torchtitan's MoE calls it), autograd's backward (data and weight gradients);
- ``loop``: one ``torch.mm`` an expert (Megatron-Core's SequentialMLP, the fallback);
- ``dense``: the same FLOPs as one GEMM of G m rows (what a dense FFN of that width would run).

FLOPs are 3 x 2 m n k a GEMM an expert (forward, data and weight gradient), as dse counts them.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")     # dse reads the presets; JAX keeps off the GPU torch times
import torch  # noqa: E402

from gpu_layer import smi, timed     # noqa: E402  (CUDA-event timing, nvidia-smi)

# (dse model preset, experts on one rank) pairs: DeepSeek-V3 at EP 64 (4 of 256) and EP 8 (32),
# Qwen3-30B-A3B at EP 8 (16 of 128), Mixtral 8x7B at EP 8 (1) and EP 1 (8).
CASES = (("deepseek-v3", 4), ("deepseek-v3", 32), ("qwen3-30b-a3b", 16), ("mixtral-8x7b", 1),
         ("mixtral-8x7b", 8))
TOKENS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def expert_shape(preset):
    """(hidden, expert width, gated) of a dse model preset's routed experts."""
    from dse.equations import memory
    from dse.inputs import presets
    m = presets.load_model(preset)
    return int(m.hidden), int(memory.expert_width(m)), bool(m.ffn_gated)


def projections(h, fe, gated):
    """(k, n) of the two routed-expert projections: up (and gate) h -> up f_e, down f_e -> h."""
    return ((h, (2 if gated else 1) * fe), (fe, h))


def grouped(h, fe, gated, G, m):
    bf = torch.bfloat16
    offs = torch.arange(1, G + 1, device="cuda", dtype=torch.int32) * m
    mats = []
    for k, n in projections(h, fe, gated):
        x = torch.randn(G * m, k, device="cuda", dtype=bf, requires_grad=True)
        w = torch.randn(G, k, n, device="cuda", dtype=bf, requires_grad=True)
        mats.append((x, w, torch.randn(G * m, n, device="cuda", dtype=bf)))

    def run():
        for x, w, dy in mats:
            torch._grouped_mm(x, w, offs=offs).backward(dy)
    return run


def loop(h, fe, gated, G, m):
    bf = torch.bfloat16
    mats = []
    for k, n in projections(h, fe, gated):
        for _ in range(G):
            mats.append((torch.randn(m, k, device="cuda", dtype=bf), torch.randn(k, n, device="cuda", dtype=bf),
                         torch.randn(m, n, device="cuda", dtype=bf)))

    def run():
        for x, w, dy in mats:
            x @ w                  # forward
            dy @ w.t()             # data gradient
            x.t() @ dy             # weight gradient
    return run


def dense(h, fe, gated, G, m):
    """G m rows at once; the weight gradient then sums over all of them (one weight, G x its FLOPs
    moved to m: same FLOPs as G experts)."""
    return loop(h, fe, gated, 1, G * m)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    p = torch.cuda.get_device_properties(0)
    res = {"device": p.name, "sms": p.multi_processor_count, "torch": torch.__version__,
           "cuda": torch.version.cuda, "idle": smi(), "cases": []}
    for preset, G in CASES:
        h, fe, gated = expert_shape(preset)
        for m in TOKENS:
            flops = sum(3 * 2 * G * m * n * k for k, n in projections(h, fe, gated))
            row = {"preset": preset, "hidden": h, "expert_width": fe, "gated": gated, "experts": G, "tokens": m,
                   "flops": flops}
            for label, make in (("grouped", grouped), ("loop", loop), ("dense", dense)):
                try:
                    t = timed(make(h, fe, gated, G, m), reps=args.reps)
                    row[label] = {"s": t, "tflops": flops / t / 1e12}
                except Exception as e:            # noqa: BLE001 - a torch or GPU without the kernel
                    row[label] = {"error": str(e)[:200]}
                torch.cuda.empty_cache()
            res["cases"].append(row)
    res["after"] = smi()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
