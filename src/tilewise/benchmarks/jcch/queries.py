"""JCC-H query parameters: qgen's substitution rules for the 22 templates, "normal" and "skewed".

The reference qgen (ldbc/dbgen.JCC-H varsub.c; rules quoted in /work/shared/jcch.md §2) draws the
parameters of each template; `qgen -k` draws the "skewed" ones, which hit the populous keys,
Black Friday and the gold parts, and without -k the "normal" ones, which avoid them. This module
draws the same values from a numpy generator seeded by (seed, stream, query), so every stream gets
its own parameters and every policy of a run gets the same ones.

The SQL is the TPC-H text of tilewise/benchmarks/tpch/sql/qNN.sql with its validation-parameter literals
replaced, so the texts are TPC-H's wherever JCC-H does not change them. JCC-H's template changes
are applied too: Q7/Q8 take their date range as parameters, Q10's upper bound is a parameter, and
Q18's subquery gains `where l_quantity <= :2`. Dates are literals (no interval arithmetic), so the
SQL stays portable (DuckDB, DataFusion, Spark SQL, Trino).

The skewed Q3 rule writes day 29, 30, 31 or, for one draw in 31, the invalid "1993-05-32". Engines
reject that literal; it runs as 1993-06-01, the day May 32 stands for (orders before it, shipments
after it), and the parameters record both.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field

import numpy as np

from tilewise.benchmarks.jcch.rules import GOLD, GOLD_NAME, REGIONS, SKEW_NATIONS
from tilewise.benchmarks.spec import Catalog, ParamSets, QuerySet
from tilewise.benchmarks.tpch import queries as Q
from tilewise.errors import UsageError

MODES = ("normal", "skewed")

# TPC-H dists.dss domains that qgen picks from (all weights equal)
SEGMENTS = ("AUTOMOBILE", "BUILDING", "FURNITURE", "MACHINERY", "HOUSEHOLD")
TYPE_S1 = ("STANDARD", "SMALL", "MEDIUM", "LARGE", "ECONOMY", "PROMO")
TYPE_S2 = ("ANODIZED", "BURNISHED", "PLATED", "POLISHED", "BRUSHED")
TYPE_S3 = ("TIN", "NICKEL", "BRASS", "STEEL", "COPPER")
CONTAINER_S1 = ("SM", "LG", "MED", "JUMBO", "WRAP")
CONTAINER_S2 = ("CASE", "BOX", "BAG", "JAR", "PKG", "PACK", "CAN", "DRUM")
SHIPMODES = ("REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB")
Q13_WORD1 = ("special", "pending", "unusual", "express")
Q13_WORD2 = ("packages", "requests", "accounts", "deposits")
COLORS = (
    "almond", "antique", "aquamarine", "azure", "beige", "bisque", "black", "blanched", "blue", "blush", "brown",
    "burlywood", "burnished", "chartreuse", "chiffon", "chocolate", "coral", "cornflower", "cornsilk", "cream",
    "cyan", "dark", "deep", "dim", "dodger", "drab", "firebrick", "floral", "forest", "frosted", "gainsboro",
    "ghost", "goldenrod", "green", "grey", "honeydew", "hot", "indian", "ivory", "khaki", "lace", "lavender",
    "lawn", "lemon", "light", "lime", "linen", "magenta", "maroon", "medium", "metallic", "midnight", "mint",
    "misty", "moccasin", "navajo", "navy", "olive", "orange", "orchid", "pale", "papaya", "peach", "peru", "pink",
    "plum", "powder", "puff", "purple", "red", "rose", "rosy", "royal", "saddle", "salmon", "sandy", "seashell",
    "sienna", "sky", "slate", "smoke", "snow", "spring", "steel", "tan", "thistle", "tomato", "turquoise",
    "violet", "wheat", "white", "yellow",
)


def large(region: int) -> str:
    return SKEW_NATIONS[region * 5]


def small(region: int, n: int) -> str:
    return SKEW_NATIONS[region * 5 + 1 + n]


@dataclass
class Binding:
    """One query of one stream: its parameters (as qgen would print them) and the SQL to run."""

    n: int
    params: dict
    sql: str
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        d = {"query": f"q{self.n}", "params": self.params}
        if self.notes:
            d["notes"] = self.notes
        return d


class _Draw:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def u(self, lo: int, hi: int) -> int:  # UnifInt(lo, hi), both ends included
        return int(self.rng.integers(lo, hi + 1))

    def pick(self, values):
        return values[self.u(0, len(values) - 1)]

    def ptype(self) -> str:
        return f"{self.pick(TYPE_S1)} {self.pick(TYPE_S2)} {self.pick(TYPE_S3)}"

    def permute(self, values) -> list:
        return [values[i] for i in self.rng.permutation(len(values))]


def _d(y: int, m: int, d: int = 1) -> dt.date:
    return dt.date(y, m, d)


def _add_months(d: dt.date, months: int) -> dt.date:
    y, m = divmod(d.month - 1 + months, 12)
    return dt.date(d.year + y, m + 1, d.day)


def draw(n: int, mode: str, rng: np.random.Generator, sf: float) -> tuple[dict, list[str]]:
    """The parameters of query n (qgen's varsub rules for JCC-H, mode normal|skewed); returns
    (params, notes). Dates are ISO strings; the derived end dates of ranges are included."""
    r = _Draw(rng)
    sk = mode == "skewed"
    notes: list[str] = []
    if n == 1:
        delta = r.u(60, 120)
        p = {"delta": delta, "date": str(_d(1998, 12, 1) - dt.timedelta(days=delta))}
    elif n == 2:
        p = {"size": r.u(1, 50), "type": r.ptype().split()[-1], "region": r.pick(REGIONS)}
        if sk:
            p["size"], p["type"] = 1, GOLD[r.u(0, 10):]
    elif n == 3:
        p = {"segment": r.pick(SEGMENTS)}
        t = r.u(0, 30)
        if sk:  # 1993, shortly after Black Friday; t == 30 writes the invalid day 32
            day = 29 + t // 10
            p["date"] = f"1993-05-{day:02d}"
            if day > 31:
                p["date_used"] = "1993-06-01"
                notes.append("qgen's skewed Q3 drew the invalid date 1993-05-32; ran it as 1993-06-01")
        else:
            p["date"] = str(_d(1995, 3, 1 + t))
    elif n == 4:
        t = r.u(0, 7)
        if sk:  # no Black Friday: May or June of 1992-94, 1997
            y = 1992 + (t >> 1)
            start = _d(1997 if y == 1995 else y, 5 + (t & 1))
        else:
            start = _d(1995 + (t >> 2), (9 if t & 2 else 1) + (t & 1))
        p = {"date": str(start), "end": str(_add_months(start, 3))}
    elif n == 5:
        y = r.u(1993, 1994) if sk else r.u(1995, 1996)
        p = {"region": r.pick(REGIONS), "date": f"{y}-01-01", "end": f"{y + 1}-01-01"}
    elif n == 6:
        y = r.u(1993, 1994) if sk else r.u(1995, 1996)
        disc = r.u(2, 9)
        qty = r.u(24, 25)
        p = {"date": f"{y}-01-01", "end": f"{y + 1}-01-01", "discount": f"0.{disc:02d}",
             "quantity": 100 if sk else qty}
    elif n == 7:
        if sk:  # trade between the large nations of two regions
            cust = r.u(0, 4)
            supp = (cust + 1 + r.u(0, 3)) % 5
            p = {"nation1": large(supp), "nation2": large(cust), "date": "1993-01-01", "end": "1994-12-31"}
        else:  # two small nations of one region
            reg, cn, sn = r.u(0, 4), r.u(0, 3), r.u(0, 2)
            if sn >= cn:
                sn = (sn + 1) % 4
            p = {"nation1": small(reg, sn), "nation2": small(reg, cn), "date": "1995-01-01", "end": "1996-12-31"}
    elif n == 8:
        ptype = r.ptype()
        r1 = r.u(0, 4)
        if sk:
            p = {"nation": large(r1), "region": REGIONS[r1], "type": GOLD, "date": "1993-01-01", "end": "1994-12-31"}
        else:
            r2 = (r1 + 1 + r.u(0, 3)) % 5
            p = {"nation": small(r2, r.u(0, 3)), "region": REGIONS[r1], "type": ptype,
                 "date": "1995-01-01", "end": "1996-12-31"}
    elif n == 9:
        color = r.pick(COLORS)
        p = {"color": GOLD_NAME[r.u(0, 10):] if sk else color}
    elif n == 10:
        if sk:  # a few days around Black Friday; the year rule also yields 1999 (no orders)
            t = r.u(0, 5)
            y = 1992 + t + 2 * (t > 2)
            lo, hi = 24 + r.u(0, 4), 29 + r.u(0, 2)
            p = {"date": f"{y}-05-{lo:02d}", "end": f"{y}-05-{hi:02d}"}
        else:  # 3 months from a day in the first two months of 1995
            t, day = r.u(0, 1), r.u(1, 25)
            p = {"date": f"1995-{1 + t:02d}-{day:02d}", "end": f"1995-{4 + t:02d}-{day:02d}"}
    elif n == 11:
        r1 = r.u(0, 4)
        p = {"nation": large(r1) if sk else small(r1, r.u(0, 3)), "fraction": f"{0.0001 / sf:11.10f}".strip()}
    elif n == 12:
        m1 = r.pick(SHIPMODES)
        m2 = r.pick(SHIPMODES)
        while m2 == m1:
            m2 = r.pick(SHIPMODES)
        if sk:
            if m1 != "REG AIR":
                m2 = "REG AIR"
            y = r.u(1993, 1994)
        else:
            y = r.u(1995, 1996)
        p = {"shipmode1": m1, "shipmode2": m2, "date": f"{y}-01-01", "end": f"{y + 1}-01-01"}
    elif n == 13:
        w1, w2 = r.pick(Q13_WORD1), r.pick(Q13_WORD2)
        if not sk:  # the normal variant filters out the gold orders' '1mine2 3gold4' comments
            lo1, hi1, lo2, hi2 = r.u(0, 1), r.u(0, 1), r.u(0, 1), r.u(0, 1)
            w1 = ("1mine2" if hi1 else "1mine")[lo1:]
            w2 = ("3gold4" if hi2 else "3gold")[lo2:]
        p = {"word1": w1, "word2": w2}
    elif n in (14, 15):
        t = r.u(0, 16)
        start = _d(1993 + t // 8, 5 + t % 4) if sk else _d(1995 + t // 8, t % 8 + (1 if t % 8 < 4 else 5))
        p = {"date": str(start), "end": str(_add_months(start, 1 if n == 14 else 3))}
    elif n == 16:
        brand = f"Brand#{r.u(1, 5)}{r.u(1, 4)}"
        ptype = " ".join(r.ptype().split()[:2])
        sizes = r.permute(list(range(1, 51)))[:8]
        if sk:
            sizes[-1] = 1  # the populous parts have size 1
        else:
            sizes = [2 if x == 1 else x for x in sizes]
        p = {"brand": brand, "type": ptype, "sizes": sizes}
    elif n == 17:
        container = f"{r.pick(CONTAINER_S1)} {r.pick(CONTAINER_S2)}"
        brand = f"Brand#{r.u(1, 5)}{r.u(1, 4)}"
        p = {"brand": "Brand#55", "container": "LG BOX"} if sk else {"brand": brand, "container": container}
    elif n == 18:
        q = r.u(312, 315)
        p = {"quantity": 500 + q if sk else q, "max_line_quantity": 100 if sk else 50}
    elif n == 19:
        b1 = f"Brand#{r.u(1, 5)}{r.u(1, 5)}"
        b2 = f"Brand#{r.u(1, 5)}{r.u(1, 5)}"
        b3 = f"Brand#{r.u(1, 5)}{r.u(1, 4)}"
        q1, q2, q3 = r.u(1, 10), r.u(10, 20), r.u(20, 30)
        if sk:  # only the populous parts (Brand#55) and their quantity 51
            b1, b2, b3, q3 = "Brand#00", "Brand#00", "Brand#55", r.u(41, 50)
        p = {"brand1": b1, "brand2": b2, "brand3": b3, "quantity1": q1, "quantity2": q2, "quantity3": q3}
    elif n == 20:
        color = r.pick(COLORS)
        r1 = r.u(0, 4)
        if sk:
            color = GOLD_NAME[:r.u(5, 16)]
            nation, y = large(r1), r.u(1993, 1994)
        else:
            nation, y = small(r1, r.u(0, 3)), r.u(1995, 1996)
        p = {"color": color, "date": f"{y}-01-01", "end": f"{y + 1}-01-01", "nation": nation}
    elif n == 21:
        r1 = r.u(0, 4)
        p = {"nation": large(r1) if sk else small(r1, r.u(0, 3))}
    elif n == 22:
        codes = [str(10 + c) for c in r.permute(list(range(25)))[:7]]
        if sk:  # the populous customers' country codes
            codes[:5] = ["40", "50", "60", "70", "80"]
        p = {"codes": codes}
    else:
        raise UsageError(f"no TPC-H query {n!r}", "queries are numbered 1..22")
    return p, notes


# ---- rendering: the TPC-H text with its validation literals replaced --------------------------------

def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _date(s: str) -> str:
    return f"date '{s}'"


def substitutions(n: int, p: dict) -> list[tuple[str, str, int]]:
    """(TPC-H literal, JCC-H replacement, occurrences in qNN.sql) for query n with parameters p."""
    if n == 1:
        return [("date '1998-09-02'", _date(p["date"]), 1)]
    if n == 2:
        return [("p_size = 15", f"p_size = {p['size']}", 1), ("like '%BRASS'", f"like {_lit('%' + p['type'])}", 1),
                ("r_name = 'EUROPE'", f"r_name = {_lit(p['region'])}", 2)]
    if n == 3:
        d = p.get("date_used", p["date"])
        return [("c_mktsegment = 'BUILDING'", f"c_mktsegment = {_lit(p['segment'])}", 1),
                ("date '1995-03-15'", _date(d), 2)]
    if n == 4:
        return [("date '1993-07-01'", _date(p["date"]), 1), ("date '1993-10-01'", _date(p["end"]), 1)]
    if n == 5:
        return [("r_name = 'ASIA'", f"r_name = {_lit(p['region'])}", 1),
                ("date '1994-01-01'", _date(p["date"]), 1), ("date '1995-01-01'", _date(p["end"]), 1)]
    if n == 6:
        disc = int(p["discount"][2:])
        return [("date '1994-01-01'", _date(p["date"]), 1), ("date '1995-01-01'", _date(p["end"]), 1),
                ("between 0.05 and 0.07", f"between 0.{disc - 1:02d} and 0.{disc + 1:02d}", 1),
                ("l_quantity < 24", f"l_quantity < {p['quantity']}", 1)]
    if n == 7:
        a, b = _lit(p["nation1"]), _lit(p["nation2"])
        return [("(n1.n_name = 'FRANCE' and n2.n_name = 'GERMANY')", f"(n1.n_name = {a} and n2.n_name = {b})", 1),
                ("(n1.n_name = 'GERMANY' and n2.n_name = 'FRANCE')", f"(n1.n_name = {b} and n2.n_name = {a})", 1),
                ("date '1995-01-01' and date '1996-12-31'", f"{_date(p['date'])} and {_date(p['end'])}", 1)]
    if n == 8:
        return [("nation = 'BRAZIL'", f"nation = {_lit(p['nation'])}", 1),
                ("r_name = 'AMERICA'", f"r_name = {_lit(p['region'])}", 1),
                ("p_type = 'ECONOMY ANODIZED STEEL'", f"p_type = {_lit(p['type'])}", 1),
                ("date '1995-01-01' and date '1996-12-31'", f"{_date(p['date'])} and {_date(p['end'])}", 1)]
    if n == 9:
        return [("'%green%'", _lit(f"%{p['color']}%"), 1)]
    if n == 10:
        return [("date '1993-10-01'", _date(p["date"]), 1), ("date '1994-01-01'", _date(p["end"]), 1)]
    if n == 11:
        return [("n_name = 'GERMANY'", f"n_name = {_lit(p['nation'])}", 2), ("* 0.0001", f"* {p['fraction']}", 1)]
    if n == 12:
        return [("('MAIL', 'SHIP')", f"({_lit(p['shipmode1'])}, {_lit(p['shipmode2'])})", 1),
                ("date '1994-01-01'", _date(p["date"]), 1), ("date '1995-01-01'", _date(p["end"]), 1)]
    if n == 13:
        return [("'%special%requests%'", _lit(f"%{p['word1']}%{p['word2']}%"), 1)]
    if n == 14:
        return [("date '1995-09-01'", _date(p["date"]), 1), ("date '1995-10-01'", _date(p["end"]), 1)]
    if n == 15:
        return [("date '1996-01-01'", _date(p["date"]), 1), ("date '1996-04-01'", _date(p["end"]), 1)]
    if n == 16:
        return [("'Brand#45'", _lit(p["brand"]), 1), ("'MEDIUM POLISHED%'", _lit(p["type"] + "%"), 1),
                ("(49, 14, 23, 45, 19, 3, 36, 9)", "(" + ", ".join(map(str, p["sizes"])) + ")", 1)]
    if n == 17:
        return [("'Brand#23'", _lit(p["brand"]), 1), ("'MED BOX'", _lit(p["container"]), 1)]
    if n == 18:  # JCC-H's template: the subquery only counts lines up to :2
        return [("> 300", f"> {p['quantity']}", 1),
                ("            lineitem\n        group by",
                 f"            lineitem\n        where\n            l_quantity <= {p['max_line_quantity']}\n"
                 "        group by", 1)]
    if n == 19:
        return [("p_brand = 'Brand#12'", f"p_brand = {_lit(p['brand1'])}", 1),
                ("p_brand = 'Brand#23'", f"p_brand = {_lit(p['brand2'])}", 1),
                ("p_brand = 'Brand#34'", f"p_brand = {_lit(p['brand3'])}", 1)] + [
            (f"l_quantity >= {old} and l_quantity <= {old} + 10",
             f"l_quantity >= {p[k]} and l_quantity <= {p[k]} + 10", 1)
            for old, k in ((1, "quantity1"), (10, "quantity2"), (20, "quantity3"))]
    if n == 20:
        return [("'forest%'", _lit(p["color"] + "%"), 1), ("date '1994-01-01'", _date(p["date"]), 1),
                ("date '1995-01-01'", _date(p["end"]), 1), ("n_name = 'CANADA'", f"n_name = {_lit(p['nation'])}", 1)]
    if n == 21:
        return [("n_name = 'SAUDI ARABIA'", f"n_name = {_lit(p['nation'])}", 1)]
    if n == 22:
        return [("('13', '31', '23', '29', '30', '18', '17')", "(" + ", ".join(_lit(c) for c in p["codes"]) + ")", 2)]
    raise UsageError(f"no TPC-H query {n!r}", "queries are numbered 1..22")


def render(n: int, p: dict, mode: str = "") -> str:
    """The JCC-H SQL of query n: TPC-H's text with the literals swapped in one pass, under a
    header comment naming the parameters (the TPC-H header names TPC-H's)."""
    sql = Q.load(n)
    subs = substitutions(n, p)
    for old, _, count in subs:
        found = sql.count(old)
        if found != count:  # the TPC-H text changed under us: fail loudly, never run a half-bound query
            raise AssertionError(f"q{n}: expected {count} x {old!r} in the TPC-H text, found {found}")
    table = {old: new for old, new, _ in subs}
    pattern = re.compile("|".join(re.escape(o) for o in sorted(table, key=len, reverse=True)))
    body = pattern.sub(lambda m: table[m.group(0)], sql)
    body = "\n".join(line for line in body.splitlines() if not line.startswith("-- TPC-H"))
    shown = ", ".join(f"{k} = {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in p.items())
    return f"-- JCC-H Q{n}{f' ({mode})' if mode else ''}: {shown}\n{body}"


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UsageError(f"unknown JCC-H parameter set {mode!r}", "use --params skewed or --params normal")
    return mode


def rng_for(seed: int, stream: int, n: int, mode: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(stream), int(n), MODES.index(mode)]))


def binding(n: int, mode: str, *, seed: int, stream: int, sf: float) -> Binding:
    """Query n of stream `stream` for the given seed: parameters drawn, SQL rendered."""
    check_mode(mode)
    p, notes = draw(n, mode, rng_for(seed, stream, n, mode), sf)
    return Binding(n, p, render(n, p, mode), notes)


def stream_bindings(numbers, mode: str, *, seed: int, stream: int, sf: float) -> dict[int, Binding]:
    return {n: binding(n, mode, seed=seed, stream=stream, sf=sf) for n in numbers}


def cache_key(b: Binding) -> str:
    """The reference-answer cache name of a binding: keyed by its exact SQL text, since every
    stream and seed has its own parameters (validate.Reference.answer_sql)."""
    import hashlib

    return f"jcch-q{b.n:02d}-{hashlib.sha256(b.sql.encode()).hexdigest()[:16]}"


class DrawnQuerySet(QuerySet):
    """The SQL every stream runs: qgen's "skewed" or "normal" parameters drawn per (seed, stream,
    query), so every stream has its own and every policy of a run the same."""

    per_stream = True

    def __init__(self, catalog: Catalog, params: str, seed: int, sf: float) -> None:
        super().__init__(catalog)
        self.params, self.seed, self.sf = check_mode(params), int(seed), float(sf)
        self._bound: dict[tuple[int, int], Binding] = {}

    def binding(self, n: int, stream: int) -> Binding:
        """The drawn parameters of query n in stream `stream`."""
        if (n, stream) not in self._bound:
            self._bound[(n, stream)] = binding(n, self.params, seed=self.seed, stream=stream, sf=self.sf)
        return self._bound[(n, stream)]

    def sql(self, n: int, stream: int) -> str:
        return self.binding(n, stream).sql

    def key(self, n: int, stream: int) -> str:
        return cache_key(self.binding(n, stream))

    def describe(self, streams, numbers) -> dict:
        """The parameters of every query of every stream, and notes (qgen's log, as results.json records it)."""
        per_stream, notes = {}, []
        for s in streams:
            per_stream[str(s)] = {}
            for n in numbers:
                b = self.binding(n, s)
                per_stream[str(s)][f"q{n}"] = b.params
                notes += [f"stream {s} q{n}: {x}" for x in b.notes]
        return {"benchmark": "jcch", "params": self.params, "seed": self.seed, "streams": per_stream, "notes": notes}


PARAMS = ParamSets(MODES, "skewed", "skewed (default; they hit the skew) or normal (they avoid it)", DrawnQuerySet)
