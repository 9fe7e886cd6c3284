"""Data layouts: how a data set's tables are laid out as files, and the transformations that make them.

A layout is named by what it is (thesis 004, ch. 5, measured these; tilewise measures them on the
machine it runs on, tilewise.layout):

    csv | tbl | json | parquet       the source as it is (its own format; read by the engine's reader)
    parquet-K                        every table as K Parquet files (contiguous row ranges, in order)
    parquet-K-rgN                    ... with row groups of N rows (N: 65536, 64k, 1m)
    parquet-K-sorted-COL             ... and the table holding COL sorted on it (globally, then cut)
    parquet-K+sorted-COL             parquet-K plus a second copy of COL's table sorted on it; each
                                     query reads the copy its predicates favour (tilewise.layout)

A layout is made table by table: each table's copy (``CopySpec``: K files, row-group size, sort
column) lives in ``<store>/<table>/<copy name>/`` as ``part-00000.parquet`` ... and
``_table.json``, its manifest (the source it was made from and that source's file identity, rows,
files with sizes and row groups, a fingerprint of the rows, what making it cost). Copies are shared
between layouts: ``parquet-8-sorted-l_shipdate`` reuses ``parquet-8``'s copies of every table but
lineitem.

A copy is built whole or not at all (tilewise.data.store.ensure_dir: a temporary sibling renamed
into place, under a lock, removed on any error, what a killed builder left swept by the next), and
it is checked before it is used: its files, sizes and footers must match its manifest, and its rows
must carry the same fingerprint (count and the sum of a hash of every row) as the source rows it
was made from. Out of disk space is an error naming the directory; nothing half-written stays.

The transformation itself runs in DuckDB (the library): read the source strictly (tilewise.data.raw:
a malformed row is an error with its file and line), materialise it (sorted where asked; DuckDB
spills to a directory inside the temporary copy when its memory limit is reached), then write each
file's row range with COPY ... (FORMAT parquet, ROW_GROUP_SIZE N). Threads and memory come from the
caller (the background core budget when cracking, tilewise.elastic.budget).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tilewise import dirs
from tilewise.data import raw, store
from tilewise.data.sources import FORMATS, TEXT_FORMATS, TableSource, parquet
from tilewise.errors import TilewiseError, UsageError
from tilewise.fsutil import atomic_write_json

TABLE_MANIFEST = "_table.json"
TABLE_FORMAT = "tilewise-layout-table/1"
SET_MANIFEST = "layout.json"
SET_FORMAT = "tilewise-layout/1"
MAX_FILES = 4096
MIN_ROW_GROUP = 1024
_NAME = re.compile(r"parquet-(\d+)(?:-rg(\d+)([km]?))?(?:([-+])sorted-([A-Za-z_][A-Za-z0-9_$]*))?")
_HELP = ("name a layout csv|tbl|json|parquet (as is), parquet-K, parquet-K-rgN, parquet-K-sorted-COL or "
         "parquet-K+sorted-COL (e.g. parquet-8-sorted-l_shipdate)")


# ---- names ------------------------------------------------------------------------------------

def _rows_text(n: int) -> str:
    if n % (1 << 20) == 0:
        return f"{n >> 20}m"
    if n % 1024 == 0:
        return f"{n >> 10}k"
    return str(n)


@dataclass(frozen=True)
class CopySpec:
    """One table's copy: K Parquet files, their row-group size (None: the writer's), sorted on a column."""

    files: int = 1
    row_group_rows: int | None = None
    sort: str | None = None

    @property
    def name(self) -> str:
        rg = f"-rg{_rows_text(self.row_group_rows)}" if self.row_group_rows else ""
        srt = f"-sorted-{self.sort}" if self.sort else ""
        return f"parquet-{self.files}{rg}{srt}"

    def to_json(self) -> dict:
        return {"files": self.files, "row_group_rows": self.row_group_rows, "sort": self.sort}


@dataclass(frozen=True)
class LayoutSpec:
    """A whole data set's layout. raw: the source as it is (format = its own); else Parquet copies."""

    format: str = "parquet"
    files: int = 1
    row_group_rows: int | None = None
    sort: str | None = None  # a column of one table; that table is sorted on it
    copies: int = 1  # 2: the unsorted copies plus a sorted copy of the sort column's table

    @property
    def raw(self) -> bool:
        return self.format != "parquet" or self.files == 0

    @property
    def name(self) -> str:
        if self.raw:
            return self.format
        base = CopySpec(self.files, self.row_group_rows).name
        if self.sort:
            return f"{base}{'+' if self.copies == 2 else '-'}sorted-{self.sort}"
        return base

    def copy(self, sorted_table: bool) -> CopySpec:
        """The copy a table gets (sorted_table: it holds the sort column, single-copy layout)."""
        return CopySpec(self.files, self.row_group_rows, self.sort if sorted_table and self.copies == 1 else None)

    def sorted_copy(self) -> CopySpec:
        return CopySpec(self.files, self.row_group_rows, self.sort)

    def to_json(self) -> dict:
        return {"name": self.name, "format": self.format, "files": None if self.raw else self.files,
                "row_group_rows": self.row_group_rows, "sort": self.sort, "copies": self.copies}


