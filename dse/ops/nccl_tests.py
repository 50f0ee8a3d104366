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
import datetime
import re
import tomllib
from pathlib import Path

import numpy as np

from dse import files
from dse.equations import collectives as col
from dse.errors import InputError
from dse.inputs import presets

__all__ = ["COLLECTIVES", "NcclTestsRun", "parse", "identify", "busbw_factor", "factor_text", "plateau",
           "fit_alpha_beta", "latency", "implied_ranks", "zero_rows", "summarize", "link_capacity",
           "measured_fields", "preset_toml", "save_preset"]

# nccl-tests binary stem -> dse collective kind whose ring fraction is the busbw factor
# (nccl-tests doc/PERFORMANCE.md and src/*.cu GetBw: all_reduce 2(n-1)/n; all_gather, reduce_scatter,
# alltoall, gather, scatter, hypercube (n-1)/n; sendrecv, broadcast, reduce 1).
COLLECTIVES = {
    "all_reduce": col.ALL_REDUCE,
    "all_gather": col.ALL_GATHER,
    "reduce_scatter": col.REDUCE_SCATTER,
    "alltoall": col.ALL_TO_ALL,
    "sendrecv": col.SEND_RECV,
    "broadcast": col.SEND_RECV,
    "reduce": col.SEND_RECV,
    "gather": col.ALL_GATHER,
    "scatter": col.ALL_GATHER,
    "hypercube": col.ALL_GATHER,
}
NATIVE = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")   # collectives dse times itself
_BINARY = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|alltoall|sendrecv|broadcast|reduce|hypercube|gather|scatter)_perf")
_NUM = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
PLATEAU_BAND = 0.95   # rows within 5% of the best busbw form the plateau
LATENCY_SHARE = 0.5   # rows below half the plateau busbw are latency-bound: they fit alpha


def busbw_factor(collective: str, n):
    """busbw / algbw for n ranks (nccl-tests PERFORMANCE.md = dse ring fraction)."""
    return float(col.ring_fraction(COLLECTIVES[collective], np.float64(n)))


def factor_text(collective: str) -> str:
    """The busbw factor as a formula, read off ``collectives.ring_fraction`` (2 and infinity ranks)."""
    two, big = busbw_factor(collective, 2), round(busbw_factor(collective, 1e12), 6)
    if two == big:
        return f"{big:g}"
    return f"{big:g}(n-1)/n" if big != 1 else "(n-1)/n"


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
    how: str = ""                 # how the collective was known: "binary", "file name", "columns", "--collective"

    @property
    def bw_rows(self) -> np.ndarray:
        """Rows whose printed bandwidths are above 0.00 (small sizes round to 0 at two decimals)."""
        return (self.algbw_bytes_per_s > 0) & (self.busbw_bytes_per_s > 0)

    @property
    def ratio(self) -> float | None:
        """Median printed busbw / algbw over the rows with bandwidth (None when no row has any)."""
        ok = self.bw_rows
        return float(np.median(self.busbw_bytes_per_s[ok] / self.algbw_bytes_per_s[ok])) if ok.any() else None


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


def _preamble(lines: list[str], source: str, collective: str | None):
    """(command, collective or None, how, ranks, nodes) from the launch line, '# Rank' lines or file name."""
    command, coll, how = "", collective, "--collective" if collective else ""
    device_ranks, hosts = 0, set()
    for ln in lines:
        m = _BINARY.search(ln)
        if m and not command:
            command = ln.strip().lstrip("$ ").strip()
        if m and coll is None:
            coll, how = m.group(1), "binary"
        dm = re.match(r"#\s+Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device", ln)
        if dm:
            device_ranks += 1
            hosts.add(dm.group(1))
    if coll is None:
        stem = source.replace("-", "_")
        coll = next((c for c in sorted(COLLECTIVES, key=len, reverse=True) if c in stem), None)
        how = "file name" if coll else ""
    n, nodes = _ranks_from_command(command) if command else (None, None)
    if device_ranks:
        n, nodes = device_ranks, len(hosts)
    return command, coll, how, n, nodes


