//! The `shm` exchange's data path: the batches of `execute_task` (every shuffle, coalesce and
//! broadcast between tiles) written once, as Arrow IPC, into shared memory on the receiving tile's
//! node, and read there in place -- one copy per hop.
//!
//! The crate's gRPC still carries the control messages over the rings of shm.rs (plans, work units,
//! metrics: `coordinator_channel`); only the data leaves it. A `WorkerChannel` (`ShmChannel`)
//! delegates the control calls to the gRPC client and runs `execute_task` here:
//!
//! - **The arena.** A data connection is one Unix socket to the worker's shm socket plus one memfd
//!   that the *receiving* side (the client: the tile that reads the task's output) makes, binds
//!   whole with mbind(MPOL_BIND) to its own node before any page is touched, maps, and passes with
//!   SCM_RIGHTS (kind KIND_DATA); the worker maps it too, answers one byte, and from then on only
//!   the worker writes into it. The file is 64 GiB of address space; pages exist only where written
//!   (memfd: nothing in /dev/shm, gone with both processes).
//! - **One copy.** The worker encodes each batch with arrow-ipc's `StreamEncoder`, whose buffers
//!   share the batch's own Arrow buffers (uncompressed: nothing is copied to encode), allocates one
//!   64-byte aligned region of the arena, and copies the buffers into it: the hop's one copy, onto
//!   the receiver's node. Over the socket goes a 32-byte descriptor (partition, offset, length,
//!   time). The client wraps the region as an Arrow `Buffer` (a custom allocation) and decodes it
//!   with `StreamDecoder` in place: the record batch's arrays point into the arena.
//! - **Release.** A region stays the receiver's until the last array in it is dropped (a hash
//!   join's build side may hold it for the query); then its offset goes back over the socket and
//!   the worker's allocator (first fit, lowest address first, so the pages in use stay few and
//!   warm) reuses it. Once a connection has allocated nothing for a second, its free pages above
//!   the first 4 MiB go back to the kernel (FALLOC_FL_PUNCH_HOLE): what an idle connection keeps is
//!   bounded, and back-to-back queries reuse warm pages instead of faulting fresh ones in.
//! - **Back-pressure.** Per call, the bytes sent but not yet taken by the consumer are bounded by
//!   the crate's per-connection budget (`worker_connection_buffer_budget_bytes`, 64 MiB by default;
//!   a message larger than the budget passes alone): the worker waits for the client's CONSUMED.
//! - **Connections are pooled** per worker URL for the process's life (idle ones are reused by the
//!   next call), so an arena's pages are faulted in once, not per task; memory grows with the
//!   connections actually used at once, never with an N x N mesh.
//! - **Faults.** The socket's hang-up ends every call on it with an error naming the peer; a call's
//!   consumers dropping all its streams cancel it (CANCEL); a worker's error ends the call (ERR).
//!
//! What is not one copy: a string-view column whose data buffers are more than twice what its
//! values use is compacted first (as the crate does for every such column, always), and dictionary
//! columns are garbage-collected as the crate does -- both local copies made to avoid sending
//! unused bytes; the IPC decoder skips validation (both ends are tilewise's own binary, as
//! DataFusion does for its own spill files).
use crate::shm;
use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::ipc::reader::StreamDecoder;
use datafusion::arrow::ipc::writer::{IpcWriteOptions, StreamEncoder};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricValue, Time};
use datafusion_distributed::{
    BytesMetricExt, CoordinatorToWorkerMsg, DistributedConfig, ExecuteTaskRequest, GetWorkerInfoRequest,
    GetWorkerInfoResponse, MaybeEncoded, ProducerHead, SetPlanRequest, TaskKey, Worker, WorkerChannel,
    WorkerToCoordinatorMsg,
};
use futures::stream::BoxStream;
use futures::StreamExt;
use http::HeaderMap;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio_stream::wrappers::UnboundedReceiverStream;

/// Address space of one connection's arena (pages exist only where written).
const ARENA_BYTES: usize = 1 << 36;
/// Free pages below this offset stay for reuse; above it they go back to the kernel once the
/// connection has been idle (allocated nothing) for IDLE.
const KEEP_BYTES: usize = 4 << 20;
const IDLE: Duration = Duration::from_secs(1);
const ALIGN: usize = 64;
/// How long a worker waits for a free region before it fails the call (the receiver holds the
/// whole arena: more than the machine's memory of batches).
const ALLOC_WAIT: Duration = Duration::from_secs(300);

