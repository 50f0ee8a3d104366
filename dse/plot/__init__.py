"""Figures for a design review: matplotlib Figures built from Reports, sweeps and fits.

Everything is in ``dse.plot.figures``; it never shows or prints."""

from dse.plot.figures import *  # noqa: F401,F403
from dse.plot.figures import __all__  # noqa: F401