def _table_blocks(lines: list[str], source: str) -> list[tuple[list, list, str]]:
    """(header, rows, label) for every block of rows under a '#  size count ...' header."""
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
            body = s.lstrip("#").strip()
            if s.startswith("#") and header is not None and body and not body.startswith("(") \
                    and "out-of-place" not in body:
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
    return blocks


def identify(header: list[str], rows: list[list[str]], ratio: float | None, n: int | None,
             tol: float = 0.01) -> tuple[str | None, str]:
    """The collective a table's columns and busbw/algbw ratio imply, and why (None when ambiguous).

    nccl-tests 2.x prints redop ("none" where the collective reduces nothing) and root (-1 where
    it has none). The ratio is the busbw factor: 2(n-1)/n >= 1 only for all-reduce, (n-1)/n < 1
    for the gather/scatter family, 1 for point-to-point and rooted copies.
    """
    redop = [r[header.index("redop")] for r in rows] if "redop" in header else None
    root = [r[header.index("root")] for r in rows] if "root" in header else None
    reduces = None if redop is None else redop[0].lower() != "none"
    rooted = None if root is None else root[0] != "-1"
    if ratio is None:
        return None, "no row with bandwidth above 0.00"
    if n:
        if abs(ratio - busbw_factor("all_reduce", n)) <= tol and n > 2:
            return "all_reduce", f"busbw/algbw {ratio:.4f} = 2(n-1)/n for n = {n}"
    if ratio > 1 + tol:
        return "all_reduce", f"busbw/algbw {ratio:.4f} > 1: only all-reduce moves 2(n-1)/n"
    if ratio < 1 - tol:
        if reduces:
            return "reduce_scatter", f"busbw/algbw {ratio:.4f} = (n-1)/n with a reduction op ({redop[0]})"
        if rooted:
            return None, "a (n-1)/n ratio with a root: gather or scatter"
        return None, f"busbw/algbw {ratio:.4f} = (n-1)/n without a reduction: all_gather or alltoall"
    if rooted is True:
        return ("reduce", "ratio 1 with a root and a reduction op") if reduces else \
            ("broadcast", "ratio 1 with a root and no reduction")
    if reduces is False and rooted is False:
        return "sendrecv", "ratio 1, no root, no reduction"
    return None, f"busbw/algbw {ratio:.4f} = 1: sendrecv, broadcast or reduce (or all-reduce on 2 ranks)"


def _ratio_precision(run: NcclTestsRun) -> float:
    """How far the printed ratio can be off: bandwidths print to 0.01 GB/s (two decimals), so about 0.01/algbw."""
    ok = run.bw_rows
    return float(np.median(0.01e9 / run.algbw_bytes_per_s[ok])) * 2.0 if ok.any() else 0.01


def parse(text: str, source: str = "log", *, collective: str | None = None, ranks: int | None = None) -> list[NcclTestsRun]:
    """Every table block in one nccl-tests output. Raises InputError when there is none.

    The collective comes from ``collective``, else the binary's name in the log or file
    name, else the table itself (``identify``: columns and busbw/algbw ratio).
    """
    lines = text.splitlines()
    command, coll, how, n, nodes = _preamble(lines, source, collective)
    if coll is not None and coll not in COLLECTIVES:
        raise InputError(f"{source}: {coll}_perf is not supported; allowed: {', '.join(c + '_perf' for c in COLLECTIVES)}")
    if ranks is not None:
        if n is not None and n != int(ranks):
            raise InputError(f"{source}: the log ran {n} ranks but --ranks says {ranks}; expected the same count")
        n = int(ranks)
    blocks = _table_blocks(lines, source)
    if not blocks:
        if coll is None:
            raise InputError(f"{source}: cannot tell which nccl-tests binary wrote it (no '*_perf' in the log or "
                             f"its name, and no table to read); give --collective {'|'.join(COLLECTIVES)}")
        raise InputError(f"{source}: no nccl-tests table found (expected '#  size  count  type ... time  algbw  busbw' "
                         f"and rows under it); is it {coll}_perf output, complete?")
    out = []
    for h, rows, lab in blocks:
        run = _block(coll or "all_reduce", n, nodes, h, rows, lab, source, command, how)
        if coll is None:
            found, why = identify(h, rows, run.ratio, n, _ratio_precision(run))
            if found is None:
                raise InputError(f"{source}: cannot tell which nccl-tests binary wrote it ({why}); "
                                 f"give --collective {'|'.join(COLLECTIVES)}")
            run = dataclasses.replace(run, collective=found, how=f"columns: {why}")
        if run.ranks is None:      # n from the ratio f (n-1)/n when it lands on a whole number (within 1%)
            n_ratio = implied_ranks(run)
            if n_ratio and np.isfinite(n_ratio) and n_ratio >= 2 and abs(n_ratio - round(n_ratio)) <= 0.01 * n_ratio:
                run = dataclasses.replace(run, ranks=int(round(n_ratio)),
                                          how=(run.how + "; " if run.how else "") + "ranks from the busbw/algbw ratio")
        out.append(run)
    return out


