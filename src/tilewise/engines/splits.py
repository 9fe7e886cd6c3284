"""How a cooperating engine splits a scan of Parquet files over its tiles (pure): the prediction
`bench --layout` and `data layout` show beside the measured per-tile figures.

An engine cuts each file into byte-range splits, reads in each split the row groups that belong
to it (Spark: those whose midpoint falls in the range; Trino: those that start in it), and hands
the splits (Spark: packed into partitions) to its workers as they ask for work. With tiles of
equal speed, a worker asks again when it has read what it was given, so each task is predicted to
go, in the engine's order, to the tile with the least work so far: the bytes of the row groups it
was given plus the engine's open cost per task (then the fewest tasks, then the lowest tile).
Dealing round-robin instead mispredicts splits that alternate in size: Trino's 32 MB initial splits
of 51 MB files (TPC-H SF 1, 4 files) were dealt 139 / 66 MB, and were read 50 / 50. What really
happened is measured per tile (Runtime.scan_stats). The engines' own rules, with their defaults:

- Spark (FilePartition): maxSplitBytes = min(spark.sql.files.maxPartitionBytes 128 MB,
  max(spark.sql.files.openCostInBytes 4 MB, total bytes (each file + the open cost) / cores));
  splits sorted by size, packed into partitions up to maxSplitBytes (each split also counts the
  open cost); a row group belongs to the split holding its midpoint.
- Trino (Hive connector): the first 200 splits of a query are at most 32 MB
  (hive.max-initial-split-size), the others 64 MB (hive.max-split-size); no packing; a row group
  belongs to the split its first byte is in.

So a layout's file count and row-group size decide how evenly the tiles share a table's scan: one
file of one row group is one task, on one tile, whatever the deployment.

A rule is one SplitRule: it cuts the files into tasks (each task the row groups it reads) and, by
default, hands them out as described above. ByteRanges describes the engines that cut files into
byte ranges (Spark's and Trino's values live in their engine folders); Files and RowGroups
describe engines whose tasks are whole files or row groups; FileAffinity an engine whose tiles own
files (file i on tile i mod N) and read only those: partitions, not tasks handed out on demand.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

MB = 1 << 20

Task = list[tuple[int, int]]  # the (file index, row-group index) pairs one task reads


class SplitRule(abc.ABC):
    """How an engine turns a table's files into tasks, and which tile runs each."""

    open_cost_bytes: int = 0  # what the engine counts per task beside its bytes (Spark's open cost)

    @abc.abstractmethod
    def tasks(self, files: list[dict], cores: int) -> list[Task]:
        """The tasks in the order the engine hands them out."""

    def describe(self) -> dict:
        """The rule as results record it."""
        return {"kind": type(self).__name__}

    def assign(self, tasks: list[Task], tiles: int, files: list[dict]) -> list[int]:
        """The tile of each task: the tile with the least work so far (bytes + open cost per task,
        then the fewest tasks, then the lowest tile), as workers of equal speed ask for work."""
        work = [[0, 0] for _ in range(max(1, tiles))]  # bytes, tasks
        out = []
        for task in tasks:
            t = min(range(len(work)), key=lambda t: (work[t][0] + work[t][1] * self.open_cost_bytes, work[t][1], t))
            work[t][0] += sum(files[i]["row_groups"][g]["compressed"] for i, g in task)
            work[t][1] += 1
            out.append(t)
        return out