// ---- frames -----------------------------------------------------------------------------------
// [u32 length of what follows][u8 type][payload], little-endian.
const REQ: u8 = 1; // client: call u64, budget u64, the request (encode_request)
const FREE: u8 = 2; // client: (offset u64, length u64) x n
const CONSUMED: u8 = 3; // client: call u64, bytes u64
const CANCEL: u8 = 4; // client: call u64
const DATA: u8 = 11; // worker: call u64, partition u32, offset u64, length u64, created ns u64
const END: u8 = 12; // worker: call u64
const ERR: u8 = 13; // worker: call u64, message (UTF-8)

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + payload.len());
    v.extend_from_slice(&((payload.len() + 1) as u32).to_le_bytes());
    v.push(kind);
    v.extend_from_slice(payload);
    v
}

async fn read_frame(r: &mut BufReader<OwnedReadHalf>) -> io::Result<(u8, Vec<u8>)> {
    let n = r.read_u32_le().await? as usize;
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "an empty frame"));
    }
    let kind = r.read_u8().await?;
    let mut payload = vec![0u8; n - 1];
    r.read_exact(&mut payload).await?;
    Ok((kind, payload))
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn u64(&mut self) -> io::Result<u64> {
        let (h, t) = self.0.split_at_checked(8).ok_or_else(short)?;
        self.0 = t;
        Ok(u64::from_le_bytes(h.try_into().expect("8 bytes")))
    }
    fn u32(&mut self) -> io::Result<u32> {
        let (h, t) = self.0.split_at_checked(4).ok_or_else(short)?;
        self.0 = t;
        Ok(u32::from_le_bytes(h.try_into().expect("4 bytes")))
    }
    fn u8(&mut self) -> io::Result<u8> {
        let (h, t) = self.0.split_first().ok_or_else(short)?;
        self.0 = t;
        Ok(*h)
    }
    fn rest(&mut self) -> &[u8] {
        std::mem::take(&mut self.0)
    }
}

fn short() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "a frame cut short")
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// The crate's request, as this path sends it (its own encoding is private to it).
fn encode_request(req: ExecuteTaskRequest, ctx: &Arc<TaskContext>) -> Result<Vec<u8>> {
    let mut v = Vec::with_capacity(64);
    v.extend_from_slice(req.task_key.query_id.as_bytes());
    for x in [req.task_key.stage_id, req.task_key.task_number, req.target_partition_start, req.target_partition_end] {
        v.extend_from_slice(&(x as u64).to_le_bytes());
    }
    match req.producer_head {
        ProducerHead::None => v.push(0),
        ProducerHead::BroadcastExec { output_partitions } => {
            v.push(1);
            v.extend_from_slice(&(output_partitions as u64).to_le_bytes());
        }
        ProducerHead::RepartitionExec { partitioning } => {
            v.push(2);
            v.extend_from_slice(&partitioning.encode(ctx)?);
        }
    }
    Ok(v)
}

fn decode_request(b: &[u8]) -> io::Result<ExecuteTaskRequest> {
    let (id, rest) = b.split_at_checked(16).ok_or_else(short)?;
    let mut c = Cursor(rest);
    let query_id = uuid::Uuid::from_bytes(id.try_into().expect("16 bytes"));
    let (stage_id, task_number) = (c.u64()? as usize, c.u64()? as usize);
    let (start, end) = (c.u64()? as usize, c.u64()? as usize);
    let producer_head = match c.u8()? {
        0 => ProducerHead::None,
        1 => ProducerHead::BroadcastExec { output_partitions: c.u64()? as usize },
        2 => ProducerHead::RepartitionExec { partitioning: MaybeEncoded::Encoded(c.rest().to_vec()) },
        h => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("producer head {h}"))),
    };
    Ok(ExecuteTaskRequest {
        task_key: TaskKey { query_id, stage_id, task_number },
        target_partition_start: start,
        target_partition_end: end,
        producer_head,
    })
}

fn df_err(e: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(e.to_string())
}

// ---- the arena ----------------------------------------------------------------------------------

/// One connection's arena, mapped in this process.
struct Mapping {
    base: *mut u8,
    len: usize,
    fd: OwnedFd,
}

unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(fd: OwnedFd, len: usize, bind_here: bool) -> io::Result<Mapping> {
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE,
                       libc::MAP_SHARED | libc::MAP_NORESERVE, fd.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let m = Mapping { base: p as *mut u8, len, fd };
        if bind_here {
            shm::bind_to_my_node(m.base, len)?; // the receiver's node, before anyone touches a page
        }
        Ok(m)
    }

    /// Give the whole pages inside [off, off + len) back to the kernel.
    fn punch(&self, off: usize, len: usize) {
        let page = 4096;
        let (a, b) = (off.div_ceil(page) * page, (off + len) / page * page);
        if b > a {
            unsafe {
                libc::fallocate(self.fd.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                                a as libc::off_t, (b - a) as libc::off_t)
            };
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// The worker's allocator over a connection's arena: free extents by offset, first fit from the
/// lowest address, coalesced on free.
struct Alloc {
    free: BTreeMap<usize, usize>,
}

impl Alloc {
    fn new(cap: usize) -> Alloc {
        Alloc { free: BTreeMap::from([(0, cap)]) }
    }

    fn alloc(&mut self, n: usize) -> Option<usize> {
        let n = n.div_ceil(ALIGN) * ALIGN;
        let (&off, &len) = self.free.iter().find(|(_, &len)| len >= n)?;
        self.free.remove(&off);
        if len > n {
            self.free.insert(off + n, len - n);
        }
        Some(off)
    }

    /// Back to the free extents (coalesced with its neighbours).
    fn release(&mut self, off: usize, n: usize) {
        let n = n.div_ceil(ALIGN) * ALIGN;
        let (mut start, mut end) = (off, off + n);
        if let Some((&p, &l)) = self.free.range(..off).next_back() {
            if p + l == off {
                self.free.remove(&p);
                start = p;
            }
        }
        if let Some(&l) = self.free.get(&end) {
            self.free.remove(&end);
            end += l;
        }
        self.free.insert(start, end - start);
    }

    /// The free ranges above KEEP_BYTES below `top` (the highest offset ever handed out): the pages
    /// that may have been touched and are not in use.
    fn free_above_keep(&self, top: usize) -> Vec<(usize, usize)> {
        self.free
            .iter()
            .filter_map(|(&off, &len)| {
                let (a, b) = (off.max(KEEP_BYTES), (off + len).min(top));
                (b > a).then_some((a, b - a))
            })
            .collect()
    }
}

// ---- the client (the receiving tile) --------------------------------------------------------------

/// What one call's batches go to, in the client's reading task.
struct Sink {
    start: usize,
    parts: Vec<mpsc::UnboundedSender<Result<Delivered>>>,
    decoders: Vec<StreamDecoder>,
    metrics: CallMetrics,
}

#[derive(Clone)]
struct CallMetrics {
    bytes: datafusion_distributed::BytesCounterMetric,
    messages: datafusion::physical_plan::metrics::Count,
    latency_sum: Time,
    latency_count: datafusion::physical_plan::metrics::Count,
    decode: Time,
}

impl CallMetrics {
    /// The metrics the crate's gRPC client records on the network boundary (tally.rs reads them).
    fn new(m: &ExecutionPlanMetricsSet) -> CallMetrics {
        let decode = Time::new();
        MetricBuilder::new(m).build(MetricValue::ElapsedCompute(decode.clone()));
        let latency_sum = Time::new();
        MetricBuilder::new(m).build(MetricValue::Time { name: Cow::Borrowed("network_latency_sum"), time: latency_sum.clone() });
        CallMetrics {
            bytes: MetricBuilder::new(m).bytes_counter("bytes_transferred"),
            messages: MetricBuilder::new(m).global_counter("msg_count"),
            latency_sum,
            latency_count: MetricBuilder::new(m).counter("network_latency_count", 0),
            decode,
        }
    }
}

/// A batch on its way to its consumer: when it is taken (or dropped unread, its stream gone), the
/// worker hears that its bytes left the call's budget.
struct Delivered {
    batch: Option<RecordBatch>,
    bytes: u64,
    call: u64,
    out: mpsc::UnboundedSender<Vec<u8>>,
}

impl Drop for Delivered {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return; // a message's other batches: the budget is charged to its last one
        }
        let mut p = [0u8; 16];
        p[..8].copy_from_slice(&self.call.to_le_bytes());
        p[8..].copy_from_slice(&self.bytes.to_le_bytes());
        let _ = self.out.send(frame(CONSUMED, &p));
    }
}

/// A region of the arena, owned by the arrays decoded from it; dropped with the last of them.
struct Region {
    map: Arc<Mapping>,
    off: usize,
    len: usize,
    out: mpsc::UnboundedSender<Vec<u8>>,
}

impl Drop for Region {
    fn drop(&mut self) {
        let mut p = [0u8; 16];
        p[..8].copy_from_slice(&(self.off as u64).to_le_bytes());
        p[8..].copy_from_slice(&(self.len as u64).to_le_bytes());
        let _ = self.out.send(frame(FREE, &p)); // a connection that is gone frees nothing
        let _ = &self.map; // the mapping lives as long as any region in it
    }
}

/// One data connection to a worker, as the client holds it.
struct Conn {
    out: mpsc::UnboundedSender<Vec<u8>>,
    sinks: Mutex<HashMap<u64, Sink>>,
    dead: AtomicBool,
    next: AtomicU64,
    who: String,
}

/// The data connections to one worker URL: idle ones wait here for the next call.
struct Pool {
    path: String,
    who: String,
    idle: Mutex<Vec<Arc<Conn>>>,
}

