//! What each tile did for one query, from the crate's own metrics (collected from every worker by
//! the coordinator once the query is done): rows its scans produced, and what its network
//! boundaries received -- bytes (Flight messages as encoded), messages, the sum of the messages'
//! latencies (producer's send to this tile's receipt: queueing included) and the time spent
//! decoding them.
//!
//! Which tile ran a task is the routing rule of affinity.rs: task t of a stage of T >= 2 tasks on
//! worker t mod N; a stage of one task on the worker of the first (pre-order) input stage of one
//! task, else worker 0; the head stage on the coordinator.
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::Result;
use datafusion::catalog::memory::DataSourceExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_distributed::{
    rewrite_distributed_plan_with_metrics, DistributedLeafExec, DistributedMetricsFormat, NetworkBoundaryExt, Stage,
    DISTRIBUTED_DATAFUSION_TASK_ID_LABEL,
};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Default, Debug, Clone, Copy)]
pub struct Tally {
    pub tasks: usize,
    pub rows_scanned: usize,
    pub bytes_in: usize,
    pub messages_in: usize,
    pub latency_ns: usize,
    pub decode_ns: usize,
}

/// Where a task ran: a worker's index, or the coordinator.
pub type Tile = Option<usize>;

/// The network boundaries of a stage (pre-order, not inside other stages): their input stage's plan
/// and task count.
fn inputs(plan: &Arc<dyn ExecutionPlan>) -> Vec<(Arc<dyn ExecutionPlan>, usize)> {
    let mut out = Vec::new();
    let _ = plan.apply(|node| {
        if let Some(nb) = node.as_network_boundary() {
            if let Stage::Local(s) = nb.input_stage() {
                out.push((Arc::clone(&s.plan), s.tasks));
            }
            return Ok(TreeNodeRecursion::Jump);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out
}

fn task_of(labels: &[datafusion::physical_plan::metrics::Label]) -> usize {
    labels
        .iter()
        .find(|l| l.name() == DISTRIBUTED_DATAFUSION_TASK_ID_LABEL)
        .and_then(|l| l.value().parse().ok())
        .unwrap_or(0)
}

/// Visit one stage: its input stages first (a one-task stage runs where its first one-task input
/// ran), then its own nodes. Returns the tile of each of its tasks.
fn stage(plan: &Arc<dyn ExecutionPlan>, tiles: Vec<Tile>, workers: usize, out: &mut BTreeMap<Tile, Tally>) -> Result<()> {
    let tile = |t: usize| tiles.get(t).copied().unwrap_or(None);
    for (child, tasks) in inputs(plan) {
        let child_tiles: Vec<Tile> = if tasks >= 2 {
            (0..tasks).map(|t| Some(t % workers.max(1))).collect()
        } else {
            vec![first_single(&child, workers)]
        };
        stage(&child, child_tiles, workers, out)?;
    }
    for t in 0..tiles.len() {
        out.entry(tile(t)).or_default().tasks += 1;
    }
    plan.apply(|node| {
        let is_boundary = node.is_network_boundary();
        let is_leaf = node.downcast_ref::<DistributedLeafExec>().is_some() || node.downcast_ref::<DataSourceExec>().is_some();
        if is_boundary || is_leaf {
            for m in node.metrics().unwrap_or_default().iter() {
                let e = out.entry(tile(task_of(m.labels()))).or_default();
                let v = m.value().as_usize();
                match m.value().name() {
                    "output_rows" if is_leaf => e.rows_scanned += v,
                    "bytes_transferred" if is_boundary => e.bytes_in += v,
                    "msg_count" if is_boundary => e.messages_in += v,
                    "network_latency_sum" if is_boundary => e.latency_ns += v,
                    "elapsed_compute" if is_boundary => e.decode_ns += v,
                    _ => {}
                }
            }
        }
        // a DistributedLeafExec's variants carry no metrics of their own; a boundary's child is another stage
        Ok(if is_boundary || is_leaf { TreeNodeRecursion::Jump } else { TreeNodeRecursion::Continue })
    })?;
    Ok(())
}

/// The tile of a one-task stage: that of its first (pre-order) input stage of one task, else worker 0
/// (affinity::route decides so).
fn first_single(plan: &Arc<dyn ExecutionPlan>, workers: usize) -> Tile {
    for (child, tasks) in inputs(plan) {
        if tasks == 1 {
            return first_single(&child, workers);
        }
    }
    if workers > 0 { Some(0) } else { None }
}

/// Per tile, what one executed distributed plan did (empty for a plan that was not distributed).
pub async fn tally(plan: Arc<dyn ExecutionPlan>, workers: usize) -> Result<BTreeMap<Tile, Tally>> {
    let mut out = BTreeMap::new();
    let with = rewrite_distributed_plan_with_metrics(plan, DistributedMetricsFormat::PerTask).await?;
    // the DistributedExec's child is the head stage, run by the coordinator
    for head in with.children() {
        stage(head, vec![None], workers, &mut out)?;
    }
    Ok(out)
}

/// One line for the coordinator's log, for its n-th statement:
/// `tilewise-tiles query: {"n": N, "tiles": {"0": {...}, ...}, "coordinator": {...}}`.
pub fn line(n: u64, t: &BTreeMap<Tile, Tally>) -> String {
    let one = |x: &Tally| {
        format!(
            "{{\"tasks\":{},\"rows_scanned\":{},\"bytes_in\":{},\"messages_in\":{},\"latency_ns\":{},\"decode_ns\":{}}}",
            x.tasks, x.rows_scanned, x.bytes_in, x.messages_in, x.latency_ns, x.decode_ns
        )
    };
    let tiles: Vec<String> = t.iter().filter_map(|(k, v)| k.map(|i| format!("\"{i}\":{}", one(v)))).collect();
    let coord = t.get(&None).map(one).unwrap_or_else(|| "{}".to_string());
    format!("tilewise-tiles query: {{\"n\":{n},\"tiles\":{{{}}},\"coordinator\":{}}}", tiles.join(","), coord)
}

/// The line of a statement whose figures are not known: `{"n": N, "unmeasured": "why"}`.
pub fn unmeasured(n: u64, why: &str) -> String {
    let why = why.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', " ");
    format!("tilewise-tiles query: {{\"n\":{n},\"unmeasured\":\"{why}\"}}")
}
