"""The tiles runtime: one bound worker per plan instance and a Flight SQL coordinator, all processes
of the native binary (build.py).

Workers start first (`tilewise-tiles worker --listen ADDR`, bound to their instance's CPUs and
memory policy; ADDR by the exchange: shm:SOCKET, unix:SOCKET or HOST:PORT); the coordinator (`tilewise-tiles serve`) gets their URLs and the data set's tables
and shares the CPUs of the instance local to the NIC (instance 0 on loopback), as Trino's does.
Queries go to the coordinator over Arrow Flight SQL (ADBC); the distributed planner splits every
statement into stages over the workers. Answers keep DataFusion's Arrow types (decimals as Decimal,
dates as datetime.date); the reference is DataFusion too, so they compare exactly.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from tilewise import nic
from tilewise.binding import Binding
from tilewise.engines.contract import QueryResult
from tilewise.engines.procgroup import ClusterError, ProcessCluster, free_port
from tilewise.engines.serve import resident_mb
from tilewise.engines.tiles import SPEC, build, shares
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Plan

LISTENING_RE = re.compile(r"listening on (\S+)")
READY_TIMEOUT_S = 60.0
# a scan is split over the tiles once it has this many bytes per task: small, so that the tiles
# cooperate on every query, as the deployment is meant to (the crate's default keeps small scans
# on the coordinator); the task count is capped by the tiles (2 tasks per scan on 2 tiles)
BYTES_PER_TASK = 64 << 10
# how long scan_stats waits for the coordinator's line of the last statement (it writes it once the
# workers' metrics are in, at most 3 s after the statement: native/tiles/src/flight.rs)
FIGURES_WAIT_S = 5.0


class TilesError(ClusterError):
    pass


def _said(e: Exception) -> str:
    """What a Flight error says, without gRPC's wrapping ("... error, with message: X. Detail: ...")."""
    text = str(e).split(". Detail:", 1)[0].split("\n", 1)[0]
    return text.split("with message: ", 1)[-1]


def table_paths(dataset) -> list[tuple[str, str, int]]:
    """(table, path, files) per table for the coordinator: its one Parquet file, or the directory
    holding all of a layout's files for it (DataFusion lists a directory as one table)."""
    out = []
    for name, src in sorted(dataset.table_sources().items()):
        if src.format != "parquet":
            raise UsageError(f"tiles reads Parquet only; table {name} is {src.format}", "use a Parquet layout")
        if len(src.files) == 1:
            out.append((name, src.files[0], 1))
            continue
        parents = {str(Path(f).parent) for f in src.files}
        if len(parents) != 1 or sorted(p.name for p in Path(next(iter(parents))).glob("*.parquet")) != sorted(
                Path(f).name for f in src.files):
            raise UsageError(f"table {name}: its {len(src.files)} files are not the whole of one directory",
                             "tiles reads a table's files as one directory")
        out.append((name, next(iter(parents)) + "/", len(src.files)))
    return out


