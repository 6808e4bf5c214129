//! The executor: walks loaded [`Op`]s with XLA's thunk semantics.
//!
//! One code path serves both modes. Eager: ops are enqueued on the stream.
//! Graph: the same walk runs while the main stream is being captured; a
//! while loop with a known trip count is unrolled into the capture (its
//! iteration number is known on the host, so dynamic-slice windows inside it
//! are exact); a while loop without trip count becomes a conditional WHILE
//! node where the backend has them (its body may not depend on the
//! iteration number, which only the device knows); a conditional needs the
//! host to read device memory and is an error in capture.

use std::collections::HashMap;

use xla_vmm_device::blas::GemmEngine;
use xla_vmm_device::vmm::VmmContext;
use xla_vmm_device::{Backend, DevicePtr};

use crate::collective::Resolved;
use crate::custom_call::CallContext;
use crate::error::{Result, RuntimeError, Teardown};
use crate::ops::{AsyncStream, Op, ParamSpec};
use crate::slots::SlotTable;

/// Everything the walk needs besides the ops and the slot table.
pub struct ExecEnv<'a, B: Backend> {
    pub backend: &'a B,
    /// The program's VMM context (custom calls' scratch memory).
    pub vmm: &'a VmmContext<B>,
    pub gemm: Option<&'a dyn GemmEngine<B>>,
    /// Extra compute streams (`computation_stream_id` i → `aux_streams[i]`).
    pub aux_streams: &'a [B::Stream],
    /// Communication streams (`Communication(i)` → `comm_streams[i]`).
    pub comm_streams: &'a [B::Stream],
    /// The communicator and peers of each collective (`CollOp::index`);
    /// empty until the first run resolves them.
    pub collectives: &'a [Resolved<B>],
    /// (replica id, partition id) of this device.
    pub logical: (u32, u32),
    /// Per async execution id: (start event, done event).
    pub events: &'a HashMap<u64, (B::Event, B::Event)>,
    /// The run's execute context, for custom calls (their user data).
    pub call_context: Option<&'a dyn CallContext>,
    /// The main stream is being captured into a graph.
    pub capturing: bool,
    /// Pinned staging buffers of host-offloaded compute, kept between runs.
    pub host_staging: &'a crate::host_execute::StagingPool<B>,
    /// The program's scratch memory (FFT work areas at their ops' offsets);
    /// null when it has none.
    pub scratch: DevicePtr,
    /// The program's staging through device memory, when part of its
    /// memory is in host memory ([`crate::staging`]).
    pub(crate) staging: Option<&'a dyn StagedRun<B>>,
}

/// A program's staging as the walk runs it (the staging module's
/// `Staging`): the program's top-level ops with their copies.
pub(crate) trait StagedRun<B: Backend> {
    fn run(
        &self,
        env: &ExecEnv<'_, B>,
        ops: &[Op<B>],
        slots: &SlotTable,
        stream: &B::Stream,
    ) -> Result<()>;
}

/// Run a program's top-level `ops` on `stream`: with its staging when it
/// has one, else as [`run_seq`].
pub fn run_program<B: Backend>(
    env: &ExecEnv<'_, B>,
    ops: &[Op<B>],
    slots: &SlotTable,
    stream: &B::Stream,
) -> Result<()> {
    match env.staging {
        Some(s) => s.run(env, ops, slots, stream),
        None => run_seq(env, ops, slots, stream, &mut Vec::new()),
    }
}

/// Run `ops` in order on `stream`. `nest` holds the iteration of each
/// enclosing while loop, outermost first.
pub fn run_seq<B: Backend>(
    env: &ExecEnv<'_, B>,
    ops: &[Op<B>],
    slots: &SlotTable,
    stream: &B::Stream,
    nest: &mut Vec<i64>,
) -> Result<()> {
    for op in ops {
        run_op(env, op, slots, stream, nest)?;
    }
    Ok(())
}

fn build_params<B: Backend>(
    be: &B,
    params: &[ParamSpec],
    slots: &SlotTable,
) -> Result<Vec<Vec<u8>>> {
    params
        .iter()
        .map(|p| match p {
            ParamSpec::Address(s) => Ok(slots.resolve(s)?.0.to_le_bytes().to_vec()),
            ParamSpec::Bytes(b) => Ok(b.clone()),
            ParamSpec::Tma(s, desc) => Ok(be.tensor_map_encode(desc, slots.resolve(s)?)?.to_vec()),
        })
        .collect()
}

