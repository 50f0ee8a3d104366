"""Engines that run ``evaluate`` many times: ``sweep`` (chunked, sharded grids),
``codesign`` (optax on the smooth relaxation), ``sensitivity`` (``jax.grad`` elasticities)."""
