//! The exchange's transports, swapped under the same plans by the workers' URLs:
//!   http://HOST:PORT   the crate's gRPC over TCP (also between hosts);
//!   unix:///PATH       the same gRPC over a Unix stream socket (one host: no TCP/IP stack);
//!   shm:///PATH        the same gRPC over ring buffers in shared memory, each bound to the node of
//!                      the side that reads it (shm.rs; PATH: the worker's socket to set them up).
//! The coordinator and every worker resolve a URL to a channel here (workers read each other's
//! shuffle outputs), so one choice of URLs changes every hop. Channels are built once per URL.
//! (Shared-memory rings on the receiving tile's node are the next transport: docs/tiles.md.)
use async_trait::async_trait;
use datafusion::common::DataFusionError;
use datafusion_distributed::grpc::{create_worker_client, BoxCloneSyncChannel, DefaultChannelResolver};
use datafusion_distributed::{ChannelResolver, WorkerChannel};
use crate::shm::ShmStream;
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::net::UnixStream;
use tonic::transport::{Endpoint, Uri};
use tower::service_fn;
use url::Url;

#[derive(Clone, Default)]
pub struct TileResolver {
    tcp: DefaultChannelResolver,
    local: Arc<Mutex<HashMap<Url, BoxCloneSyncChannel>>>,
}

impl TileResolver {
    /// A channel over a Unix socket or shared-memory rings (built once per URL).
    async fn local_channel(&self, url: &Url) -> Result<BoxCloneSyncChannel, DataFusionError> {
        if let Some(c) = self.local.lock().unwrap().get(url) {
            return Ok(c.clone());
        }
        let path = url.path().to_string();
        let who = format!("{}:{path}", url.scheme());
        // the URI is a placeholder: the connector below decides where bytes go
        let endpoint = Endpoint::try_from("http://[::]:50051").map_err(|e| DataFusionError::External(Box::new(e)))?;
        let channel = if url.scheme() == "shm" {
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
        .map_err(|e| DataFusionError::Execution(format!("cannot reach the worker at {who}: {e}")))?;
        let boxed = BoxCloneSyncChannel::new(channel);
        self.local.lock().unwrap().insert(url.clone(), boxed.clone());
        Ok(boxed)
    }
}

#[async_trait]
impl ChannelResolver for TileResolver {
    async fn get_worker_client_for_url(&self, url: &Url) -> Result<Box<dyn WorkerChannel>, DataFusionError> {
        match url.scheme() {
            "unix" | "shm" => Ok(create_worker_client(self.local_channel(url).await?)),
            _ => self.tcp.get_worker_client_for_url(url).await,
        }
    }
}
