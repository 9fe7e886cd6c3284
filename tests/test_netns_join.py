"""Workers on other hosts, tested as real separate hosts: two network namespaces joined by a veth
pair (ip netns). `tilewise up` runs in one with a routable address, `tilewise join` in the other;
each plans and binds its own workers; the joined workers take part in queries; `down` on either
side stops only that side's processes and leaves nothing of them.

Needs root and iproute2; the Spark test runs by default (as root), the Trino one with the trino
mark and --run-slow (it starts three JVMs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import tagged, wait_gone

pytestmark = [pytest.mark.root, pytest.mark.netns]
EXE = str(Path(sys.executable).parent / "tilewise")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    """Two namespaces a and b with 10.231.N.1 and 10.231.N.2 on a veth pair (N from the pid)."""

    def __init__(self, tmp: Path) -> None:
        n = os.getpid() % 200 + 20
        self.tag = f"tw{os.getpid()}"
        self.ns = {"a": f"{self.tag}a", "b": f"{self.tag}b"}
        self.addr = {"a": f"10.231.{n}.1", "b": f"10.231.{n}.2"}
        self.dirs = {h: str(tmp / f"host-{h}") for h in "ab"}
        for h in "ab":
            _ip("netns", "add", self.ns[h])
        _ip("link", "add", f"{self.tag}x", "type", "veth", "peer", "name", f"{self.tag}y")
        for h, dev in (("a", f"{self.tag}x"), ("b", f"{self.tag}y")):
            _ip("link", "set", dev, "netns", self.ns[h])
            _ip("-n", self.ns[h], "addr", "add", f"{self.addr[h]}/24", "dev", dev)
            _ip("-n", self.ns[h], "link", "set", dev, "up")
            _ip("-n", self.ns[h], "link", "set", "lo", "up")

    def run(self, host: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        env = dict(os.environ, TILEWISE_CLUSTER_DIR=self.dirs[host], TILEWISE_STATE_DIR=self.dirs[host] + "-state")
        return subprocess.run(["ip", "netns", "exec", self.ns[host], EXE, *args], capture_output=True, text=True,
                              timeout=timeout, env=env)

    def python(self, host: str, code: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns[host], sys.executable, "-c", code], capture_output=True,
                              text=True, timeout=timeout)

    def left(self, host: str) -> list[psutil.Process]:
        return tagged("TILEWISE_CLUSTER_DIR", self.dirs[host])

    def wait_gone(self, host: str, timeout: float = 20.0) -> list:
        return wait_gone("TILEWISE_CLUSTER_DIR", self.dirs[host], timeout)

    def down_b_then_a(self) -> None:
        """down on the joined host stops only its workers; then down on the coordinator's host."""
        dn = self.run("b", "down", "--name", "b", "--json")
        assert dn.returncode == 0, dn.stderr
        assert not self.wait_gone("b") and self.left("a")
        dn = self.run("a", "down", "--name", "a", "--json")
        assert dn.returncode == 0, dn.stderr
        assert not self.wait_gone("a")

    def close(self) -> None:
        for h in "ab":
            for p in self.left(h):
                try:
                    p.kill()
                except psutil.Error:
                    pass
        for h in "ab":
            subprocess.run(["ip", "netns", "del", self.ns[h]], capture_output=True)


