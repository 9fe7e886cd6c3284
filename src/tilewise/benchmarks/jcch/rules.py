"""The JCC-H rules as small pure functions over numpy arrays (no I/O).

Re-implements the reference generator's skew (ldbc/dbgen.JCC-H, the `#ifdef JCCH_SKEW` code in
build.c and skew/phash.c); /work/shared/jcch.md cites every rule. Where the paper and the code
disagree these follow the code. Every decision is made in a per-table permuted "hash space":
`h(k) = ((k-1)*PRIME + X) mod N` maps keys 1..N onto 0..N-1. Arithmetic is uint64 with the C
code's wrap-around, and the float expressions of `bin_nationkey` are evaluated in float64 exactly
as C does, so the same keys come out.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass

import numpy as np

PRIME = 1442968193
XOR_BITS = 792606555396977

REGIONS = ("AFRICA", "AMERICA", "ASIA", "EUROPE", "MIDDLE EAST")  # = r_regionkey 0..4
# skew_nations / nations_map of skew/phash.c: per region the large nation first, then 4 small ones.
SKEW_NATIONS = (
    "MOROCCO", "ALGERIA", "ETHIOPIA", "KENYA", "MOZAMBIQUE",
    "UNITED STATES", "ARGENTINA", "BRAZIL", "CANADA", "PERU",
    "CHINA", "INDONESIA", "JAPAN", "VIETNAM", "INDIA",
    "GERMANY", "FRANCE", "RUSSIA", "ROMANIA", "UNITED KINGDOM",
    "EGYPT", "IRAN", "IRAQ", "JORDAN", "SAUDI ARABIA",
)
NATION_KEYS = np.array([15, 0, 5, 14, 16, 24, 1, 2, 3, 17, 18, 9, 12, 21, 8, 7, 6, 22, 19, 23, 4, 10, 11, 13, 20],
                       dtype=np.int64)
LARGE_NATIONS = tuple(int(k) for k in NATION_KEYS[::5])  # 15, 24, 18, 7, 4 (one per region)
SMALL_NATIONS = tuple(int(k) for r in range(5) for k in NATION_KEYS[r * 5 + 1:r * 5 + 5])

GOLD = "SHINY MINED GOLD"
GOLD_NAME = "shiny mined gold"
GOLD_COMMENT = "1mine2 3gold4"
POPULOUS_ORDER_YEARS = (1992, 1993, 1994, 1997, 1998)  # h(order) 0..4
SANCTUARY_YEARS = (1995, 1996)  # no populous orders, gold customers or class-A lines
CURRENT_DATE = _dt.date(1995, 6, 17)  # TPC-H CURRENTDATE: returnflag / linestatus
EPOCH = _dt.date(1970, 1, 1)


def days(d: _dt.date) -> int:
    """date -> days since 1970-01-01 (Arrow date32)."""
    return (d - EPOCH).days


CURRENT_DAY = days(CURRENT_DATE)
BF_DAYS = {y: days(_dt.date(y, 5, 28)) for y in range(1992, 1999)}  # "Black Friday" is May 28 in the code


class PHash:
    """The bijection keys 1..n <-> hashes 0..n-1 of skew/phash.c (init_phash, PHASH, PHASH_INV)."""

    def __init__(self, n: int) -> None:
        if n < 2 or math.gcd(PRIME, n) != 1:
            raise ValueError(f"no JCC-H key permutation for a table of {n} rows")
        self.n = n
        inv = pow(PRIME, -1, n)
        if inv < 3:  # the C search starts at 3
            inv += n
        self.inv_mult = inv
        i = 1
        while 2 * i < n:
            i *= 2
        self.x = XOR_BITS & (i - 1)

    def h(self, key):
        """key (1..n) -> hash (0..n-1); int or numpy array."""
        k = np.asarray(key, dtype=np.uint64)
        with np.errstate(over="ignore"):
            out = ((k - np.uint64(1)) * np.uint64(PRIME) + np.uint64(self.x)) % np.uint64(self.n)
        return _like(key, out)

    def key(self, hv):
        """hash (0..n-1) -> key (1..n); int or numpy array."""
        h = np.asarray(hv, dtype=np.uint64)
        with np.errstate(over="ignore"):
            out = ((h + np.uint64(self.n) - np.uint64(self.x)) * np.uint64(self.inv_mult)) % np.uint64(self.n) + np.uint64(1)
        return _like(hv, out)


def _like(arg, out):
    if np.ndim(arg) == 0 and not isinstance(arg, np.ndarray):
        return int(out)
    return out.astype(np.int64)


def bin_nationkey(h, n: int) -> np.ndarray:
    """Nation key for customer/supplier hashes h of a table of n rows (skew/phash.c bin_nationkey):
    each region block of 0.2n starts with 0.18n hashes for its large nation, then 4 small nations."""
    hf = np.asarray(h, dtype=np.int64).astype(np.float64)
    row = np.trunc(hf / (0.2 * n)).astype(np.int64)
    offset = np.trunc(hf - (0.18 + row * 0.2) * n).astype(np.int64)
    col = np.zeros_like(row)
    if 0.02 * n > 0:
        small = offset > 0
        col[small] = 1 + np.trunc((4 * offset[small]).astype(np.float64) / (0.02 * n)).astype(np.int64)
    return NATION_KEYS[row * 5 + col]


@dataclass(frozen=True)
class Sizes:
    """Row counts and the derived constants of the rules for one scale factor."""

    parts: int
    suppliers: int
    customers: int
    orders: int

    @classmethod
    def for_sf(cls, sf: float) -> Sizes:
        # tpchgen-cli's row counts: base * SF, truncated
        return cls(int(200000 * sf), int(10000 * sf), int(150000 * sf), int(1500000 * sf))

    def check(self) -> None:
        """The rules need every region block to hold its 4 top suppliers plus one more."""
        if self.suppliers // 5 < 5 or self.parts < 80 or self.orders < 20 or self.customers // 5 < 3:
            raise ValueError("scale factor too small for JCC-H (needs at least SF 0.01)")

    @property
    def supp_block(self) -> int:  # B: supplier hashes per region
        return self.suppliers // 5

    @property
    def cust_block(self) -> int:
        return self.customers // 5

    @property
    def ngd(self) -> int:
        """NON_REFERENCED_GOLD_DOMAIN: part hashes 20..ngd-1 are what ordinary lines reference."""
        return ((149 * (self.parts // 150)) // 5) * 5

    @property
    def mega_lines(self) -> int:  # MAX_L_PER_O: 300000*SF lines in each populous order
        return self.orders // 5

    @property
    def mega_span(self) -> int:  # suppliers per other region in a mega order: i < Ns*0.16
        return math.ceil(self.suppliers * 0.16)

    @property
    def extra_partsupps(self) -> int:  # parts with a 4th partsupp (60 at every SF)
        return 4 * (self.parts) - (20 * self.suppliers + 3 * (self.parts - 20))

    @property
    def partsupp_rows(self) -> int:
        return 20 * self.suppliers + 3 * (self.parts - 20) + self.extra_partsupps

    def lineitem_rows(self, mega_indexes) -> int:
        small = sum(1 for i in mega_indexes if i <= 15)
        return 5 * self.mega_lines + 3 * (self.orders - 5) + (15 - small)


@dataclass(frozen=True)
class Hashes:
    part: PHash
    supplier: PHash
    customer: PHash
    orders: PHash

    @classmethod
    def of(cls, s: Sizes) -> Hashes:
        return cls(PHash(s.parts), PHash(s.suppliers), PHash(s.customers), PHash(s.orders))


# ---- customer / supplier ---------------------------------------------------------------------

def populous_customers(s: Sizes, hs: Hashes) -> list[int]:
    """Custkeys of the 5 populous customers, by region 0..4."""
    return [hs.customer.key(r * s.cust_block) for r in range(5)]


def populous_suppliers(s: Sizes, hs: Hashes) -> list[int]:
    return [hs.supplier.key(r * s.supp_block) for r in range(5)]


def customer_region_of_hash(h, s: Sizes):
    return np.asarray(h) // s.cust_block


# ---- part / partsupp -------------------------------------------------------------------------

def populous_parts(s: Sizes, hs: Hashes) -> np.ndarray:
    """Partkeys with hash 0..19, in hash order (0..4: the gold mine parts, 5..19: mega-order parts)."""
    return hs.part.key(np.arange(20))


def partsupp_class(hp, s: Sizes, hs: Hashes, cls: str) -> np.ndarray:
    """Supplier keys of partsupp class A/B/C/D for part hashes hp (build.c partsupp_class_*)."""
    hp = np.asarray(hp, dtype=np.int64)
    B = s.supp_block
    r = hp % 5
    other = (r + 1 + (hp // 5) % 4) % 5
    if cls == "A":
        sh = r * B
    elif cls == "B":
        sh = r * B + 4 + (hp // 20) % (B - 4)
    elif cls == "C":
        sh = other * B + (hp // 20) % 4
    elif cls == "D":
        sh = other * B + 4 + (hp // 20) % (B - 4)
    else:
        raise ValueError(cls)
    return hs.supplier.key(sh)


def four_partsupp_parts(s: Sizes, hs: Hashes) -> np.ndarray:
    """Partkeys that get a 4th (class D) partsupp: the first `extra` non-populous parts in key order
    (the static counter of mk_part assumes generation from part 1)."""
    pop = set(int(k) for k in populous_parts(s, hs))
    out, k = [], 1
    while len(out) < s.extra_partsupps:
        if k not in pop:
            out.append(k)
        k += 1
    return np.array(out, dtype=np.int64)


def retail_cents(partkey) -> np.ndarray:
    """p_retailprice in cents (rpb_routine)."""
    p = np.asarray(partkey, dtype=np.int64)
    return 90000 + (p // 10) % 20001 + (p % 1000) * 100


# ---- orders / lineitem -----------------------------------------------------------------------

def order_index(orderkey) -> np.ndarray:
    """Dense order index i (1..N) of a base-load o_orderkey = ((i>>3)<<5) + (i&7)."""
    k = np.asarray(orderkey, dtype=np.int64)
    return ((k >> 5) << 3) + (k & 7)


def order_key(index) -> np.ndarray:
    i = np.asarray(index, dtype=np.int64)
    return ((i >> 3) << 5) + (i & 7)


def mega_order_indexes(s: Sizes, hs: Hashes) -> list[int]:
    """Order indexes with hash 0..4 (the populous orders), by hash."""
    return [hs.orders.key(h) for h in range(5)]


def ordinary_line_part(u, region, s: Sizes, hs: Hashes):
    """Class-B line: u = a uniform TPC-H partkey draw (1..Np); returns (part hash, partkey, suppkey)
    with the part's region affinity forced to the customer region."""
    hp = 20 + hs.part.h(u) % (s.ngd - 20)
    hp = 5 * (hp // 5) + np.asarray(region, dtype=np.int64)
    return hp, hs.part.key(hp), partsupp_class(hp, s, hs, "B")


def mega_line_keys(pos, cust_region: int, s: Sizes, hs: Hashes):
    """(partkey, suppkey) of the mega order's lines at positions pos (0-based): the loop
    `for hp in 5..19: for r != cust_region: for i < 0.16*Ns`, repeated until the order is full."""
    pos = np.asarray(pos, dtype=np.int64)
    S = s.mega_span
    q = pos % (15 * 4 * S)
    hp = 5 + q // (4 * S)
    ri = (q // S) % 4
    r = ri + (ri >= cust_region)  # the ri-th region other than cust_region
    i = q % S
    return hs.part.key(hp), hs.supplier.key(r * s.supp_block + i)
