//! Synthetic plans for the host backend (one f32[4] parameter, one f32[4]
//! result), the host backend with its `inc` kernel, and f32 <-> byte
//! conversions, shared by the execution tests.

use std::sync::Arc;

use xla_vmm::*;
use xla_vmm_device::host::arg_ptr;
use xla_vmm_device::HostBackend;

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

pub fn sl(allocation: usize, size: u64) -> Slice {
    Slice {
        allocation,
        offset: 0,
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
pub fn copy_of(src: Slice, dst: Slice) -> CopyThunk {
    let s = |slice| ShapedSlice { slice, shape: None };
    CopyThunk {
        source: s(src),
        destination: s(dst),
        mem_size: src.size,
    }
}

/// `inc` over `n` f32 at `slice` (in place).
pub fn inc(slice: Slice, n: u64) -> Thunk {
    thunk(
        "inc",
        ThunkKind::CustomKernel(CustomKernelThunk {
            name: "inc".into(),
            spec: KernelSpec {
                code: KernelCode::Cubin {
                    data: Blob(b"inc\n".to_vec()),
                },
                kernel_name: "inc".into(),
                arity: 1,
                packing: None,
            },
            args: vec![KernelArg {
                slice,
                shape: None,
                written: true,
                tma: None,
            }],
            launch: LaunchDims {
                blocks: Dim3 { x: n, y: 1, z: 1 },
                threads: Dim3 { x: 1, y: 1, z: 1 },
                cluster: None,
                shared_memory_bytes: 0,
            },
            use_pdl: false,
            zeroed_output_buffer_indices: vec![],
        }),
    )
}

pub fn plan(allocations: Vec<BufferAllocation>, output_alloc: usize, thunks: Vec<Thunk>) -> Plan {
    Plan {
        module_name: "jit_test".into(),
        pjrt_client_name: String::new(),
        compute_capability: ComputeCapability::Unknown,
        allocations,
        program_shape: ProgramShape {
            parameters: vec![f32s(4)],
            result: f32s(4),
            parameter_names: vec![],
        },
        outputs: vec![OutputInfo {
            shape_index: vec![],
            allocation: output_alloc,
            passthrough: false,
            alias: None,
        }],
        kernels: KernelBinaries::default(),
        thunks,
    }
}

/// out = a + 1 (copy into the output, then inc), over 4 floats.
pub fn add_one() -> Plan {
    add_one_n(4)
}

/// out = a + 1 over `n` floats (copy into the output, then inc).
pub fn add_one_n(n: u64) -> Plan {
    let param = AllocationRole::Parameter {
        number: 0,
        shape_index: vec![],
        aliased_with_output: false,
    };
    let bytes = 4 * n;
    let copy = thunk(
        "copy",
        ThunkKind::DeviceToDeviceCopy(copy_of(sl(0, bytes), sl(1, bytes))),
    );
    let mut p = plan(
        vec![
            alloc(0, bytes, param),
            alloc(1, bytes, AllocationRole::Output { outputs: vec![] }),
        ],
        1,
        vec![copy, inc(sl(1, bytes), n)],
    );
    p.program_shape.parameters = vec![f32s(n as usize)];
    p.program_shape.result = f32s(n as usize);
    p
}

/// a += 1 in place; the output is the (donated) parameter.
pub fn add_one_donated() -> Plan {
    let param = AllocationRole::Parameter {
        number: 0,
        shape_index: vec![],
        aliased_with_output: true,
    };
    plan(vec![alloc(0, 16, param)], 0, vec![inc(sl(0, 16), 4)])
}

pub fn backend() -> Arc<HostBackend> {
    let b = HostBackend::default();
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

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn f32_values(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
