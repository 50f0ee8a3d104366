"""dse.backend: the equations' array namespace, with jax imported only when something needs it.

A process that asks only numpy questions (``dse plan``, a sweep on the host engine) must not
import jax: that import was most of the CPU time of the README's main job (issue 16,
benchmarks/time_to_answer.py). The pytrees and the float64 switch still work whoever imports
jax, and whenever.
"""

import os
import subprocess
import sys

import numpy as np

import dse
from dse import backend
from dse.inputs import presets

_HOST_JOBS = """
import sys
from dse.cli import main
assert main(["plan", "--preset", "gpt3-175b", "--tp", "8", "--pp", "8", "--gbs", "1024"]) == 0
assert main(["plan", "--preset", "llama3-8b", "--cluster", "h100-sxm", "--tp", "2", "--pp", "1", "--gbs", "1024", "--json"]) == 0
assert main(["sweep", "sweeps/llama3-405b-h100.toml", "--engine", "host", "--quiet"]) == 0
print("JAX", "jax" in sys.modules)
"""


def test_plan_and_host_sweep_never_import_jax():
    out = subprocess.run([sys.executable, "-c", _HOST_JOBS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "JAX False"


_LATE_JAX = """
import dse
from dse.inputs import presets
plan = dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024)
m, c = presets.load_model("gpt3-175b"), presets.load_cluster("seed")
rep = dse.evaluate(m, c, plan)               # numpy: jax not imported yet
import jax                                   # after the classes were defined
leaves = jax.tree_util.tree_leaves(plan)
# a pytree in and out of a jitted function and of a gradient (small programs: the registration
# is what is tested; jit(evaluate) is tests/test_evaluate_invariants.py's)
doubled = jax.jit(lambda p: p.replace(tp=2.0 * p.tp))(plan)
g = jax.grad(lambda p: p.tp * p.pp)(plan.replace(tp=8.0, pp=8.0))
nested = jax.tree_util.tree_map(lambda x: x * 0.0, rep)
print(len(leaves), len(plan.to_dict()), float(doubled.tp) == 16.0 and float(g.pp) == 8.0,
      bool(float(nested.wire_s.tp) == 0.0 and type(nested) is type(rep)))
"""


def test_pytrees_registered_when_jax_comes_later():
    out = subprocess.run([sys.executable, "-c", _LATE_JAX], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    n_leaves, n_fields, ran, finite = out.stdout.split()
    assert n_leaves == n_fields and ran == "True" and finite == "True"


def test_tree_helpers_without_jax_match_jax():
    # The fallback used before jax is imported walks the same leaves, in the same order, as jax's.
    import jax

    m, c = presets.load_model("gpt3-175b"), presets.load_cluster("seed")
    with backend.numpy_mode():
        rep = dse.evaluate(m, c, dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024))
    ours, theirs = backend._leaves(rep), jax.tree_util.tree_leaves(rep)
    assert len(ours) == len(theirs) and all(a is b for a, b in zip(ours, theirs))
    doubled = backend._map(lambda x: np.asarray(x) * 2, rep)
    assert type(doubled) is type(rep)
    assert float(doubled.step_s) == 2 * float(rep.step_s) and float(doubled.wire_s.tp) == 2 * float(rep.wire_s.tp)


def test_numpy_mode_is_numpy_and_thread_local():
    import threading

    with backend.numpy_mode():
        assert backend.jnp.maximum is np.maximum
        seen = []
        t = threading.Thread(target=lambda: seen.append(backend.host_active()))
        t.start()
        t.join()
        assert seen == [False]
    assert not backend.host_active()


def test_a_traced_evaluate_folds_what_its_constants_decide(monkeypatch):
    """Under a jax trace, what ``evaluate`` works out from concrete inputs alone (here everything
    but tp: the model's shape, the cluster, the fidelity) runs in numpy while tracing
    (backend.folding), not as equations of the program. Off, the same function stages every jnp
    call; folded it stages under 70% as many equations (61% since round 19 stopped tracing what the
    concrete inputs rule out in either mode; 55% before), and the compiled float64 program gives the
    host's numbers."""
    import jax

    model, cluster = presets.load_model("llama3-8b"), presets.load_cluster("seed", gpus=64)

    def step(tp):
        return dse.evaluate(model, cluster, dse.Plan.make(tp=tp, pp=2, mbs=1, gbs=256), "calibrated").step_s

    folded = jax.make_jaxpr(step)(2.0)
    with monkeypatch.context() as m:
        m.setattr(backend, "FOLDING", False)
        staged = jax.make_jaxpr(lambda tp: step(tp))(2.0)   # a new function: jax caches traces by function
    assert len(folded.eqns) < 0.7 * len(staged.eqns), (len(folded.eqns), len(staged.eqns))   # 1,748 vs 2,873
    for tp in (1.0, 2.0, 8.0):
        np.testing.assert_allclose(float(jax.jit(step)(tp)), float(step(tp)), rtol=1e-13)


def test_folding_leaves_large_results_to_jax(monkeypatch):
    """Inside ``folding()`` a call of constants runs in numpy (in the program's float dtype) unless
    its result would exceed FOLD_SIZE elements: then jax builds it, and numpy is never asked to
    (a chunk-sized numpy temporary dropped while tracing cost a 9.95M-plan dump 0.2 GB of peak
    memory through glibc's mmap threshold)."""
    import jax

    asked = []
    zeros, maximum = np.zeros, np.maximum
    monkeypatch.setattr(np, "zeros", lambda shape, *a, **k: asked.append(("zeros", tuple(shape))) or zeros(shape, *a, **k))
    monkeypatch.setattr(np, "maximum", lambda x, y, *a, **k: asked.append(("maximum", np.shape(x), np.shape(y)))
                        or maximum(x, y, *a, **k))
    monkeypatch.setattr(backend, "_FOLDED", {})      # the folding forms bind numpy's functions when made
    with backend.folding(np.float32):
        small = backend.jnp.maximum(np.ones(3), 2.0)
        few = backend.jnp.zeros((2, 3))
        big_shape = backend.jnp.zeros((100, 100))                    # 10,000 > FOLD_SIZE elements
        big_broadcast = backend.jnp.maximum(np.ones((100, 1)), np.ones((1, 100)))
    assert isinstance(small, np.ndarray) and small.dtype == np.float32 and small.tolist() == [2.0] * 3
    assert isinstance(few, np.ndarray) and few.dtype == np.float32
    assert isinstance(big_shape, jax.Array) and isinstance(big_broadcast, jax.Array)
    assert big_broadcast.shape == (100, 100)
    assert asked == [("maximum", (3,), ()), ("zeros", (2, 3))]


_BLAS = "import os, sys; {argv}import dse; print(os.environ.get('OPENBLAS_NUM_THREADS'))"


def test_only_the_command_asks_for_one_blas_thread(monkeypatch):
    # dse/__init__.py: the dse command (its console script, or python -m dse, whose package is imported
    # while sys.argv[0] is "-m") sets OPENBLAS_NUM_THREADS to 1 before numpy is imported, unless the
    # user set it; a program that imports dse as a library keeps its BLAS threads
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/dse", "plan"])
    assert dse._is_command()
    monkeypatch.setattr(sys, "argv", ["-m"])
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-m", "dse", "plan"])
    assert dse._is_command()
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-X", "importtime", "-u", "-m", "dse", "plan"])
    assert dse._is_command()
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-m", "pytest", "-m", "dse"])   # another module's arguments
    assert not dse._is_command()
    monkeypatch.setattr(sys, "argv", ["notebook.py"])
    monkeypatch.setattr(sys, "orig_argv", ["python3", "notebook.py"])
    assert not dse._is_command()
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    for argv, extra, want in (("sys.argv[0] = '/usr/local/bin/dse'; ", {}, "1"),
                              ("sys.argv[0] = '/usr/local/bin/dse'; ", {"OPENBLAS_NUM_THREADS": "3"}, "3"),
                              ("", {}, "None")):
        out = subprocess.run([sys.executable, "-c", _BLAS.format(argv=argv)], capture_output=True, text=True,
                             env={**env, **extra}, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == want, (argv, extra)
