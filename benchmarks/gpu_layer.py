"""What one transformer layer's parts run at on this GPU, in PyTorch, against dse's rates for it.

Run by hand on a CUDA machine with PyTorch (not a dse dependency; the tests never need it):

    PYTHONPATH=$PWD python3 benchmarks/gpu_layer.py > layer.json

Times, with CUDA events (median of 20 after 5 warm-ups), the forward + backward in BF16 of:
the layer's GEMMs alone (torch.matmul on the Megatron layout's shapes: QKV, output, FFN up/gate
and down), the attention core alone (scaled_dot_product_attention, causal, on the flash backend
and on cuDNN's where torch has them), and the whole layer (RMSNorm, GEMMs, RoPE-free attention with K/V heads repeated as torchtitan's repeat_kv,
SwiGLU or GELU, residuals); FP8 GEMMs with tensor-wise scales (torch._scaled_mm) at the same
shapes where the GPU has FP8; and a sustained 8192^3 BF16 matmul for ``--sustain`` seconds, its
rate and the SM clock and power each second (nvidia-smi), against its first second's.
FLOPs are counted as dse counts them (2 m n k a GEMM; attention 4 b s^2 a d forward, halved by the
causal mask, backward 2.5 forwards: flash-attention's benchmark convention, FUSED_ATTN_WORK).
Prints one JSON object; ``benchmarks/gpu_layer_compare.py`` sets it beside dse's rates.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from gpu_layer_compare import MODELS, rank_shape   # noqa: E402  (the layers and their shapes, from dse's presets)


def timed(fn, reps=20, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    out.sort()
    return out[len(out) // 2]


def gemm_list(h, a, kv, d, f, gated, T):
    """(m, n, k) of one layer's forward GEMMs on one GPU (tp 1): QKV, output, FFN up (+gate), down."""
    return [(T, (a + 2 * kv) * d, h), (T, h, a * d), (T, (2 if gated else 1) * f, h), (T, h, f)]