@dataclass(frozen=True)
class ByteRanges(SplitRule):
    """Files cut into byte ranges (Spark, Trino: the module doc); a row group belongs to the range
    holding its midpoint or its first byte."""

    max_split_bytes: int
    open_cost_bytes: int = 0
    per_core: bool = False  # Spark: the split size shrinks so that every core gets a split
    pack: bool = False  # Spark: small splits are packed together into one task
    row_group_at: str = "midpoint"  # or "start"
    initial_splits: int = 0  # Trino: the first N splits are smaller
    initial_split_bytes: int = 0

    def describe(self) -> dict:
        return {"kind": "ByteRanges", "max_split_bytes": self.max_split_bytes, "pack": self.pack,
                "row_group_at": self.row_group_at}

    def tasks(self, files: list[dict], cores: int) -> list[Task]:
        out = []
        for task in _splits(files, self, cores):
            groups = []
            for i, start, length in task:
                for g, rg in enumerate(files[i]["row_groups"]):
                    at = rg["offset"] + (rg["compressed"] // 2 if self.row_group_at == "midpoint" else 0)
                    if start <= at < start + max(length, 1):
                        groups.append((i, g))
            out.append(groups)
        return out


class Files(SplitRule):
    """One task per file, in file order."""

    def tasks(self, files: list[dict], cores: int) -> list[Task]:
        return [[(i, g) for g in range(len(f["row_groups"]))] for i, f in enumerate(files)]


class RowGroups(SplitRule):
    """One task per row group, in file order."""

    def tasks(self, files: list[dict], cores: int) -> list[Task]:
        return [[(i, g)] for i, f in enumerate(files) for g in range(len(f["row_groups"]))]


class FileAffinity(Files):
    """Tiles own files: file i is read by tile i mod N, whatever the others do (partitions).
    one_file: how the engine splits a table of one file instead, where it does not follow the rule
    (results record it beside the prediction, which then puts the file on tile 0)."""

    def __init__(self, one_file: str | None = None) -> None:
        self.one_file = one_file

    def describe(self) -> dict:
        return {"kind": "FileAffinity", **({"one_file": self.one_file} if self.one_file else {})}

    def assign(self, tasks: list[Task], tiles: int, files: list[dict]) -> list[int]:
        return [i % max(1, tiles) for i in range(len(tasks))]


def _splits(files: list[dict], rule: ByteRanges, cores: int) -> list[list[tuple[int, int, int]]]:
    """Tasks, each a list of (file index, start, length)."""
    if rule.per_core:
        total = sum(f["bytes"] + rule.open_cost_bytes for f in files)
        size = min(rule.max_split_bytes, max(rule.open_cost_bytes, total // max(1, cores) or 1))
    else:
        size = rule.max_split_bytes
    pieces: list[tuple[int, int, int]] = []
    made = 0
    for i, f in enumerate(files):
        start = 0
        while start < f["bytes"] or (start == 0 and f["bytes"] == 0):
            step = rule.initial_split_bytes if made < rule.initial_splits and rule.initial_split_bytes else size
            length = min(step, f["bytes"] - start) if f["bytes"] else 0
            pieces.append((i, start, length))
            made += 1
            start += max(length, 1)
            if f["bytes"] == 0:
                break
    if not rule.pack:
        return [[p] for p in pieces]
    tasks, cur, cur_size = [], [], 0
    for p in sorted(pieces, key=lambda p: -p[2]):
        if cur and cur_size + p[2] > size:
            tasks.append(cur)
            cur, cur_size = [], 0
        cur.append(p)
        cur_size += p[2] + rule.open_cost_bytes
    if cur:
        tasks.append(cur)
    return tasks


def per_tile(files: list[dict], tiles: int, cores: int, rule: SplitRule) -> list[dict]:
    """Per tile, the files, row groups, rows and bytes its tasks read and the task count, each task
    given to the tile rule.assign picks (see the module doc).
    files: [{"bytes", "row_groups": [{"offset", "compressed", "rows"}]}]."""
    tasks = rule.tasks(files, cores)
    out = [{"tile": t, "tasks": 0, "files": 0, "row_groups": 0, "rows": 0, "bytes": 0} for t in range(max(1, tiles))]
    seen: list[set] = [set() for _ in out]
    for task, t in zip(tasks, rule.assign(tasks, tiles, files)):
        out[t]["tasks"] += 1
        for i, g in task:
            rg = files[i]["row_groups"][g]
            out[t]["row_groups"] += 1
            out[t]["rows"] += rg["rows"]
            out[t]["bytes"] += rg["compressed"]
            seen[t].add(i)
    for t, s in enumerate(seen):
        out[t]["files"] = len(s)
    return out
