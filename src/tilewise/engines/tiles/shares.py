"""Which tile owns which part of the data (pure): the rule the coordinator's routing follows
(native/tiles/src/affinity.rs), and what the workers' logs say each tile read.

A table laid out as K >= 2 files is owned by files: file k (in path order) is read by tile k mod N on
every query (engines.splits.FileAffinity predicts it), so N tiles hold one copy of it between them,
each its own pages. A tile that would own no file of a table (2 <= K < N) is refused: it would sit
out every scan of that table. A table of one file is cut by the crate into byte ranges, the same on
every query; a range reads the row groups whose first page it holds (DataFusion's rule), so a file of
fewer row groups than tiles leaves some tiles without work on that table (measured per tile, never
hidden).
"""

from __future__ import annotations

import json
import re

from tilewise.errors import UsageError

SCAN_LINE = re.compile(r"^tilewise-tiles scan: (\[.*\])\s*$", re.M)
QUERY_LINE = re.compile(r"^tilewise-tiles query: (\{.*\})\s*$", re.M)
# what the coordinator says each tile did for a query (native/tiles/src/tally.rs), summed over queries
TALLY_KEYS = ("rows_scanned", "bytes_in", "messages_in", "latency_ns", "decode_ns")


def check(files: dict[str, int], tiles: int, what: str = "table") -> None:
    """UsageError when a table of 2 <= K < tiles files would leave a tile owning none of it.
    files: per table (or per layout, what='layout') its file count."""
    short = sorted((k, t) for t, k in files.items() if 2 <= k < tiles)
    if short:
        k, t = short[0]
        raise UsageError(f"{tiles} tiles cannot each own a share of {what} {t}: it has {k} files and a tile owns "
                         "whole files", f"lay the tables out as parquet-K with K a multiple of {tiles} "
                         f"(--layout parquet-{tiles}), or deploy at most {k} tiles")


def read_log(text: str) -> dict:
    """What one worker's scans were given, from its log (cumulative): tasks (stage tasks with a scan),
    input_bytes (the bytes of the files and byte ranges assigned to them; a scan reads the columns it
    needs of them) and files (each path it read any of)."""
    tasks, assigned, files = 0, 0, set()
    for m in SCAN_LINE.finditer(text):
        try:
            parts = json.loads(m.group(1))
        except ValueError:  # a line cut short by a worker that died while writing it
            continue
        tasks += 1
        for path, start, end, size in parts:
            assigned += size if start < 0 else end - start
            files.add(path)
    return {"tasks": tasks, "input_bytes": assigned, "files": files}


def read_coordinator_log(text: str, skip: set[int] | frozenset = frozenset()) -> tuple[dict[str, dict[str, int]], set[int], set[int]]:
    """What tally.rs logged, one numbered line per statement: per worker index (as the coordinator
    numbers its workers: "0", "1", ...) and "coordinator", the sums over the statements measured so
    far (rows its scans produced; what its network boundaries received: bytes, messages, the
    messages' summed latency, decoding time); the numbers of the statements with a line; and those
    whose figures are not known (the coordinator said so: a task's metrics never came). The
    statements in `skip` are left out (tilewise stopped waiting for them)."""
    out: dict[str, dict[str, int]] = {}
    seen, unmeasured = set(), set()
    for m in QUERY_LINE.finditer(text):
        try:
            doc = json.loads(m.group(1))
        except ValueError:  # a line cut short by a coordinator that died while writing it
            continue
        n = doc.get("n")
        if not isinstance(n, int) or n in seen:
            continue
        seen.add(n)
        if "unmeasured" in doc:
            unmeasured.add(n)
        if n in skip or n in unmeasured:
            continue
        for key, d in [*doc.get("tiles", {}).items(), ("coordinator", doc.get("coordinator") or {})]:
            acc = out.setdefault(key, dict.fromkeys(TALLY_KEYS, 0))
            for k in TALLY_KEYS:
                acc[k] += int(d.get(k, 0))
    return out, seen, unmeasured