def parse(name: str, *, source_format: str | None = None) -> LayoutSpec:
    """A layout from its name (see the module doc). source_format: the format of the data it is for
    (its as-is layout is that format's name; another raw format is not a transformation tilewise makes)."""
    text = (name or "").strip()
    if text in FORMATS:
        if source_format is not None and text != source_format:
            raise UsageError(f"layout {text!r}: the source is {source_format}, and tilewise writes Parquet layouts only",
                             f"use {source_format} (as is) or a parquet-K layout")
        return LayoutSpec(format=text, files=0)
    m = _NAME.fullmatch(text)
    if not m:
        raise UsageError(f"unknown layout {name!r}", _HELP)
    k = int(m.group(1))
    if not 1 <= k <= MAX_FILES:
        raise UsageError(f"layout {name!r}: {k} files per table is out of range", f"use 1 to {MAX_FILES} files")
    rg = None
    if m.group(2):
        rg = int(m.group(2)) * {"": 1, "k": 1024, "m": 1 << 20}[m.group(3)]
        if rg < MIN_ROW_GROUP:
            raise UsageError(f"layout {name!r}: row groups of {rg} rows are too small",
                             f"use {MIN_ROW_GROUP} rows or more (e.g. rg64k)")
    copies = 2 if m.group(4) == "+" else 1
    return LayoutSpec("parquet", k, rg, m.group(5), copies)


def sort_table(spec: LayoutSpec, sources: dict[str, TableSource]) -> str | None:
    """The table holding the layout's sort column; a column no table has is an error listing them."""
    if not spec.sort:
        return None
    owners = [t for t, s in sources.items() if spec.sort in s.names]
    if not owners:
        import difflib

        cols = sorted({c for s in sources.values() for c in s.names})
        near = difflib.get_close_matches(spec.sort, cols, n=5, cutoff=0.6)
        raise UsageError(f"layout {spec.name}: no table has a column {spec.sort!r}",
                         f"columns like it: {', '.join(near)}" if near else f"{len(cols)} columns exist, e.g. "
                         + ", ".join(cols[:6]))
    if len(owners) > 1:
        raise UsageError(f"layout {spec.name}: column {spec.sort!r} is in several tables ({', '.join(owners)})",
                         "sort on a column only one table has")
    return owners[0]


# ---- one transformation ---------------------------------------------------------------------------

@dataclass
class Hooks:
    """What a caller lends a transformation: how many threads it may use now (asked before each
    step: the background budget changes while it runs), and a callback after each file is written
    (tests use it to inject a full disk or to pause for a SIGKILL)."""

    threads: Callable[[], int] = lambda: max(1, len(os.sched_getaffinity(0)))
    memory_mb: int | None = None
    after_file: Callable[[int, Path], None] | None = None
    log: Callable[[str], None] | None = None


def _proc_io() -> dict[str, int]:
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (line.split(":") for line in f if ":" in line)}
    except OSError:
        return {}


def _out_of_space(e: BaseException) -> bool:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "No space left on device" in str(e) or "Disk quota exceeded" in str(e)