fn read_scalar<B: Backend>(
    env: &ExecEnv<'_, B>,
    slots: &SlotTable,
    slice: &xla_vmm::Slice,
    bytes: usize,
    stream: &B::Stream,
    what: &str,
) -> Result<Vec<u8>> {
    if env.capturing {
        return Err(RuntimeError::unsupported(format!(
            "{what}: needs a device-to-host read, impossible inside a graph capture"
        )));
    }
    if (slice.size as usize) < bytes {
        return Err(RuntimeError::invalid(format!(
            "{what}: {}-byte slice, need {bytes}",
            slice.size
        )));
    }
    let mut out = vec![0u8; bytes];
    env.backend
        .read_sync(&mut out, slots.resolve(slice)?, stream)?;
    Ok(out)
}

pub(crate) fn run_op<B: Backend>(
    env: &ExecEnv<'_, B>,
    op: &Op<B>,
    slots: &SlotTable,
    stream: &B::Stream,
    nest: &mut Vec<i64>,
) -> Result<()> {
    let be = env.backend;
    match op {
        Op::Launch {
            name,
            function,
            config,
            params,
            zero,
        } => {
            for z in zero {
                be.memset_d8(slots.resolve(z)?, 0, z.size, stream)?;
            }
            let bytes = build_params(be, params, slots)?;
            let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
            tracing::trace!(kernel = %name, ?config, "launch");
            be.launch(function, config, &refs, stream)
                .map_err(|e| RuntimeError::invalid(format!("launch of '{name}': {e}")))?;
        }
        Op::Gemm(g) => crate::gemm::run(env.gemm, g, slots, stream)?,
        Op::Copy { src, dst, bytes } => {
            if *bytes > src.size || *bytes > dst.size {
                return Err(RuntimeError::invalid(format!(
                    "copy of {bytes} bytes between slices of {} and {}",
                    src.size, dst.size
                )));
            }
            if *bytes > 0 {
                be.copy_d2d(slots.resolve(dst)?, slots.resolve(src)?, *bytes, stream)?;
            }
        }
        Op::Memzero(dst) => {
            if dst.size > 0 {
                be.memset_d8(slots.resolve(dst)?, 0, dst.size, stream)?;
            }
        }
        Op::Memset32 { dst, value } => {
            if dst.size > 0 {
                be.memset_d32(slots.resolve(dst)?, *value, dst.size / 4, stream)?;
            }
        }
        Op::While {
            name,
            condition_result,
            condition,
            body,
            trip_count,
        } => {
            nest.push(0);
            let result = run_while(
                env,
                name,
                condition_result,
                condition,
                body,
                *trip_count,
                slots,
                stream,
                nest,
            );
            nest.pop();
            result?;
        }
        Op::Conditional {
            name,
            index,
            is_pred,
            branches,
        } => run_conditional(env, name, index, *is_pred, branches, slots, stream, nest)?,
        Op::Sequential(ops) => run_seq(env, ops, slots, stream, nest)?,
        Op::DynamicSlice { windows, embedded } => {
            let table = crate::dynamic_slice::embedded_table(windows, slots, nest)?;
            run_seq(env, embedded, &table, stream, nest)?;
        }
        Op::AsyncStart {
            id,
            stream: idx,
            ops,
        } => run_async_start(env, *id, *idx, ops, slots, stream, nest)?,
        Op::Collective(c) => {
            let r = env.collectives.get(c.index).ok_or_else(|| {
                RuntimeError::invalid(format!("collective '{}' was not resolved", c.name))
            })?;
            crate::collective::run(be, c, r, slots, stream)
                .map_err(|e| RuntimeError::invalid(format!("collective '{}': {e}", c.name)))?;
        }
        Op::LogicalId { dst, partition } => {
            let v = if *partition {
                env.logical.1
            } else {
                env.logical.0
            };
            be.memset_d32(slots.resolve(dst)?, v, 1, stream)?;
        }
        Op::CustomCall(c) => {
            let call_env = crate::custom_call::CallEnv {
                backend: be,
                vmm: env.vmm,
                context: env.call_context,
                capturing: env.capturing,
            };
            crate::custom_call::run(call_env, c, slots, stream)?
        }
        Op::HostExecute(h) => {
            if env.capturing {
                return Err(RuntimeError::unsupported(format!(
                    "host compute '{}' cannot be captured into a graph",
                    h.name
                )));
            }
            crate::host_execute::run(be, env.host_staging, h, slots, stream)?
        }
        Op::Trsm(t) => crate::trsm::run(be, env.gemm, t, slots, stream)?,
        Op::Fft(f) => crate::fft::run(be, env.gemm, env.scratch, f, slots, stream)?,
        Op::Conv(c) => crate::conv::run(env.gemm, c, slots, stream)?,
        Op::AsyncDone { id } => {
            let (_, done) = env
                .events
                .get(id)
                .ok_or_else(|| RuntimeError::invalid(format!("async done {id} without a start")))?;
            be.stream_wait_event(stream, done)?;
        }
    }
    Ok(())
}

