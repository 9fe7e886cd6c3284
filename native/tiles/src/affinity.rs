//! File affinity: each tile reads the same share of every table on every query (issue 30, "data
//! partitioned, not copied").
//!
//! The crate, left to itself, routes a stage's tasks to the workers from a random offset (so a
//! table's first half is read by tile 0 on one query and by tile 1 on the next) and cuts a scan's
//! files into byte ranges by size. tilewise installs three handlers in the coordinator's session:
//!
//! - **routing**: task t of every stage with more than one task runs on worker t mod N, in the
//!   order of the workers (the plan's instances, then those that joined). A stage of one task runs
//!   where its input already is, as the crate would place it (no network hop), else on worker 0;
//! - **task count**: a scan of a table laid out as K >= 2 files asks for K tasks (the crate caps
//!   them at the workers, N), so the table is spread over every tile whatever its size;
//! - **file assignment**: when a scan has at least as many files as tasks, file k (in path order)
//!   goes whole to task k mod T; the task's files are then cut into the scan's partitions. With
//!   fewer files than tasks (one file per table), the crate's byte ranges stay, and they are the
//!   same on every query too.
//!
//! So with a K-file layout (K a multiple of N) tile t owns files t, t+N, t+2N, ... of every table:
//! it reads them on every query, and the pages it reads are first touched by it, under its memory
//! policy -- on its node. tilewise predicts the same shares (engines.splits.FileAffinity), checks
//! that every tile owns some (engines/tiles/shares.py) and reports what each tile read.
use datafusion::common::Result;
use datafusion::catalog::memory::DataSourceExec;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileGroupPartitioner, FileScanConfig};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion_distributed::{
    DesiredTaskCountEvent, DesiredTaskCountEventResponse, DistributedExt, DistributedGetterExt, DistributedLeafExec,
    NetworkBoundaryExt, Stage,
    RouteTasksEvent, RouteTasksEventResponse, ScaleUpLeafNodeEvent, ScaleUpLeafNodeEventResponse,
    WorkerPlanRewriteEvent, WorkerPlanRewriteEventResponse,
};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use std::sync::Arc;

fn file_scan(plan: &Arc<dyn ExecutionPlan>) -> Option<&FileScanConfig> {
    let dse: &DataSourceExec = plan.downcast_ref()?;
    let scan: &FileScanConfig = dse.data_source().downcast_ref()?;
    // a scan partitioned by its files' values, or one whose order matters, keeps the crate's way
    (scan.output_partitioning.is_none() && scan.output_ordering.is_empty()).then_some(scan)
}

/// The scan's files, whole and in path order. DataFusion's own optimizer may already have cut a
/// file into byte ranges spread over the scan's groups; the ranges of one file are put back together.
fn whole_files(scan: &FileScanConfig) -> Vec<PartitionedFile> {
    let mut files: Vec<PartitionedFile> = Vec::new();
    for f in scan.file_groups.iter().flat_map(|g| g.iter()) {
        if !files.iter().any(|g| g.object_meta.location == f.object_meta.location) {
            let mut whole = f.clone();
            whole.range = None;
            files.push(whole);
        }
    }
    files.sort_by(|a, b| a.object_meta.location.cmp(&b.object_meta.location));
    files
}

fn file_count(scan: &FileScanConfig) -> usize {
    whole_files(scan).len()
}

