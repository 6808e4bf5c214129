//! WHILE loops inside a stream capture, as CUDA conditional graph nodes.
//!
//! A conditional node runs its body graph while a *conditional handle* is
//! non-zero. The handle is not memory: only device code can set it (the
//! device runtime builtin `cudaGraphSetConditional`). So the loop predicate,
//! a byte in device memory, is copied into the handle by a one-thread kernel
//! ([`SET_CONDITION_PTX`], written for this crate):
//!
//! ```text
//! outer capture:  ... -> set_condition(h, pred) -> WHILE(h) { body ; set_condition(h, pred) } -> ...
//! ```
//!
//! The body is recorded by capturing a second stream into the node's body
//! graph (`cuStreamBeginCaptureToGraph`); the outer stream's capture
//! dependencies are then set to the conditional node, so later work follows
//! the loop.

use super::{handles::CudaFunction, result, CudaBackend, CudaStream};
use crate::backend::{Backend, DevicePtr, ImageKind, LaunchConfig};
use crate::checks::ArgChecks;
use crate::error::{DeviceError, Result};

/// `xla_vmm_set_condition(handle: u64, predicate: *const u8)`: sets the
/// conditional handle to 1 if `*predicate != 0`, else 0. One thread.
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
"#;

const KERNEL: &str = "xla_vmm_set_condition";

fn set_condition_kernel(b: &CudaBackend) -> Result<CudaFunction> {
    b.set_condition
        .get_or_init(|| {
            let module = b.module_load(SET_CONDITION_PTX.as_bytes(), ImageKind::Ptx)?;
            // The function keeps the module loaded for the backend's life.
            b.module_function(&module, KERNEL)
        })
        .clone()
}

fn launch_set(
    b: &CudaBackend,
    kernel: &CudaFunction,
    handle: u64,
    predicate: DevicePtr,
    stream: &CudaStream,
) -> Result<()> {
    let config = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        ..Default::default()
    };
    b.launch(
        kernel,
        &config,
        &[&handle.to_ne_bytes(), &predicate.0.to_ne_bytes()],
        stream,
    )
}

pub(super) fn capture_while(
    b: &CudaBackend,
    stream: &CudaStream,
    predicate: DevicePtr,
    body: &mut dyn FnMut(&CudaStream) -> Result<()>,
) -> Result<()> {
    b.own(stream, "stream")?;
    if !b.info.conditional_nodes {
        return Err(DeviceError::Unsupported(
            "conditional WHILE nodes need a CUDA 12.4+ driver".into(),
        ));
    }
    // Loading a module during a relaxed-mode capture is allowed.
    let kernel = set_condition_kernel(b)?;
    b.bind()?;
    let s = stream.cu_stream();
    // SAFETY: the stream is live and ours.
    let (graph, _) = unsafe { result::graph::capture_info(s)? }.ok_or_else(|| {
        DeviceError::InvalidArgument("capture_while: stream is not capturing".into())
    })?;
    // SAFETY: `graph` is the live capture graph, our context is current.
    let handle = unsafe { result::graph::conditional_handle_create(graph, b.ctx.cu_ctx(), 0)? };
    launch_set(b, &kernel, handle, predicate, stream)?;
    // SAFETY: as above; the dependency list is copied out immediately.
    let (graph, deps) = unsafe { result::graph::capture_info(s)? }
        .ok_or_else(|| DeviceError::InvalidArgument("capture_while: capture ended".into()))?;
    // SAFETY: `deps` are nodes of `graph` (the capture's frontier).
    let (node, body_graph) =
        unsafe { result::graph::add_while_node(graph, &deps, handle, b.ctx.cu_ctx())? };
    // SAFETY: `node` belongs to the graph `s` is capturing into.
    unsafe { result::graph::set_capture_dependencies(s, &mut [node])? };

    let body_stream = b.stream_create()?;
    // SAFETY: fresh stream, not capturing; `body_graph` is the node's body.
    let begun =
        unsafe { result::graph::begin_capture_to_graph(body_stream.cu_stream(), body_graph) };
    let recorded = begun.and_then(|()| {
        body(&body_stream)?;
        launch_set(b, &kernel, handle, predicate, &body_stream)
    });
    // Always end the body capture (if it began), even when the body failed.
    // SAFETY: the stream is live; the returned graph is the node's body,
    // owned by the node, so it is not destroyed here.
    let ended = unsafe { result::graph::end_capture(body_stream.cu_stream()) };
    let destroyed = b.stream_destroy(body_stream);
    recorded?;
    ended?;
    destroyed
}
