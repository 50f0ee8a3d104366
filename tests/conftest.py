import jax

# Single plans and pinned numbers are checked in float64 (DESIGN.md, Conventions).
jax.config.update("jax_enable_x64", True)
