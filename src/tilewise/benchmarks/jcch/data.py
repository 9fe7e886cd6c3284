"""JCC-H data: TPC-H with join-crossing correlations and skew, generated on top of tpchgen-cli output.

tpchgen-cli writes the TPC-H tables (lineitem excepted); the JCC-H rules (tilewise.benchmarks.jcch.rules)
then rewrite customer, supplier and part column-wise and regenerate partsupp, orders and lineitem:
- partsupp: keys and row structure from the rules; availqty/supplycost/comment reused row by row
  from TPC-H's partsupp (same row count).
- orders: TPC-H's keys, priority, clerk, shippriority and comment are kept; the date is moved
  (populous orders, Black Friday), the customer and the comment prefix follow the rules; status
  and total price are computed from the new lines.
- lineitem: keys from the rules; quantity, discount, tax, ship instruction/mode, date offsets and
  return flag drawn from TPC-H's distributions with a seeded numpy generator; comments are windows
  of a text pool made of TPC-H order comments.

Everything is streamed in blocks of a fixed number of orders (and rows), so memory is bounded by
the block size, not the scale factor, and each block's random numbers come from its own seeded
stream: the output depends only on (SF, seed, tpchgen-cli version). A worker thread computes the
next block while the current one is written.

Layout: <data_dir>/jcch-sf<X>-seed<S>/ (default data_dir ~/.cache/tilewise/jcch), built and
cached by tilewise.data.store like the TPC-H set. A cached TPC-H set of the same SF (in the TPC-H
cache) is used as the source when there is one; otherwise tpchgen-cli runs for the 7 tables.
DATA is this module as the benchmark contract's Data (tilewise.benchmarks.spec), with the checks
of tilewise.benchmarks.jcch.check.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tilewise.benchmarks.jcch import check as jcch_check
from tilewise.benchmarks.jcch import rules as J
from tilewise.benchmarks.spec import Data, DataCheck, check_seed
from tilewise.benchmarks.tpch import data as tpch
from tilewise.data import Dataset, store
from tilewise.errors import UsageError

TITLE = "JCC-H"

MANIFEST_FORMAT = "tilewise-jcch-data/1"
GENERATOR = "tilewise-jcch/1"  # bump when the rules or the random streams change
DEFAULT_SEED = 0
SOURCE_TABLES = ("region", "nation", "supplier", "customer", "part", "orders")
BLOCK_ORDERS = 1 << 17  # orders per block (about 786K lines); fixed: the random streams depend on it
CHUNK_ROWS = 1 << 18  # rows per partsupp / mega-order piece
ROW_GROUP_ROWS = 122_880
TEXT_POOL_ORDERS = 1_000_000  # order comments that make the lineitem comment pool

INSTRUCTS = ("DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN")
SHIPMODES = ("REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB")
DIP, REG_AIR = 0, 0
# random-stream tags: (seed, tag, block) seeds one numpy generator
_TAG_LINES, _TAG_MEGA, _TAG_PARTSUPP = 1, 2, 3


def default_root() -> Path:
    return store.cache_root("jcch")


def check_sf(sf) -> float:
    v = tpch.check_sf(sf)
    if v < 0.01:
        raise UsageError(f"JCC-H needs SF >= 0.01, got {sf:g}" if isinstance(sf, float) else
                         f"JCC-H needs SF >= 0.01, got {sf}", "use e.g. --sf 0.1 or --sf 1")
    return v


def set_dir(sf: float, seed: int = DEFAULT_SEED, data_dir: str | Path | None = None) -> Path:
    root = Path(data_dir) if data_dir is not None else default_root()
    return root / f"jcch-{tpch.sf_label(check_sf(sf))}-seed{check_seed(seed)}"


def is_valid(d: Path) -> bool:
    return store.is_valid(d, MANIFEST_FORMAT, tpch.TABLES)


def ensure_data(sf: float, data_dir: str | Path | None = None, *, seed: int = DEFAULT_SEED, log=None,
                progress=None) -> Path:
    """A directory holding the 8 JCC-H tables as Parquet at scale factor sf (generated if needed)."""
    sf, seed = check_sf(sf), check_seed(seed)
    target = set_dir(sf, seed, data_dir)

    def build(tmp: Path) -> dict:
        src = tpch.sf_dir(sf, None if data_dir is None else data_dir)
        version = tpch.tpchgen_version()
        scratch = None
        try:
            if not tpch.is_valid(src) or tpch.tpchgen_version() != (store.read_manifest(src) or {}).get("generator"):
                scratch = Path(tempfile.mkdtemp(prefix=".source-", dir=tmp))
                tpch.run_tpchgen(sf, scratch, SOURCE_TABLES, progress=progress)
                src = scratch
            generate(src, tmp, sf, seed, progress=progress)
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        return {"sf": sf, "seed": seed, "generator": f"{GENERATOR} on {version}"}

    return store.ensure(target, MANIFEST_FORMAT, build, what=f"JCC-H SF {sf:g} seed {seed}", log=log,
                        tables=tpch.TABLES)


# JCC-H's keys are TPC-H's: the loaded data and the refresh sets (tilewise.benchmarks.jcch.refresh,
# whose new lines take their part and supplier from JCC-H's partsupp) satisfy every one.
KEYS = tpch.KEYS


def dataset(sf: float, data_dir: str | Path | None = None, *, seed: int = DEFAULT_SEED, log=None,
            progress=None) -> Dataset:
    """The JCC-H data set at scale factor sf for seed, generated first if needed."""
    sf, seed = check_sf(sf), check_seed(seed)
    return Dataset("jcch", sf, ensure_data(sf, data_dir, seed=seed, log=log, progress=progress), seed, title=TITLE,
                   table_names=tpch.TABLES, keys=KEYS)


class _Data(Data):
    tables = tpch.TABLES
    seeded = True
    default_seed = DEFAULT_SEED
    sf_rule = ">= 0.01"
    check_kinds = (("invariant", "hard invariants"), ("target", "statistical targets (SF 1 reference)"))

    def check_sf(self, sf) -> float:
        return check_sf(sf)

    def set_dir(self, sf: float, seed: int | None = None, data_dir: str | Path | None = None) -> Path:
        return set_dir(sf, DEFAULT_SEED if seed is None else seed, data_dir)

    def is_valid(self, d: Path) -> bool:
        return is_valid(d)

    def dataset(self, sf: float, data_dir: str | Path | None = None, *, seed: int | None = None, log=None,
                progress=None) -> Dataset:
        return dataset(sf, data_dir, seed=DEFAULT_SEED if seed is None else seed, log=log, progress=progress)

    def check(self, d: Path, sf: float) -> list[DataCheck]:
        return jcch_check.run(d, sf)


DATA = _Data()


# ---- the generator -----------------------------------------------------------------------------

def generate(src: Path, out: Path, sf: float, seed: int, *, progress=None) -> dict:
    """Write the 8 JCC-H tables into out from the TPC-H tables in src; returns {table: rows}."""
    import pyarrow.parquet as pq

    sizes = _sizes(src, sf)
    sizes.check()
    hs = J.Hashes.of(sizes)
    g = _Gen(sizes, hs, seed, progress)
    for t in ("region", "nation"):
        shutil.copyfile(src / f"{t}.parquet", out / f"{t}.parquet")
    rows = {"region": 5, "nation": 25}
    rows["supplier"] = g.supplier(src / "supplier.parquet", out / "supplier.parquet")
    rows["customer"] = g.customer(src / "customer.parquet", out / "customer.parquet")
    rows["part"] = g.part(src / "part.parquet", out / "part.parquet")
    g.text_pool(src / "orders.parquet")
    rows["partsupp"] = g.partsupp(out / "partsupp.parquet")
    rows["orders"], rows["lineitem"] = g.orders_lineitem(src / "orders.parquet", out / "orders.parquet",
                                                         out / "lineitem.parquet")
    for t, n in rows.items():
        assert pq.read_metadata(out / f"{t}.parquet").num_rows == n, t
    return rows


def _sizes(src: Path, sf: float) -> J.Sizes:
    import pyarrow.parquet as pq

    def n(t):
        return pq.read_metadata(src / f"{t}.parquet").num_rows

    s = J.Sizes(n("part"), n("supplier"), n("customer"), n("orders"))
    if s != J.Sizes.for_sf(sf):
        raise UsageError(f"the TPC-H source tables in {src} are not SF {sf:g}")
    return s


def _rng(seed: int, tag: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, tag, *key])))


def _string_schema(schema):
    """tpchgen-cli's Arrow schema with string_view -> string (what every engine reads the same)."""
    import pyarrow as pa

    return pa.schema([pa.field(f.name, pa.string() if f.type == pa.string_view() else f.type, f.nullable)
                      for f in schema])


