"""A real job's start-up log against the plan: what the job did, rebuilt from its own lines.

The log is what a job prints when seed 001's advice is followed ("print the rank map at
start-up and grep the job's log"):

- rank-map lines, ``rank map: global=8 node=gpu-node-0418 local=0 tp=0 pp=1 dp=0`` (the
  format ``dse rankmap`` prints, ``dse.ops.rankmap.format_line``);
- Megatron-LM's argument summary, ``using world size: 1024, data-parallel size: 32,
  context-parallel size: 1, ... tensor-model-parallel size: 8, pipeline-model-parallel
  size: 4`` and ``Number of virtual stages per pipeline stage: 2`` (arguments.py
  validate_args), or seed 001's ``> world size 1024, data-parallel size 32`` lines;
- torchtitan's ``Building 3-D device mesh with ['pp', 'dp_shard', 'tp'], [4, 32, 8]``
  (parallel_dims.py: names outermost first);
- NCCL INFO lines (NCCL_DEBUG=INFO): ``host:pid:tid [dev] NCCL INFO comm 0x.. rank 3 nranks
  1024 ...`` gives each rank's host, ``Channel 04/0 : 3[3] -> 11[3] via NET/IB/3`` the
  transport of each pair (``dse.ops.nccl_log``).

From those it rebuilds the plan the job ran: parallel sizes, world, virtual stages, ranks a
node, the rank order (from which rank holds coordinate 1 of each dimension) and the
rank-to-node assignment, then states every difference from the expected plan and every TP
or EP pair that NCCL carried over NET.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from dse.errors import InputError
from dse.ops import nccl_log
from dse.ops.rankmap import DEFAULT_ORDER, RankMap, format_ranks
from dse.ops.verdict import FAIL, PASS, WARN, Verdict

__all__ = ["JobLog", "read", "implied", "check"]

_RANKMAP = re.compile(r"rank map:\s*global=(\d+)\s+node=(\S+)\s+local=(\d+)((?:\s+\w+=\d+)*)")
_MEGATRON = re.compile(r"using world size:\s*(\d+),\s*data-parallel size:\s*(\d+),\s*context-parallel size:\s*(\d+),"
                       r".*?tensor-model-parallel size:\s*(\d+),\s*pipeline-model-parallel size:\s*(\d+)")
_SEED = re.compile(r">\s*world size\s+(\d+),\s*data-parallel size\s+(\d+)")
_VPP = re.compile(r"Number of virtual stages per pipeline stage:\s*(\w+)|virtual stages\s+(\d+)")
_EP = re.compile(r"expert-model-parallel size:\s*(\d+)")
# older Megatron (initialize.py): "> initialized tensor model parallel with size 8", "... pipeline ... size 4"
_INIT = re.compile(r"> initialized (tensor|pipeline|context|expert) model parallel with size (\d+)")
_INIT_DIM = {"tensor": "tp", "pipeline": "pp", "context": "cp", "expert": "ep"}
_MESH = re.compile(r"Building \d+-D device mesh with \[([^\]]*)\],\s*\[([^\]]*)\]")
_NCCL_INIT = re.compile(r"(?P<host>[\w.-]+):\d+:\d+\s+\[(?P<dev>\d+)\].*NCCL INFO .*?\brank\s+(?P<rank>\d+)\s+nranks\s+"
                        r"(?P<n>\d+)")


@dataclasses.dataclass
class JobLog:
    """What a job's log says, line numbers kept for the report."""

    framework: str | None = None     # "megatron", "torchtitan" or None
    world: int | None = None
    sizes: dict = dataclasses.field(default_factory=dict)      # from the framework's summary
    vpp: int | None = None
    ranks: dict = dataclasses.field(default_factory=dict)      # global -> {"node", "local", coords, "line"}
    hosts: dict = dataclasses.field(default_factory=dict)      # global -> host, from NCCL init lines
    channels: list = dataclasses.field(default_factory=list)
    nranks: int | None = None
    evidence: dict = dataclasses.field(default_factory=dict)   # what -> line number


