//! `ThunkProto` → [`Thunk`]. The proto's `impl` oneof is read by hand (see
//! proto/xla/backends/gpu/runtime/thunk.proto): field 1 is the
//! `ThunkInfoProto`, any other length-delimited field is the kind, decoded
//! with the prost message for that field number, or kept as
//! [`ThunkKind::Unsupported`] with its field number.

use super::collective::{collective_kind, is_collective_field};
use super::convert::{allocations, decode_msg, invalid, non_negative, opt_shape, shape, Allocs};
use super::wire::{Fields, WIRE_LEN};
use super::DecodeError;
use crate::plan::{
    thunk_kind_name, AsyncStartThunk, ConditionalThunk, ConvAlgorithm, ConvDims, ConvKind,
    ConvolutionThunk, CopyThunk, CublasLtMatmulThunk, CustomCallThunk, CustomKernelThunk, Dim3,
    DsfOffset, DsfParameter, DsfResult, DynamicSliceConfig, DynamicSliceFusionThunk,
    ExecutionStream, FftThunk, FftType, GemmConfig, GemmThunk, HostExecuteStartThunk, KernelArg,
    KernelCode, KernelParam, KernelSpec, KernelThunk, LaunchDims, MatrixLayout, OffsetExpr,
    SelectKThunk, SolveTranspose, Thunk, ThunkInfo, ThunkKind, TmaDescriptor, TriangularSolveThunk,
    WhileThunk, WindowDim,
};
use crate::proto::stream_executor::{
    self as se, gpu::TmaMetadataProto, kernel_loader_spec_proto::Payload,
};
use crate::proto::xla::buffer_assignment::BufferAllocationSliceProto;
use crate::proto::xla::gpu::{self as pg, dynamic_slice_fusion_thunk_proto as dsf};
use crate::proto::xla::{self as px, gemm_config_proto};

/// Deepest nesting of thunk sequences accepted (XLA programs nest a few
/// levels; this bounds recursion on hostile input).
pub(crate) const MAX_THUNK_DEPTH: usize = 32;

/// Decodes a list of serialized `ThunkProto`s found at `path`.
pub(crate) fn sequence(
    thunks: &[Vec<u8>],
    allocs: Allocs<'_>,
    depth: usize,
    path: &str,
) -> Result<Vec<Thunk>, DecodeError> {
    if depth > MAX_THUNK_DEPTH {
        return Err(invalid(format!(
            "{path}: thunks nested deeper than {MAX_THUNK_DEPTH} levels"
        )));
    }
    thunks
        .iter()
        .enumerate()
        .map(|(i, b)| thunk(b, allocs, depth, &format!("{path}[{i}]")))
        .collect()
}

fn seq_of(
    s: &Option<pg::ThunkSequenceProto>,
    allocs: Allocs<'_>,
    depth: usize,
    path: String,
) -> Result<Vec<Thunk>, DecodeError> {
    match s {
        Some(s) => sequence(&s.thunks, allocs, depth + 1, &path),
        None => Ok(Vec::new()),
    }
}

/// Decodes one serialized `ThunkProto`.
pub(crate) fn thunk(
    bytes: &[u8],
    allocs: Allocs<'_>,
    depth: usize,
    path: &str,
) -> Result<Thunk, DecodeError> {
    let mut info_bytes = Vec::new();
    let mut kind: Option<(u32, Vec<u8>)> = None;
    for f in Fields::new(bytes, "ThunkProto") {
        let f = f.map_err(|e| invalid(format!("{path}: {e}")))?;
        if f.wire_type != WIRE_LEN {
            continue; // not a field of ThunkProto we know; ignore like protobuf would
        }
        if f.number == 1 {
            info_bytes.extend_from_slice(f.data);
            continue;
        }
        match &mut kind {
            // The same oneof field twice: protobuf merges the messages.
            Some((n, data)) if *n == f.number => data.extend_from_slice(f.data),
            // A different oneof field: the last one wins.
            _ => kind = Some((f.number, f.data.to_vec())),
        }
    }
    let info: pg::ThunkInfoProto = decode_msg(&info_bytes, "ThunkInfoProto", path)?;
    let info = ThunkInfo {
        profile_annotation: info.profile_annotation,
        thunk_id: info.thunk_id,
        concurrent_region_id: info.concurrent_region_id,
    };
    let Some((number, data)) = kind else {
        return Ok(Thunk {
            info,
            kind: ThunkKind::Unsupported {
                kind_name: "none".into(),
                field_number: 0,
            },
        });
    };
    let name = thunk_kind_name(number).unwrap_or("unknown");
    let path = format!("{path} ({name} `{}`)", info.profile_annotation);
    // Kinds that nest thunks are dispatched here so that `kind_of`'s large
    // frame is not on the recursion path.
    let nested = match number {
        2 => Some(sequential(&data, allocs, depth, &path)?),
        6 => Some(conditional(&data, allocs, depth, &path)?),
        7 => Some(while_loop(&data, allocs, depth, &path)?),
        57 => Some(async_start(&data, allocs, depth, &path)?),
        60 => Some(dynamic_slice_fusion_kind(&data, allocs, depth, &path)?),
        n if is_collective_field(n) => collective_kind(n, &data, &path, allocs)?,
        _ => None,
    };
    let kind = match nested {
        Some(k) => Some(k),
        None => kind_of(number, &data, &path, allocs)?,
    };
    let kind = kind.unwrap_or_else(|| {
        tracing::debug!(path, number, "unsupported thunk kind");
        ThunkKind::Unsupported {
            kind_name: name.into(),
            field_number: number,
        }
    });
    Ok(Thunk { info, kind })
}

