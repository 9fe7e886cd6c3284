//! ProbeSlices: a join's probe side handed over in slices the join gets through in milliseconds,
//! with a yield to the task between them, so that a cancelled query stops on its tiles even when
//! its join emits almost nothing.
//!
//! DataFusion's hash join puts what it produces into a coalescer and returns to its consumer only
//! when a whole output batch is ready; until then it loops, inside one poll, over the candidate
//! pairs of its probe batch and on to the next probe batch. A join whose filter rejects nearly every
//! pair -- JCC-H q21's EXISTS / NOT EXISTS on l_orderkey, where a mega order of 300,000 lines makes
//! 9e10 pairs -- therefore never returns from that poll, its task never yields, and nothing stops
//! it: measured, a tile at 100 % for 14 minutes after `--query-timeout` cancelled the query, and the
//! 12 queries after it timed out behind it (CoopJoins, rules.rs, only helps a join that emits).
//!
//! The rule below puts this node between every hash or nested-loop join and its probe (right)
//! input. The node measures how long the join took over the rows of the slice it was last handed
//! (the time from handing it over to being polled again) and cuts the next batch so that a slice
//! takes about `SLICE_TARGET`, and never more than `MAX_SLICE` rows: a row's cost can jump from
//! one slice to the next (JCC-H q21's probe side reaches a mega order of 300,000 lines after
//! thousands of cheap rows), and the join is deaf until its slice is done -- measured, while slices
//! could grow to a whole batch (8192 rows) one kept a tile from hearing anything for 11 s. A slice
//! is a zero-copy view; a smaller batch passes whole. Once `TURN` has gone by since the task last
//! yielded, the node returns Pending (and wakes itself): the join passes the Pending up, the task
//! yields, and a task that was cancelled or dropped in the meantime ends there. The node has the
//! properties of its input.
//!
//! The coordinator adds the node before the distributed planner cuts the plan into stages (the
//! workers receive it in the plans, through `SlicesCodec`, and the crate's per-task metrics keep the
//! plan's topology on both sides). The planner rebuilds some of the joins it cuts, without the node:
//! each worker therefore applies the rule again to every task's plan it decodes
//! (`slice_worker_plan`); on JCC-H q21 at SF 1, with the coordinator's rule alone, one join on tile 1
//! had no node. Yielding is not stopping, though: a cancelled q21 still kept tile 1 computing, over
//! tcp and shm alike -- its semi join was polled and yielded as it should, but in a hash
//! repartition's input task that nothing aborted (statements.rs). So the node is also where a
//! statement's end reaches its work: once the coordinator has told the worker that the statement is
//! over, the node fails its stream at its next poll.
use crate::statements::{self, Statement};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{exec_err, internal_err, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{HashJoinExec, NestedLoopJoinExec};
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use datafusion_distributed::{WorkerPlanRewriteEvent, WorkerPlanRewriteEventResponse};
use futures::{Stream, StreamExt};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// How long the join should take over one slice.
const SLICE_TARGET: Duration = Duration::from_millis(10);
/// At most this long between two yields of the task (while the join keeps taking slices).
const TURN: Duration = Duration::from_millis(10);
/// The first slice of a stream: small, as nothing is known yet of what a row costs the join.
const FIRST_SLICE: usize = 64;
/// The largest slice, however cheap the rows were so far (an eighth of DataFusion's batch).
const MAX_SLICE: usize = 1024;
/// What the node's codec writes (it has no parameters): a tag that a wrong node cannot match.
const TAG: &[u8] = b"tilewise.ProbeSlices/1";

#[derive(Debug)]
pub struct ProbeSlices {
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
    /// the statement this node runs for, on a worker (statements.rs); None on the coordinator
    statement: Option<Arc<Statement>>,
}

impl ProbeSlices {
    pub fn new(input: Arc<dyn ExecutionPlan>, statement: Option<Arc<Statement>>) -> Self {
        let properties = Arc::clone(input.properties());
        Self { input, properties, statement }
    }
}

impl DisplayAs for ProbeSlices {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProbeSlices")
    }
}

impl ExecutionPlan for ProbeSlices {
    fn name(&self) -> &str {
        "ProbeSlices"
    }

    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return internal_err!("ProbeSlices takes one child, got {}", children.len());
        }
        let input = children.swap_remove(0);
        let statement = self.statement.clone();
        Ok(Arc::new(match options.children_properties {
            ChildrenPropertiesMode::Keep => Self { input, properties: Arc::clone(&self.properties), statement },
            ChildrenPropertiesMode::Recompute => Self::new(input, statement),
        }))
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, ctx)?;
        let now = Instant::now();
        let statement = self.statement.clone();
        Ok(Box::pin(Slicer { input, rest: None, rows: FIRST_SLICE, handed: None, turn: now, statement, ended: false }))
    }
}

/// Rows of the next slice, from the time the join took over the last one's rows (at most MAX_SLICE).
pub fn next_slice(spent: Duration, rows: usize) -> usize {
    let per_row = spent.as_secs_f64() / rows.max(1) as f64;
    if per_row <= 0.0 {
        return MAX_SLICE;
    }
    let n = SLICE_TARGET.as_secs_f64() / per_row;
    if n >= MAX_SLICE as f64 {
        MAX_SLICE
    } else {
        (n as usize).max(1)
    }
}