def default_memory_mb() -> int:
    """A transformation's memory limit: a quarter of this machine's memory, 512 MiB to 8 GiB (DuckDB
    spills beyond it into the copy's own temporary directory)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 4 << 30
    return int(min(8 << 10, max(512, total // 4 >> 20)))


def transform(src: TableSource, copy: CopySpec, out: Path, hooks: Hooks | None = None) -> dict:
    """Write src's rows as copy into the (empty, temporary) directory out; returns the manifest body
    (files, rows, fingerprint, cost). Raises RawDataError for a malformed source row."""
    import duckdb

    hooks = hooks or Hooks()
    out = Path(out)
    spill = out / ".spill"
    t0, ru0, io0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF), _proc_io()
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"SET memory_limit = '{int(hooks.memory_mb or default_memory_mb())}MB'")
        con.execute(f"SET temp_directory = '{spill}'")
        con.execute("SET preserve_insertion_order = true")
        names = [raw._ident(c) for c in src.names]
        if copy.sort and copy.sort not in src.names:
            raise UsageError(f"table {src.table} has no column {copy.sort!r}", "pick a column of that table")
        order = f" ORDER BY {raw._ident(copy.sort)}" if copy.sort else ""
        _threads(con, hooks)
        try:
            con.execute(f"CREATE TABLE t AS SELECT * FROM {raw.scan_sql(src)}{order}")
        except duckdb.Error as e:
            err = raw.read_error(e, src)
            if err is not None:
                raise err from None
            raise
        rows, fp = con.execute(f"SELECT count(*), {_fingerprint(names)} FROM t").fetchone()
        files = []
        for i in range(copy.files):
            a, b = rows * i // copy.files, rows * (i + 1) // copy.files
            path = out / f"part-{i:05d}.parquet"
            opts = "FORMAT parquet" + (f", ROW_GROUP_SIZE {copy.row_group_rows}" if copy.row_group_rows else "")
            _threads(con, hooks)
            con.execute(f"COPY (SELECT * FROM t WHERE rowid >= {a} AND rowid < {b}) TO '{path}' ({opts})")
            _fsync(path)
            files.append(path)
            if hooks.after_file:
                hooks.after_file(i, path)
        con.execute("DROP TABLE t")
        # checked: the files read back hold exactly the rows read from the source
        lst = "[" + ", ".join(raw._lit(str(f)) for f in files) + "]"
        got_rows, got_fp = con.execute(f"SELECT count(*), {_fingerprint(names)} FROM read_parquet({lst})").fetchone()
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
    if (got_rows, got_fp) != (rows, fp):
        raise TilewiseError(f"table {src.table}: the written copy {copy.name} does not hold the source's rows "
                            f"({got_rows} rows, fingerprint {got_fp} vs {rows}, {fp})", "report this as a bug")
    ru1, io1 = resource.getrusage(resource.RUSAGE_SELF), _proc_io()
    made = parquet(src.table, [str(f) for f in files], layout=copy.name, sort=copy.sort)
    return {
        "rows": rows, "fingerprint": str(fp),
        "files": [{"name": f.name, "bytes": f.stat().st_size, "row_groups": g}
                  for f, g in zip(files, made.extra["row_groups"])],
        "cost": {"time_s": round(time.monotonic() - t0, 4),
                 "cpu_s": round((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime), 4),
                 "bytes_written": sum(f.stat().st_size for f in files),
                 "io_read_bytes": io1.get("read_bytes", 0) - io0.get("read_bytes", 0),
                 "io_write_bytes": io1.get("write_bytes", 0) - io0.get("write_bytes", 0),
                 "source_bytes": src.bytes},
    }


def _fingerprint(names: list[str]) -> str:
    """Order-independent: the rows' count and the sum of a 64-bit hash of each row."""
    return f"sum(hash({', '.join(names)})::HUGEINT)"


def _threads(con, hooks: Hooks) -> None:
    con.execute(f"SET threads = {max(1, int(hooks.threads()))}")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- the store of copies -------------------------------------------------------------------------

def source_key(sources: dict[str, TableSource]) -> str:
    """A short name for a source: the hash of its files' paths (a layout store per source)."""
    h = hashlib.sha256(json.dumps(sorted(f for s in sources.values() for f in s.files)).encode())
    return h.hexdigest()[:16]


def default_root(sources: dict[str, TableSource]) -> Path:
    """Where a source's copies go: ``<its directory>/layouts`` when that is writable, else the cache
    (~/.cache/tilewise/layouts/<source hash>)."""
    parents = {Path(f).parent for s in sources.values() for f in s.files}
    base = Path(os.path.commonpath([str(p) for p in parents])) if parents else None
    if base is not None and base.name in sources:  # tables in folders: the folder holding them
        base = base.parent
    if base is not None and os.access(base, os.W_OK):
        return base / "layouts"
    return dirs.cache_dir("layouts") / source_key(sources)


