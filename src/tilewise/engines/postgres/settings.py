"""PostgreSQL's settings per instance, decided from the instance (pure functions; the runtime passes
them as ``-c name=value`` on the postmaster's command line, so `ps` shows them and results record
them through info()).

From the instance's memory (its share of its node's memory, or --worker-memory; MEMORY_FRACTION):

- shared_buffers: a quarter of it (PostgreSQL's own advice; the OS page cache holds the rest), at
  least 128 MB;
- work_mem: what is left after shared_buffers, shared by the sort and hash nodes of the queries
  running at once: a hash node may take work_mem x hash_mem_multiplier (2), a query has a few of
  them (WORK_MEM_NODES) in each of its processes, and an instance runs about one process per core
  at a time: (memory - shared_buffers) / (2 x WORK_MEM_NODES x cores), 4 MB to 2 GB;
- maintenance_work_mem (index builds, VACUUM): a quarter of the rest, 64 MB to 2 GB;
- effective_cache_size: three quarters of it (a planner hint, nothing allocated).

From its cores: max_parallel_workers = cores, max_parallel_workers_per_gather and
max_parallel_maintenance_workers = cores - 1 (the leader works too, so one query uses all the
instance's cores), max_worker_processes = cores + 8 (the parallel workers plus PostgreSQL's own
background workers).

From the disk holding the data directory: effective_io_concurrency 200 and random_page_cost 1.1
on a non-rotational disk (SSD, NVMe, RAM), the defaults (1 and 4) on a rotational one.

jit: JIT_DEFAULT, off, as measured (docs/postgres.md, "Settings"): at TPC-H SF 0.01 and 0.1 no
plan costs enough to be compiled; at SF 1 14 queries are, and Power@Size with JIT was 0.72x
[0.53-0.99] of without (LLVM's compile time per query is not won back at these sizes).

Durability stays on (fsync, synchronous_commit): the refresh functions commit as a server would.
wal_level = minimal (no replication: less WAL for the refresh functions and the load).
"""

from __future__ import annotations

import os
from pathlib import Path

from tilewise.engines.postgres import env

MEMORY_FRACTION = 0.75  # the default share of the instance's node memory (the knob's default)
MEMORY_MIN_MB = 256  # below this the server and a TPC-H query do not fit
SHARED_BUFFERS_SHARE = 0.25
SHARED_BUFFERS_MIN_MB = 128
WORK_MEM_NODES = 4  # sort/hash nodes of one query process using work_mem at once (TPC-H Q9, Q18, Q21)
HASH_MEM_MULTIPLIER = 2.0  # PostgreSQL 15's default
WORK_MEM_MIN_MB, WORK_MEM_MAX_MB = 4, 2048
MAINTENANCE_MIN_MB, MAINTENANCE_MAX_MB = 64, 2048
EXTRA_WORKERS = 8  # background workers beyond the parallel query workers
JIT_DEFAULT = False  # measured: docs/postgres.md, "Settings"
JIT_VAR = env.JIT.name  # on | off: overrides JIT_DEFAULT (to measure it again)
ROLE = "tilewise"  # the bootstrap superuser every instance has
DATABASE = "tilewise"  # the database the data set is loaded into


def memory_settings(memory_mb: int, cores: int) -> dict[str, str]:
    """shared_buffers, work_mem, maintenance_work_mem, effective_cache_size for an instance."""
    cores = max(1, cores)
    shared = max(SHARED_BUFFERS_MIN_MB, int(memory_mb * SHARED_BUFFERS_SHARE))
    rest = max(0, memory_mb - shared)
    work = int(rest / (HASH_MEM_MULTIPLIER * WORK_MEM_NODES * cores))
    work = max(WORK_MEM_MIN_MB, min(WORK_MEM_MAX_MB, work))
    maint = max(MAINTENANCE_MIN_MB, min(MAINTENANCE_MAX_MB, rest // 4))
    return {"shared_buffers": f"{shared}MB", "work_mem": f"{work}MB", "maintenance_work_mem": f"{maint}MB",
            "effective_cache_size": f"{max(shared, int(memory_mb * 0.75))}MB"}


def parallel_settings(cores: int) -> dict[str, str]:
    cores = max(1, cores)
    return {"max_worker_processes": str(cores + EXTRA_WORKERS), "max_parallel_workers": str(cores),
            "max_parallel_workers_per_gather": str(cores - 1), "max_parallel_maintenance_workers": str(cores - 1)}


def io_settings(rotational: bool | None) -> dict[str, str]:
    """rotational: the data directory's disk spins (True), does not (False), unknown (None: defaults)."""
    if rotational is False:
        return {"effective_io_concurrency": "200", "random_page_cost": "1.1"}
    return {"effective_io_concurrency": "1", "random_page_cost": "4"}


def jit_choice(environ: dict | None = None) -> bool:
    """JIT_DEFAULT, or $TILEWISE_POSTGRES_JIT (on/off) when set."""
    text = env.JIT.value(environ)
    return JIT_DEFAULT if text is None else text == "on"


def server_settings(cores: int, memory_mb: int, *, rotational: bool | None, jit: bool | None = None) -> dict[str, str]:
    """Everything decided from the instance (what results record as its settings); jit None: jit_choice()."""
    jit = jit_choice() if jit is None else jit
    return {**memory_settings(memory_mb, cores), **parallel_settings(cores), **io_settings(rotational),
            "jit": "on" if jit else "off", "wal_level": "minimal", "max_wal_senders": "0"}


def connection_settings(port: int, listen: str, socket_dir: Path, name: str) -> dict[str, str]:
    """Where the server listens: its TCP port on `listen` and its own socket directory."""
    return {"port": str(port), "listen_addresses": listen, "unix_socket_directories": str(socket_dir),
            "unix_socket_permissions": "0700", "cluster_name": name}


def argv(postgres: Path, data_dir: Path, settings: dict[str, str]) -> list[str]:
    out = [str(postgres), "-D", str(data_dir)]
    for k, v in settings.items():
        out += ["-c", f"{k}={v}"]
    return out


def hba(listen: str) -> str:
    """pg_hba.conf: the socket (a directory only the server's user and root can enter) trusts; TCP
    asks for the instance's password (scram-sha-256)."""
    lines = ["local all all trust",
             "host all all 127.0.0.1/32 scram-sha-256",
             "host all all ::1/128 scram-sha-256"]
    if listen not in ("127.0.0.1", "localhost", "::1", ""):
        lines.append("host all all samenet scram-sha-256")
    return "\n".join(lines) + "\n"


def mb(value: str) -> int:
    """'512MB' -> 512 (the units server_settings writes)."""
    return int(value.removesuffix("MB"))


# ---- facts read from the machine (the edge) ----------------------------------------------------------

def rotational(path: Path) -> bool | None:
    """Whether the disk holding path spins (sysfs queue/rotational of its block device); None: unknown."""
    try:
        dev = os.stat(path).st_dev
        base = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    except OSError:
        return None
    for d in (base, base.parent):  # a partition's flag is on its disk
        try:
            return (d / "queue" / "rotational").read_text().strip() == "1"
        except OSError:
            continue
    return None
