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

use xla_vmm_device::blas::{GemmEngine, MatmulArgs, TrsmArgs};
use xla_vmm_device::dnn::{ConvArgs, FusedArgs};
use xla_vmm_device::vmm::VmmContext;
use xla_vmm_device::{Backend, DevicePtr};

use crate::collective::Resolved;
use crate::custom_call::{CallBuffer, CallContext, CallScratch, Invocation};
use crate::error::{Result, RuntimeError};
use crate::ops::{AsyncStream, CallOperand, CustomCallOp, Op, ParamSpec, TrsmOp};
use crate::slots::{DeviceBuffer, SlotTable};

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
    pub(crate) staging: Option<&'a crate::staging::Staging<B>>,
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

fn opt(slots: &SlotTable, s: &Option<xla_vmm::Slice>) -> Result<DevicePtr> {
    match s {
        Some(s) => slots.resolve(s),
        None => Ok(DevicePtr::NULL),
    }
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
        Op::Gemm {
            name,
            plan,
            a,
            b,
            c,
            d,
            bias,
            aux,
            scales,
            workspace,
        } => {
            let engine = env
                .gemm
                .ok_or_else(|| RuntimeError::unsupported("no BLAS-Lt engine"))?;
            let args = MatmulArgs {
                a: slots.resolve(a)?,
                b: slots.resolve(b)?,
                c: slots.resolve(c)?,
                d: slots.resolve(d)?,
                bias: opt(slots, bias)?,
                aux: opt(slots, aux)?,
                a_scale: opt(slots, &scales[0])?,
                b_scale: opt(slots, &scales[1])?,
                c_scale: opt(slots, &scales[2])?,
                d_scale: opt(slots, &scales[3])?,
                d_amax: opt(slots, &scales[4])?,
                workspace: opt(slots, workspace)?,
                workspace_bytes: workspace.map(|w| w.size).unwrap_or(0),
            };
            engine
                .run(*plan, &args, stream)
                .map_err(|e| RuntimeError::invalid(format!("matmul '{name}': {e}")))?;
        }
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
        } => {
            let n = branches.len();
            if n == 0 {
                return Ok(());
            }
            if env.capturing {
                return capture_conditional(
                    env, name, index, *is_pred, branches, slots, stream, nest,
                );
            }
            let branch = if *is_pred {
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
            run_seq(env, ops, slots, stream, nest)?;
        }
        Op::Sequential(ops) => run_seq(env, ops, slots, stream, nest)?,
        Op::DynamicSlice { windows, embedded } => {
            let table = crate::dynamic_slice::embedded_table(windows, slots, nest)?;
            run_seq(env, embedded, &table, stream, nest)?;
        }
        Op::AsyncStart {
            id,
            stream: idx,
            ops,
        } => {
            let (pool, i, what) = match *idx {
                AsyncStream::Compute(i) => (env.aux_streams, i, "compute"),
                AsyncStream::Comm(i) => (env.comm_streams, i, "communication"),
            };
            let aux = pool.get(i).ok_or_else(|| {
                RuntimeError::invalid(format!("async {what} stream {i} of {}", pool.len()))
            })?;
            let (start, done) = env
                .events
                .get(id)
                .ok_or_else(|| RuntimeError::invalid(format!("no events for async id {id}")))?;
            be.event_record(start, stream)?;
            be.stream_wait_event(aux, start)?;
            run_seq(env, ops, slots, aux, nest)?;
            be.event_record(done, aux)?;
        }
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
        Op::CustomCall(c) => run_custom_call(env, c, slots, stream)?,
        Op::HostExecute(h) => {
            if env.capturing {
                return Err(RuntimeError::unsupported(format!(
                    "host compute '{}' cannot be captured into a graph",
                    h.name
                )));
            }
            crate::host_execute::run(be, env.host_staging, h, slots, stream)?
        }
        Op::Trsm(t) => run_trsm(env, t, slots, stream)?,
        Op::Fft(f) => crate::fft::run(env, f, slots, stream)?,
        Op::Conv(c) => {
            let engine = env
                .gemm
                .ok_or_else(|| RuntimeError::unsupported("convolution: no DNN engine"))?;
            let args = ConvArgs {
                x: slots.resolve(&c.run.x)?,
                w: slots.resolve(&c.run.w)?,
                y: slots.resolve(&c.run.y)?,
                workspace: slots.resolve(&c.run.scratch)?,
                workspace_bytes: c.run.scratch.size,
                fused: match &c.run.fused {
                    Some(f) => Some(FusedArgs {
                        side_input: slots.resolve(&f.side_input)?,
                        bias: slots.resolve(&f.bias)?,
                    }),
                    None => None,
                },
            };
            engine
                .run_conv(c.plan, &args, stream)
                .map_err(|e| RuntimeError::invalid(format!("convolution '{}': {e}", c.run.name)))?;
        }
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

/// XLA's `RunTriangularSolve`: one matrix is solved directly; a batch goes
/// through the batched solve, whose two pointer arrays (`a + i * a_stride`,
/// `b + i * b_stride`) are written into `temp` first, on the same stream, as
/// 32-bit memsets (two per pointer: capturable on every backend; XLA
/// launches a small kernel for the same).
fn run_trsm<B: Backend>(
    env: &ExecEnv<'_, B>,
    t: &TrsmOp,
    slots: &SlotTable,
    stream: &B::Stream,
) -> Result<()> {
    let engine = env
        .gemm
        .ok_or_else(|| RuntimeError::unsupported("triangular solve: no BLAS engine"))?;
    let (a, b) = (slots.resolve(&t.a)?, slots.resolve(&t.b)?);
    let args = if t.spec.batch > 1 && !t.spec.is_empty() {
        let count = t.spec.batch as u64;
        let a_ptrs = slots.resolve(&t.temp)?;
        let b_ptrs = a_ptrs.offset(8 * count);
        for (table, base, stride) in [(a_ptrs, a, t.a_stride), (b_ptrs, b, t.b_stride)] {
            for i in 0..count {
                let p = base.0 + i * stride;
                let at = table.offset(8 * i);
                env.backend.memset_d32(at, p as u32, 1, stream)?;
                env.backend
                    .memset_d32(at.offset(4), (p >> 32) as u32, 1, stream)?;
            }
        }
        TrsmArgs::Batched { a_ptrs, b_ptrs }
    } else {
        TrsmArgs::Single { a, b }
    };
    engine
        .trsm(&t.spec, args, stream)
        .map_err(|e| RuntimeError::invalid(format!("triangular solve '{}': {e}", t.name)))
}

/// XLA's `CustomCallThunk::ExecuteFfiHandler`: the handler gets the stream,
/// the device, every operand and result as a typed buffer (a token as a
/// `TOKEN` buffer without data) and the run's execute context.
fn run_custom_call<B: Backend>(
    env: &ExecEnv<'_, B>,
    c: &CustomCallOp,
    slots: &SlotTable,
    stream: &B::Stream,
) -> Result<()> {
    if env.capturing && !c.call.graph_compatible() {
        return Err(RuntimeError::unsupported(format!(
            "custom call '{}': its handler is not command-buffer compatible, it cannot be captured",
            c.target
        )));
    }
    let buffers = |v: &[Option<CallOperand>]| -> Result<Vec<CallBuffer>> {
        v.iter()
            .map(|o| match o {
                Some(o) => Ok(CallBuffer {
                    dtype: o.dtype,
                    data: slots.resolve(&o.slice)?,
                    dims: o.dims.clone(),
                }),
                None => Ok(CallBuffer {
                    dtype: xla_vmm::ElementType::TOKEN.0,
                    data: DevicePtr::NULL,
                    dims: Vec::new(),
                }),
            })
            .collect()
    };
    let (args, rets) = (buffers(&c.operands)?, buffers(&c.results)?);
    let scratch = Scratch {
        vmm: env.vmm,
        capturing: env.capturing,
        buffers: std::sync::Mutex::new(Vec::new()),
    };
    let call = Invocation {
        stream: env.backend.stream_native(stream),
        device_ordinal: env.backend.info().ordinal,
        args: &args,
        rets: &rets,
        context: env.call_context,
        scratch: &scratch,
    };
    tracing::trace!(target = %c.target, name = %c.name, "custom call");
    let r = c.call.execute(&call).map_err(|e| {
        RuntimeError::Handler(format!("custom call '{}' ({}): {e}", c.target, c.name))
    });
    // Scratch memory outlives the work the handler enqueued on the stream.
    let buffers = scratch
        .buffers
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    let released = (|| -> Result<()> {
        if !buffers.is_empty() {
            env.backend.stream_synchronize(stream)?;
            for b in buffers {
                b.free()?;
            }
        }
        Ok(())
    })();
    r.and(released)
}

/// A custom call's scratch memory: one VMM buffer per request, released
/// after the call ([`run_custom_call`]).
struct Scratch<'a, B: Backend> {
    vmm: &'a VmmContext<B>,
    capturing: bool,
    buffers: std::sync::Mutex<Vec<DeviceBuffer<B>>>,
}

