"""PostgreSQL's runtime: one bound PostgreSQL server (a postmaster and everything it forks) per plan
instance, each with its own data directory, port and socket directory, each holding the whole data
set (replicas: a query runs on one instance; run_query routes it to the least busy one).

Serves the benchmarks (the servers die with tilewise) and `tilewise up/status/query/down`
(detached, recorded in the state file: every member's pid and start time is its postmaster's, and
`status` lists each server's whole process tree, so `tilewise elastic --pid <postmaster>` and
`tilewise tune` can act on it).

Where the files are: ``$TILEWISE_POSTGRES_DIR`` (default /var/tmp, a disk, not tmpfs) holds one
directory per deployment, ``tilewise-postgres-<token>/``, with ``instance-<i>/data`` and
``instance-<i>/socket`` per instance (the socket directory is open only to the server's user; the
TCP port on the cluster's host asks for the password in ``password``, readable only by whoever
started it). It is journaled before it is made, so `tilewise restore` removes what a killed run
left; `stop()` and `down` remove it.

Starting: home.run_as() decides the user (root starts the servers as an unprivileged user, see
home.py); each postmaster is spawned through the process edge (launch.spawn via ProcessCluster:
bound before exec -- CPUs, memory policy, allocator -- which every backend, parallel worker and
background worker inherits by fork; in its own session; journaled first), its settings on its
command line (settings.py). With a data set, each instance's data directory is a copy of the data
set's cached load (load.py), built first when there is none (a loader server on all the plan's
CPUs). Stopping is PostgreSQL's fast shutdown (SIGINT to the postmaster: it ends its backends,
writes a checkpoint, removes its shared memory, socket and lock files), then the process edge's
sweep of anything left; a server that died without its shutdown (SIGKILL, OOM) left its System V
segment and its dynamic shared memory behind, and is started once more on its data directory so
that PostgreSQL itself removes them (its start-up removes a dead predecessor's segments), then
stopped. The servers get SIGINT, not SIGKILL, when the tilewise that started them dies
(launch.spawn's death_signal), so they shut down cleanly even after `kill -9` of tilewise.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tilewise import changes, cpulist, launch, procs, verification
from tilewise.binding import Binding
from tilewise.engines.contract import QueryResult
from tilewise.engines.postgres import SPEC, env, home, load, settings
from tilewise.engines.postgres.home import PostgresError
from tilewise.engines.procgroup import Member, ProcessCluster, free_port, log_tail
from tilewise.engines.replicas import Router
from tilewise.errors import TilewiseError, UsageError
from tilewise.fsutil import atomic_write
from tilewise.plan import Plan

DIR_VAR = env.DIR.name
PORT_VAR = env.PORT.name
DEFAULT_BASE = Path("/var/tmp")
READY_RE = re.compile(r"database system is ready to accept connections")
START_TIMEOUT_S = 120.0
SHUTDOWN_TIMEOUT_S = 60.0  # a fast shutdown writes a checkpoint
SOCKET_MAX = 107 - len("/.s.PGSQL.65535")
LOADER_PORT = 5432  # the loader listens on its socket only: the number only names the socket


def failure(log_text: str) -> tuple[str, str] | None:
    """Why a postmaster did not start, from its log: (what, the fix), or None when the log does not say."""
    fatal = [ln.split("FATAL:", 1)[1].strip() for ln in log_text.splitlines() if "FATAL:" in ln]
    text = log_text
    if "Address already in use" in text or "could not create any TCP/IP sockets" in text:
        return ("its port is in use by another process",
                f"leave {PORT_VAR} unset (tilewise picks free ports) or set it to a free base port")
    if re.search(r"could not (map|create) (anonymous )?shared memory", text) or "out of memory" in text.lower():
        return (f"it refused its memory settings ({fatal[0] if fatal else 'shared memory'})",
                "give a smaller --worker-memory (shared_buffers is a quarter of it)")
    bad = next((f for f in fatal if "invalid value for parameter" in f or "outside the valid range" in f), None)
    if bad:
        return (f"it refused a setting: {bad}",
                "give another --worker-memory (shared_buffers is a quarter of it, work_mem comes from the rest)")
    if "Permission denied" in text or "has invalid permissions" in text or "wrong ownership" in text:
        return (f"it cannot use its data directory ({fatal[0] if fatal else 'permission denied'})",
                f"set {DIR_VAR} to a directory the server's user can write")
    if fatal:
        return (fatal[0], "")  # the caller names the log
    return None


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def base_port(environ: dict | None = None) -> int | None:
    return env.PORT.value(environ)


def traversable(path: Path, uid: int, gids: set[int]) -> Path | None:
    """The first directory on path's way that user uid (groups gids) cannot enter, or None."""
    p = Path("/")
    for part in Path(path).resolve().parts[1:]:
        p = p / part
        try:
            st = os.stat(p)
        except OSError:
            return None  # not there yet: made by us
        mode = st.st_mode
        ok = (mode & 0o100) if st.st_uid == uid else (mode & 0o010) if st.st_gid in gids else (mode & 0o001)
        if uid != 0 and not ok:
            return p
    return None