fn pools() -> &'static Mutex<HashMap<String, Arc<Pool>>> {
    static POOLS: OnceLock<Mutex<HashMap<String, Arc<Pool>>>> = OnceLock::new();
    POOLS.get_or_init(Default::default)
}

fn pool_for(path: &str, who: &str) -> Arc<Pool> {
    pools()
        .lock()
        .expect("pools lock")
        .entry(path.to_string())
        .or_insert_with(|| Arc::new(Pool { path: path.to_string(), who: who.to_string(), idle: Mutex::new(Vec::new()) }))
        .clone()
}

impl Pool {
    async fn take(self: &Arc<Self>) -> io::Result<Arc<Conn>> {
        loop {
            let c = self.idle.lock().expect("idle lock").pop();
            match c {
                Some(c) if !c.dead.load(Ordering::Acquire) => return Ok(c),
                Some(_) => continue,
                None => return self.connect().await,
            }
        }
    }

    fn put(&self, c: Arc<Conn>) {
        if !c.dead.load(Ordering::Acquire) {
            self.idle.lock().expect("idle lock").push(c);
        }
    }

    /// A new data connection: the arena is made, bound to this process's node and mapped here
    /// before the worker sees it.
    async fn connect(self: &Arc<Self>) -> io::Result<Arc<Conn>> {
        let sock = tokio::net::UnixStream::connect(&self.path).await?.into_std()?;
        sock.set_nonblocking(false)?;
        let fd = shm::named_memfd(&format!("tilewise-tiles-arena-r{}", std::process::id()), ARENA_BYTES)?;
        let raw: RawFd = fd.as_raw_fd();
        let map = Arc::new(Mapping::map(fd, ARENA_BYTES, true)?);
        let s = sock.as_raw_fd();
        tokio::task::spawn_blocking(move || shm::send_fds(s, shm::KIND_DATA, &[raw]).and_then(|()| shm::recv_ack(s)))
            .await
            .map_err(io::Error::other)??;
        sock.set_nonblocking(true)?;
        let (r, mut w) = tokio::net::UnixStream::from_std(sock)?.into_split();
        let (out, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let conn = Arc::new(Conn {
            out: out.clone(),
            sinks: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            next: AtomicU64::new(1),
            who: self.who.clone(),
        });
        // frames to the worker, in order (requests, frees, consumed bytes, cancels)
        tokio::spawn(async move {
            while let Some(f) = rx.recv().await {
                if w.write_all(&f).await.is_err() {
                    break;
                }
            }
        });
        tokio::spawn(read_loop(BufReader::with_capacity(64 << 10, r), Arc::clone(&conn), Arc::downgrade(self), map, out));
        Ok(conn)
    }
}

/// The client's reading task of one connection: descriptors in, batches out to their partitions.
async fn read_loop(mut r: BufReader<OwnedReadHalf>, conn: Arc<Conn>, pool: Weak<Pool>, map: Arc<Mapping>,
                   out: mpsc::UnboundedSender<Vec<u8>>) {
    let why = loop {
        let (kind, payload) = match read_frame(&mut r).await {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break "closed the connection".to_string(),
            Err(e) => break e.to_string(),
        };
        let mut c = Cursor(&payload);
        let Ok(call) = c.u64() else { break "sent a frame cut short".to_string() };
        match kind {
            DATA => {
                let (Ok(p), Ok(off), Ok(len), Ok(sent)) = (c.u32(), c.u64(), c.u64(), c.u64()) else {
                    break "sent a frame cut short".to_string();
                };
                let (off, len) = (off as usize, len as usize);
                if off.checked_add(len).is_none_or(|e| e > map.len) {
                    break format!("sent a region outside the arena ({off}+{len})");
                }
                let region = Arc::new(Region { map: Arc::clone(&map), off, len, out: out.clone() });
                // SAFETY: the region is inside the mapping, which the Region keeps alive; the worker
                // writes it only after the Region's drop sends it back
                let mut buf = unsafe {
                    Buffer::from_custom_allocation(NonNull::new_unchecked(map.base.add(off)), len, region)
                };
                let mut sinks = conn.sinks.lock().expect("sinks lock");
                let Some(sink) = sinks.get_mut(&call) else { continue }; // a cancelled call's last batches
                let m = sink.metrics.clone();
                m.bytes.add_bytes(len);
                m.messages.add(1);
                let now = now_ns();
                if sent > 0 && now > sent {
                    m.latency_sum.add_duration(Duration::from_nanos(now - sent));
                    m.latency_count.add(1);
                }
                let i = (p as usize).wrapping_sub(sink.start);
                if i >= sink.parts.len() {
                    break format!("sent partition {p}, outside the call's range");
                }
                let t0 = std::time::Instant::now();
                let mut batches = Vec::new();
                let mut failed = None;
                while !buf.is_empty() {
                    match sink.decoders[i].decode(&mut buf) {
                        Ok(Some(b)) => batches.push(b),
                        Ok(None) => {}
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                m.decode.add_duration(t0.elapsed());
                let tx = &sink.parts[i];
                if let Some(e) = failed {
                    let _ = tx.send(Err(df_err(format!("cannot decode a batch from {}: {e}", conn.who))));
                    continue;
                }
                // the budget is charged once per message: to its last batch (a message holds one)
                let n = batches.len();
                for (k, b) in batches.into_iter().enumerate() {
                    let bytes = if k + 1 == n { len as u64 } else { 0 };
                    let _ = tx.send(Ok(Delivered { batch: Some(b), bytes, call, out: out.clone() }));
                }
                if n == 0 {
                    drop(Delivered { batch: None, bytes: len as u64, call, out: out.clone() });
                }
            }
            END | ERR => {
                let sink = conn.sinks.lock().expect("sinks lock").remove(&call);
                if let (Some(sink), ERR) = (sink, kind) {
                    let text = String::from_utf8_lossy(c.rest()).into_owned();
                    for tx in &sink.parts {
                        let _ = tx.send(Err(df_err(&text)));
                    }
                }
                if let Some(p) = pool.upgrade() {
                    p.put(Arc::clone(&conn));
                }
            }
            k => break format!("sent a frame of unknown type {k}"),
        }
    };
    conn.dead.store(true, Ordering::Release);
    let sinks: Vec<Sink> = conn.sinks.lock().expect("sinks lock").drain().map(|(_, s)| s).collect();
    for s in sinks {
        for tx in &s.parts {
            let _ = tx.send(Err(df_err(format!("the tile at {} is gone: it {why}", conn.who))));
        }
    }
}

/// Dropped with the last of a call's partition streams: a call still running is cancelled.
struct CallGuard {
    conn: Arc<Conn>,
    call: u64,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if self.conn.sinks.lock().expect("sinks lock").contains_key(&self.call) {
            let _ = self.conn.out.send(frame(CANCEL, &self.call.to_le_bytes()));
        }
    }
}

async fn execute(path: &str, who: &str, request: ExecuteTaskRequest, metrics: ExecutionPlanMetricsSet,
                 ctx: &Arc<TaskContext>) -> Result<Vec<BoxStream<'static, Result<RecordBatch>>>> {
    let budget = DistributedConfig::from_session_config(ctx.session_config())?.worker_connection_buffer_budget_bytes;
    let (start, end) = (request.target_partition_start, request.target_partition_end);
    let body = encode_request(request, ctx)?;
    let pool = pool_for(path, who);
    let conn = pool.take().await.map_err(|e| df_err(format!("cannot reach the worker at {who}: {e}")))?;
    let call = conn.next.fetch_add(1, Ordering::Relaxed);
    let n = end.saturating_sub(start);
    let (mut txs, mut rxs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let (tx, rx) = mpsc::unbounded_channel();
        txs.push(tx);
        rxs.push(rx);
    }
    let decoders = (0..n).map(|_| unsafe { StreamDecoder::new().with_skip_validation(true) }.with_require_alignment(false)).collect();
    conn.sinks.lock().expect("sinks lock").insert(call, Sink { start, parts: txs, decoders, metrics: CallMetrics::new(&metrics) });
    // its reading task marks a connection dead before it fails the calls it holds: a call added
    // after that would never be answered
    if conn.dead.load(Ordering::Acquire) {
        conn.sinks.lock().expect("sinks lock").remove(&call);
        return Err(df_err(format!("the tile at {who} is gone")));
    }
    let mut req = Vec::with_capacity(16 + body.len());
    req.extend_from_slice(&call.to_le_bytes());
    req.extend_from_slice(&(budget as u64).to_le_bytes());
    req.extend_from_slice(&body);
    if conn.out.send(frame(REQ, &req)).is_err() {
        conn.sinks.lock().expect("sinks lock").remove(&call);
        return Err(df_err(format!("the tile at {who} is gone")));
    }
    let guard = Arc::new(CallGuard { conn, call });
    Ok(rxs
        .into_iter()
        .map(|rx| {
            let g = Arc::clone(&guard);
            UnboundedReceiverStream::new(rx)
                .map(move |d| {
                    let _ = &g;
                    d.map(|mut d| d.batch.take().expect("a delivered batch"))
                })
                .boxed()
        })
        .collect())
}

/// The `WorkerChannel` of an `shm://` worker: control over the crate's gRPC (on the rings of
/// shm.rs), data through the arena.
pub struct ShmChannel {
    pub grpc: Box<dyn WorkerChannel>,
    pub path: String,
    pub who: String,
}

#[async_trait]
impl WorkerChannel for ShmChannel {
    async fn coordinator_channel(&mut self, headers: HeaderMap, set_plan_request: SetPlanRequest,
                                 c2w_stream: BoxStream<'static, CoordinatorToWorkerMsg>,
                                 metrics: ExecutionPlanMetricsSet, task_ctx: &Arc<TaskContext>)
                                 -> Result<BoxStream<'static, Result<WorkerToCoordinatorMsg>>> {
        self.grpc.coordinator_channel(headers, set_plan_request, c2w_stream, metrics, task_ctx).await
    }

