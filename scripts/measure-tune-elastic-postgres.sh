#!/usr/bin/env bash
# Issue 21's "Measure" for paper 003 and 002 on PostgreSQL, as commands to run on a quiet machine:
#   scripts/measure-tune-elastic-postgres.sh [SF] [OUT]   (defaults: 1, results/measure-tune-elastic)
#   1. the tune table (paper 003's Fig. 8): all 22 TPC-H queries, the default against THP never +
#      AutoNUMA off, one server start, 5 timed runs each (root: the switches are changed, journaled
#      and restored; without root this step says so and is skipped)
#   2. the tune table for the allocators (paper 003's Fig. 9: Q5 and Q18): system, jemalloc, tcmalloc,
#      mimalloc, tbbmalloc, one start each, 5 timed runs
#   3. the elastic bench: 8 clients, q6 and mixed (all 22), static (os) and dense/sparse/adaptive,
#      60 s of load between 5 s idle steps: throughput, core-seconds, reaction in ticks
# Each step prints its table; the results folders hold results.json, the CSV files and the plots
# (fig8.png, elastic.png). TILEWISE=... picks the CLI (default ./.venv/bin/tilewise). For a smoke run
# at a tiny scale: REPEAT=2 DURATION=2 IDLE=1 OS_ROOT=<a fake root with the two switch files> (the
# hidden --os-root: nothing of this machine is changed) scripts/measure-tune-elastic-postgres.sh 0.01 /tmp/m
# Durations measured here (2 cores, SF 1, one pass of the 22 queries about 30 s): step 1 about 6 min,
# step 2 about 4 min, step 3 about 11 min.
set -euo pipefail
SF=${1:-1}
OUT=${2:-results/measure-tune-elastic}
TILEWISE=${TILEWISE:-./.venv/bin/tilewise}
REPEAT=${REPEAT:-5}
DURATION=${DURATION:-60}
IDLE=${IDLE:-5}
OS_ARGS=()
if [ -n "${OS_ROOT:-}" ]; then OS_ARGS=(--os-root "$OS_ROOT"); fi
mkdir -p "$OUT"
say() { echo "== $* (load average: $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$OUT/log.txt"; }

say "1. tune --engine postgres, SF $SF, 22 queries: default vs THP never + AutoNUMA off"
if [ "$(id -u)" = 0 ] || [ -n "${OS_ROOT:-}" ]; then
  "$TILEWISE" tune --engine postgres --sf "$SF" --allocators system --mem first-touch \
      --apply-os --thp never --autonuma off "${OS_ARGS[@]}" --repeat "$REPEAT" --warmup 1 --timeout 600 \
      --out "$OUT/tune-os" | tee "$OUT/tune-os.txt"
else
  say "1. skipped: --apply-os changes THP and AutoNUMA, which needs root"
fi

say "2. tune --engine postgres, SF $SF, Q5 and Q18: five allocators"
"$TILEWISE" tune --engine postgres --sf "$SF" --queries 5,18 --allocators system,jemalloc,tcmalloc,mimalloc,tbbmalloc \
    --mem first-touch --repeat "$REPEAT" --warmup 1 --timeout 600 --out "$OUT/tune-alloc" | tee "$OUT/tune-alloc.txt"

say "3. bench elastic --engine postgres, SF $SF"
"$TILEWISE" bench elastic --engine postgres --sf "$SF" --clients 8 --duration "$DURATION" --idle "$IDLE" --workloads q6,mixed \
    --configs os,dense,sparse,adaptive --out "$OUT/elastic" | tee "$OUT/elastic.txt"
say "done"