def _block(coll, n, nodes, header, rows, label, source, command, how="") -> NcclTestsRun:
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
    if np.any(size < 0) or np.any(groups[0]["time_s"] <= 0):
        raise InputError(f"{source}: sizes must be >= 0 and times positive; the table is not nccl-tests output")
    keep = size > 0            # a 0-byte row (-b 0) carries no bandwidth and no latency figure
    order = np.argsort(size[keep], kind="stable")
    size = size[keep][order]
    groups = [{k: v[keep][order] for k, v in g.items()} for g in groups]
    g0 = groups[0]
    return NcclTestsRun(coll, n, nodes, size, g0["time_s"], g0["algbw_bytes_per_s"], g0["busbw_bytes_per_s"],
                        groups[1] if len(groups) > 1 else None, label, source, command, how)


def implied_ranks(run: NcclTestsRun) -> float | None:
    """n that the printed busbw/algbw ratio implies: ratio = f (n-1)/n, so n = f / (f - ratio)."""
    f = busbw_factor(run.collective, 1e12)
    ratio = run.ratio
    if ratio is None or busbw_factor(run.collective, 2) == f:     # a constant factor says nothing of n
        return None
    if ratio >= f:
        return float("inf")
    return f / (f - ratio)


def zero_rows(run: NcclTestsRun) -> dict | None:
    """The rows printed with algbw or busbw 0.00 (nccl-tests' default -b 8): left out of bandwidth figures."""
    bad = ~run.bw_rows
    if not bad.any():
        return None
    return {"rows": int(bad.sum()), "from_size_bytes": float(run.size_bytes[bad].min()),
            "to_size_bytes": float(run.size_bytes[bad].max())}


def plateau(run: NcclTestsRun) -> dict:
    """Bus bandwidth the large messages reach: the mean busbw of rows within 5% of the best."""
    bus = run.busbw_bytes_per_s
    if not run.bw_rows.any():
        raise InputError(f"{run.source}: every row has busbw 0.00; allowed: a run with larger sizes (-e)")
    keep = bus >= PLATEAU_BAND * bus.max()
    return {"busbw_bytes_per_s": float(bus[keep].mean()), "algbw_bytes_per_s": float(run.algbw_bytes_per_s[keep].mean()),
            "rows": int(keep.sum()), "from_size_bytes": float(run.size_bytes[keep].min())}


