//! WHILE loops and XLA's conditionals inside a stream capture, as CUDA
//! conditional graph nodes.
//!
//! A conditional node runs its body graph while (WHILE) or if (IF) a
//! *conditional handle* is non-zero. The handle is not memory: only device
//! code can set it (the device runtime builtin `cudaGraphSetConditional`).
//! So a one-thread kernel ([`SET_CONDITION_PTX`], written for this crate)
//! copies the value in device memory into the handle:
//!
//! ```text
//! WHILE:  ... -> set_condition(h, pred) -> WHILE(h) { body ; set_condition(h, pred) } -> ...
//! CASE:   ... -> set_case(h0, index, 0) -> ... -> set_case(hn, index, n)
//!             -> IF(h0) { branch 0 } -> ... -> IF(hn) { branch n } -> ...
//! ```
//!
//! A conditional of n branches is n IF nodes, each with its own handle, all
//! set before the first branch runs (a branch may write the index's memory);
//! IF nodes need a 12.4 driver, where a SWITCH node would need 12.8. A body
//! is recorded by capturing a second stream into the node's body graph
//! (`cuStreamBeginCaptureToGraph`); the outer stream's capture dependencies
//! are then set to the node, so later work follows it.

use xla_vmm_ffi::cuda::driver as sys;

use super::{handles::CudaFunction, result, CudaBackend, CudaStream};
use crate::backend::{Backend, DevicePtr, ImageKind, LaunchConfig};
use crate::checks::ArgChecks;
use crate::error::{DeviceError, Result};

/// Two one-thread kernels:
/// - `xla_vmm_set_condition(handle: u64, predicate: *const u8)` sets the
///   handle to 1 if `*predicate != 0`, else 0;
/// - `xla_vmm_set_case(handle: u64, index: *const void, is_pred: u32, n:
///   u32, which: u32)` sets the handle to 1 if XLA's conditional picks
///   branch `which` of `n` (a predicate byte: true picks 0, false 1; an
///   s32: out of range, negative included, picks `n - 1`), else 0.
pub const SET_CONDITION_PTX: &str = r#"
.version 8.3
.target sm_50
.address_size 64

.extern .func cudaGraphSetConditional
(
	.param .b64 handle,
	.param .b32 value
)
;

.visible .entry xla_vmm_set_condition(
	.param .u64 p_handle,
	.param .u64 p_predicate
)
{
	.reg .b64 	%rd<4>;
	.reg .b16 	%rs<2>;
	.reg .b32 	%r<2>;
	.reg .pred 	%p<2>;

	ld.param.u64 	%rd1, [p_handle];
	ld.param.u64 	%rd2, [p_predicate];
	cvta.to.global.u64 	%rd3, %rd2;
	ld.global.u8 	%rs1, [%rd3];
	setp.ne.s16 	%p1, %rs1, 0;
	selp.u32 	%r1, 1, 0, %p1;
	{
	.param .b64 a_handle;
	st.param.b64 	[a_handle], %rd1;
	.param .b32 a_value;
	st.param.b32 	[a_value], %r1;
	call.uni cudaGraphSetConditional, (a_handle, a_value);
	}
	ret;
}

.visible .entry xla_vmm_set_case(
	.param .u64 p_handle,
	.param .u64 p_index,
	.param .u32 p_is_pred,
	.param .u32 p_n,
	.param .u32 p_which
)
{
	.reg .b64 	%rd<4>;
	.reg .b16 	%rs<2>;
	.reg .b32 	%r<8>;
	.reg .pred 	%p<5>;

	ld.param.u64 	%rd1, [p_handle];
	ld.param.u64 	%rd2, [p_index];
	ld.param.u32 	%r1, [p_is_pred];
	ld.param.u32 	%r2, [p_n];
	ld.param.u32 	%r3, [p_which];
	cvta.to.global.u64 	%rd3, %rd2;
	setp.eq.u32 	%p1, %r1, 0;
	@%p1 bra 	$L__index;
	ld.global.u8 	%rs1, [%rd3];
	setp.ne.s16 	%p2, %rs1, 0;
	selp.u32 	%r4, 0, 1, %p2;
	bra.uni 	$L__set;
$L__index:
	ld.global.u32 	%r5, [%rd3];
	add.s32 	%r6, %r2, -1;
	setp.ge.u32 	%p3, %r5, %r2;
	selp.u32 	%r4, %r6, %r5, %p3;
$L__set:
	setp.eq.u32 	%p4, %r4, %r3;
	selp.u32 	%r7, 1, 0, %p4;
	{
	.param .b64 a_handle;
	st.param.b64 	[a_handle], %rd1;
	.param .b32 a_value;
	st.param.b32 	[a_value], %r7;
	call.uni cudaGraphSetConditional, (a_handle, a_value);
	}
	ret;
}
"#;

/// The loaded kernels of [`SET_CONDITION_PTX`]: set condition, set case.
pub(super) type SetKernels = (CudaFunction, CudaFunction);

fn set_kernels(b: &CudaBackend) -> Result<SetKernels> {
    b.set_condition
        .get_or_init(|| {
            let module = b.module_load(SET_CONDITION_PTX.as_bytes(), ImageKind::Ptx)?;
            // The functions keep the module loaded for the backend's life.
            Ok((
                b.module_function(&module, "xla_vmm_set_condition")?,
                b.module_function(&module, "xla_vmm_set_case")?,
            ))
        })
        .clone()
}

