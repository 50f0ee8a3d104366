"""The sources behind the equations, in one table. Equation comments cite these keys."""

from __future__ import annotations

REFERENCES = {
    "seed000": "seed 000: 'Why the network looks this way' (the planner's model; DESIGN.md restores its equations)",
    "seed001": "seed 001: 'Parallelism Strategies and What They Cost the Network' (operator's side)",
    "zero": "Rajbhandari et al. 2020, ZeRO: Memory Optimizations Toward Training Trillion Parameter Models, SC20 (sec.5, Fig.1, sec.7)",
    "korthikanti": "Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, arXiv:2205.05198 (Table 2, sec.4-5, App.A-B)",
    "narayanan": "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM, SC21 (sec.2-3, eq.3)",
    "shoeybi": "Shoeybi et al. 2019, Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism, arXiv:1909.08053 (sec.3)",
    "gpipe": "Huang et al. 2019, GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism, NeurIPS",
    "patarasuk": "Patarasuk & Yuan 2009, Bandwidth optimal all-reduce algorithms for clusters of workstations, JPDC",
    "thakur": "Thakur, Rabenseifner & Gropp 2005, Optimization of Collective Communication Operations in MPICH, IJHPCA",
    "llama3": "Llama Team 2024, The Llama 3 Herd of Models, arXiv:2407.21783 (sec.3.3, Table 4)",
    "deepseekv3": "DeepSeek-AI 2024, DeepSeek-V3 Technical Report, arXiv:2412.19437 (sec.3.2, Table 2)",
    "railonly": "Wang et al. 2024, Rail-only: A Low-Cost High-Performance Network for Training LLMs with Trillion Parameters",
    "gshard": "Lepikhin et al. 2021, GShard: Scaling Giant Models with Conditional Computation and Automatic Sharding, ICLR",
    "switch": "Fedus et al. 2022, Switch Transformers, JMLR",
    "tpuv4": "Jouppi et al. 2023, TPU v4: An Optically Reconfigurable Supercomputer, ISCA",
    "palm": "Chowdhery et al. 2022, PaLM: Scaling Language Modeling with Pathways, App.B (MFU)",
    "ringattn": "Liu et al. 2023, Ring Attention with Blockwise Transformers for Near-Infinite Context",
    "te_cp": "NVIDIA TransformerEngine, pytorch/attention/dot_product_attention/context_parallel.py (AttnFuncWithCPAndKVP2P, AttnFuncWithCPAndKVAllGather: 2c load-balanced chunks, backward K/V re-gather)",
    "flashattn": "Dao et al. 2022, FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness, NeurIPS (sec.3.2)",
    "deepep": "deepseek-ai/DeepEP, docs and README performance tables (dispatch/combine bottleneck bandwidth, H800 NVLink and RDMA)",
    "deepseekv2": "DeepSeek-AI 2024, DeepSeek-V2, arXiv:2405.04434 (sec.2.2.2 device-limited routing)",
    "ddp": "Li et al. 2020, PyTorch Distributed: Experiences on Accelerating Data Parallel Training, VLDB",
    "fsdp": "Zhao et al. 2023, PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel, VLDB",
    "ying": "Ying et al. 2018, Image Classification at Supercomputer Scale, arXiv:1811.06992 (sec.3.3, 2-D torus all-reduce)",
    "dally": "Dally & Towles 2004, Principles and Practices of Interconnection Networks, Morgan Kaufmann (ch.3, tori and bisection)",
    "fp8formats": "Micikevicius et al. 2022, FP8 Formats for Deep Learning, arXiv:2209.05433 (E4M3 and E5M2, per-tensor scaling)",
    "te": "NVIDIA Transformer Engine (transformer_engine/pytorch/module: layernorm_linear.py, linear.py, base.py; common/recipe: DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling)",
    "megatron_fp8": "NVIDIA Megatron-LM megatron/training/arguments.py (--fp8-format, --fp8-recipe, --fp8-param-gather, --fp8-amax-history-len)",
    "mx": "Open Compute Project, OCP Microscaling Formats (MX) Specification v1.0, 2023 (sec.5: 32-value blocks, E8M0 scales)",
    "torchao_fp8": "pytorch/ao torchao/float8/float8_linear.py (Float8Linear: tensorwise dynamic scaling, 16-bit tensors saved for backward)",
    "alfares": "Al-Fares, Loukissas & Vahdat 2008, A Scalable, Commodity Data Center Network Architecture, SIGCOMM (sec.2-3, fat trees)",
}

# Which sources each part of a seed-mode result rests on (printed by `dse plan --cite`).
USED_BY = {
    "parameters": ("seed000", "narayanan"),
    "model states": ("zero",),
    "activations": ("korthikanti", "seed000"),
    "TP traffic": ("shoeybi", "narayanan", "seed000"),
    "PP traffic": ("narayanan", "seed000"),
    "DP traffic": ("zero", "patarasuk", "seed000"),
    "EP traffic": ("gshard", "switch", "seed000"),
    "CP traffic": ("llama3", "seed000", "te_cp", "ringattn"),
    "CP attention calls": ("te_cp", "flashattn"),
    "ring collectives": ("patarasuk", "thakur"),
    "placement": ("llama3", "seed000"),
    "bubble": ("gpipe", "narayanan"),
    "compute": ("palm", "narayanan", "seed000"),
    "exposed DP": ("ddp", "seed000"),
    "network tiers": ("seed001", "railonly", "llama3"),
    "torus": ("tpuv4", "ying", "dally"),
    "node-limited routing": ("deepseekv3", "deepseekv2"),
    "all-to-all rates": ("deepep",),
    "network cost": ("alfares", "railonly"),
    "FP8 recipes": ("fp8formats", "te", "megatron_fp8", "mx", "torchao_fp8"),
}


def citation(parts=None) -> str:
    """The references behind a result, one per line, in the order first used."""
    parts = parts or list(USED_BY)
    keys = []
    for part in parts:
        for k in USED_BY[part]:
            if k not in keys:
                keys.append(k)
    return "\n".join(f"[{k}] {REFERENCES[k]}" for k in keys)
