"""Every notebook under notebooks/ runs top to bottom without an error (nbclient, python3 kernel).

The notebooks run one after another in one IPython kernel, its namespace reset (``%reset -f``)
before each, so each notebook's cells must define every name they use; the interpreter, JAX
and dse are imported once, and XLA programs of identical shapes are compiled once. The
kernel runs with ``DSE_NOTEBOOK_SIZE=small`` (notebooks/build.py: smaller co-design searches).

Run times are printed (``pytest -s``) and written to notebooks/.runtimes.json (ignored
by git) for the closing note; they are measurements, never assertions.
"""

import json
import os
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow   # fresh kernels: run by .ci/run, skipped by the fast command

ROOT = Path(__file__).resolve().parents[2]
NB_DIR = ROOT / "notebooks"

import importlib.util  # noqa: E402

_spec = importlib.util.spec_from_file_location("notebooks_build", NB_DIR / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)


def test_notebooks_are_built_from_build_py():
    # the .ipynb files are generated: a stale one means build.py and the file disagree
    for name, cells in build.NOTEBOOKS.items():
        assert (NB_DIR / name).read_text() == build.render(cells), f"{name} is stale: run python3 notebooks/build.py"
    assert sorted(p.name for p in NB_DIR.glob("*.ipynb")) == sorted(build.NOTEBOOKS)


def test_notebooks_are_stored_without_outputs():
    for name in build.NOTEBOOKS:
        nb = nbformat.read(NB_DIR / name, as_version=4)
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")


@pytest.fixture(scope="module")
def kernel():
    """One python3 kernel for every notebook of this module (shut down after the last)."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(NB_DIR), env={**os.environ, "MPLBACKEND": "Agg", "DSE_NOTEBOOK_SIZE": "small",
                                          "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    yield km
    km.shutdown_kernel(now=True)


@pytest.mark.parametrize("name", sorted(build.NOTEBOOKS))
def test_notebook_runs(name, kernel):
    nb = nbformat.read(NB_DIR / name, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell("%reset -f"))   # nothing left from the notebook before
    t0 = time.perf_counter()
    NotebookClient(nb, km=kernel, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NB_DIR)}}).execute()
    seconds = time.perf_counter() - t0
    print(f"\nnotebook {name}: {seconds:.1f} s")
    times = NB_DIR / ".runtimes.json"
    data = json.loads(times.read_text()) if times.is_file() else {}
    data[name] = round(seconds, 1)
    times.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", out
    # every figure cell drew a picture
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert images >= 1


def test_gallery_regenerates(tmp_path):
    # the README's figures come from notebooks/make_gallery.py; each stays a small PNG
    spec = importlib.util.spec_from_file_location("make_gallery", NB_DIR / "make_gallery.py")
    gallery = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gallery)
    paths = gallery.main(tmp_path)
    assert sorted(p.name for p in paths) == sorted(gallery.FIGURES)
    readme = (ROOT / "README.md").read_text()
    for p in paths:
        assert p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size < 200_000
        assert f"docs/gallery/{p.name}" in readme and (ROOT / "docs" / "gallery" / p.name).is_file()
