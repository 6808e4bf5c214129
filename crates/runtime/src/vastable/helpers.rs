//! Free helpers of VA-stable mode: parameter lookup, copy lists and
//! batches, contiguous ranges, graph capture.

use xla_vmm_device::{merge_copies, Backend, DevicePtr};

use xla_vmm_policy::step::SlotRegion;

use super::{CopyOp, ParamSlot};
use crate::binding::UserBuffer;
use crate::copykernel::{CopyKernel, Table, IN, OUT};
use crate::error::{Result, RuntimeError, Teardown};
use crate::exec::{capture_graph, run_program, ExecEnv};
use crate::program::Program;
use crate::slots::SlotTable;

/// The buffer bound to slot `s`'s parameter (checked: bound, big enough).
pub(super) fn bound<'u, B: Backend>(
    users: &'u [Option<UserBuffer<B>>],
    s: &ParamSlot,
) -> Result<&'u UserBuffer<B>> {
    let u = users
        .get(s.param)
        .and_then(|u| u.as_ref())
        .ok_or_else(|| RuntimeError::arg(format!("parameter {} is not bound", s.param)))?;
    if u.bytes < s.size {
        return Err(RuntimeError::arg(format!(
            "parameter {}: {} bytes bound, slot needs {}",
            s.param, u.bytes, s.size
        )));
    }
    Ok(u)
}

/// Two of the copies (with bytes) write overlapping memory.
pub(super) fn overlapping(list: &[CopyOp], scratch: &mut Vec<(u64, u64)>) -> bool {
    if list.len() < 2 {
        return false;
    }
    scratch.clear();
    scratch.extend(
        list.iter()
            .filter(|c| c.2 > 0)
            .map(|c| (c.0 .0, c.0 .0.saturating_add(c.2))),
    );
    scratch.sort_unstable();
    scratch.windows(2).any(|w| w[0].1 > w[1].0)
}

/// Runs of slot indices (in `idx` order) whose regions touch.
pub(super) fn contiguous(idx: &[usize], slots: &[SlotRegion]) -> Vec<Vec<usize>> {
    let mut sorted = idx.to_vec();
    sorted.sort_by_key(|&i| slots[i].offset);
    let mut out: Vec<Vec<usize>> = Vec::new();
    for i in sorted {
        match out.last_mut() {
            Some(run)
                if {
                    let l = &slots[*run.last().expect("non-empty")];
                    l.offset + l.region == slots[i].offset
                } =>
            {
                run.push(i)
            }
            _ => out.push(vec![i]),
        }
    }
    out
}

/// Enqueue one direction's `(dst, src, bytes)` copies as one batch
/// (contiguous ranges merged); returns the operations enqueued (0 or 1).
pub(super) fn copy_batch<B: Backend>(
    be: &B,
    list: &[(DevicePtr, DevicePtr, u64)],
    stream: &B::Stream,
) -> Result<u64> {
    let merged = merge_copies(list);
    // Copies in a batch are unordered: if two write overlapping memory (one
    // buffer bound to two written parameters), keep them in slot order.
    if merged.windows(2).any(|w| w[0].0.offset(w[0].2) > w[1].0) {
        for &(d, s, n) in list {
            be.copy_d2d(d, s, n, stream)?;
        }
        return Ok(list.len() as u64);
    }
    match merged.as_slice() {
        [] => Ok(0),
        [(d, s, n)] => {
            be.copy_d2d(*d, *s, *n, stream)?;
            Ok(1)
        }
        _ => {
            be.copy_d2d_batch(&merged, stream)?;
            Ok(1)
        }
    }
}

/// A captured step: the graph, its exec and, with the copy kernel, its
/// two copy nodes (IN, OUT).
pub(super) type Captured<B> = (
    <B as Backend>::Graph,
    <B as Backend>::GraphExec,
    Option<[<B as Backend>::GraphNode; 2]>,
);

/// Capture the step into a graph; with the copy kernel, its first node
/// runs the IN copies and its last the OUT copies, both captured with an
/// empty table and found again in the graph to be rewritten per step.
pub(super) fn capture<B: Backend>(
    program: &Program<B>,
    env: &ExecEnv<'_, B>,
    table: &SlotTable,
    kernel: Option<&CopyKernel<B>>,
    stream: &B::Stream,
) -> Result<Captured<B>> {
    let be = program.backend();
    let empty = kernel.map(|k| Table::empty(k.capacity()));
    let graph = capture_graph(be, stream, || {
        if let (Some(k), Some(t)) = (kernel, &empty) {
            k.launch(be, IN, t, stream)?;
        }
        run_program(env, program.ops(), table, stream)?;
        if let (Some(k), Some(t)) = (kernel, &empty) {
            k.launch(be, OUT, t, stream)?;
        }
        Ok(())
    })?;
    let nodes = match kernel.map(|k| copy_nodes(be, &graph, k)).transpose() {
        Ok(n) => n,
        Err(e) => {
            Teardown::new("a graph not instantiated")
                .check("graph_destroy", be.graph_destroy(graph));
            return Err(e);
        }
    };
    match be.graph_instantiate(&graph) {
        Ok(exec) => Ok((graph, exec, nodes)),
        Err(e) => {
            Teardown::new("a graph not instantiated")
                .check("graph_destroy", be.graph_destroy(graph));
            Err(e.into())
        }
    }
}

/// The one IN and the one OUT copy node of `graph`.
fn copy_nodes<B: Backend>(
    be: &B,
    graph: &B::Graph,
    k: &CopyKernel<B>,
) -> Result<[B::GraphNode; 2]> {
    let one = |dir: usize| -> Result<B::GraphNode> {
        let mut found = be.graph_kernel_nodes(graph, k.function(dir))?;
        match found.len() {
            1 => Ok(found.remove(0)),
            n => Err(RuntimeError::invalid(format!(
                "the captured step has {n} copy nodes of direction {dir}, not one"
            ))),
        }
    };
    Ok([one(IN)?, one(OUT)?])
}
