"""The array namespace of dse's equations: jax.numpy, or numpy on the host, and jax only when used.

Every module that computes (the inputs, the equations, ``evaluate``, the report) writes
``from dse.backend import jnp`` and calls ``jnp.where``, ``jnp.maximum``, ... as it would call
jax.numpy. Those calls are answered by numpy (float64) inside ``numpy_mode()`` in this thread
(dse/engines/host.py says when that pays), and everywhere while no one has imported jax; by
jax.numpy otherwise. dse imports jax only where it compiles or differentiates (the XLA sweep
kernel, co-design, sensitivities, the fit), so ``dse plan``, ``dse validate`` and a sweep on the
host engine never import it: that import was most of their start-up (benchmarks/time_to_answer.py).
numpy float64 is the precision dse's single plans use anyway (DESIGN.md, Conventions), and its
IEEE operations give the compiled float64 program's results bit for bit
(tests/engines/test_compiled.py).

Three things need jax itself, and each waits for it:
- ``register_dataclass``: dse's inputs and reports are JAX pytrees. A class defined before jax is
  imported is registered the moment jax is (a one-shot import hook), so ``jax.jit(dse.evaluate)``
  and ``jax.grad`` see them whoever imports jax first.
- ``enable_x64()`` and ``on_jax(fn)``: configuration (float64, the compilation cache), applied
  when jax is imported (or now, if it is).
- ``nn`` and ``lax``: the smooth relaxations (dse/equations/steps.py) use jax's own functions
  under jit and grad, and numpy forms of the same three (softplus, sigmoid, stop_gradient) on
  the host.

``evaluate`` runs on the host whenever its inputs are concrete, jax imported or not
(``host_when_concrete``): eager jax.numpy costs ~20x numpy for one plan, and traces nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.abc
import importlib.util
import math
import sys
import threading

import numpy as np

__all__ = ["jnp", "nn", "lax", "numpy_mode", "host_active", "register_dataclass", "enable_x64", "on_jax", "x64", "load_jax",
           "tree_leaves", "tree_map", "process_count", "jax_ready", "on_host",
           "host_when_concrete"]

_LOCAL = threading.local()
_LOCK = threading.RLock()
_PENDING: list = []          # classes waiting for jax to be imported
_CALLBACKS: list = []        # on_jax calls waiting for jax
_REGISTERED: set = set()     # dse's pytree dataclasses


def host_active() -> bool:
    """True inside ``numpy_mode()`` in this thread."""
    return getattr(_LOCAL, "on", False)


def on_host() -> bool:
    """True where ``jnp`` is numpy: inside ``numpy_mode()``, or anywhere while no one has imported
    jax (a process that never compiles computes in float64 numpy throughout)."""
    return getattr(_LOCAL, "on", False) or not _jax_ready()


def numpy_mode():
    """Inside the block, this thread's ``jnp`` calls compute in numpy (float64 by default: Python
    numbers become float64 arrays); floating-point warnings are off, as in XLA."""
    return _thread_setting("on", True)


@contextlib.contextmanager
def _thread_setting(name, value):
    """``_LOCAL.<name>`` is ``value`` in this thread inside the block (numpy's floating-point warnings
    off), what it was after."""
    outer = _LOCAL.__dict__.get(name)
    setattr(_LOCAL, name, value)
    try:
        with np.errstate(all="ignore"):
            yield
    finally:
        setattr(_LOCAL, name, outer)


def host_when_concrete(fn):
    """``fn`` (``evaluate``, the network cost, the torus mappings) in numpy whenever its inputs are
    concrete values, jax imported or not.

    Outside a jax transformation (no input is a tracer) there is nothing to trace, and numpy
    runs one plan's equations in ~15 ms where eager jax.numpy takes ~0.35 s (each op its own
    dispatch, the first call of each op shape a compile of its own): jax arrays are copied to
    the host once, the result is numpy arrays of the inputs' dtypes, the numbers those of the
    compiled program (IEEE ops; tests/engines/test_compiled.py). Under ``jit``, ``vmap`` or
    ``grad`` some inputs are tracers and ``fn`` traces through jax.numpy, its concrete inputs as
    numpy and inside ``folding()``: what they alone decide is computed on the host while tracing.
    The relaxed model (``sharpness``) of concrete inputs runs in numpy as well (``_HOST``)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        jax = sys.modules.get("jax")
        if on_host():
            # jax arrays given in numpy mode (a fit's batch) as numpy too: an operator on one would
            # dispatch to jax and compile an eager op (a calibration fit's final loss: 48 compiles)
            host = args if jax is None else jax.tree_util.tree_map(_to_host(jax), args)
            with np.errstate(all="ignore"):
                return fn(*host, **kwargs)
        leaves = jax.tree_util.tree_leaves((args, kwargs))
        traced = [x for x in leaves if is_traced(x)]
        if not traced:
            host = jax.tree_util.tree_map(_to_host(jax), args)
            with numpy_mode():
                return fn(*host, **kwargs)
        if not FOLDING:
            return fn(*args, **kwargs)
        with folding(_float_dtype(traced)):
            return fn(*jax.tree_util.tree_map(_to_host(jax), args), **kwargs)
    return wrapper


