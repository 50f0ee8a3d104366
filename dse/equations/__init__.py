"""The planner's equations, one module per concept, pure elementwise ``jnp`` functions.

``steps`` (hard steps with a sharpness), ``memory``, ``traffic``, ``collectives``,
``topology`` (placement, tiers, islands, rails, torus), ``schedule`` (bubble, overlap),
``compute``, ``cost`` (network cost and power), ``goodput`` (failures and checkpoints).
They import only ``dse.inputs`` and each other; ``dse.evaluate`` composes them.
"""
