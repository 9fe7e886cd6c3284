//! A statement's end, told by the coordinator to every worker, so that what the statement left
//! running on a tile stops even when no stream is dropped that would stop it.
//!
//! Why: a cancelled statement is meant to stop on the tiles because its streams are dropped, stage
//! by stage, from the coordinator down. One kind of node does not stop that way: a hash
//! repartition (every shuffle's producer head) pulls its input in tasks of its own, which end only
//! when the node itself is dropped or when they next send a batch and find no reader. Under a join
//! that emits nothing -- JCC-H q21's EXISTS / NOT EXISTS on its mega orders, or any join whose
//! filter rejects every pair, below an aggregate and a shuffle -- they never send, and the node is
//! held by the streams of the stages around it, on both tiles, which wait for each other: measured
//! (2026-12-07), both tiles at 100 % minutes after the statement was cancelled and after the crate
//! had dropped every task of it, over tcp and over shm alike.
//!
//! So every statement carries an id (a header the crate passes on with every plan it sends: the
//! coordinator's process id and start time, and the statement's number); each worker keeps, per id it has plans
//! for, one `Statement` that the tasks' sessions hold (a session-config extension). Once the
//! statement's answer stream is dropped -- answered, failed or cancelled: nothing can want more of
//! its work -- the coordinator sends every worker the Flight action `tilewise.over` with the id.
//! The worker marks the statement over, and every ProbeSlices node of it (slices.rs: below every
//! join's probe side, polled at least every 10 ms while the join runs) fails its stream at its next
//! poll: the join fails, the repartition's task sends the error on and ends. Joins are where a
//! statement can spend unbounded time without output; everything else it runs ends with its input.
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest,
    HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use datafusion::common::DataFusionError;
use datafusion::execution::SessionState;
use datafusion::prelude::SessionConfig;
use datafusion_distributed::{DistributedExt, WorkerQueryContext, WorkerSessionBuilder};
use futures::stream::BoxStream;
use http::{HeaderMap, HeaderValue};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tonic::{Request, Response, Status, Streaming};
use url::Url;

/// The header that carries a statement's id to the workers (the crate's passthrough headers).
pub const HEADER: &str = "x-tilewise-statement";
/// The Flight action that ends a statement on a worker (body: the id).
pub const OVER: &str = "tilewise.over";
/// How many ended ids a worker remembers, so that a plan of a statement already over (it arrived
/// after the action) is born over.
const REMEMBER: usize = 256;
/// How long the coordinator waits for one worker to take the action (in the background: the
/// statement's answer does not wait for it).
const TELL_WAIT: Duration = Duration::from_secs(10);

/// One statement on this worker: shared by all its tasks' sessions.
#[derive(Debug)]
pub struct Statement {
    over: AtomicBool,
}

impl Statement {
    pub fn is_over(&self) -> bool {
        self.over.load(Ordering::Acquire)
    }
}

#[derive(Default)]
struct Registry {
    live: HashMap<String, Weak<Statement>>,
    ended: VecDeque<String>,
}

fn registry() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// The statement a task belongs to, from the headers its plan came with (None: no id, as from a
/// coordinator that does not send one).
pub fn from_headers(headers: &HeaderMap) -> Option<Arc<Statement>> {
    let id = headers.get(HEADER)?.to_str().ok()?;
    let mut r = registry().lock().expect("statements lock");
    if let Some(s) = r.live.get(id).and_then(Weak::upgrade) {
        return Some(s);
    }
    r.live.retain(|_, w| w.strong_count() > 0); // the statements no task holds any more
    let over = r.ended.iter().any(|e| e == id);
    let s = Arc::new(Statement { over: AtomicBool::new(over) });
    r.live.insert(id.to_string(), Arc::downgrade(&s));
    Some(s)
}

/// The statement of a task's session (set by `TileSessions`).
pub fn of(config: &SessionConfig) -> Option<Arc<Statement>> {
    config.get_extension::<Statement>()
}

/// Mark a statement over on this worker; true if any of its tasks are here.
pub fn end(id: &str) -> bool {
    let mut r = registry().lock().expect("statements lock");
    if !r.ended.iter().any(|e| e == id) {
        if r.ended.len() == REMEMBER {
            r.ended.pop_front();
        }
        r.ended.push_back(id.to_string());
    }
    match r.live.remove(id).and_then(|w| w.upgrade()) {
        Some(s) => {
            s.over.store(true, Ordering::Release);
            true
        }
        None => false,
    }
}

/// The workers' session builder: the tile's resolver, rules and codec, and the task's statement.
pub struct TileSessions<F>(pub F);

#[async_trait::async_trait]
impl<F> WorkerSessionBuilder for TileSessions<F>
where
    F: Fn(datafusion::execution::SessionStateBuilder) -> datafusion::execution::SessionStateBuilder + Send + Sync,
{
    async fn build_session_state(&self, ctx: WorkerQueryContext) -> Result<SessionState, DataFusionError> {
        let mut b = (self.0)(ctx.builder);
        if let Some(s) = from_headers(&ctx.headers) {
            b.config().get_or_insert_with(SessionConfig::default).set_extension(s);
        }
        Ok(b.build())
    }
}