class PostgresServers(ProcessCluster):
    """One bound PostgreSQL server per plan instance (role "worker", its postmaster the member)."""

    spec = SPEC
    error_cls = PostgresError
    STOP_ORDER = {"loader": 1, "worker": 1}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dataset = None
        self._idle: dict[int, list] = {}
        self._route = threading.Lock()  # guards the idle connections
        self.router = Router()
        self._user: home.RunAs | None = None
        self._roots: set[str] = set()  # the directories this process made (members record theirs too)

    # ---- where things are -----------------------------------------------------------------------
    @property
    def user(self) -> home.RunAs:
        if self._user is None:
            self._user = home.run_as()
        return self._user

    def _server_root(self) -> Path:
        """The deployment's directory for data and sockets (journaled before it is made)."""
        base = env.DIR.value() or Path(DEFAULT_BASE)
        u = self.user
        if not base.is_dir():
            raise UsageError(f"{DIR_VAR}={base} is not a directory", f"create it or set {DIR_VAR} to a writable one")
        if not os.access(base, os.W_OK | os.X_OK):
            raise UsageError(f"cannot write PostgreSQL's data directories in {base}: permission denied",
                             f"set {DIR_VAR} to a directory you can write")
        blocked = traversable(base, u.uid, {u.gid})
        if blocked is not None:
            raise UsageError(f"the user {u.name}, which runs PostgreSQL, cannot enter {blocked} (on the way to its "
                             f"data directories in {base})", f"set {DIR_VAR} to a directory {u.name} can reach")
        root = base / f"tilewise-postgres-{self.token[:12]}"
        if len(str(root / "instance-9999" / "socket")) > SOCKET_MAX:
            raise UsageError(f"{DIR_VAR}={base} is too long for a Unix socket path", "use a shorter directory")
        if self.own_journal() is not None:
            self.journal.record(changes.CreatedDirectory(str(root), "PostgreSQL data"), "state", "absent",
                                "present", lock=False)
        try:
            root.mkdir(mode=0o711)
            self._roots.add(str(root))
            os.chmod(root, 0o711)  # the server's user enters, lists nothing
        except OSError as e:
            raise UsageError(f"cannot create PostgreSQL's data directory {root}: {e.strerror or e}",
                             f"set {DIR_VAR} to a writable directory") from None
        return root

    def _own(self, path: Path, mode: int = 0o700) -> Path:
        """A directory of the server's user (created by us)."""
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, mode)
        if self.user.switch:
            os.chown(path, self.user.uid, self.user.gid)
        return path

    def _chown_tree(self, path: Path) -> None:
        u = self.user
        if not u.switch:
            return
        for d, dirs, files in os.walk(path):
            for name in [d, *(os.path.join(d, x) for x in dirs + files)]:
                st = os.lstat(name)
                if st.st_uid != u.uid or st.st_gid != u.gid:
                    os.lchown(name, u.uid, u.gid)

    # ---- running PostgreSQL's programs as its user ---------------------------------------------------
    def _env(self) -> dict:
        env = self.user.env(self.env())
        env.pop("PGDATA", None)
        env["LC_ALL"] = "C"
        return env

    def _tool(self, argv: list[str], what: str, timeout: float = 300.0) -> str:
        """Run one of PostgreSQL's programs (initdb) as the server's user; its output, or an error line."""
        try:
            res = launch.run(argv, Binding(None), env=self._env(), cwd="/", stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=timeout, **self.user.popen_kwargs())
        except subprocess.TimeoutExpired:
            raise PostgresError(f"{what} did not finish within {timeout:.0f} s") from None
        if res.returncode != 0:
            tail = " | ".join(ln.strip() for ln in (res.stdout or "").splitlines() if ln.strip())[-400:]
            raise PostgresError(f"{what} failed (exit {res.returncode}): {tail}",
                                f"set {DIR_VAR} to a directory {self.user.name} can write" if "ermission" in tail
                                else None)
        return res.stdout or ""

    def _initdb(self, data_dir: Path, bindir: Path) -> None:
        self._own(data_dir)
        self._tool([str(bindir / "initdb"), "-D", str(data_dir), "-U", settings.ROLE, "--encoding=UTF8",
                    "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"],
                   f"initdb {data_dir}")

    def _spawn_server(self, role: str, instance: int | None, data_dir: Path, b: Binding, cfg: dict[str, str],
                      bindir: Path, *, cores: int = 0, memory_mb: int = 0, extra: dict | None = None,
                      log_name: str | None = None) -> Member:
        argv = settings.argv(bindir / "postgres", data_dir, cfg)
        m = self._spawn(role, instance, argv, b, cores=cores, memory_mb=memory_mb, env=self._env(),
                        extra=extra, log_name=log_name, death_signal=signal.SIGINT, cwd="/",
                        **self.user.popen_kwargs())
        self._verify_started(m)
        return m

    def _wait_ready(self, m: Member, timeout: float) -> None:
        try:
            self.wait_log(m, READY_RE, timeout, "accept connections")
        except PostgresError:
            why = None
            with contextlib.suppress(OSError):
                why = failure(Path(m.log).read_text(errors="replace"))
            if why is None:
                raise
            who = "the loader" if m.instance is None else f"instance {m.instance}"
            raise PostgresError(f"PostgreSQL ({who}) did not start: {why[0]}",
                                why[1] or f"see its log (kept): {m.log}") from None

    def _connect(self, m: Member, dbname: str = settings.DATABASE, timeout_s: float = 30.0):
        import psycopg

        return psycopg.connect(host=m.extra["socket_dir"], port=int(m.extra["port"]), user=settings.ROLE,
                               dbname=dbname, autocommit=True, connect_timeout=max(1, int(timeout_s)))

    # ---- start -------------------------------------------------------------------------------------
    def start(self, plan: Plan, *, dataset=None, allocator: str = "system", memory_mb=None, coordinator_mb=None,
              join=None, log=None) -> None:
        if join:
            raise UsageError("PostgreSQL servers do not cooperate on a query: there is nothing to join",
                             "start them on each host with `tilewise up --engine postgres`")
        why = home.missing()
        if why:
            raise PostgresError(f"PostgreSQL cannot run here: {why}")
        bindir = home.bindir()
        self.user  # who runs the servers: an error line before anything starts  # noqa: B018
        try:
            memory_mb = self._begin(plan, dataset, memory_mb, join)
            self.dataset = dataset
            first = base_port()
            ports = {}
            for k, inst in enumerate(plan.instances):
                port = first + k if first is not None else free_port(self.host)
                if first is not None and (port > 65535 or not port_free(self.host, port)):
                    raise UsageError(f"port {port} (PostgreSQL instance {inst.id}) is in use on {self.host}",
                                     f"set {PORT_VAR} to a free base port, or unset it (tilewise picks free ports)")
                ports[inst.id] = port
            root = self._server_root()
            password = secrets.token_urlsafe(18)
            pw_file = atomic_write(root / "password", password + "\n", mode=0o600)
            rot = settings.rotational(root)
            with self._template(plan, dataset, bindir, root, allocator, memory_mb, log) as (template, load_info):
                made = self._data_dirs(plan, root, template, bindir)
            for inst in plan.instances:
                data, clone_s = made[inst.id]
                self._start_instance(inst, root, data, {**load_info, "clone_s": clone_s} if template else {}, bindir,
                                     ports[inst.id], memory_mb[inst.id], allocator, rot, pw_file, log)
            self.endpoint = str(root)
            deadline = time.monotonic() + START_TIMEOUT_S
            for m in self.workers():
                self._wait_ready(m, max(1.0, deadline - time.monotonic()))
                with contextlib.closing(self._connect(m, "postgres")) as conn:
                    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                        (settings.DATABASE,)).fetchone():  # no data set: an empty one
                        conn.execute(f"CREATE DATABASE {settings.DATABASE}")
                    conn.execute(f"ALTER ROLE {settings.ROLE} PASSWORD '{password}'")
                if log:
                    log(f"PostgreSQL server {m.instance} ready: pid {m.pid}, port {m.extra['port']}, "
                        f"{m.binding.describe()}")
        except BaseException:
            if not self.detach:
                self.stop()
            raise

    def _data_dirs(self, plan: Plan, root: Path, template: Path | None, bindir: Path) -> dict[int, tuple[Path, float]]:
        """Every instance's data directory, all at once: a copy of the cached load made by a `cp` bound
        like the instance (so the page cache of its files starts on the instance's node), or a fresh
        initdb without a data set. {instance: (data directory, seconds it took)}."""
        def one(inst) -> tuple[int, tuple[Path, float]]:
            base = root / f"instance-{inst.id}"
            base.mkdir(mode=0o711)
            os.chmod(base, 0o711)
            self._own(base / "socket")
            data = base / "data"
            t0 = time.monotonic()
            if template is not None:
                self._copy(template, data, Binding.from_instance(inst))
            else:
                self._initdb(data, bindir)
            (data / "pg_hba.conf").write_text(settings.hba(self.host))
            self._chown_tree(data / "pg_hba.conf")
            return inst.id, (data, round(time.monotonic() - t0, 3))

        with ThreadPoolExecutor(max_workers=len(plan.instances), thread_name_prefix="pg-copy") as pool:
            return dict(pool.map(one, plan.instances))

    def _start_instance(self, inst, root: Path, data: Path, load_info: dict, bindir: Path, port: int,
                        memory_mb: int, allocator: str, rotational, pw_file: Path, log) -> Member:
        cores = len(inst.cpus)
        sock = data.parent / "socket"
        cfg = {**settings.server_settings(cores, memory_mb, rotational=rotational),
               **settings.connection_settings(port, self.host, sock, f"tilewise-{inst.id}")}
        extra = {"port": port, "socket_dir": str(sock), "data_dir": str(data), "server_root": str(root),
                 "user": self.user.name, "password_file": str(pw_file),
                 "settings": {k: v for k, v in cfg.items() if k not in ("unix_socket_permissions",)},
                 "load": load_info}
        m = self._spawn_server("worker", inst.id, data, Binding.from_instance(inst, allocator), cfg, bindir,
                               cores=cores, memory_mb=memory_mb, extra=extra)
        if log:
            log(f"PostgreSQL server {inst.id} starting: pid {m.pid}, {m.binding.describe()}, port {port}")
        return m

    def _copy(self, template: Path, dst: Path, b: Binding) -> None:
        try:
            res = launch.run(["cp", "-a", "--reflink=auto", str(template), str(dst)], b, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        except launch.LaunchError as e:
            raise PostgresError(f"cannot copy the loaded data set to {dst}: {e}") from None
        if res.returncode != 0:
            raise PostgresError(f"cannot copy the loaded data set {template} to {dst}: {res.stderr.strip()[:300]}",
                                f"check the free space in {dst.parent} (or set {DIR_VAR})")
        self._chown_tree(dst)
        os.chmod(dst, 0o700)

    # ---- the data set's load, cached -------------------------------------------------------------------
    @contextlib.contextmanager
    def _template(self, plan: Plan, ds, bindir: Path, root: Path, allocator: str, memory_mb: dict[int, int], log):
        """(the data directory every instance copies, what results record of its load): the cached
        load of ds, built now when there is none, held under the cache's shared lock while the
        instances copy it. (None, {}) without a data set: every instance gets an empty database."""
        if ds is None:
            yield None, {}
            return
        tpl = load.Template(ds, home.major())
        if not tpl.cached:  # a data set in a directory we cannot write: loaded for this run only
            built, info = self._build(plan, ds, bindir, root, allocator, memory_mb, log)
            yield built, {"cached": False, **info}
            return

        def build() -> dict:
            built, info = self._build(plan, ds, bindir, root, allocator, memory_mb, log)
            tpl.store(built, info)
            return info

        with tpl.use(build) as (doc, built_now):
            if not built_now and log:
                log(f"PostgreSQL: {ds.label} was loaded before (cached in {tpl.dir}); copying it into each instance")
            yield tpl.data_dir, ({"cached": False, **doc.get("load", {})} if built_now else
                                 {"cached": True, "loaded": doc.get("load", {})})

    def _build(self, plan: Plan, ds, bindir: Path, root: Path, allocator: str, memory_mb: dict[int, int],
               log) -> tuple[Path, dict]:
        """Load ds into a fresh data directory with a loader server on all the plan's CPUs; stop it cleanly."""
        data = root / "load" / "data"
        (root / "load").mkdir(mode=0o711)
        os.chmod(root / "load", 0o711)
        sock = self._own(root / "load" / "socket")
        if log:
            log(f"PostgreSQL: loading {ds.label} (COPY, keys, VACUUM ANALYZE; once per data set)")
        t0 = time.monotonic()
        self._initdb(data, bindir)
        cpus = sorted({c for i in plan.instances for c in i.cpus})
        total_mb = sum(memory_mb.values())
        cfg = {**settings.server_settings(len(cpus), total_mb, rotational=settings.rotational(root)),
               **settings.connection_settings(LOADER_PORT, "", sock, "tilewise-load"),
               "max_wal_size": "4GB", "autovacuum": "off",
               # what it leaves in pg_wal is copied into every instance: no recycled segments kept,
               # new ones sparse (16 MB of zeros each otherwise)
               "wal_recycle": "off", "wal_init_zero": "off"}
        m = self._spawn_server("loader", None, data, Binding(tuple(cpus), "first-touch", (), allocator), cfg, bindir,
                               cores=len(cpus), memory_mb=total_mb,
                               extra={"port": LOADER_PORT, "socket_dir": str(sock), "data_dir": str(data),
                                      "server_root": str(root)}, log_name="loader")
        try:
            self._wait_ready(m, START_TIMEOUT_S)
            with contextlib.closing(self._connect(m, "postgres")) as conn:
                conn.execute(f"CREATE DATABASE {settings.DATABASE}")
            info = load.load(lambda: self._connect(m), ds, threads=len(cpus), log=log)
        except BaseException:
            self._shutdown([m], SHUTDOWN_TIMEOUT_S)
            raise
        self._shutdown([m], SHUTDOWN_TIMEOUT_S)
        ok, why = m.alive()
        if ok or not m.how_it_ended().endswith("status 0"):
            raise PostgresError(f"the PostgreSQL loader did not shut down cleanly ({m.how_it_ended()})",
                                f"log: {m.log}")
        self.members.remove(m)
        if self.on_change:
            self.on_change(self)
        info["load_s"] = round(time.monotonic() - t0, 3)
        if log:
            log(f"PostgreSQL: {ds.label} loaded in {info['load_s']:.1f} s")
        return data, info

    # ---- queries -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _connection(self, instance: int):
        m = self.worker(instance)
        if m is None:
            ids = sorted(w.instance for w in self.workers())
            raise UsageError(f"no PostgreSQL instance {instance} in this cluster",
                             f"instances are {', '.join(map(str, ids))}" if ids else "start it with tilewise up")
        with self._route:
            idle = self._idle.setdefault(instance, [])
            conn = idle.pop() if idle else None
        if conn is None:
            try:
                conn = self._connect(m)
            except Exception as e:  # noqa: BLE001 - psycopg's OperationalError and friends
                self.check_alive("connect")
                raise PostgresError(f"cannot connect to PostgreSQL instance {instance}: {_first_line(e)}",
                                    "check it runs: tilewise status") from None
        ok = False
        try:
            yield conn
            ok = True
        finally:
            keep = ok and not conn.closed and not self._stopped
            if keep:
                with self._route:
                    self._idle.setdefault(instance, []).append(conn)
            else:
                with contextlib.suppress(Exception):
                    conn.close()

    def run_query(self, sql: str, *, instance: int | None = None, timeout_s: float | None = None) -> QueryResult:
        if self._stopped:
            raise TilewiseError("the PostgreSQL engine was stopped")
        with self.router.route([m.instance for m in self.workers()], instance) as inst, \
                self._connection(inst) as conn:
            cur = conn.cursor()
            try:
                cur.execute(f"SET statement_timeout = {int(timeout_s * 1000) if timeout_s else 0}")
                t0 = time.perf_counter()
                cur.execute(sql)
                rows = cur.fetchall() if cur.description else []
                elapsed = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 - psycopg.Error: one line for the caller
                raise self._query_error(inst, e, timeout_s) from None
            cols = [d.name for d in cur.description] if cur.description else []
        return QueryResult(cols, rows, elapsed, inst)

    def _query_error(self, inst: int, e: Exception, timeout_s: float | None) -> TilewiseError:
        text = _first_line(e)
        if "statement timeout" in text and timeout_s:
            return TilewiseError(f"PostgreSQL instance {inst}: the query did not finish within {timeout_s:g} s "
                                 "(statement_timeout)")
        if self._stopped:
            return TilewiseError(f"PostgreSQL instance {inst} was stopped while running the query")
        with contextlib.suppress(TilewiseError):
            self.check_alive("run a query")
        return TilewiseError(f"PostgreSQL instance {inst}: {text}")

    def close(self) -> None:
        with self._route:
            conns = [c for lst in self._idle.values() for c in lst]
            self._idle = {}
        for c in conns:
            with contextlib.suppress(Exception):
                c.close()

    # ---- refresh functions ---------------------------------------------------------------------------
    def apply_refresh(self, function: str, rset) -> float:
        """Every replica applies the function in one transaction, all at once; returns the seconds until
        the last one committed. The Parquet files the statements read are staged first (COPY, the same
        CSV path as the load): a refresh set's own files inside the transaction, every time (so RF1's
        time includes reading its file, as DuckDB's does); a file of the loaded data set (which the
        undo of RF2 reads its rows back from) once per server, as an unlogged table kept until it stops."""
        if self._stopped or self.dataset is None:
            raise TilewiseError("the PostgreSQL engine is not running with a data set")
        base = {str(p): t for t, p in self.dataset.tables.items()}
        staged: dict[str, str] = {}

        def source(path) -> str:
            key = str(path)
            if key not in staged:
                t = base.get(key)
                staged[key] = f"tilewise_loaded_{t}" if t else f"tilewise_stage_{len(staged)}"
            return load.quote_ident(staged[key])

        sql = rset.statements(function, self.dataset, source=source)
        errors: list[str] = []
        t0 = time.perf_counter()

        def one(m: Member) -> None:
            try:
                with self._connection(m.instance) as conn:
                    cur = conn.cursor()
                    cur.execute("SET statement_timeout = 0")
                    for path, name in staged.items():
                        if path in base:
                            self._stage_loaded(conn, name, Path(path))
                    with conn.transaction():
                        for path, name in staged.items():
                            if path not in base:
                                cur.execute(load.table_ddl(name, Path(path), temp=True))
                                load.copy_into(cur, name, Path(path))
                        for stmt in sql:
                            cur.execute(stmt)
            except Exception as e:  # noqa: BLE001 - psycopg.Error
                errors.append(f"instance {m.instance}: {_first_line(e)}")

        threads = [threading.Thread(target=one, args=(m,), name=f"pg-refresh-{m.instance}") for m in self.workers()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise TilewiseError(f"PostgreSQL could not apply {function} of refresh set {rset.number}: {errors[0]}")
        return time.perf_counter() - t0

    @staticmethod
    def _stage_loaded(conn, name: str, path: Path) -> None:
        cur = conn.cursor()
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))
        if cur.fetchone()[0]:
            return
        with conn.transaction():
            cur.execute(load.table_ddl(name, path, unlogged=True))
            load.copy_into(cur, name, path, freeze=True)
            cur.execute(f"ANALYZE {load.quote_ident(name)}")

    # ---- status and settings -------------------------------------------------------------------------
    def tree(self, m: Member) -> list[procs.Stat]:
        """The member's postmaster and everything it forked, as /proc shows them now."""
        table = procs.scan()
        st = table.get(m.pid)
        if st is None or st.start != m.start:
            return []
        return [st] + [table[p] for p in sorted(procs.descendants([m.pid], table)) if p in table]

    def verify_tree(self, m: Member) -> dict:
        """Every process of the server read back from /proc against the instance's binding."""
        out = {"processes": [], "verified": 0, "mismatch": [], "not_checkable": 0}
        for st in self.tree(m):
            v = verification.verify(st.pid, m.binding, allocator_wait_s=0.0)
            name = procs.command(st.pid, limit=60)
            out["processes"].append({"pid": st.pid, "start": st.start, "name": name, "verification": v.state,
                                     "cpus": cpulist.format(v.cpus)})
            if v.state == verification.VERIFIED:
                out["verified"] += 1
            elif v.state == verification.MISMATCH:
                out["mismatch"].append(f"pid {st.pid} ({name}): " + "; ".join(v.problems))
            else:
                out["not_checkable"] += 1
        return out

    def member_status(self, m: Member) -> dict:
        d = super().member_status(m)
        d.update({"port": m.extra.get("port"), "socket_dir": m.extra.get("socket_dir"),
                  "data_dir": m.extra.get("data_dir"), "user": m.extra.get("user")})
        if not d["alive"]:
            return d
        tree = self.verify_tree(m)
        d["processes"] = tree["processes"]
        if tree["mismatch"]:
            d["binding_verified"] = False
            self._unhealthy(d, "binding not applied: " + "; ".join(tree["mismatch"][:3]))
        if not d["healthy"]:  # a stopped postmaster would keep the probe below waiting for its timeout
            return d
        try:
            with contextlib.closing(self._connect(m, timeout_s=10)) as conn:
                conn.execute("SELECT 1")
        except Exception as e:  # noqa: BLE001
            self._unhealthy(d, f"does not answer on its socket ({_first_line(e)})")
        return d

    def instance_extra(self, d: dict) -> dict:
        return {"memory_mb": d["memory_mb"], "port": d.get("port"),
                "processes": d.get("processes", [])}

    def info(self, instance: int) -> dict:
        m = self.worker(instance)
        if m is None:
            return {}
        loaded = m.extra.get("load") or {}
        # the data's way into this instance: its copy of the cached load (+ the load itself when this run made it)
        load_s = loaded.get("clone_s", 0.0) + (0.0 if loaded.get("cached") else loaded.get("load_s", 0.0))
        out = {"threads": m.cores, "memory_mb": m.memory_mb, "pid": m.pid, "version": home.server_version(),
               "settings": dict(m.extra.get("settings") or {}), "load": loaded, "port": m.extra.get("port")}
        if self.dataset is not None:
            out["load_s"] = round(load_s, 3)
        cpu = self.cpu_s(m)
        if cpu is not None:
            out["cpu_s"] = cpu
        out.update(self.tree_rss(m))
        return out

    def tree_rss(self, m: Member) -> dict:
        """The server's resident memory now, summed over its processes (/proc/PID/status): rss_mb
        (VmRSS: shared buffers counted in every process that touched them) and rss_anon_mb (RssAnon:
        each process's private memory; the shared buffers are RssShmem)."""
        rss = anon = 0
        for st in self.tree(m):
            try:
                fields = procs.status(st.pid)
            except OSError:
                continue
            rss += int(fields.get("VmRSS", "0 kB").split()[0])
            anon += int(fields.get("RssAnon", "0 kB").split()[0])
        return {"rss_mb": round(rss / 1024, 1), "rss_anon_mb": round(anon / 1024, 1)} if rss else {}

    def cpu_s(self, m: Member) -> float | None:
        """CPU seconds of the server's whole process tree so far (its exited backends included: the
        postmaster's children's times)."""
        ticks = None
        for pid in procs.tree_of(m.pid):
            try:
                fields = procs.stat_fields(procs.read_text(f"/proc/{pid}/stat"))
                ticks = (ticks or 0) + procs.cpu_ticks(fields, reaped=pid == m.pid)
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
        return None if ticks is None else round(ticks / procs.TICKS_PER_S, 3)

    def connect_hints(self, state) -> list[str]:
        ws = self.workers()
        lines = [f"{len(ws)} PostgreSQL server(s), one per instance (user {settings.ROLE}, database "
                 f"{settings.DATABASE}); files in {self.endpoint}",
                 f"query: tilewise query --name {state.name} [--instance I] \"SELECT ...\""]
        if ws:
            m = ws[0]
            lines.append(f"   or: psql -h {m.extra['socket_dir']} -p {m.extra['port']} -U {settings.ROLE} "
                         f"{settings.DATABASE}   (as root or {m.extra.get('user')}; instance {m.instance})")
            lines.append(f"   or over TCP: psql -h {self.host} -p {m.extra['port']} -U {settings.ROLE} "
                         f"{settings.DATABASE}   (password in {m.extra.get('password_file')})")
        if state.data:
            lines.append(f"{state.data.get('label', 'data')}: the {len(state.data.get('tables', {}))} tables are "
                         "loaded in every instance")
        return lines

    # ---- stopping ----------------------------------------------------------------------------------
    def _shutdown(self, members: list[Member], timeout: float) -> list[int]:
        """PostgreSQL's fast shutdown of each live postmaster (SIGINT), waiting for all of them; the
        pids of those it asked to shut down."""
        live = [m for m in members if m.alive()[0]]
        asked = [m.pid for m in live]
        for m in live:
            procs.send(procs.ProcId(m.pid, m.start), signal.SIGINT)
            procs.send(procs.ProcId(m.pid, m.start), signal.SIGCONT)  # a stopped postmaster shuts down too
        deadline = time.monotonic() + timeout
        while live and time.monotonic() < deadline:
            live = [m for m in live if m.alive()[0]]
            if live:
                time.sleep(0.05)
        return asked

    def stop(self, timeout: float = 10.0) -> list[int]:
        """Fast shutdown of every server, the process edge's sweep of anything left, IPC a killed
        server left removed by PostgreSQL itself, the data directories removed. Idempotent."""
        first = not self._stopped
        self._stopped = True
        self.close()
        servers = [m for m in self.members if m.role in ("worker", "loader")]
        shut = self._shutdown(servers, SHUTDOWN_TIMEOUT_S) if first else []
        own, self._own_journal = self._own_journal, False
        try:
            pids = super().stop(timeout)
        finally:
            self._own_journal = own
        problems = self._clean_up(servers)
        if problems:
            raise PostgresError("PostgreSQL left files behind: " + "; ".join(problems),
                                "remove them by hand (ipcrm -m for a shared memory segment)")
        if own and self.journal is not None:
            self.journal.commit()
            self.journal = None
        return sorted(set(shut) | set(pids))  # the servers that shut down when asked, and what the sweep stopped

    def _clean_up(self, servers: list[Member]) -> list[str]:
        problems = []
        roots = {m.extra.get("server_root") for m in servers if m.extra.get("server_root")} | self._roots
        for m in servers:
            data = m.extra.get("data_dir")
            if data and Path(data, "postmaster.pid").exists():
                problems += self._recover(m)
        for r in roots:
            root = Path(r)
            if root.name.startswith("tilewise-postgres-") and root.is_dir():
                shutil.rmtree(root, ignore_errors=True)
                if root.exists():
                    problems.append(f"{root} could not be removed")
        return problems

    def _recover(self, m: Member) -> list[str]:
        """A server that died without its shutdown (SIGKILL, OOM) left its System V segment, its
        dynamic shared memory and its lock files. Its stale lock files go (they name a process we
        know is gone: a zombie's pid still answers kill(pid, 0), and PostgreSQL would take it for a
        live server); then the server is started once more on its data directory, whose start-up
        removes the dead one's segments (PostgreSQL finds the old segment by the data directory's
        key and removes it with the dynamic shared memory it lists), and stopped. A segment that
        survives that, ours by the lock file, unattached, is removed directly."""
        data, sock = Path(m.extra["data_dir"]), Path(m.extra["socket_dir"])
        ok, _ = m.alive()
        if ok:
            return [f"{m.label} (pid {m.pid}) is still running"]
        old = lockfile(data / "postmaster.pid")
        for f in (data / "postmaster.pid", sock / f".s.PGSQL.{m.extra['port']}.lock"):
            if lockfile(f).get("pid") == m.pid:
                f.unlink(missing_ok=True)
        log_dir = Path(m.log).parent
        log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / f"cleanup-{m.instance}.log"
        try:
            bindir = home.bindir()
            cfg = {**settings.connection_settings(int(m.extra["port"]), "", sock, "tilewise-cleanup"),
                   "shared_buffers": "16MB", "max_worker_processes": "2", "autovacuum": "off", "wal_level": "minimal",
                   "max_wal_senders": "0"}
            with open(log, "ab") as fh:
                child = launch.spawn(settings.argv(bindir / "postgres", data, cfg), Binding(None), env=self._env(),
                                     journal=None, death_signal=signal.SIGINT, stdin=subprocess.DEVNULL, stdout=fh,
                                     stderr=subprocess.STDOUT, cwd="/", **self.user.popen_kwargs())
            deadline = time.monotonic() + START_TIMEOUT_S
            while child.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    if READY_RE.search(log.read_text(errors="replace")):
                        break
                time.sleep(0.1)
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=SHUTDOWN_TIMEOUT_S)
            rep = procs.stop(child.tree(), grace=5.0)
            if not rep.ok:
                return [f"the clean-up server of {m.label}: {rep.summary()}"]
        except (OSError, TilewiseError, KeyError) as e:
            return [f"{m.label}: cleaning up after its killed server failed: {e}"]
        shmid = old.get("shmid")
        seg = sysv_segment(shmid) if shmid is not None else None
        if seg is not None and seg["nattch"] == 0 and seg["cpid"] == m.pid:
            remove_sysv(shmid)
        if shmid is not None and sysv_segment(shmid) is not None:
            return [f"{m.label}: System V shared memory segment {shmid} is left ({log_tail(str(log))})"]
        return []