/// Decodes the oneof payload of kind `number`; `None` for kinds we do not
/// execute.
#[inline(never)]
fn kind_of(
    number: u32,
    data: &[u8],
    path: &str,
    allocs: Allocs<'_>,
) -> Result<Option<ThunkKind>, DecodeError> {
    let p = path;
    let ctx = |what: &'static str| move || format!("{p}: {what}");
    Ok(Some(match number {
        3 => ThunkKind::Copy(copy(&decode_msg(data, "CopyThunkProto", p)?, allocs, p)?),
        // The three copy kinds that wrap a `CopyThunkProto` as field 1.
        4 => {
            let m: pg::DeviceToHostCopyThunkProto =
                decode_msg(data, "DeviceToHostCopyThunkProto", p)?;
            ThunkKind::DeviceToHostCopy(wrapped_copy(m.copy_thunk, allocs, p)?)
        }
        5 => {
            let m: pg::HostToDeviceCopyThunkProto =
                decode_msg(data, "HostToDeviceCopyThunkProto", p)?;
            ThunkKind::HostToDeviceCopy(wrapped_copy(m.copy_thunk, allocs, p)?)
        }
        13 => {
            let m: pg::DeviceToDeviceCopyThunkProto =
                decode_msg(data, "DeviceToDeviceCopyThunkProto", p)?;
            ThunkKind::DeviceToDeviceCopy(wrapped_copy(m.copy_thunk, allocs, p)?)
        }
        8 => ThunkKind::Kernel(kernel(
            &decode_msg(data, "KernelThunkProto", p)?,
            allocs,
            p,
        )?),
        9 => ThunkKind::Gemm(Box::new(gemm(
            &decode_msg(data, "GemmThunkProto", p)?,
            allocs,
            p,
        )?)),
        11 => ThunkKind::TriangularSolve(Box::new(triangular_solve(
            &decode_msg(data, "TriangularSolveThunkProto", p)?,
            allocs,
            p,
        )?)),
        25 => ThunkKind::Convolution(Box::new(convolution(
            &decode_msg(data, "ConvolutionThunkProto", p)?,
            allocs,
            p,
        )?)),
        27 => ThunkKind::Fft(Box::new(fft(
            &decode_msg(data, "FftThunkProto", p)?,
            allocs,
            p,
        )?)),
        19 => {
            let m: pg::MemzeroThunkProto = decode_msg(data, "MemzeroThunkProto", p)?;
            ThunkKind::Memzero {
                dest: allocs.req_shaped(&m.dest_buffer, &ctx("dest"))?,
            }
        }
        20 => ThunkKind::SelectK(select_k(
            &decode_msg(data, "SelectKThunkProto", p)?,
            allocs,
            p,
        )?),
        28 => {
            let m: pg::Memset32BitValueThunkProto =
                decode_msg(data, "Memset32BitValueThunkProto", p)?;
            let dest = allocs.req_slice(&m.dest_buffer, &ctx("dest"))?;
            if dest.size % 4 != 0 {
                return Err(invalid(format!(
                    "{p}: memset32 destination size {} is not a multiple of 4",
                    dest.size
                )));
            }
            ThunkKind::Memset32 {
                dest,
                value: m.value,
            }
        }
        22 => ThunkKind::CublasLtMatmul(Box::new(cublas_lt(
            &decode_msg(data, "CublasLtMatmulThunkProto", p)?,
            allocs,
            p,
        )?)),
        30 => ThunkKind::CustomCall(custom_call(
            decode_msg(data, "CustomCallThunkProto", p)?,
            allocs,
            p,
        )?),
        36 => ThunkKind::CustomKernel(custom_kernel(
            &decode_msg(data, "CustomKernelThunkProto", p)?,
            allocs,
            p,
        )?),
        16 => ThunkKind::HostExecuteStart(Box::new(host_execute_start(
            decode_msg(data, "HostExecuteStartThunkProto", p)?,
            allocs,
            p,
        )?)),
        17 => {
            let m: pg::HostExecuteDoneThunkProto =
                decode_msg(data, "HostExecuteDoneThunkProto", p)?;
            ThunkKind::HostExecuteDone {
                async_events_unique_id: m.async_events_unique_id,
            }
        }
        58 => {
            let m: pg::AsyncDoneThunkProto = decode_msg(data, "AsyncDoneThunkProto", p)?;
            ThunkKind::AsyncDone {
                async_execution_id: m.async_execution_id,
            }
        }
        _ => return Ok(None),
    }))
}

fn gemm(m: &pg::GemmThunkProto, allocs: Allocs<'_>, p: &str) -> Result<GemmThunk, DecodeError> {
    let ctx = |what: &'static str| move || format!("{p}: {what}");
    Ok(GemmThunk {
        config: gemm_config(
            m.gemm_config
                .as_ref()
                .ok_or_else(|| invalid(format!("{p}: missing gemm_config")))?,
        ),
        lhs: allocs.req_slice(&m.lhs_buffer, &ctx("lhs"))?,
        rhs: allocs.req_slice(&m.rhs_buffer, &ctx("rhs"))?,
        output: allocs.req_slice(&m.output_buffer, &ctx("output"))?,
        workspace: m
            .workspace
            .as_ref()
            .map(|w| allocs.slice(w, &ctx("workspace")))
            .transpose()?,
        deterministic: m.deterministic,
    })
}