    async fn execute_task(&mut self, _headers: HeaderMap, request: ExecuteTaskRequest,
                          metrics: ExecutionPlanMetricsSet, task_ctx: &Arc<TaskContext>)
                          -> Result<Vec<BoxStream<'static, Result<RecordBatch>>>> {
        execute(&self.path, &self.who, request, metrics, task_ctx).await
    }

    async fn get_worker_info(&mut self, request: GetWorkerInfoRequest) -> Result<GetWorkerInfoResponse> {
        self.grpc.get_worker_info(request).await
    }
}

// ---- the worker (the sending tile) ----------------------------------------------------------------

/// What `shm::incoming` calls for a data connection: map the client's arena, say so, serve it.
pub fn on_data(worker: Worker) -> shm::OnData {
    Arc::new(move |sock: std::os::unix::net::UnixStream, fds: Vec<OwnedFd>| {
        let worker = worker.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(sock, fds, worker).await {
                eprintln!("tilewise-tiles worker: a data connection failed: {e}");
            }
        });
    })
}

struct Served {
    map: Arc<Mapping>,
    alloc: Mutex<Alloc>,
    freed: Notify,
    out: mpsc::UnboundedSender<Vec<u8>>,
    /// when a region was last handed out, and the highest offset ever handed out (since the last
    /// time the free pages were given back)
    used: Mutex<(tokio::time::Instant, usize)>,
    /// the client is gone: the give-back task ends, and with the calls' tasks the arena goes
    closed: AtomicBool,
}