def read(text: str, source: str = "log") -> JobLog:
    """Every line dse reads from a job log. Raises InputError when none is there."""
    job = JobLog()
    for i, ln in enumerate(text.splitlines(), 1):
        m = _RANKMAP.search(ln)
        if m:
            coords = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(4))}
            job.ranks[int(m.group(1))] = {"node": m.group(2), "local": int(m.group(3)), **coords, "line": i}
            continue
        m = _MEGATRON.search(ln)
        if m:
            w, d, c, t, p = (int(x) for x in m.groups())
            job.framework, job.world = "megatron", w
            job.sizes.update({"tp": t, "pp": p, "cp": c, "d": d})
            job.evidence["sizes"] = i
            continue
        m = _SEED.search(ln)
        if m:
            job.framework = job.framework or "megatron"
            job.world = int(m.group(1))
            job.sizes.setdefault("d", int(m.group(2)))
            job.evidence.setdefault("sizes", i)
        m = _VPP.search(ln)
        if m:
            v = m.group(1) or m.group(2)
            job.vpp = 1 if v in ("None", "none") else int(v)
            job.evidence["vpp"] = i
        m = _EP.search(ln)
        if m:
            job.sizes["ep"] = int(m.group(1))
        m = _INIT.search(ln)
        if m:
            job.framework = job.framework or "megatron"
            job.sizes.setdefault(_INIT_DIM[m.group(1)], int(m.group(2)))
            job.evidence.setdefault("sizes", i)
        m = _MESH.search(ln)
        if m:
            _mesh(job, m, i)
        m = _NCCL_INIT.search(ln)
        if m and "Channel" not in ln:     # every communicator's init names its rank and host: keep the largest's
            rank, n = int(m.group("rank")), int(m.group("n"))
            if n >= job.evidence.get("nccl_world", 0):
                if n > job.evidence.get("nccl_world", 0):
                    job.hosts = {}
                job.evidence["nccl_world"] = n
                job.hosts.setdefault(rank, m.group("host"))
    try:
        job.channels, job.nranks = nccl_log.parse(text, source)
    except InputError:
        job.channels, job.nranks = [], None
    if not (job.ranks or job.sizes or job.channels):
        raise InputError(f"{source}: no rank-map, Megatron, torchtitan or NCCL INFO line found (expected "
                         f"'rank map: global=..', 'using world size: ..', 'Building N-D device mesh ..' or "
                         f"'NCCL INFO Channel ..')")
    return job


def _mesh(job: JobLog, m, line: int) -> None:
    names = [x.strip().strip("'\"") for x in m.group(1).split(",") if x.strip()]
    dims = [int(x) for x in m.group(2).split(",") if x.strip()]
    if len(names) != len(dims):
        return
    mesh = dict(zip(names, dims))
    d = int(np.prod([v for k, v in mesh.items() if k.startswith("dp")])) if any(k.startswith("dp") for k in mesh) else 1
    job.framework = "torchtitan"
    job.sizes.update({"tp": mesh.get("tp", 1), "pp": mesh.get("pp", 1), "cp": mesh.get("cp", 1), "d": d})
    if "ep" in mesh:
        job.sizes["ep"] = mesh["ep"]
    job.world = int(np.prod(dims))
    job.evidence["sizes"] = line


def _node_of(job: JobLog) -> dict:
    """global rank -> node name: the rank-map lines, else the NCCL init lines."""
    out = {r: e["node"] for r, e in job.ranks.items()}
    for r, h in job.hosts.items():
        out.setdefault(r, h)
    return out


def implied(job: JobLog) -> dict:
    """The plan the log implies: sizes, world, vpp, ranks a node, rank order, assignment (what it can tell)."""
    out = {"framework": job.framework, "world": job.world, "vpp": job.vpp}
    sizes, lower = {}, set()
    if job.ranks:       # a rank map of every rank gives each size; a partial one only a lower bound
        complete = len(job.ranks) == max(job.ranks) + 1 and (job.world is None or job.world == len(job.ranks))
        for k in DEFAULT_ORDER:
            vals = [e[k] for e in job.ranks.values() if k in e]
            sizes[k] = max(vals) + 1 if vals else 1
            if not complete and vals:
                lower.add(k)
    for k in ("tp", "pp", "cp", "ep"):      # the framework's summary wins
        if k in job.sizes:
            sizes[k] = job.sizes[k]
            lower.discard(k)
    if "d" in job.sizes:
        sizes["dp"] = job.sizes["d"] // sizes.get("ep", 1)
        lower.discard("dp")
    out["sizes"], out["at_least"] = sizes, sorted(lower)
    nodes = _node_of(job)
    if nodes:
        per = {}
        for r, n in nodes.items():
            per.setdefault(n, []).append(r)
        out["ranks_per_node"] = max(len(v) for v in per.values())
        out["nodes_seen"] = len(per)
    if job.ranks:
        out["order"] = _order(job)
    return out