struct Slicer {
    input: SendableRecordBatchStream,
    rest: Option<RecordBatch>,
    rows: usize,
    /// when the last slice was handed over, and its rows
    handed: Option<(Instant, usize)>,
    /// when the task last yielded
    turn: Instant,
    statement: Option<Arc<Statement>>,
    /// the statement's end was reported: the stream is over
    ended: bool,
}

impl Stream for Slicer {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if self.statement.as_ref().is_some_and(|s| s.is_over()) {
            self.ended = true;
            self.rest = None;
            return Poll::Ready(Some(exec_err!("the statement is over (its coordinator ended it): this join stops")));
        }
        let now = Instant::now();
        if let Some((at, rows)) = self.handed.take() {
            self.rows = next_slice(now - at, rows);
        }
        if now - self.turn >= TURN {
            self.turn = now;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let batch = match self.rest.take() {
            Some(b) => b,
            None => match self.input.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(b))) => b,
                Poll::Pending => {
                    self.turn = Instant::now(); // the task yields on the input's account
                    return Poll::Pending;
                }
                other => return other,
            },
        };
        let n = batch.num_rows();
        if n == 0 {
            return Poll::Ready(Some(Ok(batch)));
        }
        let out = if self.rows < n {
            self.rest = Some(batch.slice(self.rows, n - self.rows));
            batch.slice(0, self.rows)
        } else {
            batch
        };
        self.handed = Some((Instant::now(), out.num_rows()));
        Poll::Ready(Some(Ok(out)))
    }
}

impl RecordBatchStream for Slicer {
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }
}

fn is_probing_join(p: &Arc<dyn ExecutionPlan>) -> bool {
    p.downcast_ref::<HashJoinExec>().is_some() || p.downcast_ref::<NestedLoopJoinExec>().is_some()
}

/// The rule: every hash or nested-loop join's right (probe) input behind a ProbeSlices (of the
/// statement the plan runs for, on a worker).
#[derive(Debug, Default)]
pub struct SliceProbes {
    pub statement: Option<Arc<Statement>>,
}

impl PhysicalOptimizerRule for SliceProbes {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if !is_probing_join(&node) {
                return Ok(Transformed::no(node));
            }
            let children = node.children();
            let [build, probe] = children.as_slice() else { return Ok(Transformed::no(node)) };
            if probe.downcast_ref::<ProbeSlices>().is_some() {
                return Ok(Transformed::no(node)); // the rule may run twice
            }
            let sliced = ProbeSlices::new(Arc::clone(probe), self.statement.clone());
            let new: Vec<Arc<dyn ExecutionPlan>> = vec![Arc::clone(build), Arc::new(sliced)];
            drop(children);
            // the wrapper has its input's properties: the join's stay as they were (its dynamic
            // filter on the probe side's scan included)
            Ok(Transformed::yes(node.replace_children(new, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep))?))
        })
        .data()
    }

    fn name(&self) -> &str {
        "tilewise_slice_probes"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// On a worker, once it has decoded a task's plan: every join's probe behind a ProbeSlices. The
/// coordinator's rule runs before the distributed planner, which may still rebuild the joins it
/// cuts into stages: here is the plan that runs.
pub fn slice_worker_plan(ev: WorkerPlanRewriteEvent) -> Result<WorkerPlanRewriteEventResponse> {
    let rule = SliceProbes { statement: statements::of(&ev.session_config) };
    Ok(WorkerPlanRewriteEventResponse::new(rule.optimize(ev.plan, &ConfigOptions::default())?))
}

/// ProbeSlices in the plans the coordinator sends (installed on the coordinator and every worker).
#[derive(Debug, Default)]
pub struct SlicesCodec;

impl PhysicalExtensionCodec for SlicesCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (buf, inputs) {
            // on a worker: the node of the statement the task's session belongs to
            (TAG, [input]) => Ok(Arc::new(ProbeSlices::new(Arc::clone(input), statements::of(ctx.session_config())))),
            _ => internal_err!("not a tilewise plan node ({} bytes, {} inputs)", buf.len(), inputs.len()),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        if node.downcast_ref::<ProbeSlices>().is_none() {
            return internal_err!("tilewise's codec cannot encode {}", node.name());
        }
        buf.extend_from_slice(TAG);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_take_about_the_target() {
        // 10 ms for 512 rows: the next slice is the same size
        assert_eq!(next_slice(Duration::from_millis(10), 512), 512);
        // 5 s for 64 rows (JCC-H q21's mega orders): about one row
        assert_eq!(next_slice(Duration::from_secs(5), 64), 1);
        // fast rows: at most MAX_SLICE, for the next rows may not be
        assert_eq!(next_slice(Duration::from_micros(50), 8192), MAX_SLICE);
        assert_eq!(next_slice(Duration::ZERO, 8192), MAX_SLICE);
    }
}

