"""JCC-H's refresh functions: TPC-H's RF1/RF2 (tilewise.benchmarks.tpch.refresh) with JCC-H's
line-key rule, so every inserted lineitem's (part, supplier) is a row of JCC-H's partsupp.

JCC-H's partsupp gives a part other suppliers than TPC-H's bridge (rules.partsupp_class), so TPC-H's
rule inserted pairs it does not hold (56 of 60 RF1 lineitems of set 1 at SF 0.01). Here a new line
is an ordinary (class-B) line, as most lines of the loaded data are: the uniform part draw is moved
to a part whose region affinity is the order's customer's region, and its supplier is that part's
class-B partsupp supplier (rules.ordinary_line_part, the same function the generator uses). The
customer keys, dates and values are TPC-H's rules, as in the loaded data's ordinary orders.
"""

from __future__ import annotations

from tilewise.benchmarks.jcch import rules as J
from tilewise.benchmarks.tpch.refresh import Rule, TpchRefresh

GENERATOR = "tilewise-jcch-refresh/1"  # bump when the generated values change: references are keyed by it


def line_keys(sf: float, part_draw, supp_draw, customers):
    """(l_partkey, l_suppkey): an ordinary line in the customer's region (supp_draw is not needed:
    the part's class-B supplier is fixed by its hash)."""
    s = J.Sizes.for_sf(sf)
    hs = J.Hashes.of(s)
    region = J.customer_region_of_hash(hs.customer.h(customers), s)
    _, partkey, suppkey = J.ordinary_line_part(part_draw, region, s, hs)
    return partkey, suppkey


REFRESH = TpchRefresh(Rule(GENERATOR, "JCC-H", line_keys))