fn select_k(
    m: &pg::SelectKThunkProto,
    allocs: Allocs<'_>,
    p: &str,
) -> Result<SelectKThunk, DecodeError> {
    let ctx = |what: &'static str| move || format!("{p}: {what}");
    // input, values, indices (and, in newer XLA, a scratch slice we do not need).
    if !(3..=4).contains(&m.args.len()) {
        return Err(invalid(format!(
            "{p}: select_k has {} buffer arguments, expected 3 (input, values, indices) or 4",
            m.args.len()
        )));
    }
    let arg = |i: usize, what: &'static str| allocs.slice(&m.args[i], &ctx(what));
    Ok(SelectKThunk {
        input: arg(0, "input")?,
        values: arg(1, "values")?,
        indices: arg(2, "indices")?,
        batch: m.batch_size,
        num_elements: m.num_elements,
        k: m.k,
        element_type: crate::plan::ElementType(m.dtype),
    })
}

fn custom_call(
    m: pg::CustomCallThunkProto,
    allocs: Allocs<'_>,
    p: &str,
) -> Result<CustomCallThunk, DecodeError> {
    let ctx = |what: &'static str| move || format!("{p}: {what}");
    let nullable = |v: &[px::NullableShapedSliceProto], what: &'static str| {
        v.iter()
            .map(|n| allocs.opt_shaped(&n.shaped_slice, &ctx(what)))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(CustomCallThunk {
        operands: nullable(&m.operands, "operand")?,
        results: nullable(&m.results, "result")?,
        target_name: m.target_name,
        opaque: m.opaque.into(),
        api_version: m.api_version,
        attributes: super::ffi_attr::attributes(m.attributes, &format!("{p}: attributes"))?,
        called_computation: m.called_computation,
        use_pdl: m.use_pdl,
    })
}

fn host_execute_start(
    m: pg::HostExecuteStartThunkProto,
    allocs: Allocs<'_>,
    p: &str,
) -> Result<HostExecuteStartThunk, DecodeError> {
    let ctx = |what: &'static str| move || format!("{p}: {what}");
    let exe = m
        .executable_proto
        .ok_or_else(|| invalid(format!("{p}: host execute without executable_proto")))?;
    let shaped = |v: &[px::ShapedSliceProto], what: &'static str| {
        v.iter()
            .map(|s| allocs.shaped(s, &ctx(what)))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(HostExecuteStartThunk {
        hlo_module: exe.hlo_module.into(),
        executable_type: exe.executable_type,
        aot_result: exe.aot_compilation_result.map(crate::plan::Blob::from),
        args: shaped(&m.args, "arg")?,
        results: shaped(&m.results, "result")?,
        async_events_unique_id: m.async_events_unique_id,
    })
}

// The recursive kinds live in their own functions to keep each recursion
// level's stack frame small (debug builds give big matches big frames).

#[inline(never)]
fn sequential(
    data: &[u8],
    allocs: Allocs<'_>,
    depth: usize,
    p: &str,
) -> Result<ThunkKind, DecodeError> {
    let m: pg::SequentialThunkProto = decode_msg(data, "SequentialThunkProto", p)?;
    Ok(ThunkKind::Sequential {
        thunks: sequence(&m.thunks, allocs, depth + 1, &format!("{p}/thunks"))?,
    })
}

#[inline(never)]
fn conditional(
    data: &[u8],
    allocs: Allocs<'_>,
    depth: usize,
    p: &str,
) -> Result<ThunkKind, DecodeError> {
    let ctx = |what: &'static str| move || format!("{p}: {what}");
    let m: pg::ConditionalThunkProto = decode_msg(data, "ConditionalThunkProto", p)?;
    let branches = m
        .branch_thunks
        .iter()
        .enumerate()
        .map(|(i, b)| sequence(&b.thunks, allocs, depth + 1, &format!("{p}/branch{i}")))
        .collect::<Result<_, _>>()?;
    Ok(ThunkKind::Conditional(ConditionalThunk {
        branch_index: allocs.req_shaped(&m.branch_index_buffer, &ctx("branch index"))?,
        branches,
    }))
}

#[inline(never)]
fn while_loop(
    data: &[u8],
    allocs: Allocs<'_>,
    depth: usize,
    p: &str,
) -> Result<ThunkKind, DecodeError> {
    let ctx = |what: &'static str| move || format!("{p}: {what}");
    let m: pg::WhileThunkProto = decode_msg(data, "WhileThunkProto", p)?;
    Ok(ThunkKind::While(WhileThunk {
        condition_result: allocs
            .req_slice(&m.condition_result_buffer_index, &ctx("condition result"))?,
        condition: seq_of(
            &m.condition_thunk_sequence,
            allocs,
            depth,
            format!("{p}/cond"),
        )?,
        body: seq_of(&m.body_thunk_sequence, allocs, depth, format!("{p}/body"))?,
        trip_count: m.trip_count,
    }))
}

