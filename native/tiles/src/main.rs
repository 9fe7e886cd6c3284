//! tilewise-tiles: one binary, two roles.
//!   tilewise-tiles worker --listen 127.0.0.1:PORT
//! serves a datafusion-distributed worker (Arrow Flight over gRPC).
use datafusion_distributed::Worker;
use std::error::Error;
use std::net::SocketAddr;
use tonic::transport::Server;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("worker") if args.len() == 4 && args[2] == "--listen" => {
            let addr: SocketAddr = args[3].parse()?;
            Server::builder()
                .add_service(Worker::default().into_worker_server())
                .serve(addr)
                .await?;
            Ok(())
        }
        _ => {
            eprintln!("usage: tilewise-tiles worker --listen HOST:PORT");
            std::process::exit(2)
        }
    }
}
