"""The benchmark contract: what one benchmark package provides, as one spec object (``SPEC``).

A benchmark (TPC-H, JCC-H, TPC-DS) is one package, ``tilewise.benchmarks.<name>`` or a
package outside the tree registered under the entry-point group ``tilewise.benchmarks``, that
exports one :class:`Benchmark`. The spec gives:

- ``data``: how its data set is generated, cached and checked (:class:`Data`);
- ``catalog``: its queries: ids, their SQL with the qualification parameters, each stream's order
  (:class:`Catalog`); ids are numbers (1..22) or strings for multi-part queries ("14a");
- ``params``: its query parameter sets, drawn per stream from a seed (:class:`ParamSets`), or None
  for one fixed set in every stream;
- ``reference_sql``: the reference-answer rules (the text the reference engine runs for a query,
  which may name the query); ``engine_null_order``: the references sort NULLs as the engine under
  test does (for benchmarks whose ORDER BY keys hold NULLs). Engines get the texts as written: an
  engine whose SQL differs rewrites them in its own folder (the engine contract's dialect hook,
  EngineSpec.dialect, told the benchmark and the query);
- ``metrics``: its figures from what a run measured, its minimum stream count, and what the
  figures lack when parts were not measured (:class:`Metrics`);
- ``refresh``: its refresh (maintenance) functions, or None when it has none here (:class:`Refresh`);
  the harness applies them only where the engine can write too;
- ``title``, ``about`` and ``heading()``: what the command line and the reports call it.

The harness (tilewise.bench.harness), ``tilewise data`` and ``tilewise bench`` know benchmarks only
through this contract and the registry (tilewise.benchmarks): a new benchmark is its own folder.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tilewise.data import Dataset, raw
from tilewise.data.refresh import DataState, RefreshSet
from tilewise.errors import UsageError

QueryId = int | str  # 6, or "14a" for one part of a multi-part query


def query_number(q: QueryId) -> int:
    """The number a query id starts with: 6 -> 6, "14a" -> 14."""
    m = re.match(r"\d+", str(q))
    if not m:
        raise ValueError(f"query id {q!r} does not start with a number")
    return int(m.group(0))


def scale_factor(sf, *, lowest: float, too_small: str, highest: float, title: str) -> float:
    """A scale factor as a float in [lowest, highest], or a UsageError: too_small says why below
    `lowest` the benchmark cannot make a set ("leaves the supplier table empty ...")."""
    try:
        v = float(sf)
    except (TypeError, ValueError):
        raise UsageError(f"scale factor {sf!r} is not a number", "use e.g. --sf 1 or --sf 0.01") from None
    if not v > 0 or v != v or v == float("inf"):
        raise UsageError(f"scale factor must be > 0, got {sf}", "use e.g. --sf 1 or --sf 0.01")
    if v < lowest * (1 - 1e-9):
        raise UsageError(f"scale factor {sf} {too_small}", f"use --sf {lowest:g} or more")
    if v > highest:
        raise UsageError(f"scale factor {sf} is beyond {title}'s largest ({highest:g})", "use e.g. --sf 1 or --sf 100")
    return v


def check_seed(seed) -> int:
    """A seed: an integer in [0, 2^63)."""
    try:
        v = int(seed)
    except (TypeError, ValueError):
        raise UsageError(f"seed {seed!r} is not an integer", "use e.g. --seed 0") from None
    if v < 0 or v >= 2**63:
        raise UsageError(f"seed must be between 0 and 2^63-1, got {seed}", "use e.g. --seed 0")
    return v


# ---- data -----------------------------------------------------------------------------------------

@dataclass
class DataCheck:
    """One check of a data set against the benchmark's specification."""

    id: str
    kind: str  # one of the benchmark's Data.check_kinds, e.g. "invariant" | "target"
    what: str
    value: object
    expected: str
    ok: bool

    def to_json(self) -> dict:
        return asdict(self)


