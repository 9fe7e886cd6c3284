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
//! takes about `SLICE_TARGET`; a batch the join gets through quickly passes whole (a slice is a
//! zero-copy view). Once `TURN` has gone by since the task last yielded, the node returns Pending
//! (and wakes itself): the join passes the Pending up, the task yields, and a task that was
//! cancelled or dropped in the meantime ends there. The node has the properties of its input.
//!
//! The coordinator adds the node before the distributed planner cuts the plan into stages (the
//! workers receive it in the plans, through `SlicesCodec`, and the crate's per-task metrics keep the
//! plan's topology on both sides). The planner rebuilds some of the joins it cuts, without the node:
//! each worker therefore applies the rule again to every task's plan it decodes
//! (`slice_worker_plan`). Measured on JCC-H q21 at SF 1 (2 tiles over `tcp`, cancelled after 10 s):
//! with the coordinator's rule alone one join on tile 1 had no node and the tile kept computing; with
//! the workers' pass too, both tiles were idle within a second. Not solved: over `shm` the same
//! cancelled q21 keeps tile 1 computing (its semi join, in a repartition's task, stops polling this
//! node after its first slice); see docs/tiles.md.
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, Result};
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
const TURN: Duration = Duration::from_millis(20);
/// The first slice of a stream: small, as nothing is known yet of what a row costs the join.
const FIRST_SLICE: usize = 64;
/// What the node's codec writes (it has no parameters): a tag that a wrong node cannot match.
const TAG: &[u8] = b"tilewise.ProbeSlices/1";

#[derive(Debug)]
pub struct ProbeSlices {
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl ProbeSlices {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let properties = Arc::clone(input.properties());
        Self { input, properties }
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
        Ok(Arc::new(match options.children_properties {
            ChildrenPropertiesMode::Keep => Self { input, properties: Arc::clone(&self.properties) },
            ChildrenPropertiesMode::Recompute => Self::new(input),
        }))
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, ctx)?;
        let now = Instant::now();
        Ok(Box::pin(Slicer { input, rest: None, rows: FIRST_SLICE, handed: None, turn: now }))
    }
}

/// Rows of the next slice, from the time the join took over the last one's rows.
pub fn next_slice(spent: Duration, rows: usize) -> usize {
    let per_row = spent.as_secs_f64() / rows.max(1) as f64;
    if per_row <= 0.0 {
        return usize::MAX;
    }
    let n = SLICE_TARGET.as_secs_f64() / per_row;
    if n >= usize::MAX as f64 {
        usize::MAX
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
}

impl Stream for Slicer {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
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

/// The rule: every hash or nested-loop join's right (probe) input behind a ProbeSlices.
#[derive(Debug, Default)]
pub struct SliceProbes;

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
            let new: Vec<Arc<dyn ExecutionPlan>> = vec![Arc::clone(build), Arc::new(ProbeSlices::new(Arc::clone(probe)))];
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
    Ok(WorkerPlanRewriteEventResponse::new(SliceProbes.optimize(ev.plan, &ConfigOptions::default())?))
}

/// ProbeSlices in the plans the coordinator sends (installed on the coordinator and every worker).
#[derive(Debug, Default)]
pub struct SlicesCodec;

impl PhysicalExtensionCodec for SlicesCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (buf, inputs) {
            (TAG, [input]) => Ok(Arc::new(ProbeSlices::new(Arc::clone(input)))),
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
        // 10 ms for 8192 rows: the next slice is the same size
        assert_eq!(next_slice(Duration::from_millis(10), 8192), 8192);
        // 5 s for 64 rows (JCC-H q21's mega orders): about one row
        assert_eq!(next_slice(Duration::from_secs(5), 64), 1);
        // fast: the batch passes whole
        assert!(next_slice(Duration::from_micros(50), 8192) > 1_000_000);
        assert_eq!(next_slice(Duration::ZERO, 8192), usize::MAX);
    }
}

