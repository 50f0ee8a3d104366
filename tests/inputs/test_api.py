"""The notebook API: make's signature and docstring come from the dataclass fields and their comments."""

from __future__ import annotations

import dataclasses
import inspect
import pydoc

import pytest

from dse import Cluster, ModelShape, Plan


@pytest.mark.parametrize("cls", [Plan, Cluster, ModelShape])
def test_make_signature_lists_every_field_with_its_default(cls):
    sig = inspect.signature(cls.make)
    fields = dataclasses.fields(cls)
    assert list(sig.parameters) == [f.name for f in fields]
    for f in fields:
        p = sig.parameters[f.name]
        assert p.kind is inspect.Parameter.KEYWORD_ONLY
        want = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        assert p.default == want


@pytest.mark.parametrize("cls", [Plan, Cluster, ModelShape])
def test_make_docstring_names_every_field_and_its_comment(cls):
    doc = pydoc.render_doc(cls.make, renderer=pydoc.plaintext)   # what help(cls.make) prints
    for f in dataclasses.fields(cls):
        assert f"    {f.name} (" in doc, f.name
    assert "(required)" in doc and "(default" in doc


def test_docstring_carries_units_from_the_source_comments():
    doc = Cluster.make.__doc__
    assert "bw_up_bytes_per_s (required): bytes/s a direction, scale-up link per accelerator" in doc
    assert "gpus_per_node (default 8):" in doc
    assert "recompute (default 1): 0 none, 1 selective, 2 full" in Plan.make.__doc__
    assert "seq (required): s, tokens per sequence" in ModelShape.make.__doc__


def test_make_still_builds_and_checks():
    p = Plan.make(tp=2, pp=4, mbs=1, gbs=64)
    assert float(p.tp) == 2.0 and float(p.cp) == 1.0 and float(p.overlap_grad_reduce) == 1.0
    with pytest.raises(TypeError, match="unknown field"):
        Plan.make(tp=2, pp=4, mbs=1, gbs=64, tpp=3)
    with pytest.raises(TypeError, match="missing field 'gbs'"):
        Plan.make(tp=2, pp=4, mbs=1)


def test_stack_and_indexing_of_concrete_inputs_stay_numpy():
    # A host batch (validation's runs, a notebook's cases) is stacked and indexed in numpy even where
    # jax is imported: eager jnp.stack dispatched one XLA conversion a value (validate: ~5,000 a call).
    import jax
    import numpy as np

    import dse
    from dse.inputs import presets

    plans = dse.stack([Plan.make(tp=t, pp=2, mbs=1, gbs=64) for t in (1, 2, 4)])
    assert all(type(x) is np.ndarray and x.shape == (3,) for x in jax.tree_util.tree_leaves(plans))
    assert plans.tp.tolist() == [1.0, 2.0, 4.0]
    r = dse.evaluate(presets.load_model("llama3-8b"), presets.load_cluster("seed").replace(gpus=64), plans)
    jr = jax.tree_util.tree_map(jax.numpy.asarray, r)           # a report of jax arrays (a jitted evaluate's)
    one = jr[1]
    assert type(one.step_s) is not jax.Array and float(one.step_s) == float(np.asarray(r.step_s)[1])
    # under a trace the same calls stay jax operations
    got = jax.jit(lambda tp: dse.stack([Plan.make(tp=tp, pp=2, mbs=1, gbs=64)] * 2).tp)(2.0)
    assert np.asarray(got).tolist() == [2.0, 2.0]
