"""``dse codesign FILE``: gradient co-design of hardware, plan and model shape (TOML spec)."""

from __future__ import annotations

import dataclasses

from dse import files
from dse.engines import codesign as cd
from dse.text.codesign_view import case_json, case_text
from dse.cli import common
from dse.errors import InputError


def register(sub):
    p = sub.add_parser("codesign", help="optimize hardware, plan and model shape by gradient (TOML spec)")
    p.add_argument("file", help="co-design spec (TOML); see sweeps/codesign_*.toml")
    p.add_argument("--json", action="store_true", help="print one JSON object (SI units)")
    p.add_argument("--no-exhaustive", action="store_true", help="skip the exhaustive search")
    p.add_argument("--baseline", action="store_true",
                   help="also run the non-gradient baseline (random starts + local search, 10x the evaluations)")
    p.add_argument("--no-cache", action="store_true",
                   help="do not keep compiled code on disk ($DSE_CACHE_DIR, else ~/.cache/dse; DSE_CACHE_DIR=off: never)")
    common.add_plot_dir_args(p, "the trajectories (and the cost front of a budget list)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    common.enable_x64()
    if args.plot is not None:
        from dse import plot   # matplotlib only when figures are asked for

        if f".{args.plot_format}" not in plot.FORMATS:
            raise InputError(f"--plot-format: {args.plot_format!r} is not allowed; allowed: png, svg")
        files.check_out_dir(args.plot, "--plot")   # before the search (dse/files.py)
    spec = cd.load_spec(args.file)
    if args.baseline:
        spec = dataclasses.replace(spec, baseline=True)
    if not args.no_cache:
        cd.enable_persistent_cache()
    result = cd.run(spec, exhaustive_search=not args.no_exhaustive)
    if args.json:
        print(files.dumps({"cases": [case_json(c) for c in result.cases]}, indent=2))
    else:
        print("\n\n".join(case_text(c) for c in result.cases))
    if args.plot is not None:
        for name, fig in plot.codesign_figures(result).items():
            plot.save(fig, f"{args.plot}/{name}.{args.plot_format}")
    return 0
