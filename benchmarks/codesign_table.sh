#!/usr/bin/env bash
# Every shipped co-design study, cold (an empty compile cache) then warm, one process each: the figures of
# the README's co-design table (gap, evaluations, first-case and later-case wall time of the gradient
# path against the exhaustive search, convergence). Run by hand; on a shared machine note the load.
#
#   bash benchmarks/codesign_table.sh OUTDIR           # then: python3 benchmarks/codesign_table.py OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: codesign_table.sh OUTDIR}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for f in ratio_dense pareto_cost ratio_moe torus shape ratio_dense_cost_per_token ratio_moe_cost_per_token \
         many_knobs_coarse many_knobs; do
    extra=(); case $f in many_knobs*) extra=(--baseline);; esac
    cache=$(mktemp -d)
    for run in cold warm; do
        uptime > "$out/${f}_$run.load"
        /usr/bin/time -f "%e s wall, %U + %S CPU-s" -o "$out/${f}_$run.time" \
            env DSE_CACHE_DIR="$cache" python3 -m dse codesign "sweeps/codesign_$f.toml" "${extra[@]}" --json \
            > "$out/${f}_$run.json" 2> "$out/${f}_$run.err"
    done
    rm -rf "$cache"
done
