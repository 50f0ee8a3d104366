"""Operator tools (seed 001): rank maps, nccl-tests and NCCL log parsing, launch specs,
the four questions, and plan suggestions.

- ``megatron``: Megatron-LM / Megatron-Core command lines both ways, with Megatron's checks;
- ``torchtitan``: torchtitan job configs both ways, Megatron-Bridge / NeMo 2 overrides;
- ``launchers``: a Kubernetes JobSet and a Slurm sbatch script that keep the rank map;
- ``check_log``: a job's own start-up log against the plan (``dse check-log``);
- ``nccl_tests``, ``nccl_log``, ``rankmap``, ``check``, ``suggest``, ``verdict``.

These read plans and Reports and parse outside formats; they hold no equation of the
model: every figure of a plan comes from ``dse.evaluate``. Library code here never
prints; the CLI modules under ``dse.cli`` format.
"""
