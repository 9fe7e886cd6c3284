"""Cracking (thesis 004, ch. 5): a deployment starts on the raw data and its tables are transformed
in the background, on the cores the deployment leaves idle; each table switches to its new copy
the moment the copy is complete and checked. `tilewise up --crack LAYOUT` starts it.

- **Who**: one background process per cluster, ``python -m tilewise.layout.crack``, started by `up`
  after the deployment answers. It carries the cluster's token, so `tilewise down` (and `restore`)
  stop it with the rest; it is not a member of the deployment (its exit does not make the cluster
  unhealthy). What it does is recorded in the cluster's state file (``data.crack``), which
  `tilewise status` shows: per table raw, transforming, switched (with what it cost), or failed.
- **Where it runs**: on the background core budget (tilewise.elastic.budget): the elastic
  allocator's net, run passively over the deployment's processes, says how many of the
  deployment's cores its work needs; the others are the transformation's (threads and CPUs follow
  the budget as it changes), and when there are none it runs at idle priority (SCHED_IDLE), which
  the kernel schedules only on an otherwise idle CPU: queries never wait for it.
- **What it does**, largest table first (the thesis: lineitem is most of the gain): make the
  table's copy in the layout store (tilewise.data.layouts: built in a temporary directory, checked
  by the fingerprint of its rows against the raw rows, renamed into place), look it up again
  (files, sizes, footers against its manifest), then switch the table on every instance
  (Runtime.switch_table: DuckDB replaces its view; a query that already started finishes on the old
  files) and record the new source in the state file (a later Spark driver reads it).
- **Crash safety**: the raw files are only ever read. A killed cracker leaves at most one
  temporary directory, which no reader ever sees (a copy exists only once renamed) and which the
  next build of that copy removes (store.ensure_dir sweeps it under the copy's lock); copies that
  were finished are reused, not made again, when cracking starts again.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from tilewise import cluster, launch, signals, topology
from tilewise.binding import Binding
from tilewise.data import layouts as L
from tilewise.data import sources_of
from tilewise.data.sources import TableSource
from tilewise.elastic import budget as B
from tilewise.elastic import modes
from tilewise.engines.contract import CLUSTER_VAR, TOKEN_VAR
from tilewise.errors import TilewiseError, UsageError
from tilewise.layout import candidates

FORMAT = "tilewise-crack/1"


def target(name: str, sources: dict[str, TableSource], tiles: int) -> L.LayoutSpec:
    """The layout to crack into: a name, or auto (Parquet, K files by the candidates' rule: a
    multiple of the tiles keeping the largest table's files under 200 MB)."""
    fmt = next(iter(sources.values())).format
    if name == "auto":
        largest = max(s.bytes for s in sources.values())
        return L.LayoutSpec("parquet", candidates.files_for(candidates.parquet_bytes(fmt, largest), tiles,
                                                            candidates.Bounds()))
    spec = L.parse(name, source_format=fmt)
    if spec.raw:
        raise UsageError(f"--crack {name}: that is the data as it is; nothing to transform",
                         "crack into a Parquet layout, e.g. --crack parquet-2 or --crack auto")
    if spec.copies == 2:
        raise UsageError(f"--crack {name}: a second copy needs each query routed to it, which a running cluster's "
                         "clients do not do", f"crack into one copy, e.g. --crack {name.replace('+', '-')}")
    L.sort_table(spec, sources)
    return spec


def order(sources: dict[str, TableSource]) -> list[str]:
    """Tables in the order they are transformed: largest first."""
    return sorted(sources, key=lambda t: (-sources[t].bytes, t))


def start(st: cluster.ClusterState, layout: str, *, layout_dir: str | None = None, pause_s: float = 0.0,
          log=None) -> dict:
    """Record the cracking plan in the cluster's state, then start the background process (detached,
    carrying the cluster token). Returns the recorded plan."""
    srcs = sources_of(st.data)
    if not srcs or not st.data.get("sources"):
        raise UsageError("--crack needs a cluster started on raw data read in place", "add --data DIR or --raw csv")
    spec = target(layout, srcs, len(st.plan.get("instances", [])))
    root = Path(layout_dir) if layout_dir else L.default_root(srcs)
    doc = {"format": FORMAT, "layout": spec.name, "store": str(root), "state": "starting", "started": time.time(),
           "raw": {t: s.to_json() for t, s in srcs.items()},
           "tables": {t: {"state": "raw", "copy": spec.copy(t == L.sort_table(spec, srcs)).name} for t in order(srcs)}}
    st.data["crack"] = doc
    cluster.save(st)
    logf = Path(st.root) / "logs" / "cracker.log"
    logf.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "tilewise.layout.crack", "--name", st.name]
    if pause_s:
        argv += ["--pause", str(pause_s)]
    env = dict(os.environ, **{TOKEN_VAR: st.token, CLUSTER_VAR: st.root})
    with open(logf, "ab") as fh:
        proc = launch.spawn(argv, Binding(None), env=env, die_with_parent=False, stdin=subprocess.DEVNULL,
                            stdout=fh, stderr=subprocess.STDOUT)

    def rec(s: cluster.ClusterState) -> None:
        c = s.data.setdefault("crack", doc)
        c.update({"pid": proc.pid, "start": proc.ident.start, "log": str(logf)})
        if c.get("state") == "starting":
            c["state"] = "running"

    cluster.update(st.name, st.token, rec)
    if log:
        log(f"cracking into {spec.name} in the background (pid {proc.pid}, log {logf}): "
            f"{', '.join(doc['tables'])}, largest first")
    return doc