@dataclass
class Made:
    """One table's copy, ready: its source for the engines and its manifest (cost, files)."""

    source: TableSource
    manifest: dict
    built: bool  # made now (False: reused from the store)


@dataclass
class LayoutSet:
    """A layout realised for a data set: per table its copies (the first is what queries read;
    a second is the sorted copy of a two-copy layout)."""

    spec: LayoutSpec
    copies: dict[str, list[Made]] = field(default_factory=dict)
    root: Path | None = None

    def sources(self) -> dict[str, TableSource]:
        return {t: c[0].source for t, c in self.copies.items()}

    def alternates(self) -> dict[str, TableSource]:
        """table -> its second (sorted) copy, for two-copy layouts."""
        return {t: c[1].source for t, c in self.copies.items() if len(c) > 1}

    def cost(self, *, built_only: bool = False) -> dict:
        """What making every copy cost (summed over tables; built_only: only those made now)."""
        tot = {"time_s": 0.0, "cpu_s": 0.0, "bytes_written": 0, "io_read_bytes": 0, "io_write_bytes": 0}
        for cs in self.copies.values():
            for c in cs:
                if built_only and not c.built:
                    continue
                for k in tot:
                    tot[k] += (c.manifest.get("cost") or {}).get(k, 0) or 0
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in tot.items()}

    def to_json(self) -> dict:
        return {"layout": self.spec.name, "spec": self.spec.to_json(),
                "tables": {t: [dict(c.source.to_json(), built=c.built, cost=c.manifest.get("cost")) for c in cs]
                           for t, cs in self.copies.items()}}


class Store:
    """The copies made from one source, under root (see the module doc)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def copy_dir(self, table: str, copy: CopySpec) -> Path:
        return self.root / table / copy.name

    def lookup(self, src: TableSource, copy: CopySpec) -> Made | None:
        """The copy when it exists and checks out against its manifest and src (None otherwise)."""
        d = self.copy_dir(src.table, copy)
        man = _read_manifest(d)
        if man is None or not _valid(d, man, src):
            return None
        return Made(_made_source(d, man, copy), man, False)

    def ensure(self, src: TableSource, copy: CopySpec, hooks: Hooks | None = None) -> Made:
        """src's copy, made now when missing (atomic, locked, checked); reused when it checks out."""
        d = self.copy_dir(src.table, copy)
        state: dict = {}

        def build(tmp: Path) -> None:
            _preflight(src, tmp)
            try:
                body = transform(src, copy, tmp, hooks)
            except BaseException as e:
                if _out_of_space(e):
                    raise TilewiseError(f"out of disk space in {self.root} while writing table {src.table} as "
                                        f"{copy.name}; the partial copy was removed, nothing else was written",
                                        "free space there or pass --layout-dir DIR on a larger file system") from None
                raise
            man = {"format": TABLE_FORMAT, "table": src.table, "copy": copy.to_json(), "name": copy.name,
                   "source": {"format": src.format, "layout": src.layout, "identity": src.identity(),
                              **({"reader": raw.READER} if src.text else {})}, **body}
            try:
                atomic_write_json(tmp / TABLE_MANIFEST, man)
            except OSError as e:
                if _out_of_space(e):
                    raise TilewiseError(f"out of disk space in {self.root} while writing table {src.table}",
                                        "free space there or pass --layout-dir DIR") from None
                raise
            state["built"] = True

        def valid(p: Path) -> bool:
            man = _read_manifest(p)
            return man is not None and _valid(p, man, src)

        try:
            store.ensure_dir(d, valid, build, what=f"table {src.table} as {copy.name}", log=hooks.log if hooks else None,
                             option="--layout-dir")
        except OSError as e:
            if _out_of_space(e):
                raise TilewiseError(f"out of disk space in {self.root}", "free space there or pass --layout-dir DIR") from None
            raise
        man = _read_manifest(d)
        if man is None:
            raise TilewiseError(f"the copy of table {src.table} in {d} vanished after it was made")
        return Made(_made_source(d, man, copy), man, bool(state.get("built")))

    def realize(self, sources: dict[str, TableSource], spec: LayoutSpec, hooks: Hooks | None = None,
                only: Callable[[str], bool] | None = None) -> LayoutSet:
        """Every table's copy for spec (made where missing), largest table first; a raw layout is the
        sources themselves. only(table) False leaves a table out (cracking does one at a time)."""
        out = LayoutSet(spec, root=self.root)
        if spec.raw:
            for t, s in sources.items():
                out.copies[t] = [Made(s, {"cost": None}, False)]
            return out
        owner = sort_table(spec, sources)
        for t in sorted(sources, key=lambda t: -_size(sources[t])):
            if only is not None and not only(t):
                continue
            src = sources[t]
            cs = [self.ensure(src, spec.copy(t == owner), hooks)]
            if spec.copies == 2 and t == owner:
                cs.append(self.ensure(src, spec.sorted_copy(), hooks))
            out.copies[t] = cs
        out.copies = {t: out.copies[t] for t in sources if t in out.copies}
        return out

    def apply(self, sources: dict[str, TableSource], spec: LayoutSpec, hooks: Hooks | None = None) -> Path:
        """Make the layout and record it: <root>/<layout>/layout.json names every table's copies (the
        set an engine or `bench --layout` reads), written atomically last."""
        made = self.realize(sources, spec, hooks)
        target = self.root / spec.name / SET_MANIFEST
        atomic_write_json(target, {"format": SET_FORMAT, **made.to_json()})
        return target