class TilesCluster(ProcessCluster):
    """Start/inspect/stop the workers and the coordinator; query the coordinator (Flight SQL)."""

    spec = SPEC
    error_cls = TilesError
    STOP_ORDER = {"coordinator": 1, "worker": 2}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._conn = None
        self._statements = 0  # run through the coordinator (each gets a numbered line of figures)
        self._gave_up: set[int] = set()  # statements whose line did not come in time: never counted

    @classmethod
    def check_installed(cls) -> None:
        why = build.missing()
        if why:
            raise TilesError(f"the tiles engine cannot run here: {why}")

    # -- start --
    def start(self, plan: Plan, *, dataset=None, allocator: str = "system", memory_mb=None, coordinator_mb=None,
              join=None, log=None, placement=None) -> None:
        self.check_installed()
        tables = table_paths(dataset) if dataset is not None else []
        shares.check({name: k for name, _, k in tables}, len(plan.instances))  # before anything starts
        if join:
            self._check_join(join)
        try:
            self._begin(plan, dataset, memory_mb, join)
            exe = str(build.binary_path())
            # `--exchange`, else the default (shm); workers joining from another host: TCP, the only
            # transport that reaches across hosts
            self.exchange = "tcp" if join else self.spec.check_exchange(self.exchange)
            urls = []
            # over shm: the batches through memory on the receiver's node (or the rings' gRPC)
            shm_data = (build.SHM_DATA.value() or "direct") if self.exchange == "shm" else None
            data_args = ["--shm-data", shm_data] if shm_data else []
            for inst in plan.instances:
                if self.exchange in ("shm", "unix"):  # shm: the socket that sets the rings up
                    sock = self.root / f"worker-{inst.id}.sock"
                    x = self.exchange
                    listen, url, extra = f"{x}:{sock}", f"{x}://{sock}", {"socket": str(sock)}
                else:
                    port = free_port(self.host)
                    listen, url, extra = f"{self.host}:{port}", f"http://{self.host}:{port}", {"port": port}
                m = self._spawn("worker", inst.id, [exe, "worker", "--listen", listen, *data_args],
                                Binding.from_instance(inst, allocator), cores=len(inst.cpus), extra=extra)
                self._verify_started(m)
                urls.append(url)
                if log:
                    log(f"worker {inst.id} started: pid {m.pid}, {m.binding.describe()}")
            for m in self.workers():
                self.wait_log(m, LISTENING_RE, READY_TIMEOUT_S, "listen")
            if join:
                self._join(join, urls, log)
                return
            cport = free_port(self.host)
            self.placement = placement or nic.place_coordinator(plan, *nic.detect(self.host))
            inst = self.placement.coordinator
            compression = build.COMPRESSION.value() or ("lz4" if self.exchange == "tcp" else "none")
            argv = [exe, "serve", "--listen", f"{self.host}:{cport}", "--workers", ",".join(urls),
                    "--bytes-per-partition", str(BYTES_PER_TASK), "--compression", compression, *data_args]
            for name, path, _ in tables:
                argv += ["--table", f"{name}={path}"]
            b = Binding.from_instance(inst, allocator) if inst is not None else Binding(None)
            m = self._spawn("coordinator", None, argv, b, cores=len(inst.cpus) if inst else 0,
                            extra={"port": cport, "compression": compression, "shm_data": shm_data})
            self._verify_started(m)
            self.endpoint = f"grpc://{self.host}:{cport}"
            self.wait_log(m, LISTENING_RE, READY_TIMEOUT_S, "listen")
            self._sql("SELECT 1")
            if log:
                log(f"coordinator (Flight SQL) at {self.endpoint}: pid {m.pid}, {b.describe()}; exchange between "
                    f"the tiles: {self.exchange}")
        except BaseException:
            if not self.detach:
                self.stop()
            raise

    # -- workers on other hosts (`tilewise join`) --
    @classmethod
    def join_address(cls, text: str) -> str:
        """HOST:PORT (or grpc://HOST:PORT, as `status` prints it) -> the coordinator's Flight URI
        (tilewise.cluster then checks the port and the route to it)."""
        m = re.fullmatch(r"(?:grpc://)?([^:/]+):(\d+)/?", text or "")
        if not m:
            raise UsageError(f"{text!r} is not a tiles coordinator address", "use HOST:PORT or grpc://HOST:PORT")
        return f"grpc://{m.group(1)}:{m.group(2)}"

    def _action(self, name: str, body: str, timeout_s: float = 30.0) -> str:
        """One of the coordinator's Flight actions (native/tiles/src/flight.rs): its one result as text."""
        import pyarrow as pa
        import pyarrow.flight as fl

        try:
            client = fl.FlightClient(self.endpoint)
            try:
                results = list(client.do_action(fl.Action(name, body.encode()), fl.FlightCallOptions(timeout=timeout_s)))
            finally:
                client.close()
        except (fl.FlightUnavailableError, fl.FlightTimedOutError, OSError) as e:
            raise TilesError(f"cannot reach the tiles coordinator at {self.endpoint}: {_said(e)}",
                             "check the address (`tilewise status` on its host prints it) and the route") from None
        except pa.ArrowException as e:  # the coordinator's own words: what it refused and why
            raise TilesError(f"the tiles coordinator at {self.endpoint} refused {name.removeprefix('tilewise.')}"
                             f"{' of ' + body if body else ''}: {_said(e)}") from None
        return results[0].body.to_pybytes().decode() if results else ""

    def _check_join(self, coordinator: str) -> None:
        """Before anything starts: the coordinator answers, and its workers are on TCP (a worker on
        another host cannot reach workers on shm or Unix sockets)."""
        self.endpoint = coordinator
        local = [u for u in self.coordinator_workers() if not u.startswith("http://")]
        if local:
            raise UsageError(f"the tiles cluster at {coordinator} exchanges over {local[0].split(':', 1)[0]} "
                             f"({local[0]}), which workers on another host cannot reach",
                             "start it with `tilewise up --engine tiles --exchange tcp --host ADDR`")

    def _join(self, coordinator: str, urls: list[str], log) -> None:
        """Ask the coordinator to plan over these workers too; they answer it over TCP."""
        self.endpoint = coordinator
        for url in urls:
            n = self._action("tilewise.join", url)
            if log:
                log(f"worker {url} joined the coordinator at {coordinator} ({n} workers there now)")

    def coordinator_workers(self) -> list[str]:
        """The worker URLs the coordinator plans over now, its own and those that joined."""
        return [u for u in self._action("tilewise.workers", "").splitlines() if u]

    def stop(self, timeout: float = 10.0) -> list[int]:
        """A joined host's workers leave the coordinator first (when it still answers), so that its
        queries no longer plan over them; then every process stops as for any cluster."""
        if self.joined and not self._stopped and self.endpoint:
            for m in self.workers():
                if m.extra.get("port"):
                    try:
                        self._action("tilewise.leave", f"http://{self.host}:{m.extra['port']}", timeout_s=5.0)
                    except TilewiseError:  # a coordinator that is gone has nothing to forget
                        pass
        return super().stop(timeout)

    # -- queries --
    def _connection(self):
        if self._conn is None:
            import adbc_driver_flightsql.dbapi as flightsql

            self._conn = flightsql.connect(self.endpoint, autocommit=True)
        return self._conn

    def _sql(self, sql: str, timeout_s: float | None = None):
        """Run one statement; after timeout_s the client cancels it (the coordinator drops its stream,
        and with it the tasks on the tiles), and it fails naming the limit.

        The driver's call runs in a thread of its own while the main thread waits: in the main thread,
        ADBC's driver manager puts its own SIGINT handler in place for the call and turns a Ctrl-C into
        a cancel, which ends the call as an ordinary error ('context canceled') -- the run would record
        a failed query and go on. Waiting here, the main thread gets tilewise's own handler: Ctrl-C
        (and SIGTERM, which would otherwise wait for the statement's end) raises at once, the
        statement is cancelled and the connection dropped, and the interrupt goes on up."""
        import threading
        import warnings

        t0 = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ADBC: "Cannot disable autocommit" (Flight SQL has none)
            cur = self._connection().cursor()
        done, out = threading.Event(), {}

        def call() -> None:
            try:
                cur.execute(sql)
                out["table"] = cur.fetch_arrow_table()
            except Exception as e:  # noqa: BLE001 - the driver raises several types; handed to the caller
                out["error"] = e
            finally:
                done.set()

        self._statements += 1
        threading.Thread(target=call, name="tiles-query", daemon=True).start()
        try:
            finished = done.wait(timeout_s)
        except BaseException:  # Ctrl-C, SIGTERM: stop the statement, then let the interrupt go on
            self._abandon(cur, done)
            raise
        if not finished:
            self._abandon(cur, done)
            raise TilewiseError(f"tiles query cancelled after the time limit of {timeout_s:g} s")
        try:
            cur.close()
        except Exception:  # noqa: BLE001 - a cursor of a server that is gone
            pass
        if "error" in out:
            self.check_alive("run a query")
            raise TilewiseError(f"tiles query failed: {' '.join(str(out['error']).split())[:600]}") from None
        return out["table"], time.monotonic() - t0

    def _abandon(self, cur, done, wait_s: float = 5.0) -> None:
        """Cancel a running statement (the coordinator drops its stream and its tasks), give the
        driver a moment to return, and drop the connection: the next statement gets a fresh one."""
        try:
            cur.adbc_cancel()
        except Exception:  # noqa: BLE001 - a statement that just finished
            pass
        done.wait(wait_s)
        self._conn, conn = None, self._conn
        if conn is not None and done.is_set():  # a connection whose call is still running is left to it
            try:
                cur.close()
                conn.close()
            except Exception:  # noqa: BLE001 - a connection to a server that is gone
                pass

    def run_query(self, sql: str, *, instance: int | None = None, timeout_s: float | None = None) -> QueryResult:
        self._check_whole_cluster(instance)
        if self._stopped or not self.endpoint:
            raise TilewiseError("the tiles engine is not started")
        table, elapsed = self._sql(sql, timeout_s)
        cols = [c.to_pylist() for c in table.columns]
        return QueryResult(table.column_names, list(zip(*cols)) if cols else [], elapsed, -1)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - a connection to a server that is gone
                pass
            self._conn = None

    # -- inspection --
    def _coordinator(self):
        return next((m for m in self.members if m.role == "coordinator"), None)

    def info(self, instance: int) -> dict:
        """The worker's CPUs, pid and resident memory (now, at its peak, anonymous): the tiles hold one
        copy of the data between them, so this is what each tile costs beside a replica's."""
        m = self.worker(instance)
        coord = self._coordinator()
        return {} if m is None else {"threads": m.cores, "pid": m.pid, **resident_mb(m.pid),
                                     "settings": {"exchange": self.exchange,
                                                  "compression": coord.extra.get("compression") if coord else None,
                                                  "shm_data": coord.extra.get("shm_data") if coord else None}}

    def scan_stats(self) -> dict[int, dict] | None:
        """Per tile, cumulative: its scan tasks and the bytes of the files and ranges assigned to them
        (what its worker logs per task: shares.read_log), and the rows its scans produced and what its
        exchange received (what the coordinator logs per statement from the crate's metrics, once they
        are in: shares.read_coordinator_log; tile i = the i-th worker, in the plan's instance order);
        `unmeasured`: the statements so far whose figures are not known. Waits (FIGURES_WAIT_S at
        most) for the line of the last statement run; one that comes later is never counted, so that
        it cannot be taken for the next statement's."""
        def text(m) -> str:
            try:
                return Path(m.log).read_text(errors="replace")
            except OSError:
                return ""

        coord = self._coordinator()
        tallies, unmeasured = {}, set()
        if coord is not None:
            deadline = time.monotonic() + FIGURES_WAIT_S
            while True:
                tallies, seen, unmeasured = shares.read_coordinator_log(text(coord), self._gave_up)
                if self._statements in seen or self._statements == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            self._gave_up |= set(range(1, self._statements + 1)) - seen
        out = {}
        for i, m in enumerate(self.workers()):  # started in the order the coordinator was given them
            d = shares.read_log(text(m))
            out[m.instance] = {"tasks": d["tasks"], "input_bytes": d["input_bytes"],
                               **tallies.get(str(i), dict.fromkeys(shares.TALLY_KEYS, 0)),
                               "unmeasured": len(unmeasured | self._gave_up)}
        return out

    def instance_extra(self, d: dict) -> dict:
        return {"coordinator": self.endpoint, "exchange": getattr(self, "exchange", None)}

    def connect_hints(self, state) -> list[str]:
        if self.joined:
            return [f"these workers joined the coordinator at {self.endpoint}: query it there (`tilewise query` on "
                    "its host, or ADBC Flight SQL at that URI)",
                    f"leave: tilewise down --name {state.name} (here)"]
        return [f"coordinator: {self.endpoint} (Arrow Flight SQL)",
                f"query: tilewise query --name {state.name} \"SELECT ...\"",
                "   or: python -c \"import adbc_driver_flightsql.dbapi as f; c = f.connect('"
                f"{self.endpoint}').cursor(); c.execute('SELECT 1'); print(c.fetch_arrow_table())\""]
