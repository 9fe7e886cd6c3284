//! tilewise-tiles: the tiles engine's native side (issue 30), on datafusion-distributed 4.x.
//!
//!   tilewise-tiles worker --listen HOST:PORT
//!       a datafusion-distributed worker (its gRPC/Flight service); tilewise starts one per tile,
//!       bound to the tile's CPUs and memory.
//!   tilewise-tiles serve --listen HOST:PORT --workers URL[,URL...] --table NAME=PATH ...
//!       the coordinator: an Arrow Flight SQL endpoint; every statement is planned by the
//!       distributed planner over the workers.
//!   tilewise-tiles query --workers URL[,URL...] --table NAME=PATH [--table ...] (--sql TEXT | --sql-file F)
//!       plans SQL with the distributed planner over the workers and prints the answer as CSV on
//!       stdout (header line first); the planning and execution time on stderr as one JSON line.
//!
//! Workers listen on HOST:PORT (gRPC over TCP), unix:PATH or shm:PATH (transport.rs, shm.rs);
//! the coordinator routes tasks with file affinity (affinity.rs; `--no-affinity`: the crate's
//! random routing). Workers on other hosts join over TCP through the coordinator's Flight actions
//! (flight.rs). Over shm the batches go through memory on the receiving tile's node, one copy per
//! hop (exchange.rs; `--shm-data grpc`: over the rings' gRPC instead).
mod affinity;
mod rules;
mod exchange;
mod flight;
mod shm;
mod slices;
mod statements;
mod tally;
mod transport;

use arrow::csv::WriterBuilder;
use arrow_flight::flight_service_server::FlightServiceServer;
use async_trait::async_trait;
use datafusion::common::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_distributed::{
    DistributedExt, SessionStateBuilderExt, Worker,
    WorkerResolver,
};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use futures::TryStreamExt;
use std::error::Error;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Instant;
use tonic::transport::Server;
use url::Url;

/// The workers a coordinator plans over: its own, plus those that joined from other hosts
/// (`tilewise join`, the Flight action `tilewise.join`: flight.rs). Read on every query.
#[derive(Clone, Default)]
pub struct Workers(pub Arc<RwLock<Vec<Url>>>);

#[async_trait]
impl WorkerResolver for Workers {
    fn get_urls(&self) -> Result<Vec<Url>, DataFusionError> {
        Ok(self.0.read().expect("workers lock").clone())
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: tilewise-tiles worker --listen HOST:PORT [--shm-data direct|grpc]\n       \
         tilewise-tiles serve --listen HOST:PORT --workers URL[,URL...] --table NAME=PATH ...\n       \
         tilewise-tiles query --workers URL[,URL...] --table NAME=PATH ... (--sql TEXT | --sql-file FILE)"
    );
    std::process::exit(2)
}

async fn worker(args: &[String]) -> Result<(), Box<dyn Error>> {
    let mut listen = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--listen" => listen = it.next().cloned(),
            "--shm-data" => transport::set_shm_data(it.next().unwrap_or_else(|| usage()))?,
            _ => usage(),
        }
    }
    let listen = listen.unwrap_or_else(|| usage());
    // workers read each other's shuffle outputs: they resolve URLs through the same transports
    // (each task's session also holds its statement: statements.rs)
    let worker = Worker::from_session_builder(statements::TileSessions(|b: SessionStateBuilder| {
        b.with_distributed_channel_resolver(transport::TileResolver::default())
            .with_distributed_worker_plan_rewrite_handler(affinity::log_scans)
            .with_distributed_worker_plan_rewrite_handler(slices::slice_worker_plan)
            .with_distributed_user_codec(slices::SlicesCodec)
    }));
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if let Some(path) = listen.strip_prefix("shm:") {
        eprintln!("tilewise-tiles worker listening on shm:{path}");
        let on_data = exchange::on_data(worker.clone());
        Server::builder()
            .add_service(worker.into_worker_server())
            .add_service(statements::Control::server())
            .serve_with_incoming_shutdown(shm::incoming(path, on_data)?, shutdown)
            .await?;
    } else if let Some(path) = listen.strip_prefix("unix:") {
        let _ = std::fs::remove_file(path);
        let incoming = UnixListenerStream::new(UnixListener::bind(path)?);
        eprintln!("tilewise-tiles worker listening on unix:{path}");
        Server::builder()
            .add_service(worker.into_worker_server())
            .add_service(statements::Control::server())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await?;
    } else {
        let addr: SocketAddr = listen.parse()?;
        eprintln!("tilewise-tiles worker listening on {addr}");
        Server::builder()
            .add_service(worker.into_worker_server())
            .add_service(statements::Control::server())
            .serve_with_shutdown(addr, shutdown)
            .await?;
    }
    Ok(())
}