impl<B: Backend> CallScratch for Scratch<'_, B> {
    fn allocate(&self, bytes: u64, alignment: u64) -> std::result::Result<DevicePtr, String> {
        if self.capturing {
            return Err("device memory for a custom call inside a graph capture".into());
        }
        let granule = self.vmm.backend().info().vmm_granularity.max(1);
        if alignment > granule || (alignment > 0 && !alignment.is_power_of_two()) {
            return Err(format!(
                "alignment {alignment} (at most the {granule}-byte VMM granule, a power of two)"
            ));
        }
        let b = DeviceBuffer::alloc_in(self.vmm, bytes).map_err(|e| e.to_string())?;
        let p = b.ptr();
        self.buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(b);
        Ok(p)
    }

    fn free(&self, ptr: DevicePtr) -> std::result::Result<(), String> {
        let known = self
            .buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|b| b.ptr() == ptr);
        if known {
            Ok(())
        } else {
            Err(format!("{ptr:?} was not allocated for this call"))
        }
    }
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

/// Why `ops` cannot be captured into a graph (`None`: it can): a
/// conditional picks its branch on the host, and a while loop without a
/// trip count needs conditional graph nodes and an iteration-free body.
pub(crate) fn capture_blocker<B: Backend>(
    ops: &[Op<B>],
    conditional_nodes: bool,
) -> Option<String> {
    ops.iter().find_map(|op| match op {
        Op::Conditional { name, branches, .. } => {
            if !conditional_nodes {
                return Some(format!(
                    "conditional {name} reads its branch index on the host (this device has no conditional graph nodes)"
                ));
            }
            branches
                .iter()
                .find_map(|b| capture_blocker(b, conditional_nodes))
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
            capture_blocker(condition, conditional_nodes)
                .or_else(|| capture_blocker(body, conditional_nodes))
        }
        Op::Conv(c) => Some(format!(
            "convolution {} runs through cuDNN's execution API (XLA keeps convolution thunks out of its command buffers too)",
            c.run.name
        )),
        Op::Trsm(t) => Some(format!(
            "triangular solve {} runs through the BLAS library (XLA keeps the thunk out of its command buffers too)",
            t.name
        )),
        Op::Fft(f) => Some(format!(
            "fft {} runs through the FFT library (XLA keeps FFT thunks out of its command buffers too)",
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
        Op::Sequential(ops) | Op::AsyncStart { ops, .. } => capture_blocker(ops, conditional_nodes),
        Op::DynamicSlice { embedded, .. } => capture_blocker(embedded, conditional_nodes),
        _ => None,
    })
}

/// Does anything in `ops` depend on the iteration number of an enclosing
/// loop (a dynamic-slice window with a non-zero stride)?
fn depends_on_iteration<B: Backend>(ops: &[Op<B>]) -> bool {
    ops.iter().any(|op| match op {
        Op::DynamicSlice { windows, embedded } => {
            windows
                .iter()
                .any(|w| matches!(w.config, Some((Some(_), _, stride)) if stride != 0))
                || depends_on_iteration(embedded)
        }
        Op::While {
            condition, body, ..
        } => depends_on_iteration(condition) || depends_on_iteration(body),
        Op::Conditional { branches, .. } => branches.iter().any(|b| depends_on_iteration(b)),
        Op::Sequential(ops) | Op::AsyncStart { ops, .. } => depends_on_iteration(ops),
        _ => false,
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
    if !env.backend.info().conditional_nodes {
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