def _decimal(cents: np.ndarray):
    """int64 cents -> decimal128(15, 2) without a per-value conversion."""
    import pyarrow as pa

    c = np.ascontiguousarray(cents, dtype=np.int64)
    buf = np.empty((len(c), 2), dtype=np.int64)
    buf[:, 0] = c
    buf[:, 1] = c >> 63
    return pa.Array.from_buffers(pa.decimal128(15, 2), len(c), [None, pa.py_buffer(buf)])


def _date32(d: np.ndarray):
    import pyarrow as pa

    d = np.ascontiguousarray(d, dtype=np.int32)
    return pa.Array.from_buffers(pa.date32(), len(d), [None, pa.py_buffer(d)])


def _pick(values: tuple[str, ...], idx: np.ndarray):
    """String column from indexes into a small set of values."""
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(np.asarray(idx, dtype=np.int8)), pa.array(values)).cast(pa.string())


def _years(d: np.ndarray) -> np.ndarray:
    return d.astype("datetime64[D]").astype("datetime64[Y]").astype(np.int64) + 1970


def _months(d: np.ndarray) -> np.ndarray:
    return d.astype("datetime64[D]").astype("datetime64[M]").astype(np.int64) % 12 + 1


class _Writer:
    def __init__(self, path: Path, schema) -> None:
        import pyarrow.parquet as pq

        self.schema = schema
        # decimals as INT64, like tpchgen-cli's files: engines decode both sets the same way
        self.w = pq.ParquetWriter(path, schema, compression="snappy", write_statistics=True,
                                  store_decimal_as_integer=True)
        self.rows = 0

    def write(self, table) -> None:
        if table.num_rows:
            self.w.write_table(table.cast(self.schema), row_group_size=ROW_GROUP_ROWS)
            self.rows += table.num_rows

    def close(self) -> int:
        self.w.close()
        return self.rows