def _to_host(jax):
    """A jax array's leaf as numpy (a tracer stays as it is)."""
    return lambda x: np.asarray(x) if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) else x


def is_traced(x) -> bool:
    """Whether ``x`` is a jax tracer (inside ``jit``, ``vmap``, ``grad``); False before jax is imported."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.core.Tracer)


def load_jax():
    """The jax module (imported now if it is not yet; dse's pending pytrees registered with it)."""
    mod = sys.modules.get("jax")
    if mod is None or not hasattr(mod, "tree_util"):
        mod = importlib.import_module("jax")
    _after_jax(mod)
    return mod


class _Namespace:
    """``jnp`` of dse's modules: numpy inside ``numpy_mode()`` in this thread, else jax.numpy
    (each call folded to numpy when none of its arguments is traced, inside ``folding()``)."""

    def __getattr__(self, name):   # every jnp call of the equations comes here: kept short
        local = _LOCAL.__dict__
        if local.get("on") or not _jax_ready():
            fn = _NP_ATTRS.get(name, _UNSEEN)
            if fn is _UNSEEN:
                fn = _NP_ATTRS[name] = getattr(np, name, _UNSEEN)
            if fn is not _UNSEEN:
                return fn
        elif local.get("fold") is not None:
            fn = _FOLDED.get(name)
            if fn is None:
                fn = _FOLDED[name] = _folded(getattr(_JNP[0] or _jax_numpy(), name), getattr(np, name, None))
            return fn
        return getattr(_JNP[0] or _jax_numpy(), name)

    def __repr__(self):
        return f"<dse jnp: {'numpy' if on_host() else 'jax.numpy'}>"


class _JaxAttr:
    """A jax submodule (``jax.nn``, ``jax.lax``) resolved on first use; on the host, the numpy
    form of the few functions the relaxations use (``_HOST``), so the relaxed model of concrete
    inputs runs in numpy too (``host_when_concrete``)."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, name):
        if on_host():
            fn = _HOST.get((self._name, name))
            if fn is not None:
                return fn
        return getattr(getattr(load_jax(), self._name), name)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))     # jax.nn.sigmoid is lax.logistic: 1 / (1 + e^-x)


def _softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))      # jax.nn.softmax: exp(x - max) / sum
    return e / np.sum(e, axis=axis, keepdims=True)


def _logsumexp(a, axis=None, keepdims=False):
    m = np.max(a, axis=axis, keepdims=True)                  # jax.nn.logsumexp: shifted by a finite max
    m = np.where(np.isfinite(m), m, 0.0)
    out = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def _fori_loop(lower, upper, body, init):
    x = init                                                 # jax.lax.fori_loop, as a Python loop
    for i in range(lower, upper):
        x = body(i, x)
    return x


_HOST = {("nn", "softplus"): lambda x: np.logaddexp(x, 0.0),     # jax.nn.softplus: logaddexp(x, 0)
         ("nn", "sigmoid"): _sigmoid,
         ("nn", "softmax"): _softmax,
         ("nn", "logsumexp"): _logsumexp,
         ("lax", "fori_loop"): _fori_loop,
         ("lax", "stop_gradient"): lambda x: x}                  # no gradient is taken on the host


# ---------------------------------------------------------------- constant folding under a trace

FOLDING = True          # host_when_concrete folds a traced call's constants (off: every jnp call staged)
FOLD_SIZE = 4096        # elements: a folded result larger than this is left to jax (a big constant costs memory traffic)
_FOLDED: dict = {}          # jnp name -> the folding form of that function (or jax's attribute)


def folding(dtype):
    """Inside the block, this thread's ``jnp`` calls whose arguments hold no tracer run in numpy
    (their floats in ``dtype``), so what a traced ``evaluate`` computes from its constants alone
    (the model's shape, the fidelity, a small sweep's inner axes) is worked out once on the host
    instead of staged into the program, lowered and folded again by XLA. ``host_when_concrete``
    enters it for a function of tracers, with the concrete inputs as numpy, so operators between
    constants run in numpy too. The same numbers: numpy's IEEE operations are those of the program
    (tests/engines/test_compiled.py), in the program's float dtype. A result of more than
    FOLD_SIZE elements is left to jax (staged), as are calls of tracers and jax.lax/jax.nn."""
    return _thread_setting("fold", np.dtype(dtype))


def _float_dtype(traced):
    """The widest floating dtype among the tracers (jax's default float when none is floating)."""
    kinds = [np.dtype(x.dtype) for x in traced if np.dtype(x.dtype).kind == "f"]
    return np.result_type(*kinds) if kinds else np.dtype(_jax_numpy().result_type(float))


def _folded(jf, nf):
    """jax.numpy's ``jf``, or numpy's ``nf`` when no argument is traced."""
    if nf is None or not callable(jf) or not callable(nf) or isinstance(jf, type) or isinstance(nf, type):
        return jf
    jax = sys.modules["jax"]
    tracer, array = jax.core.Tracer, jax.Array

    def call(*args, **kwargs):
        if _holds(args, tracer) or (kwargs and _holds(kwargs.values(), tracer)) or _large(args, kwargs):
            return jf(*args, **kwargs)
        out = nf(*_hosted(args, array), **kwargs)
        if np.size(out) > FOLD_SIZE if not isinstance(out, (tuple, list)) else any(np.size(o) > FOLD_SIZE for o in out):
            return jf(*args, **kwargs)
        return _in_dtype(out, _LOCAL.fold)
    return call


def _large(args, kwargs) -> bool:
    """Whether a call's result would clearly exceed FOLD_SIZE elements (a shape argument, or arrays
    broadcasting to more): left to jax before numpy builds it. A dropped numpy temporary the size
    of a chunk (``jnp.zeros(chunk shape)`` of the reason bits: 13 MB) raised glibc's dynamic mmap
    threshold, the sweep's chunk buffers then stayed in the heap, and the 9.95M-plan full dump
    peaked at 0.99 GB against 0.78 unfolded."""
    shapes = [np.shape(a) for a in args if hasattr(a, "shape")]
    for a in (*args, kwargs.get("shape")):
        if isinstance(a, (tuple, list)) and a and all(isinstance(n, (int, np.integer)) for n in a):
            shapes.append(tuple(a))
    try:
        return math.prod(np.broadcast_shapes(*shapes)) > FOLD_SIZE
    except ValueError:      # shapes that do not broadcast (stack, concatenate): each one's size
        return any(math.prod(sh) > FOLD_SIZE for sh in shapes)


def _holds(args, tracer) -> bool:
    for a in args:
        if isinstance(a, tracer) or (isinstance(a, (list, tuple)) and _holds(a, tracer)):
            return True
    return False


def _hosted(args, array):
    return [np.asarray(a) if isinstance(a, array) else _hosted(a, array) if isinstance(a, (list, tuple)) else a
            for a in args]


def _in_dtype(out, dtype):
    if isinstance(out, (np.ndarray, np.generic)):
        return out.astype(dtype) if out.dtype.kind == "f" and out.dtype != dtype else out
    if isinstance(out, (tuple, list)):
        return type(out)(_in_dtype(o, dtype) for o in out)
    return out


_JNP = [None]
_READY = [False]            # jax has been imported (by anyone)
_NP_ATTRS: dict = {}        # numpy's attribute for each name jnp was asked for
_UNSEEN = object()


def _jax_numpy():
    if _JNP[0] is None:
        load_jax()
        _JNP[0] = importlib.import_module("jax.numpy")
    return _JNP[0]


jnp = _Namespace()
nn = _JaxAttr("nn")
lax = _JaxAttr("lax")


def process_count() -> int:
    """``jax.process_count()``; 1 while jax is not imported (no jax.distributed job can be joined yet)."""
    return sys.modules["jax"].process_count() if _jax_ready() else 1


def x64(on: bool = True):
    """``jax.enable_x64(on)`` as a context, or nothing to do while jax is not imported (numpy's
    default is float64 already)."""
    return sys.modules["jax"].enable_x64(on) if _jax_ready() else contextlib.nullcontext()


# ---------------------------------------------------------------- pytrees without jax

def tree_leaves(tree) -> list:
    """``jax.tree_util.tree_leaves`` for dse's dataclasses (fields in order), tuples, lists and
    dicts: jax's own once jax is imported, else ``_leaves`` (the same order: register_dataclass
    keeps the field order; dict keys sorted)."""
    return sys.modules["jax"].tree_util.tree_leaves(tree) if _jax_ready() else _leaves(tree)


def tree_map(f, tree, *rest):
    """``jax.tree_util.tree_map`` for the same trees as ``tree_leaves``."""
    return sys.modules["jax"].tree_util.tree_map(f, tree, *rest) if _jax_ready() else _map(f, tree, *rest)


def _leaves(tree) -> list:
    if tree is None:
        return []
    if type(tree) in _REGISTERED:
        return [x for f in dataclasses.fields(tree) for x in _leaves(getattr(tree, f.name))]
    if isinstance(tree, (tuple, list)):
        return [x for t in tree for x in _leaves(t)]
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in _leaves(tree[k])]
    return [tree]


def _map(f, tree, *rest):
    if tree is None:
        return None
    if type(tree) in _REGISTERED:
        return dataclasses.replace(tree, **{fl.name: _map(f, getattr(tree, fl.name), *(getattr(r, fl.name) for r in rest))
                                            for fl in dataclasses.fields(tree)})
    if isinstance(tree, (tuple, list)):
        return type(tree)(_map(f, t, *(r[i] for r in rest)) for i, t in enumerate(tree))
    if isinstance(tree, dict):
        return {k: _map(f, tree[k], *(r[k] for r in rest)) for k in tree}
    return f(tree, *rest)


# ---------------------------------------------------------------- waiting for jax

def register_dataclass(cls):
    """``jax.tree_util.register_dataclass`` as a class decorator, applied when jax is imported."""
    _REGISTERED.add(cls)
    with _LOCK:
        if _jax_ready():
            sys.modules["jax"].tree_util.register_dataclass(cls)
        else:
            _PENDING.append(cls)
            _install_hook()
    return cls


def on_jax(fn) -> None:
    """Call ``fn(jax)`` now if jax is imported, else the moment it is (configuration that only
    matters to jax: float64, the persistent compilation cache)."""
    with _LOCK:
        if _jax_ready():
            fn(sys.modules["jax"])
        else:
            _CALLBACKS.append(fn)
            _install_hook()


def enable_x64():
    """Single plans, sweeps and validation run in float64 (DESIGN.md, Conventions): now if jax is
    imported, else the moment it is."""
    on_jax(lambda jax: jax.config.update("jax_enable_x64", True))


def jax_ready() -> bool:
    """True once jax is imported (by anyone)."""
    return _jax_ready()


def _jax_ready() -> bool:
    if not _READY[0]:   # an import is never undone: checked until it has happened, then a flag
        mod = sys.modules.get("jax")
        _READY[0] = mod is not None and hasattr(mod, "tree_util") and hasattr(mod, "config")
    return _READY[0]


def _after_jax(mod) -> None:
    with _LOCK:
        while _PENDING:
            mod.tree_util.register_dataclass(_PENDING.pop(0))
        while _CALLBACKS:
            _CALLBACKS.pop(0)(mod)


class _JaxHook(importlib.abc.MetaPathFinder):
    """Finds ``jax`` with the other finders, and runs ``_after_jax`` once its module has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "jax":
            return None
        _remove_hook()
        spec = importlib.util.find_spec("jax")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _after_jax(module)

        loader.exec_module = exec_module
        return spec


_HOOK = _JaxHook()


def _install_hook() -> None:
    if _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)


def _remove_hook() -> None:
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(_HOOK)