class Data(abc.ABC):
    """How a benchmark's data set is generated, cached and checked."""

    tables: tuple[str, ...]  # the tables of a set, in the benchmark's order (every Data names its own)
    seeded: bool = False  # the generator takes a seed (`data generate --seed`, `bench --data-seed`)
    default_seed: int | None = None
    sf_rule: str = "> 0"  # the scale factors it accepts, for help texts
    # (kind, heading) of the checks check() returns; empty: nothing to check a set against
    check_kinds: tuple[tuple[str, str], ...] = ()

    @abc.abstractmethod
    def check_sf(self, sf) -> float:
        """The scale factor as a float, or UsageError when the benchmark cannot make it."""

    def check_seed(self, seed) -> int:
        return check_seed(seed)

    @abc.abstractmethod
    def set_dir(self, sf: float, seed: int | None = None, data_dir: str | Path | None = None) -> Path:
        """Where the set of (sf, seed) is cached under data_dir (None: the default cache)."""

    @abc.abstractmethod
    def is_valid(self, d: Path) -> bool:
        """True when d holds a complete, intact set."""

    @abc.abstractmethod
    def dataset(self, sf: float, data_dir: str | Path | None = None, *, seed: int | None = None, log=None,
                progress=None) -> Dataset:
        """The data set, generated and cached first if needed; progress(task, done, total)."""

    def check(self, d: Path, sf: float) -> list[DataCheck]:
        """Every check of the set in d against the specification (only where check_kinds is set)."""
        raise NotImplementedError

    # how raw() makes raw text tables (results and `data layout` say it)
    raw_generator: str = "the benchmark's Parquet written as text by DuckDB (COPY ... FORMAT csv)"

    def raw(self, sf: float, fmt: str = "csv", data_dir: str | Path | None = None, *, seed: int | None = None,
            log=None, progress=None) -> Dataset:
        """The set's tables as raw text files (fmt csv or tbl, with schema.json), cached beside the
        Parquet set as <set dir>-<fmt>; a Dataset whose sources are those files, read in place. This
        default writes them from the Parquet set; a benchmark whose generator writes text overrides it
        (TPC-H: tpchgen-cli)."""
        ds = self.dataset(sf, data_dir, seed=seed, log=log, progress=progress)

        def build(tmp: Path) -> None:
            raw.finish_set(tmp, fmt, self.raw_generator, raw.from_parquet(ds.tables, fmt, tmp), sf=sf)

        d = raw.ensure_set(ds.dir.with_name(f"{ds.dir.name}-{fmt}"), fmt, build, what=f"{ds.label} as {fmt}", log=log)
        return ds.with_sources(raw.discover(d, tables=tuple(ds.table_names)), layout=fmt, dir=d)