#[inline(never)]
fn dynamic_slice_fusion_kind(
    data: &[u8],
    allocs: Allocs<'_>,
    depth: usize,
    p: &str,
) -> Result<ThunkKind, DecodeError> {
    let m: pg::DynamicSliceFusionThunkProto = decode_msg(data, "DynamicSliceFusionThunkProto", p)?;
    Ok(ThunkKind::DynamicSliceFusion(dynamic_slice_fusion(
        &m, allocs, depth, p,
    )?))
}

#[inline(never)]
fn async_start(
    data: &[u8],
    allocs: Allocs<'_>,
    depth: usize,
    p: &str,
) -> Result<ThunkKind, DecodeError> {
    use pg::async_start_thunk_proto::ExecutionStreamId as S;
    let m: pg::AsyncStartThunkProto = decode_msg(data, "AsyncStartThunkProto", p)?;
    Ok(ThunkKind::AsyncStart(AsyncStartThunk {
        async_execution_id: m.async_execution_id,
        stream: match m.execution_stream_id {
            Some(S::ComputationStreamId(id)) => ExecutionStream::Computation(id),
            Some(S::CommunicationStreamId(id)) => ExecutionStream::Communication(id),
            None => ExecutionStream::Default,
        },
        thunks: seq_of(&m.thunks, allocs, depth, format!("{p}/thunks"))?,
    }))
}

fn copy(m: &pg::CopyThunkProto, allocs: Allocs<'_>, p: &str) -> Result<CopyThunk, DecodeError> {
    let source = allocs.req_shaped(&m.source_buffer, &|| format!("{p}: source"))?;
    let destination = allocs.req_shaped(&m.destination_buffer, &|| format!("{p}: destination"))?;
    let mem_size = non_negative(m.mem_size, &|| format!("{p}: mem_size"))?;
    if mem_size > source.slice.size || mem_size > destination.slice.size {
        return Err(invalid(format!(
            "{p}: copies {mem_size} bytes between slices of {} and {} bytes",
            source.slice.size, destination.slice.size
        )));
    }
    Ok(CopyThunk {
        source,
        destination,
        mem_size,
    })
}

/// The `copy_thunk` field of a device-to-device, device-to-host or
/// host-to-device copy thunk.
fn wrapped_copy(
    m: Option<pg::CopyThunkProto>,
    allocs: Allocs<'_>,
    p: &str,
) -> Result<CopyThunk, DecodeError> {
    let c = m.ok_or_else(|| invalid(format!("{p}: missing copy_thunk")))?;
    copy(&c, allocs, p)
}

fn dim3(d: Option<&se::Dim3DProto>, p: &str, what: &str) -> Result<Dim3, DecodeError> {
    let d = d.cloned().unwrap_or_default();
    let f = |v: i64, axis: &str| non_negative(v, &|| format!("{p}: {what}.{axis}"));
    Ok(Dim3 {
        x: f(d.x, "x")?,
        y: f(d.y, "y")?,
        z: f(d.z, "z")?,
    })
}

/// Launch dimensions of kernel and custom-kernel thunks; `shared_memory` is
/// the byte count and the name of its proto field (for the error message).
fn launch_dims(
    blocks: Option<&se::Dim3DProto>,
    threads: Option<&se::Dim3DProto>,
    cluster: Option<&se::ClusterDimProto>,
    shared_memory: (i64, &str),
    p: &str,
) -> Result<LaunchDims, DecodeError> {
    let (shmem, field) = shared_memory;
    Ok(LaunchDims {
        blocks: dim3(blocks, p, "blocks")?,
        threads: dim3(threads, p, "threads")?,
        cluster: cluster
            .map(|c| dim3(c.coordinates.as_ref(), p, "cluster"))
            .transpose()?,
        shared_memory_bytes: non_negative(shmem, &|| format!("{p}: {field}"))?,
    })
}