impl Served {
    /// Every IDLE: if nothing was allocated since, the free pages above KEEP_BYTES go back to the
    /// kernel. Ends with the connection.
    async fn give_back_when_idle(self: Arc<Self>) {
        loop {
            tokio::time::sleep(IDLE).await;
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            let ranges = {
                let mut used = self.used.lock().expect("used lock");
                if used.1 <= KEEP_BYTES || used.0.elapsed() < IDLE {
                    continue;
                }
                let a = self.alloc.lock().expect("alloc lock");
                let ranges = a.free_above_keep(used.1);
                // what stays above KEEP_BYTES is in use: the next give-back looks up to its end
                used.1 = a.free.iter().next_back().map_or(KEEP_BYTES, |(&off, _)| off.max(KEEP_BYTES));
                ranges
            };
            for (off, len) in ranges {
                self.map.punch(off, len);
            }
        }
    }
}

struct Call {
    window: Arc<Semaphore>,
    budget: usize,
    stop: watch::Sender<bool>,
}

/// Resolves once the call is cancelled (at once if it already is).
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|&v| v).await;
}

async fn serve(sock: std::os::unix::net::UnixStream, fds: Vec<OwnedFd>, worker: Worker) -> io::Result<()> {
    let fd = fds.into_iter().next().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no arena passed"))?;
    let map = Arc::new(Mapping::map(fd, ARENA_BYTES, false)?); // bound by the client, to its node
    shm::send_ack(sock.as_raw_fd())?;
    sock.set_nonblocking(true)?;
    let (r, mut w) = tokio::net::UnixStream::from_std(sock)?.into_split();
    let (out, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            if w.write_all(&f).await.is_err() {
                break;
            }
        }
    });
    let served = Arc::new(Served { map, alloc: Mutex::new(Alloc::new(ARENA_BYTES)), freed: Notify::new(), out,
                                   used: Mutex::new((tokio::time::Instant::now(), 0)), closed: AtomicBool::new(false) });
    tokio::spawn(Arc::clone(&served).give_back_when_idle());
    let calls: Arc<Mutex<HashMap<u64, Call>>> = Arc::default();
    let mut r = BufReader::with_capacity(64 << 10, r);
    let result = loop {
        let (kind, payload) = match read_frame(&mut r).await {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break Ok(()),
            Err(e) => break Err(e),
        };
        if let Err(e) = handle(kind, &payload, &worker, &served, &calls) {
            break Err(e);
        }
    };
    // the client is gone (or spoke nonsense): every call on this connection stops, and once they
    // have, nothing holds the arena
    served.closed.store(true, Ordering::Release);
    for st in calls.lock().expect("calls lock").values() {
        let _ = st.stop.send(true);
    }
    result
}

