"""nccl-tests output: parse the tables, read bus bandwidth, fit alpha-beta.

nccl-tests (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md) prints one row per
message size: size (B), count (elements), type, redop, root, then time (us), algbw
and busbw (GB/s, 1e9) out of place, then in place. algbw = size / time; busbw =
algbw x the bytes a rank moves per buffer byte: 2(n-1)/n for all-reduce, (n-1)/n for
all-gather, reduce-scatter and all-to-all, 1 for send/recv. Those factors are the
ring fractions of ``dse.equations.collectives`` (seed 000 sec.3), used here, not re-derived.
busbw is the figure to hold against a link rate (seed 001: "Read busbw, not algbw").

Older and abbreviated tables (seed 001's) drop redop/root or the in-place group; the
parser reads the column names from the ``#`` header. Rows split into blocks at a
blank line or a ``#`` comment, so a listing with two runs under one header (seed
001's all-to-all, across islands and packed into one) gives two runs.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from dse.equations import collectives as col
from dse.errors import InputError

__all__ = ["COLLECTIVES", "NcclTestsRun", "parse", "busbw_factor", "plateau", "fit_alpha_beta",
           "implied_ranks", "summarize"]

# nccl-tests binary stem -> dse collective kind (busbw factor = dse ring fraction).
COLLECTIVES = {
    "all_reduce": col.ALL_REDUCE,
    "all_gather": col.ALL_GATHER,
    "reduce_scatter": col.REDUCE_SCATTER,
    "alltoall": col.ALL_TO_ALL,
    "sendrecv": col.SEND_RECV,
}
_BINARY = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|alltoall|sendrecv|broadcast|reduce|hypercube|gather|scatter)_perf")
_NUM = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
PLATEAU_BAND = 0.95   # rows within 5% of the best busbw form the plateau


def busbw_factor(collective: str, n):
    """busbw / algbw for n ranks (nccl-tests PERFORMANCE.md = dse ring fraction)."""
    return float(col.ring_fraction(COLLECTIVES[collective], np.float64(n)))


@dataclasses.dataclass(frozen=True)
class NcclTestsRun:
    """One table block. Arrays are per row, SI units (bytes, seconds, bytes/s)."""

    collective: str               # key of COLLECTIVES
    ranks: int | None             # n, when the log or the caller says
    nodes: int | None
    size_bytes: np.ndarray
    time_s: np.ndarray            # out-of-place (or the only group)
    algbw_bytes_per_s: np.ndarray
    busbw_bytes_per_s: np.ndarray
    in_place: dict | None         # {"time_s", "algbw_bytes_per_s", "busbw_bytes_per_s"} when printed
    label: str                    # the comment above the block, if any
    source: str                   # file name
    command: str                  # the launch line, if present


def _header_columns(line: str) -> list[str] | None:
    toks = line.lstrip("#").split()
    low = [t.lower() for t in toks]
    if "size" in low and "busbw" in low and "algbw" in low and "time" in low:
        return low
    return None


def _ranks_from_command(cmd: str):
    """n and nodes from an mpirun/srun line: -np/-n/--ntasks N, -N/--npernode per node, -g GPUs a process."""
    def opt(names):
        for name in names:
            m = re.search(rf"(?:^|\s){re.escape(name)}[= ]\s*(\d+)", cmd)
            if m:
                return int(m.group(1))
        return None
    procs = opt(["-np", "-n", "--ntasks", "--np"])
    per_node = opt(["-N", "--npernode", "--ntasks-per-node"])
    gpus = opt(["-g"]) or 1
    threads = opt(["-t"]) or 1
    if procs is None:
        return None, None
    n = procs * gpus * threads
    nodes = procs // per_node if per_node else None
    return n, nodes


def parse(text: str, source: str = "log", *, collective: str | None = None, ranks: int | None = None) -> list[NcclTestsRun]:
    """Every table block in one nccl-tests output. Raises InputError when there is none."""
    lines = text.splitlines()
    command, coll = "", collective
    device_ranks, hosts = 0, set()
    for ln in lines:
        m = _BINARY.search(ln)
        if m and not command:
            command = ln.strip().lstrip("$ ").strip()
            coll = coll or m.group(1)
        if m and coll is None:
            coll = m.group(1)
        dm = re.match(r"#\s+Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device", ln)
        if dm:
            device_ranks += 1
            hosts.add(dm.group(1))
    if coll is None:
        for stem in COLLECTIVES:
            if stem in source.replace("-", "_"):
                coll = stem
    if coll is None:
        raise InputError(f"{source}: cannot tell which nccl-tests binary wrote it (no '*_perf' in the log or "
                         f"its name); give --collective {'|'.join(COLLECTIVES)}")
    if coll not in COLLECTIVES:
        raise InputError(f"{source}: {coll}_perf is not supported; allowed: {', '.join(c + '_perf' for c in COLLECTIVES)}")
    n, nodes = _ranks_from_command(command) if command else (None, None)
    if device_ranks:
        n, nodes = device_ranks, len(hosts)
    if ranks is not None:
        if n is not None and n != int(ranks):
            raise InputError(f"{source}: the log ran {n} ranks but --ranks says {ranks}; expected the same count")
        n = int(ranks)

    header = None
    blocks, cur, label, pending = [], [], "", ""
    for ln in lines:
        s = ln.strip()
        cols = _header_columns(s) if s.startswith("#") else None
        if cols:
            header, pending = cols, ""
            continue
        if not s or s.startswith("#"):
            if cur:
                blocks.append((header, cur, label))
                cur = []
            if s.startswith("#"):
                body = s.lstrip("#").strip()
                if header is not None and body and not body.startswith("(") and "out-of-place" not in body:
                    pending = body
            continue
        if header is None:
            continue
        toks = s.split()
        if _NUM.match(toks[0]) and len(toks) < len(header) and (not cur or len(toks) < len(cur[-1])):
            raise InputError(f"{source}: a row has {len(toks)} of the header's {len(header)} columns "
                             f"({s[:40]!r}); the log is truncated")
        if len(toks) != len(header) or not _NUM.match(toks[0]):
            if cur:   # a line that is not a row ends the block
                blocks.append((header, cur, label))
                cur = []
            continue
        if not cur:
            label, pending = pending, ""
        cur.append(toks)
    if cur:
        blocks.append((header, cur, label))
    if not blocks:
        raise InputError(f"{source}: no nccl-tests table found (expected '#  size  count  type ... time  algbw  busbw' "
                         f"and rows under it); is it {coll}_perf output, complete?")
    return [_block(coll, n, nodes, h, rows, lab, source, command) for h, rows, lab in blocks]


def _block(coll, n, nodes, header, rows, label, source, command) -> NcclTestsRun:
    def col_index(name, which):
        idx = [i for i, c in enumerate(header) if c == name]
        return idx[which] if len(idx) > which else None

    def column(i):
        try:
            return np.array([float(r[i]) for r in rows])
        except ValueError:
            raise InputError(f"{source}: a '{header[i]}' cell is not a number; the table is truncated or not "
                             f"nccl-tests output") from None

    size = column(col_index("size", 0))
    groups = []
    for which in (0, 1):
        it, ia, ib = col_index("time", which), col_index("algbw", which), col_index("busbw", which)
        if it is None or ia is None or ib is None:
            break
        groups.append({"time_s": column(it) * 1e-6, "algbw_bytes_per_s": column(ia) * 1e9,
                       "busbw_bytes_per_s": column(ib) * 1e9})
    if np.any(size <= 0) or np.any(groups[0]["time_s"] <= 0):
        raise InputError(f"{source}: sizes and times must be positive; the table is not nccl-tests output")
    order = np.argsort(size, kind="stable")
    size = size[order]
    groups = [{k: v[order] for k, v in g.items()} for g in groups]
    g0 = groups[0]
    return NcclTestsRun(coll, n, nodes, size, g0["time_s"], g0["algbw_bytes_per_s"], g0["busbw_bytes_per_s"],
                        groups[1] if len(groups) > 1 else None, label, source, command)


def implied_ranks(run: NcclTestsRun) -> float | None:
    """n that the printed busbw/algbw ratio implies: ratio = f (n-1)/n, so n = f / (f - ratio)."""
    f = 2.0 if run.collective == "all_reduce" else 1.0
    if run.collective == "sendrecv":
        return None
    ratio = float(np.median(run.busbw_bytes_per_s / run.algbw_bytes_per_s))
    if ratio >= f:
        return float("inf")
    return f / (f - ratio)


def plateau(run: NcclTestsRun) -> dict:
    """Bus bandwidth the large messages reach: the mean busbw of rows within 5% of the best."""
    bus = run.busbw_bytes_per_s
    keep = bus >= PLATEAU_BAND * bus.max()
    return {"busbw_bytes_per_s": float(bus[keep].mean()), "algbw_bytes_per_s": float(run.algbw_bytes_per_s[keep].mean()),
            "rows": int(keep.sum()), "from_size_bytes": float(run.size_bytes[keep].min())}


def fit_alpha_beta(run: NcclTestsRun) -> dict | None:
    """Least-squares t(S) = alpha + S / algbw_inf, in relative error (weights 1/t).

    Returns alpha (s, the whole call), the asymptotic algbw and busbw, and alpha per
    ring step (dse's ``alpha_*_s`` unit: wire_time charges calls x steps x alpha).
    """
    S, t = run.size_bytes, run.time_s
    if len(np.unique(S)) < 2:
        return None
    A = np.stack([np.ones_like(S), S], axis=1) / t[:, None]
    (alpha, inv_bw), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if alpha < 0:       # no latency visible at these sizes: refit through the origin
        alpha, inv_bw = 0.0, float(np.sum(S / t) / np.sum((S / t) ** 2))
    if inv_bw <= 0:
        return None
    model = alpha + S * inv_bw
    # busbw of the fit uses the table's own busbw/algbw ratio, so it reads like its busbw column.
    ratio = float(np.median(run.busbw_bytes_per_s / run.algbw_bytes_per_s))
    out = {"alpha_s": float(alpha), "algbw_bytes_per_s": float(1.0 / inv_bw),
           "busbw_bytes_per_s": float(ratio / inv_bw),
           "max_rel_error": float(np.max(np.abs(model - t) / t))}
    if run.ranks:
        steps = float(col.ring_steps(COLLECTIVES[run.collective], np.float64(run.ranks)))
        out["ring_steps"] = steps
        out["alpha_per_step_s"] = float(alpha) / max(steps, 1.0)
    return out


def summarize(run: NcclTestsRun, link_bytes_per_s: float | None = None) -> dict:
    """Plateau, factor check, fit and share of a link rate, for one run."""
    out = {"collective": run.collective, "ranks": run.ranks, "nodes": run.nodes, "label": run.label,
           "rows": len(run.size_bytes), "plateau": plateau(run), "fit": fit_alpha_beta(run),
           "implied_ranks": implied_ranks(run)}
    if run.ranks:
        out["factor"] = busbw_factor(run.collective, run.ranks)
        ratio = float(np.median(run.busbw_bytes_per_s / run.algbw_bytes_per_s))
        out["printed_ratio"] = ratio
        out["factor_consistent"] = abs(ratio - out["factor"]) <= 0.01 * out["factor"]
    if link_bytes_per_s:
        out["link_bytes_per_s"] = float(link_bytes_per_s)
        out["link_share"] = out["plateau"]["busbw_bytes_per_s"] / float(link_bytes_per_s)
    return out


def measured_fields(summaries: list[dict], gpus_per_node: float) -> tuple[dict, list[str]]:
    """Cluster preset fields (preset units) that the measured runs set, and notes.

    A ring collective spanning nodes sets the scale-out rate and latency
    (``bw_out_GBps``, ``alpha_out_us``); one inside a node the scale-up ones. In dse's
    model a ring moves f (n-1)/n of the buffer per rank at the tier's bandwidth, so the
    measured busbw is that bandwidth. All-to-all has no field of its own; it is noted.
    The best plateau per tier wins (the run with the most nodes, then the fastest).
    """
    fields, notes, chosen = {}, [], {}
    for s in summaries:
        if s["collective"] not in ("all_reduce", "all_gather", "reduce_scatter"):
            notes.append(f"{s['collective']} plateau busbw {s['plateau']['busbw_bytes_per_s'] / 1e9:.2f} GB/s"
                         f" over {s['ranks'] or '?'} ranks{(' (' + s['label'] + ')') if s['label'] else ''}: no preset field")
            continue
        multi = (s["nodes"] or 1) > 1 or (s["ranks"] or 1) > gpus_per_node
        tier = "out" if multi else "up"
        key = (s["nodes"] or 1, s["plateau"]["busbw_bytes_per_s"])
        if tier in chosen and chosen[tier][0] >= key:
            continue
        chosen[tier] = (key, s)
    for tier, (_, s) in chosen.items():
        fields[f"bw_{tier}_GBps"] = round(s["plateau"]["busbw_bytes_per_s"] / 1e9, 3)
        fit = s["fit"]
        if fit and "alpha_per_step_s" in fit:
            fields[f"alpha_{tier}_us"] = round(fit["alpha_per_step_s"] * 1e6, 6)
        notes.append(f"bw_{tier}_GBps and alpha_{tier}_us from {s['collective']}_perf over {s['ranks'] or '?'} ranks")
    return fields, notes


def preset_toml(base: dict, measured: dict, notes: list[str], description: str, source: str) -> str:
    """A cluster preset file: the base preset's fields with the measured ones replaced."""
    fields = {k: v for k, v in base.items() if k not in ("description", "source")}
    fields.update(measured)

    def q(x: str) -> str:
        return '"' + str(x).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [f"description = {q(description)}", f"source = {q(source)}"]
    lines += [f"# {n}" for n in notes]
    for k, v in fields.items():
        lines.append(f"{k} = {v:g}" if isinstance(v, (int, float)) else f"{k} = {q(v)}")
    return "\n".join(lines) + "\n"