# ---- queries --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Catalog:
    """A benchmark's queries: ids in catalog order, each one's SQL with the qualification (or
    validation) parameters, and the order in which stream s runs them (0: the power test)."""

    title: str  # what messages call the queries' benchmark, e.g. "TPC-H"
    ids: tuple[QueryId, ...]
    text: Callable[[QueryId], str]
    order: Callable[[int], Sequence[QueryId]]  # stream s -> every id, in that stream's order
    # where a query's text divides an integer by an integer, as `(left)/(right)`: {query id as text:
    # (the pattern, how often it occurs)}. The SQL standard truncates such a quotient; an engine whose
    # `/` divides as floating point rewrites these with its own integer division
    # (Capabilities.integer_division), so the benchmark states the fact and the engine the operator
    integer_divisions: Mapping[str, tuple[str, int]] = field(default_factory=dict)

    def divisions(self, q: QueryId) -> tuple[tuple[str, int], ...]:
        """Query q's integer divisions (Catalog.integer_divisions), for engines.contract.Query."""
        d = self.integer_divisions.get(str(q))
        return (d,) if d else ()

    def stream_order(self, stream: int, selected: Iterable[QueryId] | None = None) -> list[QueryId]:
        """The ids of `selected` (default: all) in the order stream `stream` runs them."""
        row = self.order(stream)
        if selected is None:
            return list(row)
        chosen = set(selected)
        return [q for q in row if q in chosen]

    @staticmethod
    def key(q: QueryId) -> str:
        """The name a query has in results files: "q6", "q14a"."""
        return f"q{q}"

    @staticmethod
    def ref_key(q: QueryId) -> str:
        """The cache name of a query's reference answer: "q06", "q14a"."""
        return f"q{q:02d}" if isinstance(q, int) else f"q{q}"

    def _numbered(self) -> str:
        nums = [query_number(q) for q in self.ids]
        return f"queries are numbered {min(nums)}..{max(nums)}"

    def check(self, ids: Iterable[QueryId] | None) -> list[QueryId]:
        """A selection given as ids (None: all), each one of the catalog's; duplicates dropped."""
        if ids is None:
            return list(self.ids)
        out: list[QueryId] = []
        for q in ids:
            if q not in self.ids:
                raise UsageError(f"no {self.title} query {q!r}", self._numbered())
            if q not in out:
                out.append(q)
        if not out:
            raise UsageError("no queries selected", "use e.g. --queries 1,6,10-12")
        return out

    def parse(self, text: str | None) -> list[QueryId]:
        """"1,6,10-12" -> [1, 6, 10, 11, 12] in the order given; None/"all" -> all. A number
        selects every part of a multi-part query (14 -> 14a, 14b); "14a" selects one part."""
        if text is None or text.strip().lower() == "all":
            return list(self.ids)
        by_number: dict[int, list[QueryId]] = {}
        for q in self.ids:
            by_number.setdefault(query_number(q), []).append(q)
        named = {str(q).lower(): q for q in self.ids if not isinstance(q, int)}
        out: list[QueryId] = []
        for part in text.split(","):
            part = part.strip().lower().lstrip("q")
            if part in named:
                picked = [named[part]]
            else:
                try:
                    if "-" in part:
                        a, b = part.split("-", 1)
                        numbers = range(int(a), int(b.lstrip("q")) + 1)
                    else:
                        numbers = range(int(part), int(part) + 1)
                except ValueError:
                    raise UsageError(f"bad query list {text!r}", "use e.g. --queries 1,6,10-12") from None
                picked = []
                for n in numbers:
                    if n not in by_number:
                        raise UsageError(f"no {self.title} query {n}", self._numbered())
                    picked += by_number[n]
            out += [q for q in picked if q not in out]
        if not out:
            raise UsageError(f"bad query list {text!r}", "use e.g. --queries 1,6,10-12")
        return out


class QuerySet:
    """The SQL every stream runs. This base runs the catalog's text (its qualification parameters)
    in every stream; benchmarks whose streams draw their own parameters subclass it."""

    per_stream = False  # True: each stream has its own SQL (references are computed per stream)
    params: str | None = None  # the parameter set's name, as results.json records it
    seed: int | None = None  # the seed the parameters were drawn from

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def sql(self, q: QueryId, stream: int) -> str:
        return self.catalog.text(q)

    def key(self, q: QueryId, stream: int) -> str:
        """The reference-answer cache name: equal SQL, equal key."""
        return self.catalog.ref_key(q)

    def describe(self, streams: Iterable[int], ids: Iterable[QueryId]) -> dict | None:
        """What results.json records about the parameters each stream ran (None: the catalog's)."""
        return None


@dataclass(frozen=True)
class ParamSets:
    """A benchmark's query parameter sets (`--params`): each stream draws its own parameters from
    the run's seed (`--seed`), the same for every deployment of a run."""

    choices: tuple[str, ...]
    default: str
    help: str  # e.g. "skewed (default; they hit the skew) or normal (they avoid it)"
    make: Callable[[Catalog, str, int, float], QuerySet]  # (catalog, set, seed, sf) -> its QuerySet
    fixed: tuple[str, ...] = ()  # the sets that draw nothing from the seed (TPC-DS qualification)

    def seeded(self, name: str | None) -> bool:
        """The set `name` (None: the default) draws its parameters from --seed."""
        return (name or self.default).strip().lower() not in self.fixed


# ---- metrics --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Measured:
    """What one run measured, for a benchmark's metrics."""

    sf: float
    queries: int  # queries per stream (the selection)
    total_queries: int  # queries in the benchmark's catalog
    power_s: list[float] | None  # the power test's query intervals (None: no power test)
    power_refresh_s: list[float]  # the power test's refresh-function intervals
    streams: int
    interval_s: float | None  # the throughput test's measurement interval (None: no throughput test)
    refresh: bool  # the refresh functions were applied
    load_s: float | None = None  # starting the engine and loading the data (per deployment)


