"""The Spark driver, run as its own process: `python -m tilewise.engines.spark.driver FD`.

It talks to tilewise over a dedicated socket (FD, multiprocessing.connection messages), never over
stdout (the driver JVM logs there). Why a separate process and not a SparkSession inside tilewise:
pyspark keeps one global SparkContext and gateway JVM per Python process; a separate process gives
each engine start a fresh driver, and stopping is killing one process group (the driver JVM
included), even when the driver hangs in a query whose worker died.

Protocol (tuples): -> ("init", cfg) <- ("ready", info) | ("error", msg)
                   -> ("sql", text)  <- ("ok", columns, rows, elapsed_s) | ("error", msg)
                   -> ("view", name, table) <- ("ok",) | ("error", msg)   (register a table again)
                   -> ("stats",)     <- ("ok", [per executor: id, host_port, tasks, input_bytes])
                   -> ("stop",)      (or EOF) : stop the session and exit.
"""

from __future__ import annotations

import sys
import time
import traceback
from multiprocessing.connection import Connection


def _executors(sc) -> int:
    # getExecutorMemoryStatus counts the driver too
    return sc._jsc.sc().getExecutorMemoryStatus().size() - 1


def main(fd: int) -> int:
    conn = Connection(fd)
    try:
        kind, cfg = conn.recv()
    except EOFError:
        return 0
    spark = None
    try:
        from pyspark.sql import SparkSession

        b = SparkSession.builder.master(cfg["master"]).appName(cfg.get("app", "tilewise"))
        for k, v in cfg.get("conf", {}).items():
            b = b.config(k, str(v))
        t_start = time.monotonic()
        spark = b.getOrCreate()
        _log(f"session created in {time.monotonic() - t_start:.1f} s")
        spark.sparkContext.setLogLevel(cfg.get("log_level", "WARN"))
        want = int(cfg.get("executors", 0))
        deadline = time.monotonic() + float(cfg.get("executor_timeout_s", 90))
        while _executors(spark.sparkContext) < want:
            if time.monotonic() > deadline:
                conn.send(("error", f"only {_executors(spark.sparkContext)} of {want} executors registered "
                                    f"within {cfg.get('executor_timeout_s', 90)} s"))
                return 1
            time.sleep(0.1)
        _log(f"{want} executor(s) registered after {time.monotonic() - t_start:.1f} s")
        for name, t in cfg.get("tables", {}).items():
            register(spark, name, t)
        _log(f"tables registered after {time.monotonic() - t_start:.1f} s")
        conn.send(("ready", {"executors": _executors(spark.sparkContext), "spark_version": spark.version}))
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                break
            if msg[0] == "stop":
                break
            if msg[0] == "view":  # a table switched to another copy (cracking)
                try:
                    register(spark, msg[1], msg[2])
                    conn.send(("ok",))
                except Exception as e:
                    conn.send(("error", _one_line(e)))
                continue
            if msg[0] == "stats":
                try:
                    conn.send(("ok", executor_stats(spark)))
                except Exception as e:
                    conn.send(("error", _one_line(e)))
                continue
            if msg[0] == "sql":
                try:
                    t0 = time.perf_counter()
                    df = spark.sql(msg[1])
                    rows = df.collect()
                    elapsed = time.perf_counter() - t0
                    conn.send(("ok", list(df.columns), [tuple(r) for r in rows], elapsed))
                except Exception as e:  # the query failed: report it, keep serving
                    conn.send(("error", _one_line(e)))
        return 0
    except Exception as e:
        try:
            conn.send(("error", _one_line(e)))
        except OSError:
            pass
        traceback.print_exc()
        return 1
    finally:
        if spark is not None:
            try:
                spark.stop()
            except Exception:
                pass


TRAILING = "__tilewise_end"


def register(spark, name: str, t: dict) -> None:
    """A temporary view over a table's files: {"path"} or {"files"} of Parquet, or raw text with its
    schema (DDL), read strictly (FAILFAST: a malformed row fails the query instead of turning NULL)."""
    fmt = t.get("format", "parquet")
    paths = list(t.get("files") or [t["path"]])
    if fmt == "parquet":
        reader = spark.read.schema(t["schema"]) if t.get("schema") else spark.read
        df = reader.parquet(*paths)
    elif fmt in ("csv", "tbl"):
        ddl = t["schema"] + (f", `{TRAILING}` STRING" if t.get("trailing") else "")
        df = (spark.read.schema(ddl).option("sep", t.get("delimiter", ",")).option("header", bool(t.get("header")))
              .option("mode", "FAILFAST").option("quote", '"').option("escape", '"').option("nullValue", "")
              .csv(paths))
        if t.get("trailing"):
            df = df.drop(TRAILING)
    elif fmt == "json":
        df = spark.read.schema(t["schema"]).option("mode", "FAILFAST").json(paths)
    else:
        raise ValueError(f"table {name}: Spark cannot read format {fmt!r}")
    df.createOrReplaceTempView(name)


def executor_stats(spark) -> list[dict]:
    """Per executor (the driver excluded), cumulative: tasks, input bytes and records (the status
    store Spark's UI reads; it is kept with the UI off too)."""
    store = spark.sparkContext._jsc.sc().statusStore()
    execs = store.executorList(True)
    out = []
    for i in range(execs.size()):
        e = execs.apply(i)
        if e.id() == "driver":
            continue
        out.append({"id": e.id(), "host_port": e.hostPort(), "tasks": int(e.totalTasks()),
                    "input_bytes": int(e.totalInputBytes())})
    return out


def _log(msg: str) -> None:
    print(f"tilewise driver: {msg}", file=sys.stderr, flush=True)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:1500]}"


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
