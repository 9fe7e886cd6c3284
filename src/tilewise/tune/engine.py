"""`tilewise tune --engine E`: paper 003's study on a running database engine (its W5, Fig. 8), as a
use case: ``run(config, reporter) -> results document``.

The engine is started through its runtime (the engine contract: no engine is named here), bound as
a plan instance (``--policy``, default wim), and serves a benchmark's queries (TPC-H by default,
``--queries`` a subset) at a scale factor. The grid is the tuner's (allocators x memory policies x
placements x THP x AutoNUMA, the default first). How each knob reaches the engine:

- **allocator**: preloaded (LD_PRELOAD) into the engine's process, so what it forks inherits it
  (a postmaster's backends and parallel workers); read back from /proc/PID/maps of every process
  of the instance's tree (verification.verify_tree) after the start and again after the queries;
- **memory policy**: the instance's policy (set_mempolicy before exec: inherited the same way);
- **placement**: with ``--cores K``, the instance is bound to K CPUs chosen dense or sparse
  (knobs.thread_order), so the engine sizes its thread pool (or its parallel workers) to K and
  the OS runs them there; ``none`` keeps the plan's CPUs. Engines run their own threads, so this
  is the placement a black box allows;
- **THP, AutoNUMA**: OS switches through the change-and-undo layer, admitted before anything
  starts, applied while the engine runs (they take no restart) and restored after each block.

Schedule: the configurations that need the same engine start (allocator, memory policy, placement)
share one start; under it, each of warm-up + repeat rounds runs every OS state's queries in turn
(apply, run each query once, restore), so OS states are interleaved round by round, in reverse
order every other round. The default
configuration is case 0. A query's time is the engine's own (QueryResult.elapsed_s); each
configuration's first answer to each query is checked against the reference (DataFusion), and a
wrong answer fails that configuration. A failing start or query is recorded, the sweep goes on.

Output: the results document (kind ``tune.engine``: per-query latency change per configuration
against the default with 95 % intervals, a table, CSV files, Fig. 8's plot), the recommendation
with its reasons (tune.recommend, pure), and the recommended configuration as tuned.json (for
`bench tpch --config`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from dataclasses import dataclass, replace

from tilewise import benchmarks, engines, topology, verification
from tilewise import plan as planner
from tilewise.benchmarks import validate
from tilewise.binding import Binding
from tilewise.engines.contract import Query
from tilewise.environment import system_check
from tilewise.errors import TilewiseError, UsageError
from tilewise.results import model
from tilewise.results.output import Writer
from tilewise.tune import knobs, recommend, session
from tilewise.tune.os_switches import OsSwitches


@dataclass
class Config:
    engine: str
    benchmark: str = "tpch"
    sf: str | float = "0.1"
    queries: str | None = None  # "1,6,10-12"; None: all
    policy: str = "wim"
    cores: int | None = None  # placements dense/sparse: the instance's CPUs
    allocators: str | None = None  # comma list; None: every one installed
    mem: str = "first-touch,interleave"
    placements: str = "none"
    repeat: int = 3
    warmup: int = 1
    out: str = "tune-results"
    apply_os: bool = False
    thp: str | None = None
    autonuma: str | None = None
    os_root: str = "/"
    data_dir: str | None = None
    timeout: float = 600.0  # per query
    min_gain: float = recommend.MIN_GAIN
    max_slowdown: float = recommend.MAX_SLOWDOWN
    command: tuple = ()  # (the workload tuner's grid reads it: an engine is no command)


class Reporter:
    def message(self, text: str) -> None: ...
    def done(self, doc: dict) -> None: ...


def deployment(base: planner.Plan, c: knobs.Config, topo, cores: int | None) -> planner.Plan:
    """The plan a configuration starts: every instance with the configuration's memory policy and,
    for placement dense/sparse, `cores` CPUs of its own chosen in that order."""
    out = []
    for inst in base.instances:
        cpus = inst.cpus
        if c.placement != "none":
            order = knobs.thread_order(topo, c.placement, cores, set(inst.cpus))
            cpus = tuple(sorted(dict.fromkeys(order)))
        out.append(replace(inst, cpus=cpus, cores=len(cpus) if c.placement != "none" else inst.cores,
                           mem_policy=c.mem, mem_nodes=tuple(c.mem_nodes)))
    return replace(base, instances=tuple(out))


def restart_key(c: knobs.Config) -> tuple:
    """What takes a new start of the engine: the allocator, the memory policy, the placement."""
    return (c.allocator, c.mem, tuple(c.mem_nodes), c.placement)


def check_allocators(spec, allocs: list[str]) -> None:
    for a in allocs:
        spec.check_allocator(a, "--allocators")


def check_placements(places: list[str], cores: int | None, base: planner.Plan) -> None:
    smallest = min(len(i.cpus) for i in base.instances)
    placed = [p for p in places if p != "none"]
    if cores is not None and not placed:
        raise UsageError("--cores sizes the dense/sparse placements", "add --placements dense,sparse (or drop --cores)")
    if placed and cores is None:
        raise UsageError(f"placement {placed[0]} of an engine needs --cores K (fewer than the instance's {smallest} CPUs): "
                         "the engine sizes its threads to the CPUs it is given",
                         f"e.g. --cores {max(1, smallest // 2)} --placements none,dense,sparse")
    if cores is not None and not 1 <= cores < smallest:
        raise UsageError(f"--cores {cores} must be below the instance's {smallest} CPUs (with all of them, dense and "
                         "sparse are the same set as none)", f"e.g. --cores {max(1, smallest // 2)}")


def run(cfg: Config, reporter: Reporter | None = None) -> dict:
    """The sweep; returns the results document (also given to reporter.done)."""
    rep = reporter or Reporter()
    spec = engines.get(cfg.engine)
    spec.check_env()  # a bad TILEWISE_* value: usage (exit 2)
    why = spec.missing()
    if why:
        raise UsageError(f"{spec.title} cannot run here: {why}")
    bench = benchmarks.get(cfg.benchmark)
    sf = bench.data.check_sf(cfg.sf)
    qids = bench.catalog.parse(cfg.queries)
    t = topology.load(None)
    base = planner.plan(t, cfg.policy)
    own = spec.capabilities.linked_allocator
    if own and cfg.allocators is None:
        cfg = replace(cfg, allocators="system")  # nothing to preload into it: its own allocator is the default
    g = session.grid(cfg, t)
    check_allocators(spec, g.allocs)
    check_placements(g.places, cfg.cores, base)
    osw = OsSwitches(cfg.os_root)
    keys = [k for k, vals in (("thp", g.thps), ("autonuma", g.autonuma)) if vals]
    if cfg.apply_os:
        osw.check_permission(keys)  # admission: before anything is started or written
    writer = Writer(cfg.out, plots=False)
    data = bench.data.dataset(sf, cfg.data_dir, log=rep.message)
    texts = {bench.catalog.key(q): spec.sql(bench.catalog.text(q), Query(bench.name, q, 0, bench.catalog.ref_key(q),
                                                                       bench.catalog.divisions(q)))
             for q in qids}
    cases = [{"case": i, "label": c.label(), "config": c.to_json(), "start": None, "runs": [],
              "answers": {"checked": 0, "wrong": [], "not_comparable": []}, "failures": []}
             for i, c in enumerate(g.cases)]
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(g.cases):
        groups.setdefault(restart_key(c), []).append(i)
    params = {"engine": spec.name, "benchmark": bench.name, "benchmark_title": bench.title, "sf": sf,
              "queries": list(texts), "policy": base.policy, "cores": cfg.cores, "repeat": cfg.repeat, "warmup": cfg.warmup, "timeout_s": cfg.timeout,
              "min_gain": cfg.min_gain, "max_slowdown": cfg.max_slowdown,
              "grid": {"allocators": g.allocs, "mem": [knobs.Config(mem=m, mem_nodes=n).mem_label() for m, n in g.mems],
                       "placements": g.places, "thp": g.thps, "autonuma": g.autonuma, "cases": len(g.cases),
                       "starts": len(groups)}}
    doc = model.new("tune.engine", topo=t, params=params, engines={spec.name: spec.version()},
                    os_switches={k: v.to_json() for k, v in osw.state().items()},
                    system_check=system_check(numa_nodes=len(t.cpu_nodes)))
    doc.update({"plan": base.to_json(), "data": {"label": data.label, "dir": str(data.dir)}, "cases": cases,
                "starts": [], "recommendation": None})
    ctx = _Sweep(cfg, spec, bench, data, texts, qids, t, base, osw, rep, doc, writer)
    stack = contextlib.ExitStack()
    if cfg.apply_os:
        stack.enter_context(osw.controlling(keys, "tune --engine --apply-os"))
    try:
        with stack:
            rep.message(f"tilewise tune: {spec.title} at {bench.title} SF {sf:g}, {len(texts)} queries, "
                        f"{len(g.cases)} configurations in {len(groups)} engine start(s), {cfg.warmup} warm-up + "
                        f"{cfg.repeat} measured runs of each query")
            for members in groups.values():
                ctx.one_start([g.cases[i] for i in members], [cases[i] for i in members])
                writer.write(doc)
    except BaseException as e:
        model.stopped(doc, e)
        writer.write(doc)
        raise
    rec = ctx.recommendation(g.cases)
    doc["recommendation"] = rec.to_json()
    model.finish(doc, complete=True)
    writer.write(doc, plots=True)
    paths = {"json": str(writer.json_path)}
    paths.update({p.name: str(p) for p in writer.plot_paths})
    tuned = os.path.join(cfg.out, "tuned.json")
    target = {"engine": spec.name, "benchmark": bench.name, "sf": sf, "queries": list(texts), "policy": base.policy}
    measured = {"recommended": rec.label, "changed": rec.changed, "reasons": rec.reasons, "repeat": cfg.repeat}
    knobs.save_config(tuned, knobs.TunedFile(rec.config, target, measured, t.fingerprint()))
    paths["config"] = tuned
    doc["files"] = paths
    doc["reproduce"] = reproduce(rec.config, spec.name, bench.name, sf, cfg, tuned, base.policy)
    writer.write(doc, plots=True)
    rep.done(doc)
    if all(c["failures"] and not any(r["status"] == "ok" for r in c["runs"]) for c in cases):
        raise TilewiseError("every configuration failed", "see the failures above and in results.json")
    return doc


def reproduce(c: knobs.Config, engine: str, bench: str, sf: float, cfg: Config, tuned: str, policy: str) -> dict:
    args = ["tilewise", "bench", bench, "--engine", engine, "--sf", f"{sf:g}", "--policies", policy, "--config", tuned]
    if cfg.queries:
        args += ["--queries", cfg.queries]
    out = {"tilewise": shlex.join(args)}
    if c.placement != "none":
        out["placement"] = f"placement {c.placement} on {cfg.cores} cores: bind the engine to the CPUs results.json lists"
    if c.os_desired():
        out["os"] = "as root, before the run: " + "; ".join(
            f"echo {v} > /sys/kernel/mm/transparent_hugepage/enabled" if k == "thp" else
            f"echo {v} > /proc/sys/kernel/numa_balancing" for k, v in c.os_desired().items())
    return out


class _Sweep:
    """The state of one sweep: the reference answers, and each engine start's runs."""

    def __init__(self, cfg, spec, bench, data, texts, qids, topo, base, osw, rep, doc, writer):
        self.cfg, self.spec, self.bench, self.data, self.texts, self.qids = cfg, spec, bench, data, texts, qids
        self.topo, self.base, self.osw, self.rep, self.doc, self.writer = topo, base, osw, rep, doc, writer
        self.ref = None
        self.no_reference: dict[str, str] = {}

    def references(self, runtime) -> None:
        """The reference answers, computed (or read from the cache) before the first timed run; for
        a benchmark whose references sort NULLs as the engine does, probed on the running engine."""
        if self.ref is not None:
            return
        null_order = None
        if self.bench.engine_null_order:
            null_order = validate.probe_null_order(lambda sql: runtime.run_query(sql).rows)
        self.ref = validate.Reference(self.data, null_order=null_order)
        t0 = time.perf_counter()
        for q in self.qids:
            try:
                self.ref.answer(q)
            except validate.NoReference as e:
                self.no_reference[self.bench.catalog.key(q)] = str(e)
        self.rep.message(f"reference answers: DataFusion {self.ref.version}, {len(self.ref.computed)} computed in "
                         f"{time.perf_counter() - t0:.1f} s (cached in {self.ref.cache_dir})")

    def one_start(self, configs: list[knobs.Config], cases: list[dict]) -> None:
        first = configs[0]
        plan = deployment(self.base, first, self.topo, self.cfg.cores)
        start = {"allocator": first.allocator, "mem": first.mem_label(), "placement": first.placement,
                 "cases": [c["case"] for c in cases], "cpus": [list(i.cpus) for i in plan.instances],
                 "start_s": None, "verification": [], "verification_after": [], "error": None}
        self.doc["starts"].append(start)
        label = f"{first.allocator}/{first.mem_label()}/{first.placement}"
        self.rep.message(f"starting {self.spec.title}: {label}")
        runtime = self.spec.runtime_class()()
        try:
            t0 = time.perf_counter()
            try:
                runtime.start(plan, dataset=self.data, allocator=first.allocator)
            except TilewiseError as e:
                start["error"] = str(e)
                for c in cases:
                    c["failures"].append(f"the engine did not start: {e}")
                self.rep.message(f"  {label}: the engine did not start: {e}")
                return
            start["start_s"] = round(time.perf_counter() - t0, 3)
            for c in cases:
                c["start"] = len(self.doc["starts"]) - 1
            start["verification"] = self._verify(runtime, plan, first.allocator)
            self.references(runtime)
            self._rounds(runtime, configs, cases)
            start["verification_after"] = self._verify(runtime, plan, first.allocator)
            for v in start["verification_after"]:
                if v["problems"]:
                    for c in cases:
                        c["failures"].append(f"binding not as configured after the queries: {v['problems'][0]}")
        finally:
            runtime.stop()

    def _verify(self, runtime, plan, allocator: str) -> list[dict]:
        out = []
        by_id = {i.id: i for i in plan.instances}
        for st in runtime.status():
            inst = by_id.get(st.id)
            if st.pid is None or inst is None:
                out.append({"instance": st.id, "processes": 0, "problems": [st.detail or "not running"]})
                continue
            v = verification.verify_tree(st.pid, Binding.from_instance(inst, allocator))
            out.append({"instance": st.id, **v})
            if v["problems"]:
                self.rep.message(f"  instance {st.id}: {v['problems'][0]}")
        return out

    def _rounds(self, runtime, configs: list[knobs.Config], cases: list[dict]) -> None:
        checked: set[tuple[int, str]] = set()
        total = self.cfg.warmup + self.cfg.repeat
        for r in range(total):
            timed = r >= self.cfg.warmup
            pairs = list(zip(configs, cases))
            # every other round in reverse: a state that always ran first (or last) would carry the
            # order's effect (caches, the machine's drift within a round) as if it were its own
            for c, case in (pairs if r % 2 == 0 else pairs[::-1]):
                desired = c.os_desired()
                ctx = self.osw.applied(desired, "tune --engine --apply-os") if desired else contextlib.nullcontext()
                times = []
                with ctx:
                    for q, key in zip(self.qids, self.texts):
                        rec = self._query(runtime, q, key, case, checked)
                        if timed:
                            case["runs"].append({"repeat": r - self.cfg.warmup, **rec})
                        if rec["status"] == "ok":
                            times.append(rec["elapsed_s"])
                        else:
                            self.rep.message(f"  {case['label']} {key}: {rec['error']}")
                    name = f"run {r + 1 - self.cfg.warmup}/{self.cfg.repeat}" if timed else "warm-up"
                    self.rep.message(f"  {case['label']} {name}: " + ", ".join(f"{x * 1e3:.1f}" for x in times) + " ms")
            if timed:
                self.writer.write(self.doc)

    def _query(self, runtime, q, key: str, case: dict, checked: set) -> dict:
        try:
            res = runtime.run_query(self.texts[key], timeout_s=self.cfg.timeout)
        except TilewiseError as e:
            msg = str(e)
            if msg not in case["failures"]:
                case["failures"].append(f"{key}: {msg}")
            return {"query": key, "status": "failed", "error": msg}
        if (case["case"], key) not in checked:
            checked.add((case["case"], key))
            self._check(q, key, res.rows, case)
        return {"query": key, "status": "ok", "elapsed_s": res.elapsed_s}

    def _check(self, q, key: str, rows, case: dict) -> None:
        if key in self.no_reference:
            case["answers"]["not_comparable"].append(key)
            return
        try:
            chk = self.ref.check(q, rows)
        except validate.NoReference as e:
            self.no_reference[key] = str(e)
            case["answers"]["not_comparable"].append(key)
            return
        case["answers"]["checked"] += 1
        if not chk.ok:
            case["answers"]["wrong"].append(key)
            case["failures"].append(f"{key}: wrong answer ({chk.detail})")

    def recommendation(self, configs: list[knobs.Config]) -> recommend.Recommendation:
        cands = []
        for c, case in zip(configs, self.doc["cases"]):
            times: dict[str, list[float]] = {k: [] for k in self.texts}
            for r in case["runs"]:
                if r["status"] == "ok":
                    times[r["query"]].append(r["elapsed_s"])
            cands.append(recommend.Candidate(case["label"], c, times, case["failures"][0] if case["failures"] else None))
        check = self.doc["environment"].get("system_check") or {}
        facts = recommend.Facts(len(self.topo.cpu_nodes), self.cfg.min_gain, self.cfg.max_slowdown,
                                tuple(check.get("warnings") or ()))
        return recommend.recommend(cands[0], cands[1:], facts)