def lockfile(path: Path) -> dict:
    """A PostgreSQL lock file (postmaster.pid or a socket's .lock): its pid, and, in postmaster.pid's
    7th line, the System V segment's key and id. {} when it cannot be read."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    out: dict = {}
    with contextlib.suppress(IndexError, ValueError):
        out["pid"] = int(lines[0])
    with contextlib.suppress(IndexError, ValueError):
        key, shmid = lines[6].split()
        out["key"], out["shmid"] = int(key), int(shmid)
    return out


def sysv_segment(shmid: int) -> dict | None:
    """/proc/sysvipc/shm's row of a segment (nattch, cpid, uid as ints), or None when there is none."""
    try:
        with open("/proc/sysvipc/shm") as f:
            head = f.readline().split()
            for line in f:
                row = dict(zip(head, line.split()))
                if int(row.get("shmid", -1)) == shmid:
                    return {"nattch": int(row["nattch"]), "cpid": int(row["cpid"]), "uid": int(row["uid"])}
    except (OSError, ValueError, KeyError):
        return None
    return None


def remove_sysv(shmid: int) -> None:
    import ctypes

    IPC_RMID = 0
    ctypes.CDLL(None, use_errno=True).shmctl(ctypes.c_int(shmid), IPC_RMID, None)


def _first_line(e: BaseException) -> str:
    text = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return text[0] if text else type(e).__name__