def _size(s: TableSource) -> int:
    try:
        return s.bytes
    except OSError:
        return 0


def _read_manifest(d: Path) -> dict | None:
    try:
        man = json.loads((d / TABLE_MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return man if isinstance(man, dict) and man.get("format") == TABLE_FORMAT else None


def _valid(d: Path, man: dict, src: TableSource) -> bool:
    """A copy checks out: made from these very source files, and every file is as recorded."""
    try:
        if man["source"]["identity"] != src.identity():
            return False
        if src.text and man["source"].get("reader") != raw.READER:  # read from text another way: make it again
            return False
        import pyarrow.parquet as pq

        rows = 0
        for f in man["files"]:
            p = d / f["name"]
            if p.stat().st_size != f["bytes"]:
                return False
            rows += pq.read_metadata(p).num_rows
        return rows == man["rows"]
    except Exception:  # anything unreadable means "make it again"
        return False


def _made_source(d: Path, man: dict, copy: CopySpec) -> TableSource:
    files = [str(d / f["name"]) for f in man["files"]]
    return TableSource(man["table"], "parquet", tuple(files), rows=man["rows"], layout=copy.name, sort=copy.sort,
                       extra={"row_groups": [f["row_groups"] for f in man["files"]],
                              "bytes": [f["bytes"] for f in man["files"]]})


# text -> Parquet shrinks the bytes (TPC-H at SF 1: about 0.35); Parquet -> Parquet keeps them
_RATIO = {"parquet": 1.1, **{f: 0.6 for f in TEXT_FORMATS}}


def estimate_bytes(src: TableSource) -> int:
    """What a copy of src will take on disk, generously (for the free-space check before writing)."""
    return int(_size(src) * _RATIO.get(src.format, 1.0))


def _preflight(src: TableSource, d: Path) -> None:
    """Refuse before writing anything when the file system cannot hold the copy."""
    try:
        st = os.statvfs(d)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    need = estimate_bytes(src)
    if need > free:
        raise TilewiseError(f"not enough disk space in {d.parent} for table {src.table}: about {need / 1e6:.1f} MB "
                            f"needed, {free / 1e6:.1f} MB free; nothing was written",
                            "free space there or pass --layout-dir DIR on a larger file system")


def load_set(path: str | Path) -> LayoutSet:
    """A layout recorded by Store.apply (<root>/<layout>/layout.json), its copies checked."""
    p = Path(path)
    if p.is_dir():
        p = p / SET_MANIFEST
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read layout {p}: {e}", "make it with tilewise data layout --apply") from None
    if doc.get("format") != SET_FORMAT:
        raise UsageError(f"{p} is not a tilewise layout ({SET_FORMAT})")
    spec = parse(doc["layout"])
    out = LayoutSet(spec, root=p.parent.parent)
    for t, cs in doc["tables"].items():
        made = []
        for c in cs:
            s = TableSource.from_json(c, t)
            missing = [f for f in s.files if not os.path.exists(f)]
            if missing:
                raise TilewiseError(f"layout {spec.name}: table {t}'s file {missing[0]} is gone",
                                    "make the layout again (tilewise data layout --apply)")
            made.append(Made(s, {"cost": c.get("cost")}, False))
        out.copies[t] = made
    return out
