import os
import resource
import tempfile
import time

# One OpenBLAS thread, as the dse command asks for (dse/__init__.py): this process and the dse
# processes and notebook kernel the tests start (they inherit it) multiply no matrices, and each
# extra BLAS thread spins ~0.1 CPU-s when numpy loads. Set before this process imports numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

# Compiled programs persist across test sessions in a tmp dir, never the user's home
# (dse/engines/compiled.py; keys hold dse's source hash, so a changed equation recompiles).
os.environ.setdefault("DSE_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"dse-test-cache-{os.getuid()}"))

from dse.engines.compiled import enable_persistent_cache  # noqa: E402

enable_persistent_cache()
# Every program, however quick to compile, goes to the test cache: the tests that differentiate
# eagerly (gradients through the topologies, the optimizer's per-start check) compile ~100 small
# programs each, which dse's 0.2 s floor (engines/compiled.py) leaves out; a second run loads them.
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

# Single plans and pinned numbers are checked in float64 (DESIGN.md, Conventions).
jax.config.update("jax_enable_x64", True)


# ---------------------------------------------------------------- what each test costs
# `DSE_TEST_COST=1 python3 -m pytest ...` prints, at the end, the tests that cost the most CPU
# (this process and the subprocesses it waited for) with the XLA compiles each triggered and
# their compile seconds (JAX's monitoring events), and the total per folder. Set it to a path
# ending in .json to also write every test's figures there. Measurements, never assertions.

_COST = os.environ.get("DSE_TEST_COST", "")
_STATS: dict = {}
_NOW = {"compiles": 0, "compile_s": 0.0, "trace_lower_s": 0.0}


def _on_duration(event, seconds, **_):
    if event == "/jax/core/compile/backend_compile_duration":
        _NOW["compiles"] += 1
        _NOW["compile_s"] += seconds
    elif event in ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration"):
        _NOW["trace_lower_s"] += seconds


def _cpu():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def pytest_configure(config):
    if _COST:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(_on_duration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _COST:
        yield
        return
    _NOW.update(compiles=0, compile_s=0.0, trace_lower_s=0.0)
    w0, (c0, k0) = time.perf_counter(), _cpu()
    yield
    (c1, k1) = _cpu()
    _STATS[item.nodeid] = {"wall_s": time.perf_counter() - w0, "cpu_s": c1 - c0, "child_cpu_s": k1 - k0, **_NOW}


def pytest_terminal_summary(terminalreporter):
    if not _COST or not _STATS:
        return
    import json

    tr = terminalreporter
    cost = lambda v: v["cpu_s"] + v["child_cpu_s"]  # noqa: E731
    tr.section("CPU per test (DSE_TEST_COST)")
    for node, v in sorted(_STATS.items(), key=lambda kv: -cost(kv[1]))[:30]:
        tr.write_line(f"{cost(v):7.1f} CPU-s ({v['child_cpu_s']:5.1f} in subprocesses) {v['wall_s']:7.1f} s wall "
                      f"{v['compiles']:4d} compiles ({v['compile_s']:5.1f} s)  {node}")
    folders: dict = {}
    for node, v in _STATS.items():
        parts = node.split("::")[0].split("/")
        f = folders.setdefault(parts[1] if len(parts) > 2 else "tests/*.py", [0, 0.0, 0.0, 0])
        f[0] += 1
        f[1] += cost(v)
        f[2] += v["wall_s"]
        f[3] += v["compiles"]
    for name, (n, c, w, k) in sorted(folders.items(), key=lambda kv: -kv[1][1]):
        tr.write_line(f"{name:<12} {n:4d} tests {c:8.1f} CPU-s {w:8.1f} s wall {k:6d} compiles")
    tr.write_line(f"{'total':<12} {len(_STATS):4d} tests {sum(cost(v) for v in _STATS.values()):8.1f} CPU-s "
                  f"(load average {os.getloadavg()[0]:.2f})")
    if _COST.endswith(".json"):
        with open(_COST, "w") as fh:
            json.dump(_STATS, fh, indent=0)