def fit_alpha_beta(run: NcclTestsRun) -> dict | None:
    """Least-squares t(S) = alpha + S / algbw_inf, in relative error (weights 1/t), over every row.

    Returns alpha (s, the whole call), the asymptotic algbw and busbw, and alpha per
    ring step (dse's ``alpha_*_s`` unit: wire_time charges calls x steps x alpha).
    Times are printed to 0.01 us, so rows whose bandwidth rounds to 0.00 still count here.
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
    ratio = run.ratio or busbw_factor(run.collective, run.ranks or 1e12)
    out = {"alpha_s": float(alpha), "algbw_bytes_per_s": float(1.0 / inv_bw),
           "busbw_bytes_per_s": float(ratio / inv_bw),
           "max_rel_error": float(np.max(np.abs(model - t) / t))}
    steps = _steps(run)
    if steps:
        out["ring_steps"] = steps
        out["alpha_per_step_s"] = float(alpha) / max(steps, 1.0)
    return out


def _steps(run: NcclTestsRun) -> float | None:
    if not run.ranks or run.collective not in NATIVE:
        return None
    return float(col.ring_steps(COLLECTIVES[run.collective], np.float64(run.ranks)))


def latency(run: NcclTestsRun) -> dict | None:
    """alpha from the latency-bound rows: those below half the plateau busbw (all of them bandwidth 0.00 too).

    Each such row gives t - S / algbw_plateau, the time the bandwidth term does not explain;
    alpha is their median (alpha-beta model, Hockney 1994). None without two such rows: a table
    of large messages only (seed 001's -b 512M) says nothing of latency.
    """
    pl = plateau(run)
    small = run.busbw_bytes_per_s < LATENCY_SHARE * pl["busbw_bytes_per_s"]
    if small.sum() < 2:
        return None
    resid = run.time_s[small] - run.size_bytes[small] / pl["algbw_bytes_per_s"]
    alpha = float(np.median(resid))
    if alpha <= 0:
        return None
    out = {"alpha_s": alpha, "rows": int(small.sum()), "from_size_bytes": float(run.size_bytes[small].min()),
           "to_size_bytes": float(run.size_bytes[small].max())}
    steps = _steps(run)
    if steps:
        out["ring_steps"] = steps
        out["alpha_per_step_s"] = alpha / max(steps, 1.0)
    return out


def summarize(run: NcclTestsRun, link_bytes_per_s: float | None = None) -> dict:
    """Plateau, factor check, fits and share of a link rate, for one run."""
    out = {"collective": run.collective, "ranks": run.ranks, "nodes": run.nodes, "label": run.label,
           "rows": len(run.size_bytes), "plateau": plateau(run), "fit": fit_alpha_beta(run),
           "latency": latency(run), "implied_ranks": implied_ranks(run), "zero_rows": zero_rows(run),
           "identified_by": run.how, "printed_ratio": run.ratio, "factor_text": factor_text(run.collective)}
    if run.ranks:
        out["factor"] = busbw_factor(run.collective, run.ranks)
        out["factor_consistent"] = abs(run.ratio - out["factor"]) <= 0.01 * out["factor"]
    if link_bytes_per_s:
        out["link_bytes_per_s"] = float(link_bytes_per_s)
        out["link_share"] = out["plateau"]["busbw_bytes_per_s"] / float(link_bytes_per_s)
    return out


def spans_nodes(s: dict, gpus_per_node: float) -> bool:
    """A run crosses nodes when the log names more than one, or has more ranks than a node holds."""
    return (s["nodes"] or 1) > 1 or (s["ranks"] or 1) > gpus_per_node


def link_capacity(s: dict, gpus_per_node: float, cluster) -> tuple[float, str]:
    """The capacity a run's busbw is held against, and its tier: a node's NICs (g x bw_out, "out") across
    nodes, one GPU's scale-up rate ("up") inside one.

    A ring over k ranks a node crosses each node's boundary on k rails at once (NCCL runs one
    ring a channel, one NIC a GPU), so an all-node busbw reads against g x bw_out (seed 001:
    148 GB/s "roughly 37 percent of the 400 GB/s").
    """
    if spans_nodes(s, gpus_per_node):
        return gpus_per_node * float(cluster.bw_out_bytes_per_s), "out"
    return float(cluster.bw_up_bytes_per_s), "up"


def ranks_per_node(s: dict, gpus_per_node: float) -> float:
    """k, ranks of the run a node: n / nodes when the log says, else a full node of g."""
    if s["nodes"] and s["ranks"]:
        return s["ranks"] / s["nodes"]
    return min(float(s["ranks"] or gpus_per_node), gpus_per_node)


def measured_fields(summaries: list[dict], gpus_per_node: float) -> tuple[dict, list[str]]:
    """Cluster preset fields (preset units) that the measured runs set, and notes naming the rows used.

    What the fields mean (dse.equations.topology): ``bw_out_GBps`` is one accelerator's
    scale-out rate, ``bw_up_GBps`` its scale-up rate, ``alpha_*_us`` the latency of one ring
    step. A ring collective over k ranks a node moves its busbw through k NICs a node at
    once, so one accelerator's scale-out rate is busbw / k (issue 17: the whole-job
    147.75 GB/s of seed 001 is 18.5 GB/s a GPU of a 50 GB/s NIC, not 147.75). Inside a
    node busbw is the per-GPU rate itself. alpha comes from the latency-bound rows only
    (``latency``), divided by the ring's steps; without such rows it is not written.
    All-to-all and rooted collectives have no field of their own; they are noted.
    The best plateau per tier wins (the run with the most nodes, then the fastest).
    """
    fields, notes, chosen = {}, [], {}
    for s in summaries:
        if s["collective"] not in ("all_reduce", "all_gather", "reduce_scatter"):
            notes.append(f"{s['collective']} plateau busbw {s['plateau']['busbw_bytes_per_s'] / 1e9:.2f} GB/s"
                         f" over {s['ranks'] or '?'} ranks{(' (' + s['label'] + ')') if s['label'] else ''}: no preset field")
            continue
        tier = "out" if spans_nodes(s, gpus_per_node) else "up"
        key = (s["nodes"] or 1, s["plateau"]["busbw_bytes_per_s"])
        if tier in chosen and chosen[tier][0] >= key:
            continue
        chosen[tier] = (key, s)
    for tier, (_, s) in chosen.items():
        pl, k = s["plateau"], ranks_per_node(s, gpus_per_node) if tier == "out" else 1.0
        fields[f"bw_{tier}_GBps"] = round(pl["busbw_bytes_per_s"] / k / 1e9, 3)
        what = f"{s['collective']}_perf over {s['ranks'] or '?'} ranks{' [' + s['source'] + ']' if s.get('source') else ''}"
        notes.append(f"bw_{tier}_GBps = plateau busbw {pl['busbw_bytes_per_s'] / 1e9:.2f} GB/s"
                     + (f" / {k:g} ranks a node" if k != 1 else "")
                     + f", from the {pl['rows']} rows >= {pl['from_size_bytes']:.0f} B of {what}")
        lat = s["latency"]
        if lat and "alpha_per_step_s" in lat:
            fields[f"alpha_{tier}_us"] = round(lat["alpha_per_step_s"] * 1e6, 6)
            notes.append(f"alpha_{tier}_us = {lat['alpha_s'] * 1e6:.2f} us a call / {lat['ring_steps']:g} ring steps, "
                         f"from the {lat['rows']} latency-bound rows {lat['from_size_bytes']:.0f}-"
                         f"{lat['to_size_bytes']:.0f} B")
        else:
            notes.append(f"alpha_{tier}_us kept from the base preset: {what} has no latency-bound rows "
                         f"(run it from -b 8 to measure latency)")
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


def preset_path(name: str) -> Path:
    """Where ``--save NAME`` writes: a .toml path as given, else NAME.toml in the user's preset folder."""
    if name.endswith(".toml") or "/" in name:
        return Path(name)
    if not name.replace("-", "").replace("_", "").isalnum():
        raise InputError(f"--save: {name!r} is not a preset name; allowed: letters, digits, - and _, or a .toml path")
    return presets.user_dir("clusters") / f"{name}.toml"


def save_preset(summaries: list[dict], base: dict, base_name: str, name: str, gpus_per_node: float, *,
                logs=(), force: bool = False, today: str | None = None) -> tuple[Path, dict, list[str]]:
    """Write a cluster preset: ``base`` (preset units) with the measured fields; the file must load first."""
    measured, notes = measured_fields(summaries, gpus_per_node)
    if not measured:
        raise InputError("--save: no all_reduce, all_gather or reduce_scatter run among the logs; "
                         "a preset needs one to set a bandwidth")
    path = preset_path(name)
    if path.exists() and not force:
        raise InputError(f"--save: {str(path)!r} exists; allowed: a new name, or --force to overwrite")
    today = today or datetime.date.today().isoformat()
    text = preset_toml(base, measured, notes,
                       description=f"{base_name} with bandwidths measured by nccl-tests on {today}",
                       source=f"dse nccl-tests {' '.join(logs)} (base preset {base_name})")
    presets.cluster_from_fields(tomllib.loads(text))
    if path.parent == presets.user_dir("clusters"):
        path.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(files.check_out_file(path, "--save"), text)   # atomic (dse/files.py)
    return path, measured, notes
