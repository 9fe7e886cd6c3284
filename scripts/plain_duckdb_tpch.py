#!/usr/bin/env python3
"""Plain DuckDB TPC-H, no tilewise in the loop: the baseline for the harness-overhead measurement.

A thin wrapper of `python -m tilewise.bench.plain_duckdb` (see its --help): same data, same SQL,
same work per query as a tilewise DuckDB worker. `tilewise bench overhead` runs it in alternation
with `tilewise bench tpch` and reports the ratio with a confidence interval.

  .venv/bin/python scripts/plain_duckdb_tpch.py --sf 1 --runs 3
"""

from tilewise.bench.plain_duckdb import main

if __name__ == "__main__":
    main()