fn launch_one(
    b: &CudaBackend,
    kernel: &CudaFunction,
    args: &[&[u8]],
    stream: &CudaStream,
) -> Result<()> {
    let config = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        ..Default::default()
    };
    b.launch(kernel, &config, args, stream)
}

fn launch_set(
    b: &CudaBackend,
    kernel: &CudaFunction,
    handle: u64,
    predicate: DevicePtr,
    stream: &CudaStream,
) -> Result<()> {
    launch_one(
        b,
        kernel,
        &[&handle.to_ne_bytes(), &predicate.0.to_ne_bytes()],
        stream,
    )
}

/// The capture graph of `stream` (which must be capturing), after checking
/// the backend has conditional nodes.
fn capturing_graph(b: &CudaBackend, stream: &CudaStream, what: &str) -> Result<sys::CUgraph> {
    b.own(stream, "stream")?;
    if !b.info.conditional_nodes {
        return Err(DeviceError::Unsupported(format!(
            "conditional graph nodes ({what}) need a CUDA 12.4+ driver"
        )));
    }
    b.bind()?;
    // SAFETY: the stream is live and ours.
    let (graph, _) = unsafe { result::graph::capture_info(stream.cu_stream())? }
        .ok_or_else(|| DeviceError::InvalidArgument(format!("{what}: stream is not capturing")))?;
    Ok(graph)
}

/// Add a conditional node of `kind` on `handle` at the capture frontier of
/// `stream`, make it the frontier, and record its body by capturing a
/// second stream into the node's body graph with `body`.
fn add_node_and_capture(
    b: &CudaBackend,
    stream: &CudaStream,
    handle: u64,
    kind: result::graph::ConditionalKind,
    body: &mut dyn FnMut(&CudaStream) -> Result<()>,
) -> Result<()> {
    let s = stream.cu_stream();
    // SAFETY: the stream is live and ours; the dependency list is copied out
    // immediately.
    let (graph, deps) = unsafe { result::graph::capture_info(s)? }
        .ok_or_else(|| DeviceError::InvalidArgument("conditional: capture ended".into()))?;
    // SAFETY: `deps` are nodes of `graph` (the capture's frontier); the
    // handle was made for `graph`.
    let (node, body_graph) =
        unsafe { result::graph::add_conditional_node(graph, &deps, handle, kind, b.ctx.cu_ctx())? };
    // SAFETY: `node` belongs to the graph `s` is capturing into.
    unsafe { result::graph::set_capture_dependencies(s, &mut [node])? };

    let body_stream = b.stream_create()?;
    // SAFETY: fresh stream, not capturing; `body_graph` is the node's body.
    let begun =
        unsafe { result::graph::begin_capture_to_graph(body_stream.cu_stream(), body_graph) };
    let recorded = begun.and_then(|()| body(&body_stream));
    // Always end the body capture (if it began), even when the body failed.
    // SAFETY: the stream is live; the returned graph is the node's body,
    // owned by the node, so it is not destroyed here.
    let ended = unsafe { result::graph::end_capture(body_stream.cu_stream()) };
    let destroyed = b.stream_destroy(body_stream);
    recorded?;
    ended?;
    destroyed
}

pub(super) fn capture_case(
    b: &CudaBackend,
    stream: &CudaStream,
    index: DevicePtr,
    is_pred: bool,
    branches: usize,
    body: &mut dyn FnMut(usize, &CudaStream) -> Result<()>,
) -> Result<()> {
    let graph = capturing_graph(b, stream, "capture_case")?;
    let n = u32::try_from(branches).map_err(|_| {
        DeviceError::InvalidArgument(format!("a conditional of {branches} branches"))
    })?;
    // Loading a module during a relaxed-mode capture is allowed.
    let (_, set_case) = set_kernels(b)?;
    let mut handles = Vec::with_capacity(branches);
    for which in 0..n {
        // SAFETY: `graph` is the live capture graph, our context is current.
        let h = unsafe { result::graph::conditional_handle_create(graph, b.ctx.cu_ctx(), 0)? };
        let args: [&[u8]; 5] = [
            &h.to_ne_bytes(),
            &index.0.to_ne_bytes(),
            &u32::from(is_pred).to_ne_bytes(),
            &n.to_ne_bytes(),
            &which.to_ne_bytes(),
        ];
        launch_one(b, &set_case, &args, stream)?;
        handles.push(h);
    }
    for (i, h) in handles.into_iter().enumerate() {
        add_node_and_capture(b, stream, h, result::graph::ConditionalKind::If, &mut |s| {
            body(i, s)
        })?;
    }
    Ok(())
}

pub(super) fn capture_while(
    b: &CudaBackend,
    stream: &CudaStream,
    predicate: DevicePtr,
    body: &mut dyn FnMut(&CudaStream) -> Result<()>,
) -> Result<()> {
    let graph = capturing_graph(b, stream, "capture_while")?;
    // Loading a module during a relaxed-mode capture is allowed.
    let (set, _) = set_kernels(b)?;
    // SAFETY: `graph` is the live capture graph, our context is current.
    let handle = unsafe { result::graph::conditional_handle_create(graph, b.ctx.cu_ctx(), 0)? };
    launch_set(b, &set, handle, predicate, stream)?;
    add_node_and_capture(
        b,
        stream,
        handle,
        result::graph::ConditionalKind::While,
        &mut |s| {
            body(s)?;
            launch_set(b, &set, handle, predicate, s)
        },
    )
}
