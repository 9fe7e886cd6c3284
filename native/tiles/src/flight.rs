//! The coordinator's client endpoint: Arrow Flight SQL (arrow-flight's server trait), so users reach
//! the tiles with ADBC (`adbc-driver-flightsql`) or JDBC. A statement is planned by the distributed
//! planner over the tiles' workers; its answer streams back as Arrow IPC.
//!
//! Stateless statements: GetFlightInfo(CommandStatementQuery) plans the SQL for its schema and hands
//! back a ticket holding the SQL; DoGet runs it. GetSqlInfo answers the server's name and version
//! (drivers ask on connect). Custom actions let workers on other hosts join and leave (`tilewise
//! join` / `down`).
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::FlightSqlService;
use arrow_flight::sql::{
    CommandGetSqlInfo, CommandStatementQuery, ProstMessageExt, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{Action, FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use datafusion::prelude::SessionContext;
use datafusion::physical_plan::execute_stream;
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::net::TcpStream;
use url::Url;
use tonic::{Request, Response, Status};

pub struct Coordinator {
    pub ctx: Arc<SessionContext>,
    pub workers: crate::Workers,
    /// statements run so far (DoGet): each gets one line of per-tile figures in the log, numbered
    pub statements: std::sync::atomic::AtomicU64,
}

/// How long the per-tile figures of a statement may take to arrive once it is over. The crate waits
/// for the metrics of every task of every stage, and a task that never ran (a branch the plan did
/// not need: TPC-DS q14a, q23a) sends none: without a bound the wait never ends.
const METRICS_WAIT: Duration = Duration::from_secs(3);

/// Dropped with a statement's answer stream: tells every worker the statement is over (whatever
/// of it still runs there stops: statements.rs) and logs what each tile did for it.
struct Figures {
    plan: Option<Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
    workers: Vec<Url>,
    id: String,
    n: u64,
}

impl Drop for Figures {
    fn drop(&mut self) {
        let (Some(plan), n) = (self.plan.take(), self.n) else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let workers = self.workers.len();
        rt.spawn(crate::statements::tell_over(std::mem::take(&mut self.workers), std::mem::take(&mut self.id)));
        rt.spawn(async move {
            let figures = tokio::time::timeout(METRICS_WAIT, crate::tally::tally(plan, workers)).await;
            eprintln!("{}", match figures {
                Ok(Ok(t)) => crate::tally::line(n, &t),
                Ok(Err(e)) => crate::tally::unmeasured(n, &e.to_string()),
                Err(_) => crate::tally::unmeasured(
                    n, &format!("the metrics of some tasks did not arrive within {} s", METRICS_WAIT.as_secs())),
            });
        });
    }
}

/// How long the coordinator tries to reach a worker that asks to join.
const JOIN_CONNECT: Duration = Duration::from_secs(5);

impl Coordinator {
    /// `tilewise.join URL`: a worker on another host (`tilewise join`) takes part in every query from
    /// now on. Only over TCP: a worker elsewhere cannot reach workers on shm or unix sockets here.
    async fn join(&self, text: &str) -> Result<String, Status> {
        let url = Url::parse(text).map_err(|e| Status::invalid_argument(format!("{text:?} is not a worker URL: {e}")))?;
        let (Some(host), Some(port)) = (url.host_str(), url.port()) else {
            return Err(Status::invalid_argument(format!("{text:?} has no host and port")));
        };
        if url.scheme() != "http" {
            return Err(Status::invalid_argument(format!("{text:?}: a worker joins over TCP (http://HOST:PORT)")));
        }
        let local: Vec<Url> = self.workers.0.read().expect("workers lock").clone();
        if let Some(w) = local.iter().find(|w| w.scheme() != "http") {
            return Err(Status::failed_precondition(format!(
                "this cluster's workers exchange over {} ({w}), which a worker on another host cannot reach; \
                 start the cluster with --exchange tcp --host ADDR",
                w.scheme()
            )));
        }
        match tokio::time::timeout(JOIN_CONNECT, TcpStream::connect((host, port))).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(Status::unavailable(format!("the coordinator cannot reach {url}: {e}"))),
            Err(_) => return Err(Status::unavailable(format!("the coordinator cannot reach {url}: timed out"))),
        }
        let mut w = self.workers.0.write().expect("workers lock");
        if !w.contains(&url) {
            w.push(url);
        }
        Ok(w.len().to_string())
    }

    /// `tilewise.leave URL`: the worker no longer takes part (its host's `tilewise down`).
    fn leave(&self, text: &str) -> Result<String, Status> {
        let url = Url::parse(text).map_err(|e| Status::invalid_argument(format!("{text:?} is not a worker URL: {e}")))?;
        let mut w = self.workers.0.write().expect("workers lock");
        if w.len() == 1 && w[0] == url {
            return Err(Status::failed_precondition("a coordinator keeps at least one worker"));
        }
        w.retain(|u| u != &url);
        Ok(w.len().to_string())
    }
}

fn sql_info() -> &'static SqlInfoData {
    static INFO: OnceLock<SqlInfoData> = OnceLock::new();
    INFO.get_or_init(|| {
        let mut b = SqlInfoDataBuilder::new();
        b.append(SqlInfo::FlightSqlServerName, "tilewise tiles (datafusion-distributed)");
        b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        b.append(SqlInfo::FlightSqlServerArrowVersion, "59");
        b.append(SqlInfo::FlightSqlServerReadOnly, true);
        b.build().expect("static SqlInfo")
    })
}