/// The coordinator's part of every statement id: its process id and start time (the workers may
/// outlive a coordinator; ids stay unique).
pub fn process_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        format!("{}.{t}", std::process::id())
    })
}

/// The coordinator: a statement's session config, tagged with its id.
pub fn tag(config: &mut SessionConfig, id: &str) -> Result<(), DataFusionError> {
    let mut h = HeaderMap::new();
    h.insert(HEADER, HeaderValue::from_str(id).map_err(|e| DataFusionError::Internal(e.to_string()))?);
    config.set_distributed_passthrough_headers(h)
}

/// The coordinator: tell every worker that the statement is over (each within TELL_WAIT; a worker
/// that cannot be reached has nothing of it running either, or is gone).
pub async fn tell_over(workers: Vec<Url>, id: String) {
    let calls = workers.into_iter().map(|url| {
        let id = id.clone();
        async move {
            let told = async {
                let channel = crate::transport::channel(&url).await.map_err(|e| e.to_string())?;
                let mut client = arrow_flight::flight_service_client::FlightServiceClient::new(channel);
                client
                    .do_action(Request::new(Action::new(OVER, id.into_bytes())))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.message().to_string())
            };
            match tokio::time::timeout(TELL_WAIT, told).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("tilewise-tiles: could not tell {url} a statement is over: {e}"),
                Err(_) => eprintln!("tilewise-tiles: {url} did not take a statement's end within {} s", TELL_WAIT.as_secs()),
            }
        }
    });
    futures::future::join_all(calls).await;
}

/// The worker's Flight service: the one action `tilewise.over`.
pub struct Control;

impl Control {
    pub fn server() -> FlightServiceServer<Control> {
        FlightServiceServer::new(Control)
    }
}

fn no(what: &str) -> Status {
    Status::unimplemented(format!("a tilewise worker does not serve {what}; the coordinator does (Flight SQL)"))
}

#[tonic::async_trait]
impl FlightService for Control {
    type HandshakeStream = BoxStream<'static, Result<HandshakeResponse, Status>>;
    type ListFlightsStream = BoxStream<'static, Result<FlightInfo, Status>>;
    type DoGetStream = BoxStream<'static, Result<FlightData, Status>>;
    type DoPutStream = BoxStream<'static, Result<PutResult, Status>>;
    type DoExchangeStream = BoxStream<'static, Result<FlightData, Status>>;
    type DoActionStream = BoxStream<'static, Result<arrow_flight::Result, Status>>;
    type ListActionsStream = BoxStream<'static, Result<ActionType, Status>>;

    async fn do_action(&self, request: Request<Action>) -> Result<Response<Self::DoActionStream>, Status> {
        let action = request.into_inner();
        if action.r#type != OVER {
            return Err(Status::invalid_argument(format!("unknown action {:?}", action.r#type)));
        }
        let id = String::from_utf8(action.body.to_vec()).map_err(|_| Status::invalid_argument("the id is not text"))?;
        let here = end(&id);
        let body = if here { "stopped" } else { "none here" };
        let out = futures::stream::once(async move { Ok(arrow_flight::Result { body: body.into() }) });
        Ok(Response::new(Box::pin(out)))
    }

    async fn list_actions(&self, _r: Request<Empty>) -> Result<Response<Self::ListActionsStream>, Status> {
        let t = ActionType { r#type: OVER.into(), description: "end a statement's work on this tile (body: its id)".into() };
        Ok(Response::new(Box::pin(futures::stream::once(async move { Ok(t) }))))
    }

    async fn handshake(&self, _r: Request<Streaming<HandshakeRequest>>) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(no("handshakes"))
    }
    async fn list_flights(&self, _r: Request<Criteria>) -> Result<Response<Self::ListFlightsStream>, Status> {
        Err(no("ListFlights"))
    }
    async fn get_flight_info(&self, _r: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        Err(no("GetFlightInfo"))
    }
    async fn poll_flight_info(&self, _r: Request<FlightDescriptor>) -> Result<Response<PollInfo>, Status> {
        Err(no("PollFlightInfo"))
    }
    async fn get_schema(&self, _r: Request<FlightDescriptor>) -> Result<Response<SchemaResult>, Status> {
        Err(no("GetSchema"))
    }
    async fn do_get(&self, _r: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        Err(no("DoGet"))
    }
    async fn do_put(&self, _r: Request<Streaming<FlightData>>) -> Result<Response<Self::DoPutStream>, Status> {
        Err(no("DoPut"))
    }
    async fn do_exchange(&self, _r: Request<Streaming<FlightData>>) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(no("DoExchange"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(id: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_str(id).unwrap());
        h
    }

    #[test]
    fn a_statement_ends_for_all_its_tasks_and_late_ones_are_born_over() {
        let a = from_headers(&headers("t-1")).unwrap();
        let b = from_headers(&headers("t-1")).unwrap();
        let other = from_headers(&headers("t-2")).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(end("t-1"));
        assert!(a.is_over() && b.is_over() && !other.is_over());
        // a plan that comes after the end
        assert!(from_headers(&headers("t-1")).unwrap().is_over());
        // no tasks of it here: nothing to stop, but remembered
        assert!(!end("t-3"));
        assert!(from_headers(&headers("t-3")).unwrap().is_over());
        assert!(from_headers(&HeaderMap::new()).is_none());
    }
}
