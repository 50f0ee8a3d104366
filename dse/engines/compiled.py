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
import re
import tempfile
from pathlib import Path

from dse.backend import load_jax, on_jax, tree_leaves, tree_map

_MEMORY: dict = {}
_SOURCE: list = []
_ENABLED: list = []


# XLA:CPU options of a program whose compile is what counts: one that runs once, or on a few points
# (the co-design optimizer, sensitivities). At O0 with XLA:CPU's classic LLVM emitters for its
# fusions (not the MLIR fusion emitters), a differentiated ``evaluate`` compiles in a fraction of
# XLA's default time. Fusion stays on: without it every elementwise op is a kernel of its own
# (7,209 in the optimizer's loop on ratio_dense), and XLA:CPU's runtime orders them by a pairwise
# buffer-conflict scan, quadratic in their number, at every compile and every load from the disk
# cache. On ratio_dense's first case the optimizer's program went (without fusion -> this):
# compile 18.0 -> 8.0 CPU-s, load 4.5 -> 0.8, run 0.75 -> 0.33, its end points the same to 2e-8;
# with XLA's defaults it compiled in 45. Sensitivities at one plan (Llama 3 70B on 1,024 H100):
# first call, trace included, 3.4 -> 3.0 CPU-s, the same elasticities.
COMPILE_FIRST = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def cpu_options(options, platform: str | None = None) -> dict | None:
    """``options`` where programs compile for the CPU (``platform``, default JAX's default backend),
    else None (XLA's defaults): XLA:CPU's options are not options of the GPU compiler, which
    refuses them ("No such compile option: 'xla_cpu_use_fusion_emitters'", seen on an H200)."""
    if not options:
        return None
    platform = platform or load_jax().default_backend()
    return dict(options) if platform == "cpu" else None


_UNKNOWN_OPTIONS: set = set()     # XLA options this process's XLA refused ("No such compile option")


def compile_lowered(lowered, options=None):
    """``lowered.compile(options)`` without the options this XLA does not have.

    XLA's option set changes between jaxlib releases: jax 0.11.2's XLA:CPU no longer has
    ``xla_cpu_use_fusion_emitters`` (COMPILE_FIRST, kernel.FLOAT32_OPTIONS) and refuses the whole
    compile ("INVALID_ARGUMENT: No such compile option", seen on an H200 machine's CPU backend). An
    option it refuses is dropped (for the rest of the process) and the compile retried: the options
    make a compile faster or a loop faster, never change what a program computes."""
    opts = {k: v for k, v in (options or {}).items() if k not in _UNKNOWN_OPTIONS}
    while True:
        try:
            return lowered.compile(opts or None)
        except Exception as e:     # jax.errors.JaxRuntimeError
            m = re.search(r"No such compile option: '([^']+)'", str(e))
            if m is None or m.group(1) not in opts:
                raise
            _UNKNOWN_OPTIONS.add(m.group(1))
            del opts[m.group(1)]


def cache_dir() -> Path | None:
    """The on-disk cache directory, or None when turned off."""
    env = os.environ.get("DSE_CACHE_DIR")
    if env is not None:
        return None if env.strip() in ("", "off", "0") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dse"


def enable_persistent_cache() -> Path | None:
    """Point JAX's persistent compilation cache at ``cache_dir()/xla`` (once a process; when jax
    is imported, so a process that never compiles never imports it)."""
    root = cache_dir()
    if root is None or _ENABLED:
        return root
    _ENABLED.append(True)

    def configure(jax):
        try:
            jax.config.update("jax_compilation_cache_dir", str(root / "xla"))
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
        except Exception:   # an older/newer JAX without these options: no persistent cache, still correct
            pass

    on_jax(configure)
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
    jax = load_jax()
    import jaxlib

    blob = repr((parts, jax.__version__, jaxlib.__version__, _source_hash(), os.environ.get("XLA_FLAGS", ""),
                 jax.process_count(), tuple((d.platform, d.device_kind, d.id) for d in jax.devices()),
                 tuple((d.platform, d.device_kind, d.id) for d in devices)))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def load_or_compile(parts, build, devices=None):
    """The compiled program of key ``parts``; ``build()`` lowers and compiles it on a miss."""
    jax = load_jax()
    devices = list(devices or jax.devices())
    key = _key(parts, devices)
    if key in _MEMORY:
        return _MEMORY[key]
    root = enable_persistent_cache()
    path = None if root is None else root / "exe" / f"{key}.pkl"
    loaded = _load(path, devices) if path is not None and path.is_file() else None
    if loaded is not None:
        compiled = _Loaded(loaded, build, path)
    elif path is not None:
        compiled = _build_whole(build)
        _save(path, compiled)
    else:
        compiled = build()
    if len(_MEMORY) > 16:   # a notebook or test session keeps its recent programs
        _MEMORY.pop(next(iter(_MEMORY)))
    _MEMORY[key] = compiled
    return compiled


def _build_whole(build):
    """``build()`` with JAX's own persistent cache off: an XLA:CPU program JAX loaded from that
    cache serializes without its kernels ("NOT_FOUND: Function ... not found" when the copy is
    run), so the copy saved here is always of a program compiled in this process. JAX decides
    whether its cache is used once a process, at the first compile, so switching the option is
    not enough: the cache is reset (jax.experimental.compilation_cache.reset_cache) before the
    build, to see the option off, and after it, to see it on again."""
    jax = load_jax()
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    was = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    jax_cache.reset_cache()
    try:
        return build()
    finally:
        jax.config.update("jax_enable_compilation_cache", was)
        jax_cache.reset_cache()


class _Loaded:
    """A program loaded from disk, checked by its first call: should it fail to run (a
    program from another XLA build or setup), it is compiled again and the copy replaced."""

    def __init__(self, compiled, build, path):
        self.compiled, self.build, self.path, self.checked = compiled, build, path, False

    def __call__(self, *args):
        jax = load_jax()
        if self.checked:
            return self.compiled(*args)
        try:
            out = jax.block_until_ready(self.compiled(*args))
        except Exception:   # jax.errors.JaxRuntimeError (NOT_FOUND ...) from a stale executable
            self.compiled = _build_whole(self.build)
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


def evaluate_exact(model, cluster, plan, fidelity="seed"):
    """``evaluate`` in float64 on a batch (any shapes broadcasting to one 1-D or 0-D shape), as numpy.

    The same equations run by numpy (dse/engines/host.py): for one plan or a few dozen rows no
    XLA program pays for itself (loading a cached one costs ~100x the evaluation), and float64
    numpy ops are the IEEE ops of XLA:CPU, so the numbers are those of the compiled program.
    Shared by ``dse plan``, the sweep's reported rows and suggest.
    """
    import numpy as np

    from dse.engines.host import numpy_mode, to_numpy
    from dse.evaluate import evaluate
    from dse.inputs.fidelity import resolve

    args = tree_map(lambda x: np.asarray(x, np.float64), (model, cluster, plan))
    shape = np.broadcast_shapes(*[x.shape for x in tree_leaves(args)])
    if len(shape) > 1:
        raise ValueError(f"evaluate_exact: inputs of shape {shape}; allowed: 0-D or 1-D")
    fid = tree_map(lambda x: np.asarray(x, np.float64), resolve(fidelity))
    with numpy_mode():
        rep = evaluate(*args, fid)
    return tree_map(lambda x: np.array(np.broadcast_to(x, shape)), to_numpy(rep))