def _order(job: JobLog) -> list[str] | None:
    """Dimensions innermost first, from the rank that holds coordinate 1 of each (its global rank is the stride)."""
    strides = {}
    for r, e in job.ranks.items():
        hot = [k for k in DEFAULT_ORDER if e.get(k, 0) != 0]
        if len(hot) == 1 and e[hot[0]] == 1:
            strides[hot[0]] = r
    return sorted(strides, key=strides.get) if strides else None


def check(job: JobLog, rm: RankMap, *, vpp: int = 1, sp: bool = True) -> dict:
    """Verdicts for every difference between the log and the plan's rank map, and NCCL's pairs classified."""
    imp = implied(job)
    vs = [_world(job, rm), _sizes(imp, rm), _vpp(job, vpp)]
    vs += _placement(job, rm)
    pairs = []
    if job.channels:
        observed = _ObservedMap(rm, job)
        top = max(max(c.src, c.dst) for c in job.channels)
        if top >= rm.world:
            vs.append(Verdict("NCCL ranks", FAIL, f"NCCL names rank {top}; the plan has {rm.world} ranks"))
        else:
            pairs = nccl_log.classify(job.channels, observed, sp=sp)
            vs += _net_pairs(pairs)
    else:
        vs.append(Verdict("TP/EP pairs on NVLink", WARN, "no NCCL INFO Channel lines: run with NCCL_DEBUG=INFO to see "
                                                        "which transport each pair took"))
    return {"verdicts": [v for v in vs if v is not None], "pairs": pairs, "implied": imp}


def _world(job: JobLog, rm: RankMap) -> Verdict | None:
    w = job.world or (max(job.ranks) + 1 if job.ranks else None) or job.nranks
    if w is None:
        return None
    name = "world size"
    if w != rm.world:
        return Verdict(name, FAIL, f"the job ran {w} ranks (line {job.evidence.get('sizes', '?')}); the plan has {rm.world}")
    return Verdict(name, PASS, f"{w} ranks, as planned")


def _sizes(imp: dict, rm: RankMap) -> Verdict:
    name = "parallel sizes"
    got, lower = imp["sizes"], set(imp.get("at_least", ()))
    diff = [f"{k.upper()} {'at least ' if k in lower else ''}{got[k]} (plan {rm.sizes[k]})" for k in DEFAULT_ORDER
            if k in got and (got[k] > rm.sizes[k] if k in lower else got[k] != rm.sizes[k])]
    said = " ".join(f"{k}{'>=' if k in lower else '='}{got[k]}" for k in DEFAULT_ORDER if k in got)
    if not got:
        return Verdict(name, WARN, "the log states no parallel size (no rank-map or framework summary line)")
    if diff:
        return Verdict(name, FAIL, f"the job ran {', '.join(diff)}", (f"from the log: {said}",))
    return Verdict(name, PASS, f"{said}, as planned" if not lower else f"{said}: consistent with the plan "
                               f"(a partial rank map bounds {', '.join(sorted(lower))} from below)")


def _vpp(job: JobLog, vpp: int) -> Verdict | None:
    if job.vpp is None:
        return None
    name = "virtual stages"
    if job.vpp != vpp:
        return Verdict(name, FAIL, f"the job interleaves {job.vpp} virtual stages a rank (line {job.evidence['vpp']}); "
                                   f"the plan has {vpp}: the bubble is (p-1)/({job.vpp} m), not (p-1)/({vpp} m)")
    return Verdict(name, PASS, f"{vpp} virtual stage{'s' if vpp > 1 else ''} a rank, as planned")


def _placement(job: JobLog, rm: RankMap) -> list[Verdict]:
    """Coordinates and nodes of the logged ranks against the plan's rank map."""
    out = []
    if job.ranks:
        bad = [r for r, e in sorted(job.ranks.items()) if r < rm.world and
               any(int(rm.coords(r)[k]) != e.get(k, 0) for k in DEFAULT_ORDER if k in e or rm.sizes[k] > 1)]
        order = _order(job)
        if bad:
            r = bad[0]
            e = job.ranks[r]
            want = " ".join(f"{k}={int(v)}" for k, v in rm.coords(r).items() if rm.sizes[k] > 1 or k in e)
            got = " ".join(f"{k}={e[k]}" for k in DEFAULT_ORDER if k in e)
            how = f"; the job orders ranks {','.join(order)} innermost first" if order else ""
            out.append(Verdict("rank order", FAIL, f"{len(bad)} of {len(job.ranks)} logged ranks sit elsewhere than "
                                                   f"planned: rank {r} is {got} (line {e['line']}), the plan puts it at "
                                                   f"{want}{how}; the plan's order is {','.join(rm.order)}"))
        else:
            out.append(Verdict("rank order", PASS, f"all {len(job.ranks)} logged ranks have the planned coordinates"))
    nodes = _node_of(job)
    if nodes:
        out.append(_nodes(nodes, job, rm))
    return out


