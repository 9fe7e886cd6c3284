//! Physical plan rules the coordinator applies before the distributed planner cuts a plan into
//! stages (so the workers receive the same plans, and the crate's per-task metrics keep the plan's
//! topology on both sides).
//!
//! ## CoopJoins: joins that yield, so a cancelled query stops on its tiles
//!
//! A join whose output far exceeds its input (a hash join on a column of few values, a cross join)
//! hands its consumer batch after batch without ever waiting on its own input, and an aggregate
//! above it loops over them inside one poll of its task: the task never yields, so nothing -- a
//! client's cancel, `--query-timeout`, the consumer dropping its stream -- stops it before the join
//! is done (measured: a tile at 100 % for minutes after the query was cancelled). DataFusion's own
//! yield points sit at the leaves only (EnsureCooperative).
//!
//! This rule wraps every join in DataFusion's `CooperativeExec` (it has a protobuf form), which
//! spends a unit of the tokio task's budget per batch: after 128 batches the task yields, and a
//! cancelled task ends. A join that evaluates a filter over billions of pairs and emits almost
//! nothing hands over no batch to count: slices.rs (ProbeSlices) makes that one yield.
//!
//! ## WindowSortKeys: every window's partition keys in the sort below it
//!
//! Below a filter such as `d_year = 1999`, DataFusion knows d_year is constant and leaves it out of
//! the sort a window `PARTITION BY ..., d_year` needs. When the sort and the filter end up in
//! different stages, the worker that decodes the window's stage has lost that knowledge (a network
//! boundary carries no equivalences) and refuses the plan: "All partition by columns should have an
//! ordering" (TPC-DS q47 and q57 whenever they are distributed; datafusion-distributed 4.0, to be
//! reported upstream). This rule adds the missing keys to the sort, after the partition keys it has:
//! the order of the rows does not change (each added key is constant, or equal to a key already
//! there, wherever the plan was valid), and the worker sees every partition key ordered.
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::arrow::compute::SortOptions;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec};
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PiecewiseMergeJoinExec, SortMergeJoinExec, SymmetricHashJoinExec,
};
use datafusion::physical_plan::{ChildrenPropertiesMode, ExecutionPlan, ReplaceChildrenOptions};
use std::sync::Arc;

fn is_join(p: &Arc<dyn ExecutionPlan>) -> bool {
    p.downcast_ref::<HashJoinExec>().is_some()
        || p.downcast_ref::<NestedLoopJoinExec>().is_some()
        || p.downcast_ref::<CrossJoinExec>().is_some()
        || p.downcast_ref::<SortMergeJoinExec>().is_some()
        || p.downcast_ref::<SymmetricHashJoinExec>().is_some()
        || p.downcast_ref::<PiecewiseMergeJoinExec>().is_some()
}

#[derive(Debug, Default)]
pub struct CoopJoins;

impl PhysicalOptimizerRule for CoopJoins {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            // a join already wrapped (the rule may run twice) stays as it is
            if node.downcast_ref::<CooperativeExec>().is_some() || !node.children().into_iter().any(is_join) {
                return Ok(Transformed::no(node));
            }
            let children = node
                .children()
                .into_iter()
                .map(|c| if is_join(c) { Arc::new(CooperativeExec::new(Arc::clone(c))) as _ } else { Arc::clone(c) })
                .collect();
            // the wrapper has its join's properties: the parent's stay as they were (recomputing them
            // loses what the planner knew of the orders above a join: TPC-DS q47 and q57 failed so)
            Ok(Transformed::yes(node.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep))?))
        })
        .data()
    }

    fn name(&self) -> &str {
        "tilewise_cooperative_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[derive(Debug, Default)]
pub struct WindowSortKeys;

impl PhysicalOptimizerRule for WindowSortKeys {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let keys = if let Some(w) = node.downcast_ref::<WindowAggExec>() {
                w.window_expr().first().map(|e| e.partition_by().to_vec())
            } else if let Some(w) = node.downcast_ref::<BoundedWindowAggExec>() {
                w.window_expr().first().map(|e| e.partition_by().to_vec())
            } else {
                None
            };
            let children = node.children();
            let (Some(keys), [input]) = (keys, children.as_slice()) else { return Ok(Transformed::no(node)) };
            let Some(sort) = input.downcast_ref::<SortExec>() else { return Ok(Transformed::no(node)) };
            let exprs: Vec<PhysicalSortExpr> = sort.expr().iter().cloned().collect();
            // the sort's leading partition keys, then the keys it lacks
            let lead = exprs.iter().take_while(|s| keys.iter().any(|k| k.eq(&s.expr))).count();
            let missing: Vec<_> = keys.iter().filter(|k| !exprs[..lead].iter().any(|s| s.expr.eq(*k))).cloned().collect();
            if missing.is_empty() {
                return Ok(Transformed::no(node));
            }
            let asc = SortOptions { descending: false, nulls_first: false };
            let mut order: Vec<PhysicalSortExpr> = exprs[..lead].to_vec();
            order.extend(missing.iter().map(|k| PhysicalSortExpr::new(Arc::clone(k), asc)));
            order.extend(exprs[lead..].iter().filter(|s| !missing.iter().any(|k| k.eq(&s.expr))).cloned());
            let Some(order) = LexOrdering::new(order) else { return Ok(Transformed::no(node)) };
            let new_sort = SortExec::new(order, Arc::clone(sort.input()))
                .with_preserve_partitioning(sort.preserve_partitioning())
                .with_fetch(sort.fetch());
            drop(children);
            let recompute = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
            Ok(Transformed::yes(node.replace_children(vec![Arc::new(new_sort)], recompute)?))
        })
        .data()
    }

    fn name(&self) -> &str {
        "tilewise_window_sort_keys"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
