//! The exchange's transports, swapped under the same plans by the workers' URLs:
//!   http://HOST:PORT   the crate's gRPC over TCP (also between hosts);
//!   unix:///PATH       the same gRPC over a Unix stream socket (one host: no TCP/IP stack);
//!   shm:///PATH        the control calls as the same gRPC over ring buffers in shared memory, each
//!                      bound to the node of the side that reads it (shm.rs), and the data --
//!                      execute_task's batches -- as Arrow IPC written once into memory on the
//!                      receiving tile's node and read there in place (exchange.rs); PATH: the
//!                      worker's socket to set them up. `--shm-data grpc` sends the data over the
//!                      rings' gRPC too (to measure what the one-copy path saves).
//! The coordinator and every worker resolve a URL to a channel here (workers read each other's
//! shuffle outputs), so one choice of URLs changes every hop. Channels are built once per URL and
//! process: the session a worker builds per task shares them.
use async_trait::async_trait;
use datafusion::common::DataFusionError;
use datafusion_distributed::grpc::{create_worker_client, BoxCloneSyncChannel, DefaultChannelResolver};
use datafusion_distributed::{ChannelResolver, WorkerChannel};
use crate::exchange::ShmChannel;
use crate::shm::ShmStream;
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use tokio::net::UnixStream;
use tonic::transport::{Endpoint, Uri};
use tower::service_fn;
use url::Url;

/// Whether an shm worker's data goes through the arena (exchange.rs: one copy per hop) or over
/// the rings' gRPC (`--shm-data grpc`), as the process was started.
static SHM_DATA_GRPC: AtomicBool = AtomicBool::new(false);

pub fn set_shm_data(mode: &str) -> Result<(), String> {
    match mode {
        "direct" => SHM_DATA_GRPC.store(false, Ordering::Relaxed),
        "grpc" => SHM_DATA_GRPC.store(true, Ordering::Relaxed),
        other => return Err(format!("--shm-data {other}: direct or grpc")),
    }
    Ok(())
}

/// Channels to workers, one per URL for the process's life.
fn local() -> &'static Mutex<HashMap<Url, BoxCloneSyncChannel>> {
    static LOCAL: OnceLock<Mutex<HashMap<Url, BoxCloneSyncChannel>>> = OnceLock::new();
    LOCAL.get_or_init(Default::default)
}

#[derive(Clone, Default)]
pub struct TileResolver {
    tcp: DefaultChannelResolver,
}

/// A channel to a worker, whatever its transport (built once per URL and process). The crate's
/// own resolver makes its TCP channels (`TileResolver`); this one also carries tilewise's own calls
/// to the workers (statements.rs).
pub async fn channel(url: &Url) -> Result<BoxCloneSyncChannel, DataFusionError> {
    if let Some(c) = local().lock().unwrap().get(url) {
        return Ok(c.clone());
    }
    let path = url.path().to_string();
    let who = if url.scheme() == "http" { url.to_string() } else { format!("{}:{path}", url.scheme()) };
    let unreachable = |e: tonic::transport::Error| DataFusionError::Execution(format!("cannot reach the worker at {who}: {e}"));
    let channel = match url.scheme() {
        "http" => Endpoint::from_shared(url.to_string()).map_err(unreachable)?.connect().await.map_err(unreachable)?,
        scheme => {
            // the URI is a placeholder: the connector below decides where bytes go
            let endpoint = Endpoint::try_from("http://[::]:50051").map_err(|e| DataFusionError::External(Box::new(e)))?;
            if scheme == "shm" {
                endpoint
                    .connect_with_connector(service_fn(move |_: Uri| {
                        let p = path.clone();
                        async move { Ok::<_, std::io::Error>(TokioIo::new(ShmStream::connect(&p).await?)) }
                    }))
                    .await
            } else {
                endpoint
                    .connect_with_connector(service_fn(move |_: Uri| {
                        let p = path.clone();
                        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(p).await?)) }
                    }))
                    .await
            }
            .map_err(unreachable)?
        }
    };
    let boxed = BoxCloneSyncChannel::new(channel);
    local().lock().unwrap().entry(url.clone()).or_insert(boxed.clone());
    Ok(boxed)
}

#[async_trait]
impl ChannelResolver for TileResolver {
    async fn get_worker_client_for_url(&self, url: &Url) -> Result<Box<dyn WorkerChannel>, DataFusionError> {
        match url.scheme() {
            "shm" if !SHM_DATA_GRPC.load(Ordering::Relaxed) => Ok(Box::new(ShmChannel {
                grpc: create_worker_client(channel(url).await?),
                path: url.path().to_string(),
                who: format!("shm:{}", url.path()),
            })),
            "unix" | "shm" => Ok(create_worker_client(channel(url).await?)),
            _ => self.tcp.get_worker_client_for_url(url).await,
        }
    }
}