/// What `query` and `serve` share: the workers, the tables, the planner's settings.
struct Session {
    workers: Workers,
    tables: Vec<(String, String)>,
    bytes_per_partition: Option<usize>,
    /// each tile reads the same share of every table on every query (affinity.rs); off: the
    /// crate's random routing
    affinity: bool,
    /// how workers compress what they send each other (the crate's default: lz4): none, lz4, zstd
    compression: Option<String>,
}

impl Session {
    /// Parse the shared options; returns the rest for the caller.
    fn parse(args: &[String]) -> Result<(Session, Vec<String>), Box<dyn Error>> {
        let mut s = Session { workers: Workers::default(), tables: Vec::new(), bytes_per_partition: None, affinity: true, compression: None };
        let mut rest = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--workers" => {
                    for w in it.next().unwrap_or_else(|| usage()).split(',') {
                        s.workers.0.write().expect("workers lock").push(Url::parse(w)?);
                    }
                }
                "--table" => {
                    let spec = it.next().unwrap_or_else(|| usage());
                    let (name, path) = spec.split_once('=').unwrap_or_else(|| usage());
                    s.tables.push((name.to_string(), path.to_string()));
                }
                // the planner distributes a scan once it has this many bytes per task (small: always)
                "--bytes-per-partition" => {
                    s.bytes_per_partition = Some(it.next().unwrap_or_else(|| usage()).parse()?)
                }
                "--no-affinity" => s.affinity = false,
                "--compression" => s.compression = Some(it.next().unwrap_or_else(|| usage()).clone()),
                "--shm-data" => transport::set_shm_data(it.next().unwrap_or_else(|| usage()))?,
                _ => rest.push(a.clone()),
            }
        }
        if s.workers.0.read().expect("workers lock").is_empty() {
            usage()
        }
        Ok((s, rest))
    }

    async fn context(&self) -> Result<SessionContext, Box<dyn Error>> {
        // at least 2 target partitions: with 1 (a coordinator bound to one CPU) DataFusion plans
        // single-phase aggregates (AggregateExec mode=Single) and the distributed planner spreads
        // them over tasks that each see part of the rows -- wrong answers (TPC-H q11, q15 at SF 1;
        // datafusion-distributed 4.0). With 2 or more it plans partial + final aggregates.
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let config = SessionConfig::new().with_target_partitions(cores.max(2));
        let mut builder = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_distributed_worker_resolver(self.workers.clone())
            .with_distributed_channel_resolver(transport::TileResolver::default())
            .with_physical_optimizer_rule(Arc::new(rules::WindowSortKeys))
            .with_physical_optimizer_rule(Arc::new(slices::SliceProbes::default()))
            .with_physical_optimizer_rule(Arc::new(rules::CoopJoins))
            .with_distributed_user_codec(slices::SlicesCodec)
            .with_distributed_planner();
        if self.affinity {
            builder = affinity::install(builder);
        }
        if let Some(c) = &self.compression {
            builder = builder.with_distributed_compression(match c.as_str() {
                "none" => None,
                "lz4" => Some(datafusion_distributed::CompressionType::LZ4_FRAME),
                "zstd" => Some(datafusion_distributed::CompressionType::ZSTD),
                other => return Err(format!("--compression {other}: none, lz4 or zstd").into()),
            })?;
        }
        if let Some(b) = self.bytes_per_partition {
            builder = builder.with_distributed_file_scan_config_bytes_per_partition(b)?;
        }
        let ctx = SessionContext::from(builder.build());
        for (name, path) in &self.tables {
            ctx.register_parquet(name, path, ParquetReadOptions::default()).await?;
        }
        Ok(ctx)
    }
}

