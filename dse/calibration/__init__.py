"""Calibration: published runs read and compared (``validate``) and the optax fits (``fit``)
that write a calibration file. What a calibrated mode *is* lives in ``dse.inputs.fidelity``."""
