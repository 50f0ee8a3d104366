"""One whole training step of a short Llama-shaped model on one GPU in PyTorch, beside calibrated dse.

Run by hand on a CUDA machine with PyTorch (not a dse dependency; the tests never need it), from
the repository root so that this checkout's dse is importable:

    PYTHONPATH=$PWD python3 benchmarks/gpu_step.py > step.json

benchmarks/gpu_layer.py times a layer's kernels; this times what a training step adds around them
on one GPU, with no network: the embedding, the output layer and the fp32 cross-entropy on its
logits, autocast's casts of fp32 weights to BF16, the AdamW step over fp32 parameters, and
recomputation. The model is Llama 3 8B's layer (dse/data/models/llama3-8b.toml: hidden 4096, 32
heads, 8 KV heads, SwiGLU 14336, vocabulary 128,256) with ``--layers`` layers, batch 2 of 8,192
tokens (torchtitan's Llama 3.1 8B runs, judged_runs.csv R109), attention on SDPA's FlashAttention-2
backend, as torchtitan's 2024 runs; three variants: eager without recomputation, eager with every
layer checkpointed (full), and each layer compiled (torch.compile, as torchtitan compiles its
blocks). Each: median of 10 steps after 3 warm-ups (CUDA events), the forward + backward alone the
same way, the allocator's peak. Then calibrated dse's step time and memory for the same plan on the
preset matching the GPU's name (one GPU, TP = PP = 1, ZeRO 0, the torchtitan stack's fields).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_layer import Layer, timed  # noqa: E402  (the same layer as the layer check)
from gpu_layer_compare import rank_shape  # noqa: E402

H, A, KV, D, FFN, _, VOCAB = rank_shape("llama3-8b")
SEQ, BATCH = 8192, 2


class Model(torch.nn.Module):
    def __init__(s, layers, checkpoint):
        super().__init__()
        s.emb = torch.nn.Embedding(VOCAB, H)
        s.layers = torch.nn.ModuleList(Layer(H, A, KV, D, FFN, True) for _ in range(layers))
        s.norm = torch.nn.RMSNorm(H)
        s.out = torch.nn.Linear(H, VOCAB, bias=False)
        s.checkpoint = checkpoint

    def forward(s, tokens):
        x = s.emb(tokens)
        for layer in s.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False) if s.checkpoint else layer(x)
        return s.out(s.norm(x))


def measure(layers, checkpoint, compiled):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    model = Model(layers, checkpoint).cuda()                 # fp32 parameters, BF16 compute (autocast)
    if compiled:
        for i, layer in enumerate(model.layers):
            model.layers[i] = torch.compile(layer)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
    target = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")

    def forward_backward():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):      # the backward too: a checkpoint recomputes there
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(tokens)
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), target.view(-1))   # torchtitan: fp32 logits
            loss.backward()

    def step():
        forward_backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    out = {"step_s": timed(step, reps=10, warm=3)}
    out["forward_backward_s"] = timed(lambda: (forward_backward(), opt.zero_grad(set_to_none=True)), reps=10, warm=2)
    out["peak_allocated_GB"] = torch.cuda.max_memory_allocated() / 1e9
    out["peak_reserved_GB"] = torch.cuda.max_memory_reserved() / 1e9
    del model, opt
    torch.cuda.empty_cache()
    return out


def dse_step(device_name, layers, recompute):
    from dse.engines.compiled import evaluate_exact
    from dse.inputs import presets, stacks
    from dse.inputs.plan import Plan

    name = presets.cluster_for_gpu(device_name)
    if name is None:
        return {"error": f"no cluster preset matches {device_name!r}"}
    model = presets.load_model("llama3-8b", layers=layers, seq=SEQ)
    cluster = presets.load_cluster(name, gpus=1)
    fields = dict(stacks.plan_fields("torchtitan"), tp=1, pp=1, mbs=BATCH, gbs=BATCH, zero=0, sp=0,
                  recompute=recompute)
    r = evaluate_exact(model, cluster, Plan.make(**fields), "calibrated")
    f = lambda x: float(x)   # noqa: E731
    return {"cluster": name, "step_s": f(r.step_s), "compute_s": f(r.compute_s), "memory_GB": f(r.memory_bytes) / 1e9,
            "context_and_nccl_GB": (f(r.context_bytes) + f(r.nccl_bytes)) / 1e9}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--only", help="run the variants whose label contains this text")
    args = ap.parse_args()
    res = {"device": torch.cuda.get_device_properties(0).name, "torch": torch.__version__, "layers": args.layers,
           "variants": {}}
    for label, ckpt, comp, rc in (("eager, no recompute", False, False, 0.0), ("eager, full recompute", True, False, 2.0),
                                  ("compiled layers, no recompute", False, True, 0.0)):
        if args.only and args.only not in label:
            continue
        try:
            got = measure(args.layers, ckpt, comp)
        except Exception as e:      # noqa: BLE001 - a variant this torch or GPU cannot run
            got = {"error": str(e)[:300]}
        try:
            got["dse"] = dse_step(res["device"], args.layers, rc)
        except Exception as e:      # noqa: BLE001
            got["dse"] = {"error": str(e)[:300]}
        res["variants"][label] = got
        print(label, json.dumps(got), file=sys.stderr, flush=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