def _nodes(nodes: dict, job: JobLog, rm: RankMap) -> Verdict:
    name = "ranks a node"
    per = {}
    for r, n in nodes.items():
        per.setdefault(n, set()).add(r)
    over = [n for n, rs in per.items() if len(rs) > rm.gpus_per_node]
    if over:
        return Verdict(name, FAIL, f"node {over[0]} holds {len(per[over[0]])} ranks; the plan has {rm.gpus_per_node} a node")
    split = []   # planned node-mates the job put on different nodes
    for n, rs in per.items():
        planned = {int(rm.node_index(r)) for r in rs if r < rm.world}
        if len(planned) > 1:
            split.append((n, sorted(rs)))
    # TP groups that the job's own placement splits over nodes (the failure that matters)
    tp_split = []
    for g in rm.groups("tp"):
        hosts = {nodes[int(r)] for r in g if int(r) in nodes}
        if len(hosts) > 1:
            tp_split.append(g)
    if tp_split:
        g = tp_split[0]
        return Verdict(name, FAIL, f"{len(tp_split)} TP groups span nodes in the job (first: ranks {format_ranks(g)} on "
                                   f"{', '.join(sorted({nodes[int(r)] for r in g if int(r) in nodes}))}): the launcher "
                                   f"did not give each node consecutive ranks ({rm.assignment} planned)")
    if split:
        n, rs = split[0]
        return Verdict(name, WARN, f"node {n} holds ranks {format_ranks(rs)}, which the plan puts on different nodes "
                                   f"({rm.assignment} assignment); no TP group is split")
    return Verdict(name, PASS, f"{len(per)} nodes seen, each holding the ranks the plan puts there")


def _net_pairs(pairs: list[dict]) -> list[Verdict]:
    tp = [p for p in pairs if p["dimension"] in ("TP", "TP/SP") and p["kind"] == "NET"]
    ep = [p for p in pairs if p["dimension"] == "EP" and p["kind"] == "NET"]
    out = []
    if tp:
        out.append(Verdict("TP pairs on NVLink", FAIL, f"{len(tp)} TP pair{'s' if len(tp) > 1 else ''} over NET: "
                                                       + "; ".join(f"{p['src']} -> {p['dst']} via {p['via']} (line "
                                                                   f"{p['line']})" for p in tp[:4])))
    else:
        n = sum(p["dimension"] in ("TP", "TP/SP") for p in pairs)
        out.append(Verdict("TP pairs on NVLink", PASS, f"{n} TP pair{'s' if n != 1 else ''} in the log, none over NET"))
    if ep:
        out.append(Verdict("EP pairs on NVLink", WARN, f"{len(ep)} EP pair{'s' if len(ep) > 1 else ''} over NET: "
                                                       + "; ".join(f"{p['src']} -> {p['dst']} via {p['via']} (line "
                                                                   f"{p['line']})" for p in ep[:4])))
    return out


class _ObservedMap:
    """The plan's coordinates with the job's own nodes (``nccl_log.classify`` asks coords and node_index)."""

    def __init__(self, rm: RankMap, job: JobLog):
        self._rm = rm
        self._nodes = _node_of(job)
        self._index = {}
        self._coords = {r: {k: e.get(k, 0) for k in DEFAULT_ORDER} for r, e in job.ranks.items()}

    def coords(self, rank):
        r = int(rank)
        return self._coords.get(r) or {k: int(v) for k, v in self._rm.coords(r).items()}

    def node_index(self, rank):
        """An index of the rank's node: the job's host where the log names it, else the planned node's name."""
        r = int(rank)
        name = self._nodes.get(r) or self._rm.node_name(int(self._rm.node_index(r)))
        return self._index.setdefault(name, len(self._index))