async fn query(args: &[String]) -> Result<(), Box<dyn Error>> {
    let (session, rest) = Session::parse(args)?;
    let (mut sql, mut explain) = (None, false);
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--sql" => sql = it.next().cloned(),
            "--sql-file" => sql = Some(std::fs::read_to_string(it.next().unwrap_or_else(|| usage()))?),
            "--explain" => explain = true,
            _ => usage(),
        }
    }
    let sql = sql.unwrap_or_else(|| usage());
    let ctx = session.context().await?;
    let t0 = Instant::now();
    let df = ctx.sql(&sql).await?;
    let plan = df.create_physical_plan().await?;
    let planned = t0.elapsed();
    if explain {
        eprintln!("{}", datafusion_distributed::display_plan_ascii(plan.as_ref(), false));
    }
    let stream = datafusion::physical_plan::execute_stream(plan, ctx.task_ctx())?;
    let batches: Vec<_> = stream.try_collect().await?;
    let total = t0.elapsed();
    let mut out = WriterBuilder::new().with_header(true).build(std::io::stdout());
    for b in &batches {
        out.write(b)?;
    }
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    eprintln!(
        "{{\"rows\":{rows},\"plan_s\":{:.6},\"total_s\":{:.6}}}",
        planned.as_secs_f64(),
        total.as_secs_f64()
    );
    Ok(())
}

async fn serve(args: &[String]) -> Result<(), Box<dyn Error>> {
    let (session, rest) = Session::parse(args)?;
    let mut listen = None;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--listen" => listen = it.next().cloned(),
            _ => usage(),
        }
    }
    let addr: SocketAddr = listen.unwrap_or_else(|| usage()).parse()?;
    let ctx = Arc::new(session.context().await?);
    let svc = FlightServiceServer::new(flight::Coordinator { ctx, workers: session.workers.clone(), statements: Default::default() });
    eprintln!("tilewise-tiles coordinator (Flight SQL) listening on {addr}");
    Server::builder()
        .add_service(svc)
        .serve_with_shutdown(addr, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// The digest of the sources, as tilewise's build passes it (engines/tiles/build.py): rustc records
/// that the crate reads it, so cargo compiles the crate again whenever it changes -- and so refreshes
/// the binary it puts in the shared target directory, which another checkout's build may have
/// replaced with its own.
const SOURCE_KEY: &str = match option_env!("TILEWISE_TILES_SOURCE_KEY") {
    Some(k) => k,
    None => "",
};

/// Scheduler ticks between two looks at the sockets and rings (tokio's default: 61). A join that
/// runs for minutes yields every few milliseconds (slices.rs); at 61 ticks of it a worker would
/// hear a call -- a statement's end (statements.rs), a plan -- only every second or so.
const EVENT_INTERVAL: u32 = 16;

fn main() -> Result<(), Box<dyn Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().event_interval(EVENT_INTERVAL).build()?;
    rt.block_on(run())
}

async fn run() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("worker") => worker(&args[2..]).await,
        Some("query") => query(&args[2..]).await,
        Some("serve") => serve(&args[2..]).await,
        // the digest of the sources this binary was built from (tilewise's build checks it)
        Some("source-key") => {
            println!("{SOURCE_KEY}");
            Ok(())
        }
        _ => usage(),
    }
}