/// One frame from the client.
fn handle(kind: u8, payload: &[u8], worker: &Worker, served: &Arc<Served>,
          calls: &Arc<Mutex<HashMap<u64, Call>>>) -> io::Result<()> {
    let mut c = Cursor(payload);
    match kind {
        REQ => {
            let (call, budget) = (c.u64()?, c.u64()? as usize);
            let req = decode_request(c.rest())?;
            let budget = budget.clamp(1 << 20, 1 << 30);
            let (stop, stop_rx) = watch::channel(false);
            let window = Arc::new(Semaphore::new(budget));
            calls.lock().expect("calls lock").insert(call, Call { window: Arc::clone(&window), budget, stop });
            let (worker, served, calls) = (worker.clone(), Arc::clone(served), Arc::clone(calls));
            tokio::spawn(async move {
                let res = run_call(&worker, req, &served, call, budget, window, stop_rx).await;
                calls.lock().expect("calls lock").remove(&call);
                let f = match res {
                    Ok(()) => frame(END, &call.to_le_bytes()),
                    Err(e) => {
                        let mut p = call.to_le_bytes().to_vec();
                        p.extend_from_slice(e.to_string().as_bytes());
                        frame(ERR, &p)
                    }
                };
                let _ = served.out.send(f);
            });
        }
        FREE => {
            let mut a = served.alloc.lock().expect("alloc lock");
            while let (Ok(off), Ok(len)) = (c.u64(), c.u64()) {
                a.release(off as usize, len as usize);
            }
            drop(a);
            served.freed.notify_waiters();
        }
        CONSUMED => {
            let (call, bytes) = (c.u64()?, c.u64()? as usize);
            if let Some(st) = calls.lock().expect("calls lock").get(&call) {
                st.window.add_permits(bytes.clamp(1, st.budget)); // what send() took for it
            }
        }
        CANCEL => {
            if let Some(st) = calls.lock().expect("calls lock").get(&c.u64()?) {
                let _ = st.stop.send(true);
            }
        }
        k => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a frame of unknown type {k}"))),
    }
    Ok(())
}

/// Run one call: every partition in its own task (they compute in parallel, as the crate's gRPC
/// service runs them), each batch written once into the arena.
async fn run_call(worker: &Worker, req: ExecuteTaskRequest, served: &Arc<Served>, call: u64, budget: usize,
                  window: Arc<Semaphore>, stop: watch::Receiver<bool>) -> Result<()> {
    let start = req.target_partition_start;
    let (streams, _ctx) = worker.execute_task(req).await?;
    let mut tasks = Vec::with_capacity(streams.len());
    let (fail, _) = watch::channel(false);
    let fail = Arc::new(fail);
    for (i, mut stream) in streams.into_iter().enumerate() {
        let (served, window, fail) = (Arc::clone(served), Arc::clone(&window), Arc::clone(&fail));
        let (stop, failed) = (stop.clone(), fail.subscribe());
        let partition = (start + i) as u32;
        tasks.push(tokio::spawn(async move {
            let mut encoder: Option<StreamEncoder> = None;
            let halt = async move {
                tokio::select! { _ = stopped(stop) => {}, _ = stopped(failed) => {} }
            };
            tokio::pin!(halt);
            let r: Result<()> = async {
                loop {
                    let next = tokio::select! {
                        biased;
                        _ = &mut halt => return Ok(()),
                        b = stream.next() => b,
                    };
                    let Some(batch) = next else { return Ok(()) };
                    let batch = compact(batch?)?;
                    let enc = match &mut encoder {
                        Some(e) => e,
                        None => encoder.insert(StreamEncoder::try_new_with_options(&batch.schema(), IpcWriteOptions::default())?),
                    };
                    let buffers = enc.encode(&batch)?;
                    tokio::select! {
                        biased;
                        _ = &mut halt => return Ok(()),
                        r = send(&served, call, partition, &buffers, budget, &window) => r?,
                    }
                }
            }
            .await;
            if r.is_err() {
                let _ = fail.send(true); // the call fails: its other partitions stop
            }
            r
        }));
    }
    let mut first_err = None;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(df_err(format!("a partition's task failed: {e}")));
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// One message: wait for the call's budget and a region, copy the encoder's buffers in, describe it.
async fn send(served: &Served, call: u64, partition: u32, buffers: &[Buffer], budget: usize, window: &Semaphore)
              -> Result<()> {
    let len: usize = buffers.iter().map(|b| b.len()).sum();
    window.acquire_many(len.clamp(1, budget) as u32).await.map_err(df_err)?.forget();
    let deadline = tokio::time::Instant::now() + ALLOC_WAIT;
    let off = loop {
        let freed = served.freed.notified();
        tokio::pin!(freed);
        freed.as_mut().enable(); // registered before the attempt: a free after it wakes us
        if let Some(off) = served.alloc.lock().expect("alloc lock").alloc(len) {
            let mut used = served.used.lock().expect("used lock");
            *used = (tokio::time::Instant::now(), used.1.max(off + len));
            break off;
        }
        tokio::select! {
            _ = freed => {}
            _ = tokio::time::sleep_until(deadline) => return Err(df_err(format!(
                "the receiving tile holds this connection's whole arena ({} GiB) of batches", ARENA_BYTES >> 30))),
        }
    };
    // the hop's one copy: the batch's own buffers into the receiver's memory
    let mut at = off;
    for b in buffers {
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), served.map.base.add(at), b.len()) };
        at += b.len();
    }
    let mut p = Vec::with_capacity(36);
    p.extend_from_slice(&call.to_le_bytes());
    p.extend_from_slice(&partition.to_le_bytes());
    p.extend_from_slice(&(off as u64).to_le_bytes());
    p.extend_from_slice(&(len as u64).to_le_bytes());
    p.extend_from_slice(&now_ns().to_le_bytes());
    served.out.send(frame(DATA, &p)).map_err(|_| df_err("the receiving tile is gone"))
}

