//! Plan builders and the host backend (kernels `scale2` and `inc`) shared
//! by the executor tests.

use std::sync::Arc;

use xla_vmm::*;
use xla_vmm_device::host::{arg_ptr, arg_u32};
use xla_vmm_device::HostBackend;

#[allow(dead_code)] // not every test file has f32 vectors
pub fn f32s(n: usize) -> Shape {
    Shape {
        element_type: ElementType::F32,
        dimensions: vec![n as i64],
        ..Default::default()
    }
}

pub fn alloc(index: usize, size: u64, role: AllocationRole) -> BufferAllocation {
    BufferAllocation::new(index, size, role)
}

pub fn param(number: u64, aliased: bool) -> AllocationRole {
    AllocationRole::Parameter {
        number,
        shape_index: vec![],
        aliased_with_output: aliased,
    }
}

pub fn sl(allocation: usize, offset: u64, size: u64) -> Slice {
    Slice {
        allocation,
        offset,
        size,
    }
}

pub fn thunk(name: &str, kind: ThunkKind) -> Thunk {
    Thunk {
        info: ThunkInfo {
            profile_annotation: name.into(),
            ..Default::default()
        },
        kind,
    }
}

/// A copy of all of `src` into `dst` (the payload of every copy kind).
#[allow(dead_code)] // not every test file copies
pub fn copy_of(src: Slice, dst: Slice) -> CopyThunk {
    let s = |slice| ShapedSlice { slice, shape: None };
    CopyThunk {
        source: s(src),
        destination: s(dst),
        mem_size: src.size,
    }
}

#[allow(dead_code)] // not every test file copies
pub fn copy(name: &str, src: Slice, dst: Slice) -> Thunk {
    thunk(name, ThunkKind::DeviceToDeviceCopy(copy_of(src, dst)))
}

pub fn plan(
    allocations: Vec<BufferAllocation>,
    params: Vec<Shape>,
    outputs: Vec<(usize, Shape)>,
    thunks: Vec<Thunk>,
) -> Plan {
    let result = Shape {
        element_type: ElementType::TUPLE,
        tuple_shapes: outputs.iter().map(|(_, s)| s.clone()).collect(),
        ..Default::default()
    };
    Plan {
        module_name: "test".into(),
        pjrt_client_name: String::new(),
        compute_capability: ComputeCapability::Unknown,
        allocations,
        program_shape: ProgramShape {
            parameters: params,
            result,
            parameter_names: vec![],
        },
        outputs: outputs
            .iter()
            .enumerate()
            .map(|(i, (a, _))| OutputInfo {
                shape_index: vec![i as i64],
                allocation: *a,
                passthrough: false,
                alias: None,
            })
            .collect(),
        kernels: KernelBinaries::default(),
        thunks,
    }
}

pub fn backend() -> Arc<HostBackend> {
    let b = HostBackend::default();
    // scale2(src, dst, n: u32 constant): dst[i] = 2 * src[i].
    b.register_kernel(
        "scale2",
        Arc::new(|ctx, args, _cfg| {
            let (src, dst, n) = (
                arg_ptr(args, 0)?,
                arg_ptr(args, 1)?,
                arg_u32(args, 2)? as usize,
            );
            let v: Vec<f32> = ctx.read_f32(src, n)?.iter().map(|x| 2.0 * x).collect();
            ctx.write_f32(dst, &v)
        }),
    );
    // inc(buf): buf[i] += 1 for i < grid.x.
    b.register_kernel(
        "inc",
        Arc::new(|ctx, args, cfg| {
            let p = arg_ptr(args, 0)?;
            let n = cfg.grid[0] as usize;
            let v: Vec<f32> = ctx.read_f32(p, n)?.iter().map(|x| x + 1.0).collect();
            ctx.write_f32(p, &v)
        }),
    );
    Arc::new(b)
}

#[allow(dead_code)] // not every test file has f32 data
pub fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A custom kernel thunk `name` over `args` (slice, written), packed as
/// XLA does: one address per argument, then `n` (u32) when given.
#[allow(dead_code)] // used by the binding tests only
pub fn kernel(name: &str, args: Vec<(Slice, bool)>, n: Option<u32>, grid: u64) -> Thunk {
    let arity = args.len() as u32 + u32::from(n.is_some());
    let packing = n.map(|n| {
        let mut p: Vec<KernelParam> = (0..args.len())
            .map(|i| KernelParam::ArgAddress {
                arg_index: i as u32,
            })
            .collect();
        p.push(KernelParam::Bytes {
            data: Blob(n.to_le_bytes().to_vec()),
        });
        p
    });
    thunk(
        name,
        ThunkKind::CustomKernel(CustomKernelThunk {
            name: name.into(),
            spec: KernelSpec {
                code: KernelCode::Cubin {
                    data: Blob(format!("{name}\n").into_bytes()),
                },
                kernel_name: name.into(),
                arity,
                packing,
            },
            args: args
                .into_iter()
                .map(|(slice, written)| KernelArg {
                    slice,
                    shape: None,
                    written,
                    tma: None,
                })
                .collect(),
            launch: LaunchDims {
                blocks: Dim3 {
                    x: grid,
                    y: 1,
                    z: 1,
                },
                threads: Dim3 { x: 1, y: 1, z: 1 },
                cluster: None,
                shared_memory_bytes: 0,
            },
            use_pdl: false,
            zeroed_output_buffer_indices: vec![],
        }),
    )
}

/// The matmul half of `GemmEngine` for a host engine that runs none (one
/// that only solves or convolves): expands inside its
/// `impl GemmEngine<HostBackend>`.
#[allow(unused_macros)] // only the engines' test files use it
macro_rules! no_matmul {
    () => {
        fn prepare(
            &self,
            _: &xla_vmm_device::blas::GemmConfig,
            _: xla_vmm_device::blas::Epilogue,
            _: usize,
            _: usize,
            _: u64,
        ) -> xla_vmm_device::error::Result<xla_vmm_device::blas::GemmPlanId> {
            Err(xla_vmm_device::error::DeviceError::Unsupported(
                "matmul".into(),
            ))
        }

        fn workspace_needed(
            &self,
            _: xla_vmm_device::blas::GemmPlanId,
        ) -> xla_vmm_device::error::Result<u64> {
            Ok(0)
        }

        fn run(
            &self,
            _: xla_vmm_device::blas::GemmPlanId,
            _: &xla_vmm_device::blas::MatmulArgs,
            _: &xla_vmm_device::host::HostStream,
        ) -> xla_vmm_device::error::Result<()> {
            Err(xla_vmm_device::error::DeviceError::Unsupported(
                "matmul".into(),
            ))
        }
    };
}
#[allow(unused_imports)]
pub(crate) use no_matmul;

/// Why loading `p` with no GEMM / DNN engine and no custom calls fails (the
/// default configuration): the error's text.
#[allow(dead_code)] // not every test file loads without engines
pub fn load_error_without_engines(
    b: &Arc<HostBackend>,
    p: Plan,
    stream: &xla_vmm_device::host::HostStream,
) -> String {
    let cfg = xla_vmm_runtime::RunConfig::default();
    xla_vmm_runtime::Executable::load_with(b.clone(), p, None, None, &cfg, stream)
        .err()
        .expect("loading without engines fails")
        .to_string()
}
