"""Compile once, reuse: compiled XLA programs kept in memory and on disk, keyed by what decides them.

``load_or_compile(key, build)`` returns a ``jax.stages.Compiled``: from this process's
memory, else from the user's cache directory (a serialized executable: no trace, no
lowering, no compile), else ``build()`` and saved there. The key holds the caller's
parts (spec fingerprint, geometry, dtype, ...) plus the JAX/jaxlib versions, the
devices and a hash of dse's own source, so a changed equation never loads a stale
program. JAX's persistent compilation cache is switched on in the same directory,
so programs compiled elsewhere (eager ops, co-design) are reused by later processes too.

Where: ``$DSE_CACHE_DIR`` if set ("off" or "" turns every on-disk cache off), else
``$XDG_CACHE_HOME/dse`` or ``~/.cache/dse``. Tests set ``DSE_CACHE_DIR`` to a tmp dir.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path

import jax

_MEMORY: dict = {}
_SOURCE: list = []
_ENABLED: list = []


def cache_dir() -> Path | None:
    """The on-disk cache directory, or None when turned off."""
    env = os.environ.get("DSE_CACHE_DIR")
    if env is not None:
        return None if env.strip() in ("", "off", "0") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dse"


def enable_persistent_cache() -> Path | None:
    """Point JAX's persistent compilation cache at ``cache_dir()/xla`` (once a process)."""
    root = cache_dir()
    if root is None or _ENABLED:
        return root
    _ENABLED.append(True)
    try:
        jax.config.update("jax_compilation_cache_dir", str(root / "xla"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    except Exception:   # an older/newer JAX without these options: no persistent cache, still correct
        pass
    return root


def _source_hash() -> str:
    """A hash of every dse source file: a changed equation is a different program."""
    if not _SOURCE:
        h = hashlib.sha256()
        pkg = Path(__file__).resolve().parents[1]
        for f in sorted(pkg.rglob("*.py")):
            h.update(str(f.relative_to(pkg)).encode())
            h.update(f.read_bytes())
        _SOURCE.append(h.hexdigest()[:16])
    return _SOURCE[0]


def _key(parts, devices) -> str:
    import jaxlib

    blob = repr((parts, jax.__version__, jaxlib.__version__, _source_hash(), os.environ.get("XLA_FLAGS", ""),
                 jax.process_count(), tuple((d.platform, d.device_kind, d.id) for d in jax.devices()),
                 tuple((d.platform, d.device_kind, d.id) for d in devices)))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def load_or_compile(parts, build, devices=None):
    """The compiled program of key ``parts``; ``build()`` lowers and compiles it on a miss."""
    devices = list(devices or jax.devices())
    key = _key(parts, devices)
    if key in _MEMORY:
        return _MEMORY[key]
    root = enable_persistent_cache()
    path = None if root is None else root / "exe" / f"{key}.pkl"
    loaded = _load(path, devices) if path is not None and path.is_file() else None
    if loaded is not None:
        compiled = _Loaded(loaded, build, path)
    else:
        compiled = build()
        if path is not None:
            _save(path, compiled)
    if len(_MEMORY) > 16:   # a notebook or test session keeps its recent programs
        _MEMORY.pop(next(iter(_MEMORY)))
    _MEMORY[key] = compiled
    return compiled


class _Loaded:
    """A program loaded from disk, checked by its first call: should it fail to run (a
    program from another XLA build or setup), it is compiled again and the copy replaced."""

    def __init__(self, compiled, build, path):
        self.compiled, self.build, self.path, self.checked = compiled, build, path, False

    def __call__(self, *args):
        if self.checked:
            return self.compiled(*args)
        try:
            out = jax.block_until_ready(self.compiled(*args))
        except Exception:   # jax.errors.JaxRuntimeError (NOT_FOUND ...) from a stale executable
            self.compiled = self.build()
            _save(self.path, self.compiled)
            out = self.compiled(*args)
        self.checked = True
        return out


def _load(path: Path, devices):
    from jax.experimental import serialize_executable

    try:
        blob, in_tree, out_tree = pickle.loads(path.read_bytes())
        return serialize_executable.deserialize_and_load(blob, in_tree, out_tree, backend=devices[0].client,
                                                         execution_devices=devices)
    except Exception:   # unreadable or from another build: compile again (and overwrite)
        return None


def _save(path: Path, compiled) -> None:
    from jax.experimental import serialize_executable

    try:
        blob = pickle.dumps(serialize_executable.serialize(compiled))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except Exception:   # a read-only cache or a program that cannot be serialized: no disk copy
        pass


# ---------------------------------------------------------------- exact (float64) evaluation of a few points

# A few dozen points: compile time is all that counts. Without fusion XLA:CPU compiles the
# model in about a third of the time, and each op is the same IEEE float64 op as in eager
# ``evaluate`` (checked equal in tests/engines/test_compiled.py).
_EXACT_OPTIONS = {"xla_disable_hlo_passes": "fusion,cpu-instruction-fusion", "xla_backend_optimization_level": 0}


def _bucket(n: int) -> int:
    return 1 if n <= 1 else max(64, 1 << (n - 1).bit_length())   # one plan, or a few batch sizes


def evaluate_exact(model, cluster, plan, fidelity="seed"):
    """``evaluate`` in float64 on a batch (any shapes broadcasting to one 1-D or 0-D shape), as numpy.

    One compiled program per batch bucket, shared by every caller (``dse plan``, the sweep's
    reported rows, suggest): the fidelity is an argument, not a constant, so the program does
    not depend on the mode or the spec; it is loaded from the cache directory when there.
    """
    import numpy as np

    from dse.evaluate import evaluate
    from dse.inputs.fidelity import resolve

    with jax.enable_x64(True):
        leaves = [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves((model, cluster, plan))]
        shape = np.broadcast_shapes(*[x.shape for x in leaves])
        if len(shape) > 1:
            raise ValueError(f"evaluate_exact: inputs of shape {shape}; allowed: 0-D or 1-D")
        n = int(np.prod(shape))
        size = _bucket(n)
        pad = lambda x: np.concatenate([np.broadcast_to(x, (n,)).reshape(-1),  # noqa: E731
                                        np.full(size - n, np.broadcast_to(x, (n,)).reshape(-1)[0])])
        args = jax.tree_util.tree_map(lambda x: pad(np.asarray(x, np.float64)), (model, cluster, plan))
        fid = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), resolve(fidelity))
        dev = jax.devices()[0]
        fn = jax.jit(lambda m, c, p, f: evaluate(m, c, p, f))
        compiled = load_or_compile(("evaluate_exact", size), lambda: fn.lower(*args, fid).compile(_EXACT_OPTIONS),
                                   devices=[dev])
        rep = jax.device_get(compiled(*args, fid))
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[:n].reshape(shape), rep)
