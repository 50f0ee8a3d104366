"""Compile once, reuse: programs cached in memory and on disk; the exact (numpy) path equals eager ``evaluate``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dse import Plan, evaluate
from dse.engines import compiled
from dse.inputs import presets


def _leaves_equal(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
                                      for x, y in zip(la, lb))


@pytest.mark.parametrize("fidelity", ["seed", "calibrated"])
def test_exact_path_is_eager_evaluate_bit_for_bit(fidelity):
    """The exact path (``evaluate`` by numpy in float64, engines/host.py) gives eager ``evaluate``'s
    numbers exactly, for one plan and for a batch (tp 1..8 of Llama 3 8B on 64 GPUs)."""
    model, cluster = presets.load_model("llama3-8b"), presets.load_cluster("seed", gpus=64)
    one = Plan.make(tp=8, pp=2, mbs=1, gbs=256)
    assert _leaves_equal(compiled.evaluate_exact(model, cluster, one, fidelity), evaluate(model, cluster, one, fidelity))
    batch = Plan.make(tp=jnp.array([1.0, 2.0, 4.0, 8.0]), pp=2, mbs=1, gbs=256)
    got = compiled.evaluate_exact(model, cluster, batch, fidelity)
    assert np.shape(got.step_s) == (4,)
    assert _leaves_equal(got, jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (4,)),
                                                     evaluate(model, cluster, batch, fidelity)))


def test_a_second_process_loads_instead_of_compiling(tmp_path, monkeypatch):
    monkeypatch.setenv("DSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiled, "_MEMORY", {})
    x = jnp.arange(4.0)
    builds = []

    def build():
        builds.append(1)
        return jax.jit(lambda v: v * 3.0 + 1.0).lower(x).compile()

    assert np.array_equal(compiled.load_or_compile(("t", 1), build)(x), x * 3 + 1) and len(builds) == 1
    assert len(list((tmp_path / "exe").glob("*.pkl"))) == 1
    monkeypatch.setattr(compiled, "_MEMORY", {})            # a fresh process: nothing in memory
    assert np.array_equal(compiled.load_or_compile(("t", 1), build)(x), x * 3 + 1) and len(builds) == 1
    compiled.load_or_compile(("t", 2), build)               # another key compiles
    assert len(builds) == 2


def test_unreadable_cache_file_is_compiled_again(tmp_path, monkeypatch):
    monkeypatch.setenv("DSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiled, "_MEMORY", {})
    x = jnp.arange(3.0)
    build = lambda: jax.jit(lambda v: v + 2.0).lower(x).compile()  # noqa: E731
    compiled.load_or_compile(("u",), build)
    (path,) = (tmp_path / "exe").glob("*.pkl")
    path.write_bytes(b"not a program")
    monkeypatch.setattr(compiled, "_MEMORY", {})
    assert np.array_equal(compiled.load_or_compile(("u",), build)(x), x + 2)


def test_cache_dir_off_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("DSE_CACHE_DIR", "off")
    assert compiled.cache_dir() is None
    monkeypatch.delenv("DSE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compiled.cache_dir() == tmp_path / "dse"


def test_numpy_mode_is_scoped_to_its_block_and_thread():
    """Inside numpy_mode the equations return numpy arrays in this thread only; outside, and in
    other threads at the same time, they are jax (jit still traces them)."""
    import threading

    from dse.engines import host
    from dse.equations import steps

    x = np.array([-1.0, 2.0])
    seen = []
    with host.numpy_mode():
        got = steps.relu(x)
        t = threading.Thread(target=lambda: seen.append(steps.relu(x)))
        t.start()
        t.join()
    assert type(got) is np.ndarray and np.array_equal(got, [0.0, 2.0])
    assert isinstance(seen[0], jax.Array)
    assert isinstance(steps.relu(x), jax.Array)
    assert np.array_equal(jax.jit(steps.relu)(x), [0.0, 2.0])


def test_small_sweeps_compile_for_compile_time():
    """A sweep kernel of at most FIRST_POINTS plans compiles compile-first (its loop is milliseconds
    at any optimization level); bigger ones keep XLA's optimized code (at 967,680 plans the
    compile-first loop was 20x slower for no shorter compile: kernel.py)."""
    from dse.engines.sweep import kernel

    small = kernel.compile_options(np.float32, "cpu", 512)
    big = kernel.compile_options(np.float32, "cpu", 967_680)
    assert small == {**kernel.FLOAT32_OPTIONS, **compiled.COMPILE_FIRST}
    assert big == kernel.FLOAT32_OPTIONS
    assert kernel.compile_options(np.float32, "gpu", 512) == {}


def test_cpu_options_stay_on_the_cpu(monkeypatch):
    """XLA:CPU's compile options are not the GPU compiler's: on an H200, `dse codesign` failed with
    "No such compile option: 'xla_cpu_use_fusion_emitters'" (the optimizer and the sensitivity program
    passed them on every platform). compiled.cpu_options gives them to CPU compiles only. The
    co-design optimizer compiles for the CPU wherever JAX also sees an accelerator (there XLA:GPU took
    13.9 s to compile it against XLA:CPU's 4.5 s: codesign/compiled.py), with its options, and says so in
    its key."""
    from dse.engines.codesign.compiled import OPTIMIZER_OPTIONS, OPTIMIZER_PLATFORM, Program

    assert compiled.cpu_options(OPTIMIZER_OPTIONS, "cpu") == OPTIMIZER_OPTIONS
    assert compiled.cpu_options(OPTIMIZER_OPTIONS, "gpu") is None
    assert compiled.cpu_options({}, "cpu") is None
    seen = []
    real = compiled.load_or_compile
    monkeypatch.setattr(compiled, "load_or_compile",
                        lambda key, build, devices=None: seen.append((key, devices)) or real(key, build, devices))
    prog = Program(lambda x: x * 2.0, ("test", "cpu_options"), OPTIMIZER_OPTIONS, OPTIMIZER_PLATFORM)
    out = prog(np.float64(3.0))
    key, devices = seen[0]
    assert float(out) == 6.0 and [d.platform for d in devices] == ["cpu"]
    assert key[-1] == repr(OPTIMIZER_OPTIONS) and list(out.devices())[0].platform == "cpu"


def test_options_this_xla_lacks_are_dropped(monkeypatch):
    """jax 0.11.2's XLA:CPU has no xla_cpu_use_fusion_emitters and refused every compile that named it
    (co-design, sensitivities, float32 sweeps: 'No such compile option'). compile_lowered drops an
    option XLA refuses, for the rest of the process, and compiles with the others."""
    monkeypatch.setattr(compiled, "_UNKNOWN_OPTIONS", set())
    lowered = jax.jit(lambda x: x * 2.0).lower(np.float32(3.0))
    fake = "xla_cpu_no_such_option_in_any_xla"
    exe = compiled.compile_lowered(lowered, {fake: True, "xla_backend_optimization_level": 0})
    assert float(exe(np.float32(3.0))) == 6.0 and compiled._UNKNOWN_OPTIONS == {fake}
    with pytest.raises(Exception, match="No such compile option"):     # XLA itself still refuses it
        lowered.compile({fake: True})
