"""Operator tools (seed 001): rank maps, nccl-tests and NCCL log parsing, launch specs,
the four questions, and plan suggestions.

These read plans and Reports and parse outside formats; they hold no equation of the
model: every figure of a plan comes from ``dse.evaluate``. Library code here never
prints; the CLI modules under ``dse.cli`` format.
"""