/// As the crate does before sending: dictionaries garbage-collected, and string or binary views
/// compacted -- but only views whose data buffers hold more than twice what their values use (a
/// compaction is a copy; the crate compacts every view column, always). The coordinator does the
/// same to what it answers (flight.rs): a few rows of a top-k may point into megabytes of buffers.
pub fn compact(batch: RecordBatch) -> Result<RecordBatch> {
    let (schema, arrays, rows) = batch.into_parts();
    let arrays = arrays
        .into_iter()
        .map(|a| -> Result<Arc<dyn Array>> {
            if let Some(d) = a.as_any_dictionary_opt() {
                return Ok(arrow_select::dictionary::garbage_collect_any_dictionary(d)?);
            }
            if let Some(v) = a.as_string_view_opt() {
                if wasteful(v.data_buffers(), v.views(), v.len()) {
                    return Ok(Arc::new(v.gc()));
                }
            } else if let Some(v) = a.as_binary_view_opt() {
                if wasteful(v.data_buffers(), v.views(), v.len()) {
                    return Ok(Arc::new(v.gc()));
                }
            }
            Ok(a)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new_with_options(schema, arrays, &RecordBatchOptions::new().with_row_count(Some(rows)))?)
}

fn wasteful(data: &[Buffer], views: &[u128], len: usize) -> bool {
    let held: usize = data.iter().map(|b| b.len()).sum();
    if held == 0 {
        return false;
    }
    // a view longer than 12 bytes points into a data buffer (its first 4 bytes are its length)
    let used: usize = views[..len].iter().map(|v| *v as u32 as usize).filter(|&n| n > 12).sum();
    held > 2 * used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_reuses_the_lowest_free_extent_and_coalesces() {
        let mut a = Alloc::new(1 << 20);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(100).unwrap();
        let z = a.alloc(100).unwrap();
        assert_eq!((x, y, z), (0, 128, 256));
        a.release(y, 100);
        assert_eq!(a.alloc(64), Some(128)); // the hole, lowest first
        a.release(128, 64);
        a.release(x, 100);
        a.release(z, 100);
        assert_eq!(a.free.len(), 1); // all coalesced again
        assert_eq!(a.free.get(&0), Some(&(1 << 20)));
    }

    #[test]
    fn what_is_given_back_is_free_above_keep_and_below_the_top() {
        let mut a = Alloc::new(64 << 20);
        let lo = a.alloc(KEEP_BYTES - 4096).unwrap();
        let hi = a.alloc(1 << 20).unwrap();
        let top = hi + (1 << 20);
        assert_eq!(a.free_above_keep(top), vec![]); // all in use
        a.release(lo, KEEP_BYTES - 4096);
        assert_eq!(a.free_above_keep(top), vec![]); // below KEEP: kept warm
        a.release(hi, 1 << 20);
        assert_eq!(a.free_above_keep(top), vec![(KEEP_BYTES, top - KEEP_BYTES)]);
    }

    #[test]
    fn a_request_round_trips() {
        let id = uuid::Uuid::from_bytes([7; 16]);
        let req = ExecuteTaskRequest {
            task_key: TaskKey { query_id: id, stage_id: 3, task_number: 1 },
            target_partition_start: 2,
            target_partition_end: 5,
            producer_head: ProducerHead::BroadcastExec { output_partitions: 4 },
        };
        let ctx = datafusion::prelude::SessionContext::new().task_ctx();
        let back = decode_request(&encode_request(req, &ctx).unwrap()).unwrap();
        assert_eq!(back.task_key, TaskKey { query_id: id, stage_id: 3, task_number: 1 });
        assert_eq!((back.target_partition_start, back.target_partition_end), (2, 5));
        assert!(matches!(back.producer_head, ProducerHead::BroadcastExec { output_partitions: 4 }));
    }
}