/// XLA's conditional: the branch its index picks (a predicate: true picks
/// branch 0; an s32 out of range picks the last), read on the host, or
/// picked on the device in a capture ([`capture_conditional`]).
#[allow(clippy::too_many_arguments)]
fn run_conditional<B: Backend>(
    env: &ExecEnv<'_, B>,
    name: &str,
    index: &xla_vmm::Slice,
    is_pred: bool,
    branches: &[Vec<Op<B>>],
    slots: &SlotTable,
    stream: &B::Stream,
    nest: &mut Vec<i64>,
) -> Result<()> {
    let n = branches.len();
    if n == 0 {
        return Ok(());
    }
    if env.capturing {
        return capture_conditional(env, name, index, is_pred, branches, slots, stream, nest);
    }
    let branch = if is_pred {
        let v = read_scalar(env, slots, index, 1, stream, name)?;
        // XLA: true selects branch 0, false branch 1.
        if v[0] != 0 {
            0
        } else {
            1
        }
    } else {
        let v = read_scalar(env, slots, index, 4, stream, name)?;
        let i = i32::from_le_bytes([v[0], v[1], v[2], v[3]]);
        // Out of range selects the last branch (XLA's default).
        if i < 0 || i as usize >= n {
            n - 1
        } else {
            i as usize
        }
    };
    let ops = branches
        .get(branch)
        .ok_or_else(|| RuntimeError::invalid(format!("{name}: branch {branch} of {n}")))?;
    run_seq(env, ops, slots, stream, nest)
}