fn err(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

#[tonic::async_trait]
impl FlightSqlService for Coordinator {
    type FlightService = Coordinator;

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let df = self.ctx.sql(&query.query).await.map_err(|e| Status::invalid_argument(e.to_string()))?;
        let schema = df.schema().as_arrow().clone();
        let ticket = TicketStatementQuery { statement_handle: query.query.into_bytes().into() };
        let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(ticket.as_any().encode_to_vec()));
        let info = FlightInfo::new()
            .try_with_schema(&schema)
            .map_err(err)?
            .with_endpoint(endpoint)
            .with_descriptor(request.into_inner());
        Ok(Response::new(info))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let sql = String::from_utf8(ticket.statement_handle.to_vec()).map_err(|_| Status::invalid_argument("ticket"))?;
        // the statement's own session: its id goes with every plan sent to the workers
        let n = self.statements.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let id = format!("{}-{n}", crate::statements::process_tag());
        let mut state = self.ctx.state();
        crate::statements::tag(state.config_mut(), &id).map_err(err)?;
        let ctx = SessionContext::new_with_state(state);
        let df = ctx.sql(&sql).await.map_err(|e| Status::invalid_argument(e.to_string()))?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let plan = df.create_physical_plan().await.map_err(err)?;
        let stream = execute_stream(Arc::clone(&plan), ctx.task_ctx()).map_err(err)?;
        // once the statement is over -- answered, failed or cancelled: the stream is dropped -- what
        // each tile did (tally.rs), one numbered line in the coordinator's log, written by a task of
        // its own: the client's answer does not wait for the workers' metrics (tilewise reads the
        // line after the statement's time is taken)
        let workers = self.workers.0.read().expect("workers lock").clone();
        let figures = Figures { plan: Some(plan), workers, id, n };
        let stream = stream.map(move |x| {
            let _ = &figures;
            // what goes to the client carries only the bytes its rows use (views into the batches the
            // tiles sent, or into the files, would drag whole buffers along: over gRPC's 16 MiB limit)
            x.and_then(crate::exchange::compact)
        });
        let batches = stream.map_err(|e| arrow_flight::error::FlightError::ExternalError(Box::new(e)));
        let out = FlightDataEncoderBuilder::new().with_schema(schema).build(batches).map_err(Status::from);
        Ok(Response::new(Box::pin(out)))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(query.as_any().encode_to_vec()));
        let info = FlightInfo::new()
            .try_with_schema(query.into_builder(sql_info()).schema().as_ref())
            .map_err(err)?
            .with_endpoint(endpoint)
            .with_descriptor(request.into_inner());
        Ok(Response::new(info))
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let builder = query.into_builder(sql_info());
        let schema = builder.schema();
        let batch = builder.build();
        let out = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(futures::stream::once(async { batch }))
            .map_err(Status::from);
        Ok(Response::new(Box::pin(out)))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}

    /// tilewise's own actions: `tilewise.join` / `tilewise.leave` (body: a worker URL) and
    /// `tilewise.workers` (one URL per line); each answers with one result.
    async fn do_action_fallback(
        &self,
        request: Request<Action>,
    ) -> Result<Response<<Self as FlightService>::DoActionStream>, Status> {
        let action = request.into_inner();
        let body = String::from_utf8(action.body.to_vec())
            .map_err(|_| Status::invalid_argument("the action's body is not text"))?;
        let reply = match action.r#type.as_str() {
            "tilewise.join" => self.join(body.trim()).await?,
            "tilewise.leave" => self.leave(body.trim())?,
            "tilewise.workers" => {
                self.workers.0.read().expect("workers lock").iter().map(|u| u.to_string()).collect::<Vec<_>>().join("\n")
            }
            other => return Err(Status::invalid_argument(format!("unknown action {other:?}"))),
        };
        let out = futures::stream::once(async move { Ok(arrow_flight::Result { body: reply.into_bytes().into() }) });
        Ok(Response::new(Box::pin(out)))
    }
}
