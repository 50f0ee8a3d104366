"""NCCL transport lines (NCCL_DEBUG=INFO): which transport each channel picked, per plan dimension.

NCCL prints, for every channel of every communicator it sets up,

    [host:pid:tid [dev]] NCCL INFO Channel 04/0 : 3[3] -> 11[3] [send] via NET/IB/3/GDRDMA

``a[x] -> b[y]``: ranks a and b, with the device or bus id in brackets; the transport
after ``via``: ``P2P/...`` (NVLink or PCIe peer access), ``NVL``/``NVLS`` (NVLink
SHARP), ``SHM`` (host memory), ``NET/<plugin>/<dev>`` (the NIC), ``CollNet``. That line
is the ground truth of where a dimension landed (seed 001, "Building and Operating
It"). Each pair is mapped to the plan's coordinates with the rank map: a pair that
differs only in tp is a TP (and sequence-parallel) pair, and TP over NET is the
failure the seed warns about.
"""

from __future__ import annotations

import dataclasses
import re

from dse.errors import InputError
from dse.ops.rankmap import DEFAULT_ORDER, RankMap

__all__ = ["Channel", "parse", "classify", "transport_kind", "check_ranks"]

_CHANNEL = re.compile(
    r"NCCL INFO Channel\s+(?P<ch>\d+)(?:/(?P<of>\d+))?\s*:\s*(?P<a>\d+)\[(?P<da>[^\]]*)\]\s*->\s*"
    r"(?P<b>\d+)\[(?P<db>[^\]]*)\](?:\s*\[(?P<dir>send|receive)\])?\s+via\s+(?P<via>\S+(?:\s+\S+)?)")
_NRANKS = re.compile(r"NCCL INFO .*?\bnranks\s+(\d+)", re.IGNORECASE)   # "comm 0x.. rank 0 nranks 16 ..." 


def transport_kind(via: str) -> str:
    """NET, P2P, NVL (NVLS/NVL), SHM, COLLNET or OTHER from the text after 'via'."""
    head = via.split("/")[0].upper()
    for k in ("NET", "P2P", "SHM", "COLLNET"):
        if head.startswith(k):
            return k
    if head.startswith("NVL"):
        return "NVL"
    return "OTHER"


@dataclasses.dataclass(frozen=True)
class Channel:
    line_no: int
    channel: int
    src: int
    dst: int
    via: str           # as printed: "NET/IB/3", "P2P/direct pointer", ...
    kind: str          # transport_kind(via)
    text: str          # the line, stripped


def parse(text: str, source: str = "log") -> tuple[list[Channel], int | None]:
    """Channel lines, and the largest communicator size the log states (None if it does not)."""
    out, nranks = [], None
    for i, ln in enumerate(text.splitlines(), 1):
        m = _CHANNEL.search(ln)
        if m:
            via = m.group("via")
            via = via.split("#")[0].strip()
            kind = transport_kind(via)
            if kind != "P2P" and " " in via:       # "P2P/direct pointer" keeps its second word only
                via = via.split()[0]
            out.append(Channel(i, int(m.group("ch")), int(m.group("a")), int(m.group("b")), via, kind, ln.strip()))
            continue
        n = _NRANKS.search(ln)
        if n:
            v = int(n.group(1))
            nranks = v if nranks is None else max(nranks, v)
    if not out:
        raise InputError(f"{source}: no NCCL transport lines found (expected 'NCCL INFO Channel xx/x : a[a] -> b[b] "
                         f"via P2P|NVL|SHM|NET/...', from NCCL_DEBUG=INFO)")
    return out, nranks


def _dims_differ(rm: RankMap, a: int, b: int) -> list[str]:
    ca, cb = rm.coords(a), rm.coords(b)
    return [k for k in DEFAULT_ORDER if int(ca[k]) != int(cb[k])]


def classify(channels: list[Channel], rm: RankMap, sp: bool = True) -> list[dict]:
    """Each unique (src, dst, transport) with the plan dimension it serves and a verdict.

    FAIL: a TP pair (or SP: it lives in the TP group) over NET. WARN: a TP pair on
    another inter-node transport (SHM across sockets is still not NVLink), or a CP/EP
    pair over NET (allowed, but latency-bound or bisection-bound, seed 001 table).
    PASS otherwise (PP and DP are expected on the network).
    """
    seen, rows = set(), []
    for c in channels:
        key = (c.src, c.dst, c.kind)
        if key in seen:
            continue
        seen.add(key)
        dims = _dims_differ(rm, c.src, c.dst)
        dim = dims[0] if len(dims) == 1 else ("+".join(dims) if dims else "self")
        same_node = int(rm.node_index(c.src)) == int(rm.node_index(c.dst))
        label = "TP/SP" if dim == "tp" and sp else dim.upper()
        status, why = "PASS", ""
        if dim == "tp" and c.kind == "NET":
            status, why = "FAIL", "TP pair over the network: it must stay inside one NVLink domain"
        elif dim == "tp" and c.kind not in ("P2P", "NVL"):
            status, why = "WARN", f"TP pair on {c.kind}, not NVLink"
        elif dim in ("cp", "ep") and c.kind == "NET":
            status, why = "WARN", f"{dim.upper()} pair over the network"
        elif same_node and c.kind == "NET":
            why = "note: two ranks of one node talk over the NIC (P2P disabled, or GPU order by PCI not NVML?)"
        rows.append({"line": c.line_no, "channel": c.channel, "src": c.src, "dst": c.dst, "via": c.via,
                     "kind": c.kind, "dimension": label, "same_node": same_node,
                     "src_coords": {k: int(v) for k, v in rm.coords(c.src).items()},
                     "dst_coords": {k: int(v) for k, v in rm.coords(c.dst).items()},
                     "status": status, "why": why})
    return rows


def check_ranks(channels: list[Channel], nranks: int | None, rm: RankMap, source: str) -> None:
    """The log's ranks must fit the plan: every rank < world, the world communicator of the same size."""
    top = max(max(c.src, c.dst) for c in channels)
    if top >= rm.world:
        raise InputError(f"{source}: names rank {top} but the plan has {rm.world} ranks (0..{rm.world - 1}); "
                         f"expected the log of this plan's job")
    if nranks is not None and nranks != rm.world:
        raise InputError(f"{source}: its largest communicator has {nranks} ranks but the plan has {rm.world}; "
                         f"expected the log of this plan's job")