@pytest.fixture
def hosts(tmp_path):
    if not shutil.which("ip"):
        pytest.skip("iproute2 (ip) is not installed")
    try:
        h = Hosts(tmp_path)
    except subprocess.CalledProcessError as e:
        subprocess.run(["ip", "netns", "del", f"tw{os.getpid()}a"], capture_output=True)
        subprocess.run(["ip", "netns", "del", f"tw{os.getpid()}b"], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {e.stderr.strip()}")
    yield h
    h.close()


def _policy() -> str:
    return "wic" if len(os.sched_getaffinity(0)) >= 2 else "wim"


@pytest.mark.spark
def test_spark_workers_join_from_another_host(hosts):
    up = hosts.run("a", "up", "--engine", "spark", "--policy", "wim", "--host", hosts.addr["a"], "--worker-memory",
                   "1g", "--name", "a", "--json")
    assert up.returncode == 0, up.stderr[-2000:]
    adoc = json.loads(up.stdout)
    url = adoc["endpoint"]
    assert url == f"spark://{hosts.addr['a']}:{url.rsplit(':', 1)[1]}"
    j = hosts.run("b", "join", "--engine", "spark", "--coordinator", url.removeprefix("spark://"), "--policy", _policy(),
                  "--worker-memory", "1g", "--name", "b", "--json")
    assert j.returncode == 0, j.stderr[-2000:]
    jdoc = json.loads(j.stdout)
    assert jdoc["joined"] and jdoc["healthy"] and all(m["role"] == "worker" for m in jdoc["members"])
    assert all(m["binding_verified"] for m in jdoc["members"])
    # a job on host a's master runs tasks on host b's executors (they register back over the veth)
    code = f"""
from pyspark.sql import SparkSession
s = (SparkSession.builder.master({url!r}).config("spark.driver.host", {hosts.addr['a']!r})
     .config("spark.driver.bindAddress", {hosts.addr['a']!r}).config("spark.ui.enabled", "false")
     .config("spark.executor.memory", "512m").getOrCreate())
import time
deadline = time.time() + 120
while s.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < 2 and time.time() < deadline:
    time.sleep(0.2)
rdd = s.sparkContext.parallelize(range(400), 40)
hosts = rdd.map(lambda x: __import__("os").environ.get("SPARK_LOCAL_IP", "?")).collect()
print("SUM", rdd.sum(), "HOSTS", sorted(set(hosts)))
s.stop()
"""
    py = hosts.python("a", code, timeout=300)
    assert py.returncode == 0, py.stderr[-2000:]
    assert "SUM 79800" in py.stdout and hosts.addr["b"] in py.stdout, py.stdout
    hosts.down_b_then_a()


@pytest.mark.trino
@pytest.mark.slow
def test_trino_workers_join_from_another_host(hosts, trino_ready, tmp_path):
    from tilewise.benchmarks.tpch import data as tpch_data

    data = tpch_data.dataset(0.01, tmp_path / "data")  # same path on both "hosts" (one file system)
    up = hosts.run("a", "up", "--engine", "trino", "--policy", "wim", "--host", hosts.addr["a"], "--sf", "0.01",
                   "--data-dir", str(data.dir.parent), "--worker-memory", "1g", "--coordinator-memory", "768m",
                   "--name", "a", "--json")
    assert up.returncode == 0, up.stderr[-2000:]
    adoc = json.loads(up.stdout)
    port = adoc["endpoint"].rsplit(":", 1)[1]
    assert adoc["endpoint"] == f"http://{hosts.addr['a']}:{port}"
    j = hosts.run("b", "join", "--engine", "trino", "--coordinator", f"{hosts.addr['a']}:{port}", "--policy", "wim",
                  "--worker-memory", "1g", "--name", "b", "--json")
    assert j.returncode == 0, j.stderr[-2000:]
    jdoc = json.loads(j.stdout)
    assert jdoc["joined"] and jdoc["healthy"] and [m["role"] for m in jdoc["members"]] == ["worker"]
    # the coordinator lists b's worker at b's address; a query reads lineitem with both workers
    q = hosts.run("a", "query", "--name", "a", "--json",
                  "SELECT count(*) FROM system.runtime.nodes WHERE state = 'active' AND NOT coordinator "
                  f"AND http_uri LIKE 'http://{hosts.addr['b']}:%'")
    assert q.returncode == 0 and json.loads(q.stdout)["rows"] == [[1]], q.stderr
    q = hosts.run("a", "query", "--name", "a", "--json", "SELECT count(*), sum(l_quantity) FROM lineitem")
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout)["rows"][0][0] == 60175
    hosts.down_b_then_a()


def test_tiles_workers_join_from_another_host(hosts, tmp_path):
    """The tiles coordinator on host a (its own worker on TCP at a's address); host b's workers join it,
    take part in its queries over the veth (b's worker logs its scans), and leave it on b's `down`."""
    from tilewise import engines
    from tilewise.benchmarks.tpch import data as tpch_data
    from tilewise.engines.tiles import shares

    why = engines.get("tiles").missing()
    if why:
        pytest.skip(why)
    data = tpch_data.dataset(0.01, tmp_path / "data")  # same path on both "hosts" (one file system)
    up = hosts.run("a", "up", "--engine", "tiles", "--policy", "wim", "--exchange", "tcp", "--host", hosts.addr["a"],
                   "--sf", "0.01", "--data-dir", str(data.dir.parent), "--name", "a", "--json")
    assert up.returncode == 0, up.stderr[-2000:]
    uri = json.loads(up.stdout)["endpoint"]
    assert uri.startswith(f"grpc://{hosts.addr['a']}:")
    j = hosts.run("b", "join", "--engine", "tiles", "--coordinator", uri, "--policy", _policy(), "--name", "b",
                  "--json")
    assert j.returncode == 0, j.stderr[-2000:]
    jdoc = json.loads(j.stdout)
    assert jdoc["joined"] and jdoc["healthy"] and {m["role"] for m in jdoc["members"]} == {"worker"}
    assert all(m["binding_verified"] for m in jdoc["members"])
    workers = """
import pyarrow.flight as fl
c = fl.FlightClient(%r)
print([r.body.to_pybytes().decode() for r in c.do_action(fl.Action("tilewise.workers", b""))][0])
""" % uri
    listed = hosts.python("a", workers)
    assert listed.returncode == 0, listed.stderr
    assert len([u for u in listed.stdout.split() if u.startswith(f"http://{hosts.addr['b']}:")]) == len(jdoc["members"])
    for _ in range(2):
        q = hosts.run("a", "query", "--name", "a", "--json", "SELECT count(*), sum(l_quantity) FROM lineitem")
        assert q.returncode == 0, q.stderr
        assert json.loads(q.stdout)["rows"][0] == [60175, "1536127.00"]
    took_part = [shares.read_log(Path(m["log"]).read_text())["tasks"] for m in jdoc["members"]]
    assert sum(took_part) > 0, took_part  # b's workers ran scan tasks of a's queries
    dn = hosts.run("b", "down", "--name", "b", "--json")  # b's workers leave the coordinator, then stop
    assert dn.returncode == 0, dn.stderr
    assert not hosts.wait_gone("b") and hosts.left("a")
    listed = hosts.python("a", workers)
    assert hosts.addr["b"] not in listed.stdout and hosts.addr["a"] in listed.stdout, listed.stdout
    q = hosts.run("a", "query", "--name", "a", "--json", "SELECT count(*) FROM lineitem")
    assert q.returncode == 0 and json.loads(q.stdout)["rows"] == [[60175]], q.stderr
    dn = hosts.run("a", "down", "--name", "a", "--json")
    assert dn.returncode == 0, dn.stderr
    assert not hosts.wait_gone("a")