class _Rows:
    """Read a Parquet file's columns sequentially in arbitrary-sized slices."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        import pyarrow.parquet as pq

        self.it = pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=CHUNK_ROWS, columns=columns)
        self.buf: list = []
        self.have = 0

    def take(self, n: int):
        import pyarrow as pa

        while self.have < n:
            b = next(self.it)
            self.buf.append(b)
            self.have += b.num_rows
        t = pa.Table.from_batches(self.buf)
        out, rest = t.slice(0, n), t.slice(n)
        self.buf = rest.to_batches()
        self.have -= n
        return out


class _Gen:
    def __init__(self, sizes: J.Sizes, hs: J.Hashes, seed: int, progress) -> None:
        self.s, self.hs, self.seed = sizes, hs, seed
        self.progress = progress
        self.gold_parts = J.populous_parts(sizes, hs)[:5]  # by region
        self.pop_supps = np.array(J.populous_suppliers(sizes, hs), dtype=np.int64)
        self.pop_custs = np.array(J.populous_customers(sizes, hs), dtype=np.int64)

    def _report(self, task: str, done: float, total: float) -> None:
        if self.progress:
            self.progress(task, done, total)

    # -- supplier, customer, part: column-wise rewrites ------------------------------------------

    def _rewrite(self, name: str, src: Path, dst: Path, rows: int, columns) -> int:
        """Stream a TPC-H table through columns(table) -> {column: new values} into dst."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        f = pq.ParquetFile(src, pre_buffer=False)  # streamed: no read cache of the whole file
        schema = _string_schema(f.schema_arrow)
        w = _Writer(dst, schema)
        for b in f.iter_batches(batch_size=CHUNK_ROWS):
            w.write(_replace(pa.Table.from_batches([b]).cast(schema), columns))
            self._report(name, w.rows, rows)
        return w.close()

    def supplier(self, src: Path, dst: Path) -> int:
        return self._rewrite("supplier", src, dst, self.s.suppliers, self._supplier_columns)

    def customer(self, src: Path, dst: Path) -> int:
        return self._rewrite("customer", src, dst, self.s.customers, self._customer_columns)

    def part(self, src: Path, dst: Path) -> int:
        return self._rewrite("part", src, dst, self.s.parts, self._part_columns)

    def _supplier_columns(self, t) -> dict:
        import pyarrow as pa
        import pyarrow.compute as pc

        h = self.hs.supplier.h(t["s_suppkey"].to_numpy())
        empty = pa.array((h % self.s.supp_block) < 4)  # the top-4 suppliers of each region
        return {"s_nationkey": pa.array(J.bin_nationkey(h, self.s.suppliers)),
                "s_comment": pc.if_else(empty, "", t["s_comment"])}

    def _customer_columns(self, t) -> dict:
        import pyarrow as pa
        import pyarrow.compute as pc

        h = self.hs.customer.h(t["c_custkey"].to_numpy())
        populous = pa.array(h % self.s.cust_block == 0)
        code = pa.array([f"{4 + r}0" for r in range(5)]).take(pa.array(J.customer_region_of_hash(h, self.s)))
        phone = pc.if_else(populous, pc.binary_join_element_wise(code, pc.utf8_slice_codeunits(t["c_phone"], 2), ""),
                           t["c_phone"])
        return {"c_nationkey": pa.array(J.bin_nationkey(h, self.s.customers)), "c_phone": phone}

    def _part_columns(self, t) -> dict:
        import pyarrow as pa
        import pyarrow.compute as pc

        hp = self.hs.part.h(t["p_partkey"].to_numpy())
        pop = hp < 20
        brand55 = pc.equal(t["p_brand"], "Brand#55").to_numpy(zero_copy_only=False)
        lgbox = pc.equal(t["p_container"], "LG BOX").to_numpy(zero_copy_only=False)
        size = t["p_size"].to_numpy().astype(np.int32)
        unref_gold = hp > self.s.ngd
        # no other part may share two of the populous parts' attributes (build.c mk_part)
        new_brand = pc.if_else(pa.array(~pop & brand55 & lgbox),
                               pc.binary_join_element_wise("Brand#1", pc.utf8_slice_codeunits(t["p_brand"], 7), ""),
                               t["p_brand"])
        new_brand = pc.if_else(pa.array(pop), "Brand#55", new_brand)
        bump = ~pop & (size == 1) & (brand55 | unref_gold | lgbox)
        size = np.where(bump, 2 + hp % 50, size)
        size = np.where(pop, 1, size).astype(np.int32)
        gold_type = pop | (~pop & ~brand55 & unref_gold)
        return {
            "p_name": pc.if_else(pa.array(pop), J.GOLD_NAME, t["p_name"]),
            "p_brand": new_brand,
            "p_type": pc.if_else(pa.array(gold_type), J.GOLD, t["p_type"]),
            "p_size": pa.array(size),
            "p_container": pc.if_else(pa.array(pop), "LG BOX", t["p_container"]),
        }

    # -- partsupp --------------------------------------------------------------------------------

    def partsupp_keys(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ps_partkey, position in part) in key order, in pieces of <= CHUNK_ROWS rows: 3 rows
        per part, 4 for the first 60 non-populous parts, one per supplier for the 20 populous."""
        s = self.s
        special = {int(k): s.suppliers for k in J.populous_parts(s, self.hs)}
        special.update({int(k): 4 for k in J.four_partsupp_parts(s, self.hs)})
        pending: list[tuple[np.ndarray, np.ndarray]] = []
        have = 0
        k = 1
        for sk in sorted(special) + [s.parts + 1]:
            while k < sk:  # plain parts: 3 rows each
                e = min(sk, k + CHUNK_ROWS // 3)
                pending.append((np.repeat(np.arange(k, e, dtype=np.int64), 3), np.tile(np.arange(3), e - k)))
                have += 3 * (e - k)
                k = e
                if have >= CHUNK_ROWS:
                    yield _concat(pending)
                    pending, have = [], 0
            if sk > s.parts:
                break
            cnt = special[sk]
            for a in range(0, cnt, CHUNK_ROWS):
                n = min(CHUNK_ROWS, cnt - a)
                pending.append((np.full(n, sk, dtype=np.int64), np.arange(a, a + n)))
                have += n
                if have >= CHUNK_ROWS:
                    yield _concat(pending)
                    pending, have = [], 0
            k = sk + 1
        if pending:
            yield _concat(pending)

    def _partsupp_piece(self, piece: int, keys: np.ndarray, pos: np.ndarray):
        import pyarrow as pa

        s, hs = self.s, self.hs
        hp = hs.part.h(keys)
        pop = hp < 20
        supp = np.zeros(len(keys), dtype=np.int64)
        for i, cls in enumerate("ABCD"):
            m = ~pop & (pos == i)
            if m.any():
                supp[m] = J.partsupp_class(hp[m], s, hs, cls)
        supp[pop] = hs.supplier.key(pos[pop])  # populous parts: one row per supplier
        rng = _rng(self.seed, _TAG_PARTSUPP, piece)
        qty = rng.integers(1, 10000, len(keys), dtype=np.int32)
        qty[pop] = int(4_000_000 * s.parts / 200_000)  # 4,000,000 * SF
        cost = rng.integers(100, 100001, len(keys), dtype=np.int64)
        return pa.table({"ps_partkey": keys, "ps_suppkey": supp, "ps_availqty": qty, "ps_supplycost": _decimal(cost),
                         "ps_comment": self._comments(rng, len(keys), 49, 198)})

    def partsupp(self, dst: Path) -> int:
        w = _Writer(dst, _partsupp_schema())

        def write(t) -> None:
            w.write(t)
            self._report("partsupp", w.rows, self.s.partsupp_rows)

        jobs = ((lambda i=i, k=k, p=p: self._partsupp_piece(i, k, p)) for i, (k, p) in enumerate(self.partsupp_keys()))
        _pipeline(jobs, write)
        return w.close()

    # -- orders and lineitem ---------------------------------------------------------------------

    def text_pool(self, orders_src: Path) -> None:
        import pyarrow as pa

        self.pool = self._text_pool(orders_src)
        self.pool_np = np.frombuffer(self.pool, dtype=np.uint8)
        self.pool_buf = pa.py_buffer(self.pool)

    def _text_pool(self, orders_src: Path) -> bytes:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(orders_src, pre_buffer=False)
        parts, n = [], 0
        for b in pf.iter_batches(batch_size=CHUNK_ROWS, columns=["o_comment"]):
            spaced = pc.binary_join_element_wise(b.column(0).cast("string"), " ", "")  # comment + " "
            offsets = np.frombuffer(spaced.buffers()[1], dtype=np.int32, count=len(spaced) + 1, offset=4 * spaced.offset)
            parts.append(spaced.buffers()[2].to_pybytes()[offsets[0]:offsets[-1]])
            n += b.num_rows
            if n >= TEXT_POOL_ORDERS:
                break
        return b"".join(parts)

    def _comments(self, rng: np.random.Generator, n: int, lo: int = 10, hi: int = 43):
        """n comments: consecutive windows of lo..hi characters of the text pool (TPC-H's TEXT():
        lineitem 10..43, partsupp 49..198)."""
        import pyarrow as pa

        lens = rng.integers(lo, hi + 1, n, dtype=np.int32)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lens, out=offsets[1:])
        total = int(offsets[-1])
        pool = self.pool
        start = int(rng.integers(0, len(pool)))
        if start + total <= len(pool):
            data = self.pool_buf.slice(start, total)
        else:
            reps = -(-(start + total) // len(pool))
            data = pa.py_buffer(np.tile(self.pool_np, reps)[start:start + total])
        return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), data)

    def _lines(self, rng, okey, odate, region, linenumber, skewed_first: np.ndarray | None,
               part_supp=None):
        """Line columns for given per-line order fields; returns (arrow columns, price cents, F flags).
        skewed_first marks class-A (gold mine) lines of ordinary orders; part_supp=(partkey,
        suppkey) gives the keys of mega-order lines (all skewed)."""
        s, hs = self.s, self.hs
        n = len(okey)
        if part_supp is None:
            u = rng.integers(1, s.parts + 1, n)
            _, pk, sk = J.ordinary_line_part(u, region, s, hs)
            skewed = skewed_first
            partkey = np.where(skewed, self.gold_parts[region], pk)
            suppkey = np.where(skewed, self.pop_supps[region], sk)
        else:
            partkey, suppkey = part_supp
            skewed = np.ones(n, dtype=bool)
        qty = rng.integers(1, 51, n, dtype=np.int64)
        qty[skewed] = 51
        disc = rng.integers(0, 11, n, dtype=np.int64)
        tax = rng.integers(0, 9, n, dtype=np.int64)
        instruct = rng.integers(0, 4, n, dtype=np.int8)
        mode = rng.integers(0, 7, n, dtype=np.int8)
        instruct[skewed] = DIP
        mode[skewed] = REG_AIR
        ship = odate + rng.integers(1, 122, n, dtype=np.int32)
        commit = odate + rng.integers(30, 91, n, dtype=np.int32)
        receipt = ship + rng.integers(1, 31, n, dtype=np.int32)
        ra = rng.integers(0, 2, n, dtype=np.int8)  # R or A when received by CURRENTDATE
        flag = np.where(receipt <= J.CURRENT_DAY, ra, 2).astype(np.int8)  # 0 R, 1 A, 2 N
        if part_supp is None:
            # Black Friday orders: almost all non-skewed lines are 'R' (build.c mk_item, "Q10")
            bf = odate == _bf_days(_years(odate))
            flag[~skewed & bf & (okey % 50 != 0)] = 0
        status_f = ship <= J.CURRENT_DAY
        eprice = J.retail_cents(partkey) * qty
        price = (eprice * (100 - disc) // 100) * (100 + tax) // 100
        cols = {
            "l_orderkey": okey, "l_partkey": partkey, "l_suppkey": suppkey,
            "l_linenumber": linenumber.astype(np.int32),
            "l_quantity": _decimal(qty * 100), "l_extendedprice": _decimal(eprice),
            "l_discount": _decimal(disc), "l_tax": _decimal(tax),
            "l_returnflag": _pick(("R", "A", "N"), flag), "l_linestatus": _pick(("O", "F"), status_f),
            "l_shipdate": _date32(ship), "l_commitdate": _date32(commit), "l_receiptdate": _date32(receipt),
            "l_shipinstruct": _pick(INSTRUCTS, instruct), "l_shipmode": _pick(SHIPMODES, mode),
            "l_comment": self._comments(rng, n),
        }
        return cols, price, status_f

    def _block(self, b: int, t):
        """One block of orders (a pyarrow table of TPC-H orders): returns (orders table, [lineitem tables])."""
        import pyarrow as pa
        import pyarrow.compute as pc

        s, hs = self.s, self.hs
        okey = t["o_orderkey"].to_numpy()
        i = J.order_index(okey)
        ho = hs.orders.h(i)
        region = ho % 5
        pop = ho < 5
        date = np.asarray(t["o_orderdate"].cast(pa.int32()).to_numpy(), dtype=np.int64)
        years_pop = np.array([J.BF_DAYS[y] for y in J.POPULOUS_ORDER_YEARS])
        date = np.where(pop, years_pop[np.minimum(ho, 4)], date)
        year = _years(date)
        sanctuary = (year == 1995) | (year == 1996)
        gold = ~sanctuary & ((ho // 20) % 20 < 7)
        # customers: gold orders -> the region's populous customer; others a region-local customer
        C = s.cust_block
        x = (ho // 5) % (C - C // 3)
        x = (x * 3 // 2) % C
        x = np.where(x == 0, 1, x)
        cust = np.where(gold, self.pop_custs[region], hs.customer.key(region * C + x))
        # Black Friday: 3/4 of the orders (by index) dated Jan-Apr or Sep-Dec move to May 28
        month = _months(date)
        move = ((i * 17) % 4 < 3) & ((month < 5) | (month > 8))
        bf_day = _bf_days(year)
        date = np.where(move, bf_day, date)
        comment = pc.if_else(pa.array(gold), pc.binary_join_element_wise(
            J.GOLD_COMMENT, pc.utf8_slice_codeunits(t["o_comment"], 13), ""), t["o_comment"])

        rng = _rng(self.seed, _TAG_LINES, b)
        ordi = np.flatnonzero(~pop)
        cnt = np.where(i[ordi] <= 15, 4, 3)
        oi = np.repeat(np.arange(len(ordi)), cnt)
        starts = np.zeros(len(ordi) + 1, dtype=np.int64)
        np.cumsum(cnt, out=starts[1:])
        linenumber = np.arange(int(starts[-1])) - starts[:-1][oi] + 1
        row = ordi[oi]
        first_gold = (linenumber == 1) & ~sanctuary[row]
        cols, price, fflag = self._lines(rng, okey[row], date[row], region[row], linenumber, first_gold)
        ordinary = pa.table(cols)
        total = np.zeros(len(okey), dtype=np.int64)
        total[ordi] = np.bincount(oi, weights=price, minlength=len(ordi)).astype(np.int64)
        nf = np.bincount(oi, weights=fflag, minlength=len(ordi)).astype(np.int64)
        status = np.zeros(len(okey), dtype=np.int8)  # 0 O, 1 F, 2 P
        status[ordi] = np.where(nf == cnt, 1, np.where(nf > 0, 2, 0))

        # ordinary lines split where the mega orders' lines go (they are separate jobs)
        megas = np.flatnonzero(pop)
        cuts = [0] + [int(starts[np.searchsorted(ordi, m)]) for m in megas] + [len(ordinary)]
        segments = [ordinary.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])]
        status[megas] = 1  # populous orders are 'F'
        orders = _replace(t, {"o_custkey": pa.array(cust), "o_orderstatus": _pick(("O", "F", "P"), status),
                              "o_orderdate": _date32(date), "o_comment": comment})
        return _Block(orders, total, megas, segments)

    def _mega_piece(self, index: int, piece: int):
        """Lines [piece * CHUNK_ROWS, ...) of the populous order with dense index `index`: only
        the rules decide its key, date and region, so it needs no input."""
        import pyarrow as pa

        s, hs = self.s, self.hs
        h = hs.orders.h(index)
        region = h % 5
        a = piece * CHUNK_ROWS
        n = min(CHUNK_ROWS, s.mega_lines - a)
        pos = np.arange(a, a + n)
        keys = J.mega_line_keys(pos, region, s, hs)
        day = J.BF_DAYS[J.POPULOUS_ORDER_YEARS[h]]
        cols, price, _ = self._lines(_rng(self.seed, _TAG_MEGA, h, piece), np.full(n, int(J.order_key(index))),
                                     np.full(n, day), np.full(n, region), pos + 1, None, part_supp=keys)
        return pa.table(cols), int(price.sum())

    def orders_lineitem(self, src: Path, orders_dst: Path, lineitem_dst: Path) -> tuple[int, int]:
        import pyarrow.parquet as pq

        f = pq.ParquetFile(src, pre_buffer=False)  # streamed: no read cache of the whole file
        oschema = _string_schema(f.schema_arrow)
        w_o = _Writer(orders_dst, oschema)
        w_l = _Writer(lineitem_dst, _lineitem_schema())
        mega = J.mega_order_indexes(self.s, self.hs)
        total_lines = self.s.lineitem_rows(mega)
        reader = _Rows(src, None)
        nblocks = -(-self.s.orders // BLOCK_ORDERS)

        pieces = -(-self.s.mega_lines // CHUNK_ROWS)
        state: dict = {}

        def jobs():
            """Per block: its orders and ordinary lines, then each of its mega orders in pieces
            (planned from the rules: a mega order's lines never wait in memory for its block)."""
            for b in range(nblocks):
                n = min(BLOCK_ORDERS, self.s.orders - b * BLOCK_ORDERS)
                yield lambda b=b, n=n: ("block", self._block(b, reader.take(n).cast(oschema)))
                for m in sorted(i for i in mega if (i - 1) // BLOCK_ORDERS == b):
                    for k in range(pieces):
                        yield lambda m=m, k=k: ("mega", (k, *self._mega_piece(m, k)))

        def lines(t) -> None:
            w_l.write(t)
            self._report("orders+lineitem", w_l.rows, total_lines)

        def consume(result) -> None:
            kind, r = result
            if kind == "block":
                state.update(block=r, mega=0, total=0)
                lines(r.segments[0])
            else:
                k, table, price = r
                lines(table)
                state["total"] += price
                if k == pieces - 1:  # the mega order is complete: its total, then the next segment
                    blk = state["block"]
                    blk.total[blk.megas[state["mega"]]] = state["total"]
                    state["mega"] += 1
                    state["total"] = 0
                    lines(blk.segments[state["mega"]])
            blk = state["block"]
            if state["mega"] == len(blk.megas) and state.get("written") is not blk:
                w_o.write(_replace(blk.orders, {"o_totalprice": _decimal(blk.total)}))
                state["written"] = blk

        _pipeline(jobs(), consume)
        return w_o.close(), w_l.close()


_BF_TABLE = np.array([J.BF_DAYS.get(y, 0) for y in range(1992, 1999)], dtype=np.int64)


def _bf_days(year: np.ndarray) -> np.ndarray:
    return _BF_TABLE[np.clip(year - 1992, 0, 6)]


@dataclass
class _Block:
    orders: object  # pyarrow Table, o_totalprice still TPC-H's
    total: np.ndarray  # o_totalprice in cents; the mega orders' filled in as their pieces are written
    megas: np.ndarray  # positions of the block's mega orders
    segments: list  # ordinary lines before, between and after the mega orders


def _replace(t, columns):
    """t with the columns that columns(t) returns ({name: values}) swapped in."""
    for name, values in (columns(t) if callable(columns) else columns).items():
        t = t.set_column(t.schema.get_field_index(name), name, values)
    return t


def _pipeline(jobs, consume) -> None:
    """Run jobs (callables, in order) in a worker thread, one ahead, and consume each result in
    order in the calling thread: computing block b+1 overlaps writing block b (numpy and the
    Parquet writer release the GIL); at most two results are alive at a time."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="jcch-gen") as pool:
        it = iter(jobs)
        nxt = next(it, None)
        fut = pool.submit(nxt) if nxt else None
        while fut is not None:
            result = fut.result()
            nxt = next(it, None)
            fut = pool.submit(nxt) if nxt else None
            consume(result)
            del result


def _partsupp_schema():
    import pyarrow as pa

    return pa.schema([pa.field("ps_partkey", pa.int64(), False), pa.field("ps_suppkey", pa.int64(), False),
                      pa.field("ps_availqty", pa.int32(), False), pa.field("ps_supplycost", pa.decimal128(15, 2), False),
                      pa.field("ps_comment", pa.string(), False)])


def _concat(pieces):
    return np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])


def _lineitem_schema():
    import pyarrow as pa

    d = pa.decimal128(15, 2)
    s = pa.string()
    return pa.schema([
        pa.field("l_orderkey", pa.int64(), False), pa.field("l_partkey", pa.int64(), False),
        pa.field("l_suppkey", pa.int64(), False), pa.field("l_linenumber", pa.int32(), False),
        pa.field("l_quantity", d, False), pa.field("l_extendedprice", d, False),
        pa.field("l_discount", d, False), pa.field("l_tax", d, False),
        pa.field("l_returnflag", s, False), pa.field("l_linestatus", s, False),
        pa.field("l_shipdate", pa.date32(), False), pa.field("l_commitdate", pa.date32(), False),
        pa.field("l_receiptdate", pa.date32(), False), pa.field("l_shipinstruct", s, False),
        pa.field("l_shipmode", s, False), pa.field("l_comment", s, False),
    ])