fn tma(
    m: &TmaMetadataProto,
    n_args: usize,
    p: &str,
) -> Result<Vec<(usize, TmaDescriptor)>, DecodeError> {
    let mut out = Vec::new();
    for (&arg, d) in &m.arg_index_to_tma_info {
        let i = usize::try_from(arg)
            .ok()
            .filter(|&i| i < n_args)
            .ok_or_else(|| {
                invalid(format!(
                    "{p}: TMA descriptor for argument {arg} of {n_args}"
                ))
            })?;
        let nn = |v: &[i64], what: &str| {
            v.iter()
                .map(|&x| non_negative(x, &|| format!("{p}: TMA {what}")))
                .collect::<Result<Vec<_>, _>>()
        };
        let nn32 = |v: &[i32], what: &str| {
            v.iter()
                .map(|&x| {
                    u32::try_from(x).map_err(|_| invalid(format!("{p}: TMA {what}: negative {x}")))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        out.push((
            i,
            TmaDescriptor {
                element_size: non_negative(d.element_size, &|| format!("{p}: TMA element_size"))?,
                global_dims: nn(&d.global_dims, "global_dims")?,
                global_strides: nn(&d.global_strides, "global_strides")?,
                box_dims: nn32(&d.box_dims, "box_dims")?,
                element_strides: nn32(&d.element_strides, "element_strides")?,
                interleave: d.interleave,
                swizzle: d.swizzle,
                l2_promotion: d.l2_promotion,
                float_oob_fill: d.float_oob_fill,
            },
        ));
    }
    Ok(out)
}

/// Shared by kernel and custom-kernel thunks: zips slices, shapes, written
/// flags and TMA descriptors into args, and checks zeroed indices.
fn kernel_args(
    slices: Vec<(crate::plan::Slice, Option<crate::plan::Shape>)>,
    written: &[bool],
    tma_meta: Option<&TmaMetadataProto>,
    zeroed: &[i64],
    p: &str,
) -> Result<(Vec<KernelArg>, Vec<u64>), DecodeError> {
    if written.len() != slices.len() {
        return Err(invalid(format!(
            "{p}: {} arguments but {} `written` flags",
            slices.len(),
            written.len()
        )));
    }
    let mut args: Vec<KernelArg> = slices
        .into_iter()
        .zip(written)
        .map(|((slice, shape), &written)| KernelArg {
            slice,
            shape,
            written,
            tma: None,
        })
        .collect();
    if let Some(m) = tma_meta {
        for (i, d) in tma(m, args.len(), p)? {
            args[i].tma = Some(d);
        }
    }
    let zeroed = zeroed
        .iter()
        .map(|&z| {
            u64::try_from(z)
                .ok()
                .filter(|&z| (z as u128) < args.len() as u128)
                .ok_or_else(|| {
                    invalid(format!(
                        "{p}: zeroed output index {z} of {} args",
                        args.len()
                    ))
                })
        })
        .collect::<Result<_, _>>()?;
    Ok((args, zeroed))
}

fn kernel(
    m: &pg::KernelThunkProto,
    allocs: Allocs<'_>,
    p: &str,
) -> Result<KernelThunk, DecodeError> {
    if !m.args_shape.is_empty() && m.args_shape.len() != m.args.len() {
        return Err(invalid(format!(
            "{p}: {} args but {} args_shape",
            m.args.len(),
            m.args_shape.len()
        )));
    }
    let slices = m
        .args
        .iter()
        .enumerate()
        .map(|(i, s)| {
            Ok((
                allocs.slice(s, &|| format!("{p}: arg {i}"))?,
                opt_shape(&m.args_shape.get(i).cloned())?,
            ))
        })
        .collect::<Result<Vec<_>, DecodeError>>()?;
    let (args, zeroed) = kernel_args(
        slices,
        &m.written,
        m.tma_metadata.as_ref(),
        &m.zeroed_output_buffer_indices,
        p,
    )?;
    let ld = m.launch_dimensions.unwrap_or_default();
    Ok(KernelThunk {
        kernel_name: m.kernel_name.clone(),
        args,
        launch: launch_dims(
            ld.block_counts
                .as_ref()
                .and_then(|b| b.coordinates.as_ref()),
            ld.thread_counts_per_block
                .as_ref()
                .and_then(|t| t.coordinates.as_ref()),
            m.cluster_dim.as_ref(),
            (m.shmem_bytes, "shmem_bytes"),
            p,
        )?,
        use_pdl: m.use_pdl,
        zeroed_output_buffer_indices: zeroed,
    })
}

fn custom_kernel(
    m: &pg::CustomKernelThunkProto,
    allocs: Allocs<'_>,
    p: &str,
) -> Result<CustomKernelThunk, DecodeError> {
    let slices = m
        .args
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let s = allocs.shaped(s, &|| format!("{p}: arg {i}"))?;
            Ok((s.slice, s.shape))
        })
        .collect::<Result<Vec<_>, DecodeError>>()?;
    let (args, zeroed) = kernel_args(
        slices,
        &m.written,
        m.tma_metadata.as_ref(),
        &m.zeroed_output_buffer_indices,
        p,
    )?;
    let ck = m
        .custom_kernel
        .as_ref()
        .ok_or_else(|| invalid(format!("{p}: missing custom_kernel")))?;
    let spec = ck.kernel_spec.clone().unwrap_or_default();
    let code = match spec.payload {
        Some(Payload::Cubin(c)) => KernelCode::Cubin {
            data: c.data.into(),
        },
        Some(Payload::Ptx(t)) => KernelCode::Ptx { text: t.data },
        Some(Payload::InProcessSymbol(s)) => KernelCode::InProcessSymbol {
            persistent_name: s.persistent_name,
        },
        None => KernelCode::None,
    };
    let packing = spec
        .kernel_args_packing_spec
        .as_ref()
        .map(|ps| {
            ps.kernel_arguments
                .iter()
                .enumerate()
                .map(|(i, a)| match a.relocations.as_slice() {
                    [] => Ok(KernelParam::Bytes {
                        data: a.data.clone().into(),
                    }),
                    [r] if r.kind == 1 && a.data.is_empty() => u32::try_from(r.argument_index)
                        .ok()
                        .filter(|&x| (x as usize) < args.len())
                        .map(|arg_index| KernelParam::ArgAddress { arg_index })
                        .ok_or_else(|| {
                            invalid(format!(
                                "{p}: packed parameter {i} refers to argument {} of {}",
                                r.argument_index,
                                args.len()
                            ))
                        }),
                    _ => Err(invalid(format!(
                        "{p}: packed parameter {i}: unsupported relocation (kinds {:?}, {} data bytes)",
                        a.relocations.iter().map(|r| r.kind).collect::<Vec<_>>(),
                        a.data.len()
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    Ok(CustomKernelThunk {
        name: ck.name.clone(),
        spec: KernelSpec {
            code,
            kernel_name: spec.kernel_name,
            arity: u32::try_from(spec.arity)
                .map_err(|_| invalid(format!("{p}: negative kernel arity {}", spec.arity)))?,
            packing,
        },
        args,
        launch: launch_dims(
            ck.block_dims.as_ref().and_then(|b| b.coordinates.as_ref()),
            ck.thread_dims.as_ref().and_then(|t| t.coordinates.as_ref()),
            ck.cluster_dim.as_ref(),
            (ck.shared_memory_bytes, "shared_memory_bytes"),
            p,
        )?,
        use_pdl: m.use_pdl,
        zeroed_output_buffer_indices: zeroed,
    })
}

fn layout(l: Option<gemm_config_proto::MatrixLayout>) -> MatrixLayout {
    let l = l.unwrap_or_default();
    MatrixLayout {
        order: l.order,
        num_rows: l.num_rows,
        num_cols: l.num_cols,
        batch_size: l.batch_size,
        leading_dim_stride: l.leading_dim_stride,
        batch_stride: l.batch_stride,
        transpose: l.transpose,
        dtype: crate::plan::ElementType(l.dtype),
    }
}

fn gemm_config(g: &px::GemmConfigProto) -> GemmConfig {
    GemmConfig {
        lhs_layout: layout(g.lhs_layout),
        rhs_layout: layout(g.rhs_layout),
        c_layout: layout(g.c_layout),
        output_layout: layout(g.output_layout),
        alpha_real: g.alpha_real,
        alpha_imag: g.alpha_imag,
        beta: g.beta,
        compute_precision: g.compute_precision,
        precision_algorithm: g.precision_algorithm,
        algorithm: g.algorithm,
        grad_x: g.grad_x,
        grad_y: g.grad_y,
        compute_type: g.compute_type,
        scale_mode: g.scale_mode,
    }
}

fn cublas_lt(
    m: &pg::CublasLtMatmulThunkProto,
    allocs: Allocs<'_>,
    p: &str,
) -> Result<CublasLtMatmulThunk, DecodeError> {
    use pg::cublas_lt_matmul_thunk_proto::Impl;
    let ctx = |what: &'static str| move || format!("{p}: {what}");
    let (gemm_config, grouped) = match &m.r#impl {
        Some(Impl::GemmConfig(g)) => (Some(gemm_config(g)), false),
        Some(Impl::GroupedGemmConfig(_)) => (None, true),
        None => return Err(invalid(format!("{p}: missing gemm_config"))),
    };
    Ok(CublasLtMatmulThunk {
        gemm_config,
        grouped,
        epilogue: m.epilogue,
        algorithm_idx: m.algorithm_idx,
        canonical_hlo: m.canonical_hlo.clone(),
        a: allocs.req_shaped(&m.a, &ctx("a"))?,
        b: allocs.req_shaped(&m.b, &ctx("b"))?,
        c: allocs.req_shaped(&m.c, &ctx("c"))?,
        d: allocs.req_shaped(&m.d, &ctx("d"))?,
        bias: allocs.opt_shaped(&m.bias, &ctx("bias"))?,
        aux: allocs.opt_shaped(&m.aux, &ctx("aux"))?,
        a_scale: allocs.opt_shaped(&m.a_scale, &ctx("a_scale"))?,
        b_scale: allocs.opt_shaped(&m.b_scale, &ctx("b_scale"))?,
        c_scale: allocs.opt_shaped(&m.c_scale, &ctx("c_scale"))?,
        d_scale: allocs.opt_shaped(&m.d_scale, &ctx("d_scale"))?,
        d_amax: allocs.opt_shaped(&m.d_amax, &ctx("d_amax"))?,
        workspace: allocs.opt_shaped(&m.workspace, &ctx("workspace"))?,
        group_sizes: allocs.opt_shaped(&m.group_sizes, &ctx("group_sizes"))?,
        autotune_workspace_size: m.autotune_workspace_size,
    })
}

const MAX_EXPR_DEPTH: usize = 64;

fn offset_expr(e: &dsf::OffsetExprProto, depth: usize, p: &str) -> Result<OffsetExpr, DecodeError> {
    if depth > MAX_EXPR_DEPTH {
        return Err(invalid(format!("{p}: offset expression nested too deeply")));
    }
    Ok(OffsetExpr {
        kind: e.kind,
        value: e.value,
        compare_direction: e.compare_direction,
        operands: e
            .operands
            .iter()
            .map(|o| offset_expr(o, depth + 1, p))
            .collect::<Result<_, _>>()?,
    })
}

fn offsets(v: &[dsf::OffsetProto], p: &str) -> Result<Vec<DsfOffset>, DecodeError> {
    v.iter()
        .map(|o| {
            Ok(DsfOffset {
                dimension: o.dimension_number,
                expr: o
                    .offset
                    .as_ref()
                    .map(|e| offset_expr(e, 0, p))
                    .transpose()?,
            })
        })
        .collect()
}

fn slice_config(c: &Option<pg::DynamicSliceConfig>) -> Option<DynamicSliceConfig> {
    c.as_ref().map(|c| DynamicSliceConfig {
        loop_index: c.loop_index,
        byte_offset: c.byte_offset,
        byte_stride: c.byte_stride,
    })
}

/// Hero `what` `i`'s number, which must name one of the fusion's `len`
/// `what` buffers.
fn hero_number(n: i64, i: usize, len: usize, what: &str, p: &str) -> Result<u64, DecodeError> {
    let n = non_negative(n, &|| format!("{p}: {what} {i} number"))?;
    if n >= len as u64 {
        return Err(invalid(format!(
            "{p}: hero {what} {i} uses fusion {what} {n} of {len}"
        )));
    }
    Ok(n)
}

#[inline(never)]
fn dynamic_slice_fusion(
    m: &pg::DynamicSliceFusionThunkProto,
    allocs: Allocs<'_>,
    depth: usize,
    p: &str,
) -> Result<DynamicSliceFusionThunk, DecodeError> {
    let buffers = |v: &[BufferAllocationSliceProto], what: &str| {
        v.iter()
            .enumerate()
            .map(|(i, s)| allocs.slice(s, &|| format!("{p}: {what} buffer {i}")))
            .collect::<Result<Vec<_>, _>>()
    };
    let parameter_buffers = buffers(&m.parameter_buffers, "parameter")?;
    let result_buffers = buffers(&m.result_buffers, "result")?;
    let parameters = m
        .parameters
        .iter()
        .enumerate()
        .map(|(i, q)| {
            Ok(DsfParameter {
                parameter_number: hero_number(
                    q.parameter_number,
                    i,
                    parameter_buffers.len(),
                    "parameter",
                    p,
                )?,
                parameter_shape: opt_shape(&q.parameter_shape)?,
                slice_shape: opt_shape(&q.slice_shape)?,
                slice_config: slice_config(&q.slice_config),
                slice_offsets: offsets(&q.slice_offsets, p)?,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let results = m
        .results
        .iter()
        .enumerate()
        .map(|(j, r)| {
            Ok(DsfResult {
                parameter_number: r.parameter_number,
                result_number: hero_number(r.result_number, j, result_buffers.len(), "result", p)?,
                result_shape: opt_shape(&r.result_shape)?,
                update_shape: opt_shape(&r.update_shape)?,
                update_config: slice_config(&r.update_config),
                update_offsets: offsets(&r.update_offsets, p)?,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let embedded_allocations =
        allocations(&m.slice_allocations, &format!("{p}: embedded allocation"))?;
    let sizes: Vec<u64> = embedded_allocations.iter().map(|a| a.size).collect();
    let embedded_allocs = Allocs {
        sizes: &sizes,
        what: "embedded allocation",
    };
    let embedded = seq_of(
        &m.embedded_thunks,
        embedded_allocs,
        depth,
        format!("{p}/embedded"),
    )?;
    Ok(DynamicSliceFusionThunk {
        parameters,
        results,
        parameter_buffers,
        result_buffers,
        embedded_allocations,
        embedded,
        verify_offsets: m.verify_offsets,
    })
}

/// `FftThunkProto`: what the thunk carries; its geometry is checked where
/// it is loaded (`xla_vmm_runtime`'s `fft.rs`).
fn fft(m: &pg::FftThunkProto, allocs: Allocs<'_>, p: &str) -> Result<FftThunk, DecodeError> {
    let ctx = |what: &'static str| move || format!("{p}: {what}");
    let fft_type = FftType::from_proto(m.fft_type)
        .ok_or_else(|| invalid(format!("{p}: fft type {} (0 to 3 expected)", m.fft_type)))?;
    let req_shape = |s: &Option<px::ShapeProto>, what: &str| {
        s.as_ref()
            .ok_or_else(|| invalid(format!("{p}: fft without {what}")))
            .and_then(shape)
    };
    Ok(FftThunk {
        fft_type,
        fft_length: m.fft_length.clone(),
        input: allocs.req_slice(&m.input_buffer, &ctx("input"))?,
        output: allocs.req_slice(&m.output_buffer, &ctx("output"))?,
        input_shape: req_shape(&m.input_shape, "input_shape")?,
        output_shape: req_shape(&m.output_shape, "output_shape")?,
    })
}

/// `TriangularSolveThunkProto`, with the sizes XLA's thunk derives from
/// `b`'s shape (batch, m, n) checked against the slices they address.
fn triangular_solve(
    m: &pg::TriangularSolveThunkProto,
    allocs: Allocs<'_>,
    p: &str,
) -> Result<TriangularSolveThunk, DecodeError> {
    let ctx = |what: &'static str| move || format!("{p}: {what}");
    let o = m
        .options
        .as_ref()
        .ok_or_else(|| invalid(format!("{p}: missing triangular solve options")))?;
    let transpose_a = match o.transpose_a {
        1 => SolveTranspose::NoTranspose,
        2 => SolveTranspose::Transpose,
        3 => SolveTranspose::Adjoint,
        other => {
            return Err(invalid(format!(
                "{p}: triangular solve transpose_a {other} (1, 2 or 3 expected)"
            )))
        }
    };
    let a = allocs.req_shaped(&m.a_buffer, &ctx("a"))?;
    let b = allocs.req_shaped(&m.b_buffer, &ctx("b"))?;
    let temp = allocs.req_shaped(&m.temp_buffer, &ctx("temp"))?;
    let shape = b
        .shape
        .clone()
        .ok_or_else(|| invalid(format!("{p}: triangular solve b without a shape")))?;
    let dims = &shape.dimensions;
    if dims.len() < 2 || dims.iter().any(|&d| d < 0) {
        return Err(invalid(format!(
            "{p}: triangular solve b of dimensions {dims:?} (rank 2 or more, none negative)"
        )));
    }
    let (m_rows, n_cols) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let too_big = || {
        invalid(format!(
            "{p}: triangular solve b of dimensions {dims:?} overflows"
        ))
    };
    let batch = dims[..dims.len() - 2]
        .iter()
        .try_fold(1i64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(too_big)?;
    let t = TriangularSolveThunk {
        left_side: o.left_side,
        lower: o.lower,
        unit_diagonal: o.unit_diagonal,
        transpose_a,
        element_type: shape.element_type,
        batch,
        m: m_rows,
        n: n_cols,
        a,
        b,
        temp,
    };
    // What the solve addresses must lie inside the slices (an element size
    // is known for every type the BLAS accepts; others are refused at load).
    if let Some(bits) = shape.element_type.bit_width() {
        let bytes = u64::from(bits / 8).max(1);
        let batch = batch as u64;
        let need = |stride: Option<u64>| {
            stride
                .and_then(|s| s.checked_mul(batch))
                .ok_or_else(too_big)
        };
        for (what, need, have) in [
            ("a", need(t.a_batch_stride(bytes))?, t.a.slice.size),
            ("b", need(t.b_batch_stride(bytes))?, t.b.slice.size),
            (
                "temp",
                if batch > 1 { need(Some(16))? } else { 0 },
                t.temp.slice.size,
            ),
        ] {
            if need > have {
                return Err(invalid(format!(
                    "{p}: triangular solve {what} needs {need} bytes, its slice has {have}"
                )));
            }
        }
    }
    Ok(t)
}

/// `ConvolutionThunkProto`: the descriptor (kind, shapes, window, dimension
/// numbers, the autotuned algorithm) and the buffers, as recorded. Whether
/// our runtime can run it is the runtime's check; here the proto must be
/// complete and its buffers inside their allocations.
fn convolution(
    m: &pg::ConvolutionThunkProto,
    allocs: Allocs<'_>,
    p: &str,
) -> Result<ConvolutionThunk, DecodeError> {
    let ctx = |what: &'static str| move || format!("{p}: {what}");
    let d = m
        .conv_descriptor
        .as_ref()
        .ok_or_else(|| invalid(format!("{p}: convolution without conv_descriptor")))?;
    // `stream_executor.dnn.ConvolutionKind` in jax 0.11.2's executables
    // (later XLA has its own enum, where 2 and 3 trade places): the thunks
    // XLA names `cudnn-conv-bw-filter` carry 2, `cudnn-conv-bw-input` 3.
    let kind = match d.kind {
        1 => ConvKind::Forward,
        2 => ConvKind::BackwardFilter,
        3 => ConvKind::BackwardInput,
        4 => ConvKind::ForwardActivation,
        5 => ConvKind::ForwardGraph,
        other => return Err(invalid(format!("{p}: convolution kind {other}"))),
    };
    let req_shape = |s: &Option<px::ShapeProto>, what: &str| {
        s.as_ref()
            .ok_or_else(|| invalid(format!("{p}: convolution without {what}")))
            .and_then(shape)
    };
    let cfg = d.backend_config.clone().unwrap_or_default();
    let algo = cfg.algorithm.unwrap_or_default();
    let mut knobs: Vec<(i64, i64)> = algo.tuning_knobs.into_iter().collect();
    knobs.sort_unstable();
    let dn = d
        .dnums
        .as_ref()
        .ok_or_else(|| invalid(format!("{p}: convolution without dimension numbers")))?;
    let shaped = |v: &[px::ShapedSliceProto], what: &'static str| {
        v.iter()
            .map(|s| allocs.shaped(s, &ctx(what)))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(ConvolutionThunk {
        kind,
        operands: shaped(&m.operand_buffers, "operand")?,
        results: shaped(&m.result_buffers, "result")?,
        scratch: allocs.req_slice(&m.scratch_buffer, &ctx("scratch"))?,
        operand0_shape: req_shape(&d.operand0_shape, "operand0_shape")?,
        operand1_shape: req_shape(&d.operand1_shape, "operand1_shape")?,
        result_shape: req_shape(&d.result_shape, "result_shape")?,
        window: d
            .window
            .as_ref()
            .map(|w| {
                w.dimensions
                    .iter()
                    .map(|w| WindowDim {
                        size: w.size,
                        stride: w.stride,
                        padding_low: w.padding_low,
                        padding_high: w.padding_high,
                        window_dilation: w.window_dilation,
                        base_dilation: w.base_dilation,
                        window_reversal: w.window_reversal,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        dnums: ConvDims {
            input_batch: dn.input_batch_dimension,
            input_feature: dn.input_feature_dimension,
            input_spatial: dn.input_spatial_dimensions.clone(),
            kernel_input_feature: dn.kernel_input_feature_dimension,
            kernel_output_feature: dn.kernel_output_feature_dimension,
            kernel_spatial: dn.kernel_spatial_dimensions.clone(),
            output_batch: dn.output_batch_dimension,
            output_feature: dn.output_feature_dimension,
            output_spatial: dn.output_spatial_dimensions.clone(),
        },
        feature_group_count: d.feature_group_count,
        algorithm: ConvAlgorithm {
            algo_id: algo.algo_id,
            knobs,
            workspace_size: algo.workspace_size.map(|w| w.value),
        },
        conv_result_scale: cfg.conv_result_scale,
        side_input_scale: cfg.side_input_scale,
        activation_mode: cfg.activation_mode,
        leakyrelu_alpha: cfg.leakyrelu_alpha,
        has_serialized_graph: cfg.serialized_graph.is_some(),
    })
}