def gemms(h, a, kv, d, f, gated, T, dtype=torch.bfloat16):
    """Forward + backward of the layer's GEMMs alone: each forward m x n x k and its two gradients."""
    mats = []
    for m, n, k in gemm_list(h, a, kv, d, f, gated, T):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        w = torch.randn(k, n, device="cuda", dtype=dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        mats.append((x, w, dy))

    def run():
        for x, w, dy in mats:
            x @ w                  # forward
            dy @ w.t()             # data gradient
            x.t() @ dy             # weight gradient
    flops = sum(3 * 2 * m * n * k for m, n, k in gemm_list(h, a, kv, d, f, gated, T))
    return run, flops


def fp8_gemms(h, a, kv, d, f, gated, T):
    """The same GEMMs in FP8 (e4m3 x e4m3, tensor-wise scales, BF16 out), as torchtitan's Float8 runs them."""
    e4 = torch.float8_e4m3fn
    one = torch.ones((), device="cuda")
    mats = []
    for m, n, k in gemm_list(h, a, kv, d, f, gated, T):
        for mm, nn, kk in ((m, n, k), (m, k, n), (k, n, m)):     # forward, data gradient, weight gradient
            x = torch.randn(mm, kk, device="cuda").to(e4)
            w = torch.randn(nn, kk, device="cuda").to(e4).t()    # column-major second operand
            mats.append((x, w))

    def run():
        for x, w in mats:
            torch._scaled_mm(x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    flops = sum(3 * 2 * m * n * k for m, n, k in gemm_list(h, a, kv, d, f, gated, T))
    return run, flops


def attention(a, d, s, b, backend):
    """Forward + backward of causal SDPA on one backend, K/V with all ``a`` heads (GQA's K/V repeated)."""
    from torch.nn.attention import sdpa_kernel
    q = torch.randn(b, a, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, a, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)   # K/V heads repeated
    v = torch.randn(b, a, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)   # to a, as torchtitan does
    g = torch.randn(b, a, s, d, device="cuda", dtype=torch.bfloat16)

    def run():
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(g)
    flops = 4 * b * s * s * a * d / 2 * 3.5
    return run, flops


class Layer(torch.nn.Module):
    def __init__(s, h, a, kv, d, f, gated):
        super().__init__()
        s.a, s.kv, s.d, s.gated = a, kv, d, gated
        s.n1, s.n2 = torch.nn.RMSNorm(h), torch.nn.RMSNorm(h)
        s.qkv = torch.nn.Linear(h, (a + 2 * kv) * d, bias=False)
        s.o = torch.nn.Linear(a * d, h, bias=False)
        s.up = torch.nn.Linear(h, (2 if gated else 1) * f, bias=False)
        s.down = torch.nn.Linear(f, h, bias=False)

    def forward(s, x):
        b, t, _ = x.shape
        q, k, v = s.qkv(s.n1(x)).split([s.a * s.d, s.kv * s.d, s.kv * s.d], dim=-1)
        q, k, v = (z.view(b, t, -1, s.d).transpose(1, 2) for z in (q, k, v))
        k, v = (z.repeat_interleave(s.a // s.kv, dim=1) for z in (k, v))      # torchtitan's repeat_kv
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.o(y.transpose(1, 2).reshape(b, t, -1))
        u = s.up(s.n2(x))
        if s.gated:
            g, u = u.chunk(2, dim=-1)
            u = F.silu(g) * u
        else:
            u = F.gelu(u, approximate="tanh")
        return x + s.down(u)


def layer(h, a, kv, d, f, gated, s, b, backend):
    from torch.nn.attention import sdpa_kernel
    m = Layer(h, a, kv, d, f, gated).cuda().to(torch.bfloat16)
    x = torch.randn(b, s, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(b, s, h, device="cuda", dtype=torch.bfloat16)

    def run():
        with sdpa_kernel(backend):
            m(x).backward(g)
    return run


def smi():
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.strip().split(",")
    return [float(v) for v in out]


def sustained(seconds):
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    per = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        k = 0
        while time.perf_counter() - t0 < 1.0:
            for _ in range(20):
                x @ w
            torch.cuda.synchronize()
            k += 20
        dt = time.perf_counter() - t0
        per.append({"tflops": 2 * n ** 3 * k / dt / 1e12, "sm_mhz_power_w_temp_c": smi()})
    return per


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sustain", type=float, default=30.0, help="seconds of the sustained matmul")
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend
    p = torch.cuda.get_device_properties(0)
    res = {"device": p.name, "sms": p.multi_processor_count, "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "idle": smi(), "shapes": {}}
    fp8 = torch.cuda.get_device_capability(0) >= (8, 9)
    for name, (preset, tp, s, b) in MODELS.items():
        h, a, kv, d, f, gated, _ = rank_shape(preset, tp)
        T = s * b
        row = {}
        run, fl = gemms(h, a, kv, d, f, gated, T)
        t = timed(run)
        row["gemms_bf16"] = {"s": t, "tflops": fl / t / 1e12}
        if fp8:
            try:
                run, fl = fp8_gemms(h, a, kv, d, f, gated, T)
                t = timed(run)
                row["gemms_fp8"] = {"s": t, "tflops": fl / t / 1e12}
            except Exception as e:            # noqa: BLE001 - an old torch without _scaled_mm's signature
                row["gemms_fp8"] = {"error": str(e)[:200]}
        for label, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                run, fl = attention(a, d, s, b, be)
                t = timed(run)
                row[f"attention_{label}"] = {"s": t, "tflops": fl / t / 1e12}
                t = timed(layer(h, a, kv, d, f, gated, s, b, be))
                row[f"layer_{label}"] = {"s": t}
            except Exception as e:            # noqa: BLE001 - a backend this torch or GPU lacks
                row[f"attention_{label}"] = {"error": str(e)[:200]}
            torch.cuda.empty_cache()
        res["shapes"][name] = row
        print(name, json.dumps(row), flush=True, file=sys.stderr)
    res["sustained_8192_bf16"] = sustained(args.sustain)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