/// An async start: `ops` on their stream, after the work before it on
/// `stream`, its done event recorded after them.
fn run_async_start<B: Backend>(
    env: &ExecEnv<'_, B>,
    id: u64,
    idx: AsyncStream,
    ops: &[Op<B>],
    slots: &SlotTable,
    stream: &B::Stream,
    nest: &mut Vec<i64>,
) -> Result<()> {
    let be = env.backend;
    let (pool, i, what) = match idx {
        AsyncStream::Compute(i) => (env.aux_streams, i, "compute"),
        AsyncStream::Comm(i) => (env.comm_streams, i, "communication"),
    };
    let aux = pool.get(i).ok_or_else(|| {
        RuntimeError::invalid(format!("async {what} stream {i} of {}", pool.len()))
    })?;
    let (start, done) = env
        .events
        .get(&id)
        .ok_or_else(|| RuntimeError::invalid(format!("no events for async id {id}")))?;
    be.event_record(start, stream)?;
    be.stream_wait_event(aux, start)?;
    run_seq(env, ops, slots, aux, nest)?;
    be.event_record(done, aux)?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_while<B: Backend>(
    env: &ExecEnv<'_, B>,
    name: &str,
    condition_result: &xla_vmm::Slice,
    condition: &[Op<B>],
    body: &[Op<B>],
    trip_count: Option<i64>,
    slots: &SlotTable,
    stream: &B::Stream,
    nest: &mut Vec<i64>,
) -> Result<()> {
    let last = nest.len() - 1;
    if let Some(n) = trip_count {
        // Known trip count: the body runs n times, the condition never.
        for i in 0..n.max(0) {
            nest[last] = i;
            run_seq(env, body, slots, stream, nest)?;
        }
        return Ok(());
    }
    if env.capturing {
        return capture_while(
            env,
            name,
            condition_result,
            condition,
            body,
            slots,
            stream,
            nest,
        );
    }
    let mut i = 0i64;
    loop {
        nest[last] = i;
        run_seq(env, condition, slots, stream, nest)?;
        let v = read_scalar(env, slots, condition_result, 1, stream, name)?;
        if v[0] == 0 {
            return Ok(());
        }
        run_seq(env, body, slots, stream, nest)?;
        i += 1;
    }
}

/// Capture what `walk` enqueues on `stream` into a graph, holding the
/// capture gate (no vendor work while the stream captures,
/// `capture_gate`). A walk that fails leaves no graph behind: the capture
/// ends and what it recorded is destroyed, and the walk's error is the
/// answer.
pub(crate) fn capture_graph<B: Backend>(
    be: &B,
    stream: &B::Stream,
    walk: impl FnOnce() -> Result<()>,
) -> Result<B::Graph> {
    let gate = xla_vmm_device::capture_gate::capture();
    be.stream_begin_capture(stream)?;
    let walked = walk();
    let captured = be.stream_end_capture(stream);
    drop(gate);
    match (walked, captured) {
        (Ok(()), captured) => Ok(captured?),
        (Err(e), Ok(graph)) => {
            Teardown::new("the graph of a failed capture")
                .check("graph_destroy", be.graph_destroy(graph));
            Err(e)
        }
        (Err(e), Err(_)) => Err(e),
    }
}

/// Why `ops` cannot be captured into a graph (`None`: it can): a
/// conditional picks its branch on the host, and a while loop without a
/// trip count needs conditional graph nodes and an iteration-free body;
/// triangular solves and FFTs need an `engine` whose library calls a
/// capture takes ([`GemmEngine::library_calls_capturable`]).
pub(crate) fn capture_blocker<B: Backend>(
    ops: &[Op<B>],
    info: &xla_vmm_device::DeviceInfo,
    engine: Option<&dyn GemmEngine<B>>,
) -> Option<String> {
    let conditional_nodes = info.conditional_nodes;
    let library_capture = engine.is_some_and(|e| e.library_calls_capturable());
    ops.iter().find_map(|op| match op {
        Op::Conditional { name, branches, .. } => {
            if !info.case_nodes {
                return Some(format!(
                    "conditional {name} reads its branch index on the host (conditionals are not captured on this device)"
                ));
            }
            branches
                .iter()
                .find_map(|b| capture_blocker(b, info, engine))
        }
        Op::While {
            name,
            condition,
            body,
            trip_count,
            ..
        } => {
            if trip_count.is_none() {
                if !conditional_nodes {
                    return Some(format!(
                        "while {name} has no known trip count and this device has no conditional graph nodes"
                    ));
                }
                if depends_on_iteration(condition) || depends_on_iteration(body) {
                    return Some(format!(
                        "while {name} has no known trip count and its body depends on the iteration number"
                    ));
                }
            }
            capture_blocker(condition, info, engine)
                .or_else(|| capture_blocker(body, info, engine))
        }
        Op::Conv(c) => Some(format!(
            "convolution {} runs through cuDNN's execution API (XLA keeps convolution thunks out of its command buffers too)",
            c.run.name
        )),
        Op::Trsm(t) if !library_capture => Some(format!(
            "triangular solve {} runs through a BLAS library this backend does not capture",
            t.name
        )),
        Op::Fft(f) if !library_capture => Some(format!(
            "fft {} runs through an FFT library this backend does not capture",
            f.run.name
        )),
        Op::HostExecute(h) => Some(format!(
            "host compute {} runs on the host between device work (XLA keeps the host-execute thunks out of its command buffers too)",
            h.name
        )),
        Op::CustomCall(c) if !c.call.graph_compatible() => Some(format!(
            "custom call '{}' ({}) has an FFI handler that is not command-buffer compatible",
            c.target, c.name
        )),
        Op::Sequential(ops) | Op::AsyncStart { ops, .. } => capture_blocker(ops, info, engine),
        Op::DynamicSlice { embedded, .. } => capture_blocker(embedded, info, engine),
        _ => None,
    })
}

/// Does `ops` hold a library call (an FFT, a triangular solve)?
pub(crate) fn has_library_calls<B: Backend>(ops: &[Op<B>]) -> bool {
    any_op(ops, &|op| matches!(op, Op::Fft(_) | Op::Trsm(_)))
}

/// Does `pred` hold for an op of `ops` or of the ops nested in them (a
/// loop's condition and body, a conditional's branches, a sequence, an
/// async region, a dynamic slice's embedded ops)?
fn any_op<B: Backend>(ops: &[Op<B>], pred: &impl Fn(&Op<B>) -> bool) -> bool {
    ops.iter().any(|op| {
        pred(op)
            || match op {
                Op::While {
                    condition, body, ..
                } => any_op(condition, pred) || any_op(body, pred),
                Op::Conditional { branches, .. } => branches.iter().any(|b| any_op(b, pred)),
                Op::Sequential(ops) | Op::AsyncStart { ops, .. } => any_op(ops, pred),
                Op::DynamicSlice { embedded, .. } => any_op(embedded, pred),
                _ => false,
            }
    })
}

/// Does anything in `ops` depend on the iteration number of an enclosing
/// loop (a dynamic-slice window with a non-zero stride)?
fn depends_on_iteration<B: Backend>(ops: &[Op<B>]) -> bool {
    any_op(ops, &|op| {
        matches!(op, Op::DynamicSlice { windows, .. }
            if windows.iter().any(|w| matches!(w.config, Some((Some(_), _, stride)) if stride != 0)))
    })
}

/// A conditional inside a capture: one graph node per branch, the branch
/// picked on the device from the index when the graph runs
/// (`Backend::capture_case`), with XLA's rules (a predicate: true picks
/// branch 0; an index out of range picks the last).
#[allow(clippy::too_many_arguments)]
fn capture_conditional<B: Backend>(
    env: &ExecEnv<'_, B>,
    name: &str,
    index: &xla_vmm::Slice,
    is_pred: bool,
    branches: &[Vec<Op<B>>],
    slots: &SlotTable,
    stream: &B::Stream,
    nest: &mut Vec<i64>,
) -> Result<()> {
    if !env.backend.info().case_nodes {
        return Err(RuntimeError::unsupported(format!(
            "{name}: a conditional needs conditional graph nodes in graph mode"
        )));
    }
    let need = if is_pred { 1 } else { 4 };
    if index.size < need {
        return Err(RuntimeError::invalid(format!(
            "{name}: {}-byte branch index, need {need}",
            index.size
        )));
    }
    let at = slots.resolve(index)?;
    let mut failed: Option<RuntimeError> = None;
    let captured = env
        .backend
        .capture_case(stream, at, is_pred, branches.len(), &mut |b, s| {
            run_seq(env, &branches[b], slots, s, nest).map_err(|e| {
                let msg = e.to_string();
                failed = Some(e);
                xla_vmm_device::DeviceError::InvalidArgument(msg)
            })
        });
    match (captured, failed) {
        (_, Some(e)) => Err(e),
        (r, None) => Ok(r?),
    }
}

/// A while loop without trip count inside a capture: the condition once,
/// then a WHILE node whose body is `body; condition` (XLA's command-buffer
/// form of the same loop).
#[allow(clippy::too_many_arguments)]
fn capture_while<B: Backend>(
    env: &ExecEnv<'_, B>,
    name: &str,
    condition_result: &xla_vmm::Slice,
    condition: &[Op<B>],
    body: &[Op<B>],
    slots: &SlotTable,
    stream: &B::Stream,
    nest: &mut Vec<i64>,
) -> Result<()> {
    if !env.backend.info().conditional_nodes {
        return Err(RuntimeError::unsupported(format!(
            "{name}: a while loop without trip count needs conditional graph nodes in graph mode"
        )));
    }
    if depends_on_iteration(condition) || depends_on_iteration(body) {
        return Err(RuntimeError::unsupported(format!(
            "{name}: a while loop without trip count whose body depends on the iteration number \
             cannot be captured (the iteration is only known on the device)"
        )));
    }
    if condition_result.size < 1 {
        return Err(RuntimeError::invalid(format!(
            "{name}: empty condition result slice"
        )));
    }
    run_seq(env, condition, slots, stream, nest)?;
    let predicate = slots.resolve(condition_result)?;
    let mut inner: Option<RuntimeError> = None;
    let captured = env.backend.capture_while(stream, predicate, &mut |s| {
        let r = run_seq(env, body, slots, s, nest)
            .and_then(|()| run_seq(env, condition, slots, s, nest));
        r.map_err(|e| {
            let msg = e.to_string();
            inner = Some(e);
            xla_vmm_device::DeviceError::InvalidArgument(msg)
        })
    });
    match (captured, inner) {
        (_, Some(e)) => Err(e),
        (Err(e), None) => Err(e.into()),
        (Ok(()), None) => Ok(()),
    }
}
