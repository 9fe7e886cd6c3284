#!/usr/bin/env bash
# The PostgreSQL engine's "Measure" section (issue 21), next to DuckDB, as commands to run on a
# quiet machine:  scripts/measure-postgres.sh [SF] [OUT]   (defaults: 1, results/measure-postgres)
#   1. TPC-H at SF, all 22 queries, wim and wic, power and throughput, 3 timed runs: postgres and
#      duckdb; per-query medians and QphH in each results.json, side by side with `tilewise report`
#   2. load time: PostgreSQL's cached load of the data set removed, then a start (loads and caches),
#      then a second start (copies the cached load): `load` / `load_s` per instance
#   3. resident memory per instance after the 22 queries (RSS summed over each server's processes,
#      and PSS, which counts shared memory once): postgres and duckdb, wim and wic
#   4. jit off/on at 0.01, 0.1 and SF (power test): the measurement behind settings.JIT_DEFAULT
# TILEWISE=... picks the CLI (default ./.venv/bin/tilewise), PY=... its python.
set -euo pipefail
SF=${1:-1}
OUT=${2:-results/measure-postgres}
TILEWISE=${TILEWISE:-./.venv/bin/tilewise}
PY=${PY:-./.venv/bin/python}
mkdir -p "$OUT"
say() { echo "== $* (load average: $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$OUT/log.txt"; }

say "1. TPC-H SF $SF, wim,wic, power + throughput, postgres and duckdb"
for e in postgres duckdb; do
  "$TILEWISE" bench tpch --engine "$e" --sf "$SF" --policies wim,wic --runs 3 --out "$OUT/tpch-$e" --no-plots
done
"$TILEWISE" report "$OUT/tpch-duckdb" "$OUT/tpch-postgres" | tee "$OUT/report-duckdb-vs-postgres.txt"

say "2. load time (cache removed) and cached-load time"
DATA=$("$PY" -c "from tilewise.benchmarks.tpch import data; print(data.dataset($SF).dir)")
rm -rf "$DATA/postgres"
for k in load cached; do
  "$TILEWISE" bench tpch --engine postgres --sf "$SF" --policies wim --runs 1 --no-warmup --tests power \
      --queries 6 --no-plots --out "$OUT/load-$k" --json > /dev/null
  "$PY" -c "import json,sys; d=json.load(open('$OUT/load-$k/results.json')); i=d['policies']['wim']['instances'][0]; \
print('$k', 'load_s', i.get('load_s'), json.dumps(i.get('load')))" | tee -a "$OUT/log.txt"
done

say "3. RSS per instance after the 22 queries"
for e in postgres duckdb; do
  for p in wim wic; do
    "$PY" scripts/engine_rss.py --engine "$e" --sf "$SF" --policy "$p" --per-instance > "$OUT/rss-$e-$p.json"
    "$PY" -c "import json; d=json.load(open('$OUT/rss-$e-$p.json')); \
print('$e $p', {k: (v['rss_mb'], v['pss_mb']) for k, v in d['instances'].items()})" | tee -a "$OUT/log.txt"
  done
done

say "4. jit off/on (power test, wim)"
for sf in 0.01 0.1 "$SF"; do
  for j in off on; do
    TILEWISE_POSTGRES_JIT=$j "$TILEWISE" bench tpch --engine postgres --sf "$sf" --tests power --policies wim \
        --runs 3 --no-plots --out "$OUT/jit-sf$sf-$j" --json > /dev/null
  done
  "$TILEWISE" report "$OUT/jit-sf$sf-off" "$OUT/jit-sf$sf-on" | tee "$OUT/jit-sf$sf.txt"
done
say "done: $OUT"