# ---- the background process ------------------------------------------------------------------------

def _say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} cracker: {msg}", flush=True)


def run(name: str, *, pause_s: float = 0.0) -> int:
    st = cluster.load(name)
    token = os.environ.get(TOKEN_VAR)
    if st is None or st.token != token or "crack" not in st.data:
        _say(f"cluster {name} is not (or no longer) the one this cracker was started for")
        return 1
    plan = st.data["crack"]
    raw = {t: TableSource.from_json(d, t) for t, d in plan["raw"].items()}
    spec = L.parse(plan["layout"])
    owner = L.sort_table(spec, raw)
    store = L.Store(plan["store"])
    cpus = sorted({c for i in st.plan.get("instances", []) for c in i["cpus"]})
    pool = modes.make_pool(topology.load(None), allowed_cpus=cpus)
    budget = B.Budget(pool, st.cluster().processes())
    pause = (lambda i, p: time.sleep(pause_s)) if pause_s else None

    def mark(table: str, **fields) -> None:
        def f(s: cluster.ClusterState) -> None:
            s.data["crack"]["tables"][table].update(fields)
        if not cluster.update(name, st.token, f):
            raise TilewiseError(f"cluster {name} is gone")

    with B.Ticker(budget) as ticker:
        hooks = L.Hooks(threads=ticker.threads, after_file=pause, log=_say)
        for t in order(raw):
            copy = spec.copy(t == owner)
            mark(t, state="transforming", since=time.time())
            _say(f"{t}: making {copy.name} ({raw[t].bytes / 1e6:.1f} MB of {raw[t].format}); background CPUs now "
                 f"{list(ticker.current) or 'none (idle priority)'}")
            try:
                made = store.ensure(raw[t], copy, hooks)
                checked = store.lookup(raw[t], copy)
                if checked is None:
                    raise TilewiseError(f"the copy of {t} in {store.copy_dir(t, copy)} does not check out")
            except TilewiseError as e:
                mark(t, state="failed", error=str(e))
                raise
            cl = st.cluster()
            try:
                cl.switch_table(t, checked.source.to_json())
            finally:
                cl.close()

            def switched(s: cluster.ClusterState, t=t, made=made, checked=checked) -> None:
                s.data.setdefault("sources", {})[t] = checked.source.to_json()
                s.data["crack"]["tables"][t].update(state="switched", at=time.time(), made_now=made.built,
                                                    cost=made.manifest.get("cost"), files=len(checked.source.files))
            if not cluster.update(name, st.token, switched):
                raise TilewiseError(f"cluster {name} is gone")
            _say(f"{t}: switched to {copy.name} ({len(checked.source.files)} files, "
                 f"{'made now' if made.built else 'reused'})")

    def done(s: cluster.ClusterState) -> None:
        s.data["crack"].update(state="done", finished=time.time())
    cluster.update(name, st.token, done)
    _say("every table switched")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tilewise.layout.crack")
    ap.add_argument("--name", required=True)
    ap.add_argument("--pause", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: sleep after each file
    a = ap.parse_args(argv)
    signals.install()  # SIGTERM (tilewise down) raises: the temporary copy is removed on the way out
    try:
        return run(a.name, pause_s=a.pause)
    except (TilewiseError, OSError) as e:
        why = str(e)
        _say(f"failed: {why}")

        def failed(s: cluster.ClusterState) -> None:
            s.data.get("crack", {}).update(state="failed", error=why)
        try:
            cluster.update(a.name, os.environ.get(TOKEN_VAR, ""), failed)
        except TilewiseError:
            pass
        return 1
    except (KeyboardInterrupt, signals.Terminated):
        _say("stopped")
        return 130


if __name__ == "__main__":
    sys.exit(main())