class Metrics(abc.ABC):
    """A benchmark's figures (Power@Size, Throughput@Size, QphH@Size for TPC-H) from what a run measured."""

    # (key in a run's record, title) of the figures figures() returns: the power figure, the
    # throughput figure, then the composite (TPC-H: Power@Size, Throughput@Size, QphH@Size)
    names: tuple[tuple[str, str], ...] = ()

    @abc.abstractmethod
    def min_streams(self, sf: float) -> int:
        """The minimum number of throughput-test streams the specification asks for at sf."""

    @abc.abstractmethod
    def figures(self, m: Measured) -> dict[str, float | None]:
        """{key: value} for every key of `names`; None where the run did not measure enough."""

    def notes(self, *, queries: int, total_queries: int, refresh_reason: str | None) -> list[str]:
        """What the figures lack: parts not measured (no refresh functions: refresh_reason says
        why; a subset of the queries), said so no figure is taken for the published metric."""
        return []


# ---- refresh functions ----------------------------------------------------------------------------

class Refresh(abc.ABC):
    """A benchmark's refresh (data maintenance) functions: a pair applied to numbered update sets.

    The power test applies the pair of set 1 around its queries; the throughput test's refresh
    stream one pair per query stream. An engine applies them (Engine.apply_refresh), and undoes
    them (``undo-<function>``) after a run, outside the timed region."""

    functions: tuple[str, str] = ("RF1", "RF2")
    restore: str = ""  # how undoing them restores the loaded data (results.json's refresh.restore)

    @abc.abstractmethod
    def ensure_sets(self, dataset: Dataset, count: int, *, log=None) -> list[RefreshSet]:
        """Update sets 1..count of `dataset`, generated and cached where missing."""

    @abc.abstractmethod
    def loaded(self) -> DataState:
        """The data state of the loaded data (refresh functions move it on: DataState.after)."""

    def describe(self, sf: float) -> dict:
        """What results.json records about the sets (generator, sizes)."""
        return {}


# ---- the spec -------------------------------------------------------------------------------------

def as_written(sql: str, q: QueryId | None = None) -> str:
    return sql


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: the object its package exports as SPEC."""

    name: str  # the registry's name, e.g. "tpch"
    title: str  # e.g. "TPC-H"
    about: str  # one line for help texts
    data: Data
    catalog: Catalog
    metrics: Metrics
    params: ParamSets | None = None
    refresh: Refresh | None = None
    # the text the reference engine runs for a query's text (and its id, None when not known)
    reference_sql: Callable[[str, QueryId | None], str] = field(default=as_written)
    docs: str = ""  # where its documentation is, e.g. "docs/tpch.md"
    # the references sort NULLs as the engine under test (probed when it starts): ORDER BY keys hold NULLs
    engine_null_order: bool = False

    @property
    def query_seed(self) -> bool:
        """Its streams draw parameters from a seed (`--seed`)."""
        return self.params is not None

    def heading(self, query_params: str | None = None) -> str:
        """The benchmark's name in titles: "TPC-H", "JCC-H (skewed)"."""
        return f"{self.title} ({query_params})" if query_params else self.title

    def dataset(self, sf, data_dir: str | Path | None = None, *, seed: int | None = None, log=None,
                progress=None) -> Dataset:
        """Its data set at sf (and seed, for seeded generators), generated first if needed."""
        if not self.data.seeded:
            if seed is not None:
                raise UsageError(f"the {self.title} generator takes no seed", "drop --seed/--data-seed")
        else:
            seed = self.data.check_seed(self.data.default_seed if seed is None else seed)
        return self.data.dataset(self.data.check_sf(sf), data_dir, seed=seed, log=log, progress=progress)

    def query_set(self, params: str | None = None, *, seed: int = 0, sf: float = 1.0) -> QuerySet:
        """The SQL every stream runs: the catalog's texts, or the parameter set `params` (default:
        the benchmark's) drawn per stream from seed."""
        if self.params is None:
            if params is not None:
                raise UsageError(f"{self.title} has one fixed set of query parameters", "drop --params")
            return QuerySet(self.catalog)
        p = self.params.default if params is None else params
        if p not in self.params.choices:
            raise UsageError(f"unknown {self.title} parameter set {p!r}",
                             "use " + " or ".join(f"--params {c}" for c in self.params.choices))
        return self.params.make(self.catalog, p, check_seed(seed), float(sf))
