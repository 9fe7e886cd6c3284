//! The coordinator's client endpoint: Arrow Flight SQL (arrow-flight's server trait), so users reach
//! the tiles with ADBC (`adbc-driver-flightsql`) or JDBC. A statement is planned by the distributed
//! planner over the tiles' workers; its answer streams back as Arrow IPC.
//!
//! Stateless statements: GetFlightInfo(CommandStatementQuery) plans the SQL for its schema and hands
//! back a ticket holding the SQL; DoGet runs it. GetSqlInfo answers the server's name and version
//! (drivers ask on connect).
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::FlightSqlService;
use arrow_flight::sql::{
    CommandGetSqlInfo, CommandStatementQuery, ProstMessageExt, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use datafusion::prelude::SessionContext;
use futures::TryStreamExt;
use prost::Message;
use std::sync::{Arc, OnceLock};
use tonic::{Request, Response, Status};

pub struct Coordinator {
    pub ctx: Arc<SessionContext>,
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
        let df = self.ctx.sql(&sql).await.map_err(|e| Status::invalid_argument(e.to_string()))?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let stream = df.execute_stream().await.map_err(err)?;
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
}