/// Task t of a stage runs on worker t mod N. A stage of one task runs where its first (pre-order)
/// input stage of one task runs (no network hop: the crate's own rule), else on worker 0 (the crate
/// would pick one at random); tally.rs follows the same rule.
pub fn route(ev: RouteTasksEvent) -> Option<Result<RouteTasksEventResponse>> {
    let urls = match ev.task_ctx.session_config().get_distributed_worker_resolver().and_then(|r| r.get_urls()) {
        Ok(urls) if !urls.is_empty() => urls,
        Ok(_) => return None,
        Err(e) => return Some(Err(e)),
    };
    if ev.task_count == 1 {
        let mut single = None;
        let _ = ev.plan.apply(|node| {
            let Some(nb) = node.as_network_boundary() else { return Ok(TreeNodeRecursion::Continue) };
            if let Stage::Remote(r) = nb.input_stage() {
                if r.workers.len() == 1 {
                    single = Some(r.workers[0].clone());
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
            Ok(TreeNodeRecursion::Jump)
        });
        return Some(Ok(RouteTasksEventResponse::new(vec![single.unwrap_or_else(|| urls[0].clone())])));
    }
    Some(Ok(RouteTasksEventResponse::new((0..ev.task_count).map(|t| urls[t % urls.len()].clone()).collect())))
}

/// A table of K >= 2 files asks for K tasks (capped at the workers by the crate).
pub fn task_count(ev: DesiredTaskCountEvent) -> Option<Result<DesiredTaskCountEventResponse>> {
    let k = file_count(file_scan(ev.plan)?);
    (k >= 2).then(|| Ok(DesiredTaskCountEventResponse::desired(k)))
}

/// File k (in path order) goes whole to task k mod T, when there are at least T files.
pub fn assign_files(ev: ScaleUpLeafNodeEvent) -> Option<Result<ScaleUpLeafNodeEventResponse>> {
    let scan = file_scan(ev.plan)?;
    let tasks = ev.task_count;
    let files = whole_files(scan);
    if tasks < 2 || files.len() < tasks {
        return None;
    }
    let partitions = ev.plan.output_partitioning().partition_count().max(1);
    let variants = (0..tasks).map(|t| {
        let mine = FileGroup::new(files.iter().skip(t).step_by(tasks).cloned().collect());
        let mut groups: Vec<FileGroup> = FileGroupPartitioner::new()
            .with_target_partitions(partitions)
            .with_repartition_file_min_size(0)
            .repartition_file_groups(std::slice::from_ref(&mine))
            .unwrap_or_else(|| vec![mine]);
        // every task's scan exposes the same partition count: extra groups folded in, empty ones
        // (reading nothing) added
        while groups.len() > partitions {
            let extra = groups.pop().expect("more groups than partitions");
            let into = groups.len() % partitions;
            groups[into] = FileGroup::new(groups[into].iter().chain(extra.iter()).cloned().collect());
        }
        groups.resize_with(partitions, || FileGroup::new(vec![]));
        let mut mine_scan = scan.clone();
        mine_scan.file_groups = groups;
        DataSourceExec::from_data_source(mine_scan) as Arc<dyn ExecutionPlan>
    });
    Some(DistributedLeafExec::try_new(Arc::clone(ev.plan), variants.collect::<Vec<_>>())
        .map(|leaf| ScaleUpLeafNodeEventResponse::new(Arc::new(leaf))))
}

/// The three handlers on a coordinator's session builder.
pub fn install(b: datafusion::execution::SessionStateBuilder) -> datafusion::execution::SessionStateBuilder {
    b.with_distributed_route_tasks_handler(route)
        .with_distributed_desired_task_count_handler(task_count)
        .with_distributed_scale_up_leaf_node_handler(assign_files)
}

/// On a worker: one line on stderr (its log) per stage task it is given, naming the files (and byte
/// ranges) its scans read -- how tilewise shows, per tile, that each tile read its own share.
///   `tilewise-tiles scan: [["PATH", START, END, SIZE], ...]` (one JSON array) (START END: -1 -1 for the whole file;
///   SIZE: the file's bytes)
pub fn log_scans(ev: WorkerPlanRewriteEvent) -> Result<WorkerPlanRewriteEventResponse> {
    let mut parts = Vec::new();
    ev.plan.apply(|node| {
        if let Some(dse) = node.downcast_ref::<DataSourceExec>() {
            if let Some(scan) = dse.data_source().downcast_ref::<FileScanConfig>() {
                for f in scan.file_groups.iter().flat_map(|g| g.iter()) {
                    let (a, b) = f.range.as_ref().map(|r| (r.start, r.end)).unwrap_or((-1, -1));
                    let path = f.object_meta.location.to_string().replace('\\', "\\\\").replace('"', "\\\"");
                    parts.push(format!("[\"/{path}\", {a}, {b}, {}]", f.object_meta.size));
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if !parts.is_empty() {
        eprintln!("tilewise-tiles scan: [{}]", parts.join(", "));
    }
    Ok(WorkerPlanRewriteEventResponse::new(ev.plan))
}
