"""tiles: bound DataFusion workers that cooperate on one query (issue 30), on datafusion-distributed.

A coordinator (an Arrow Flight SQL endpoint that plans every statement with the distributed
planner) and one worker per plan instance, each a bound process of the native binary
(native/tiles, built by `tilewise engines install tiles` into the cache, build.py). The workers
cooperate on every query through the crate's exchange (shuffles, coalesces, broadcasts across
network boundaries); clients connect with ADBC (`adbc-driver-flightsql`) or JDBC.

The exchange is chosen per deployment (`--exchange shm|unix|tcp`, Capabilities.exchanges): the
batches written once into shared memory on the reading tile's node and read there in place (shm;
the control messages as the crate's gRPC over rings on the same nodes), the crate's gRPC over Unix
sockets, or over TCP. Each tile owns a share of the data (shares.py: whole files of a K-file layout,
the same on every query). Workers on other hosts join over TCP (`tilewise join --engine tiles`: the
coordinator's Flight actions).
"""

from __future__ import annotations

from tilewise.engines.contract import Capabilities, EngineSpec
from tilewise.engines import splits
from tilewise.engines.tiles import build, shares
from tilewise.engines.tiles.dialect import dialect
from tilewise.parts import Part

PART = Part("tiles", extra="tiles", group="engines", size="about 1.4 GB of build cache, a 129 MB binary",
            what="the tiles engine: datafusion-distributed workers bound per tile, a Flight SQL coordinator")


def version() -> str:
    return f"tilewise-tiles ({build.source_key()}) on datafusion-distributed 4.0"


def install_step(version: str | None = None, progress=None, keep_download: bool = False) -> dict:
    doc = build.build(message=(progress.message if progress is not None else lambda s: None))
    doc["engine"] = "tiles"
    doc["notes"] = [f"tilewise-tiles: {doc['binary']}" + (f" (built in {doc['seconds']} s)" if doc.get("built") else
                                                          " (already built for these sources)")]
    return doc


SPEC = EngineSpec(
    name="tiles",
    title="tiles",
    summary="a Flight SQL coordinator + one bound DataFusion worker per instance (datafusion-distributed; "
            "they cooperate on every query)",
    runtime="tilewise.engines.tiles.runtime:TilesCluster",
    capabilities=Capabilities(replicas=False, refresh=False, join=True, reads=("parquet",),
                              exchanges=("shm", "unix", "tcp"), tile_stats=True),
    missing=build.missing,
    version=version,
    part=PART,
    install=install_step,
    install_help="builds native/tiles with cargo into the cache (12-16 min the first time on 2 cores)",
    dialect=dialect,  # dialect.py: TPC-DS q66, as the reference rewrites it
    endpoint_label="coordinator",
    # tile t reads files t, t+N, ... of a table of K >= 2 files on every query (shares.py); a table of
    # one file is cut into byte ranges by the crate (measured per tile: scan_stats)
    scan_split=splits.FileAffinity(one_file="cut into byte ranges by the crate, each on the same tile on every "
                                             "query; not predicted (see the measured figures)"),
    check_shares=shares.check,
    env=(build.CACHE, build.COMPRESSION, build.SHM_DATA),
)
