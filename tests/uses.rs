//! `Thunk::uses` / `reads` / `writes` classify accesses as documented, and
//! recurse through nested sequences but not into dynamic-slice-fusion
//! embedded thunks.

use xla_vmm::{
    Access, AsyncStartThunk, CopyThunk, CustomKernelThunk, DynamicSliceFusionThunk,
    ExecutionStream, KernelArg, KernelCode, KernelSpec, LaunchDims, ShapedSlice, Slice, Thunk,
    ThunkInfo, ThunkKind, WhileThunk,
};

fn s(allocation: usize, offset: u64, size: u64) -> Slice {
    Slice {
        allocation,
        offset,
        size,
    }
}

fn shaped(slice: Slice) -> ShapedSlice {
    ShapedSlice { slice, shape: None }
}

fn thunk(kind: ThunkKind) -> Thunk {
    Thunk {
        info: ThunkInfo::default(),
        kind,
    }
}

fn kernel(args: &[(Slice, bool)], zeroed: &[u64]) -> Thunk {
    thunk(ThunkKind::CustomKernel(CustomKernelThunk {
        name: "k".into(),
        spec: KernelSpec {
            code: KernelCode::None,
            kernel_name: "k".into(),
            arity: args.len() as u32,
            packing: None,
        },
        args: args
            .iter()
            .map(|&(slice, written)| KernelArg {
                slice,
                shape: None,
                written,
                tma: None,
            })
            .collect(),
        launch: LaunchDims::default(),
        use_pdl: false,
        zeroed_output_buffer_indices: zeroed.to_vec(),
    }))
}

#[test]
fn kernel_args_copy_and_memset() {
    let k = kernel(
        &[(s(0, 0, 8), false), (s(1, 0, 8), true), (s(2, 0, 8), true)],
        &[2],
    );
    assert_eq!(
        k.own_uses(),
        vec![
            (s(0, 0, 8), Access::Read),
            (s(1, 0, 8), Access::Write),
            (s(2, 0, 8), Access::Overwrite),
        ]
    );
    // Write may read; Overwrite does not.
    assert_eq!(k.reads(), vec![s(0, 0, 8), s(1, 0, 8)]);
    assert_eq!(k.writes(), vec![s(1, 0, 8), s(2, 0, 8)]);

    let c = thunk(ThunkKind::DeviceToDeviceCopy(CopyThunk {
        source: shaped(s(3, 4, 16)),
        destination: shaped(s(4, 0, 16)),
        mem_size: 16,
    }));
    assert_eq!(c.reads(), vec![s(3, 4, 16)]);
    assert_eq!(c.writes(), vec![s(4, 0, 16)]);

    let m = thunk(ThunkKind::Memset32 {
        dest: s(5, 0, 4),
        value: 1,
    });
    assert_eq!(m.own_uses(), vec![(s(5, 0, 4), Access::Overwrite)]);
    assert!(m.reads().is_empty());
}

#[test]
fn nested_sequences_are_included() {
    let body = kernel(&[(s(0, 0, 4), false), (s(1, 0, 4), true)], &[]);
    let cond = kernel(&[(s(1, 0, 4), false), (s(2, 0, 1), true)], &[]);
    let w = thunk(ThunkKind::While(WhileThunk {
        condition_result: s(2, 0, 1),
        condition: vec![cond],
        body: vec![body],
        trip_count: None,
    }));
    let a = thunk(ThunkKind::AsyncStart(AsyncStartThunk {
        async_execution_id: 1,
        stream: ExecutionStream::Computation(1),
        thunks: vec![w],
    }));
    let uses = a.uses();
    assert!(uses.contains(&(s(0, 0, 4), Access::Read)));
    assert!(uses.contains(&(s(1, 0, 4), Access::Write)));
    assert!(uses.contains(&(s(2, 0, 1), Access::Write)));
    let mut visited = 0;
    a.walk(0, &mut |_, _| visited += 1);
    assert_eq!(visited, 4); // async start, while, condition kernel, body kernel
}

#[test]
fn dynamic_slice_fusion_reports_real_buffers_only() {
    use xla_vmm::{DsfParameter, DsfResult};
    // The embedded kernel uses synthetic allocations 0 and 1.
    let embedded = kernel(&[(s(0, 0, 4), false), (s(1, 0, 4), true)], &[]);
    let d = thunk(ThunkKind::DynamicSliceFusion(DynamicSliceFusionThunk {
        parameters: vec![DsfParameter {
            parameter_number: 1,
            parameter_shape: None,
            slice_shape: None,
            slice_config: None,
            slice_offsets: vec![],
        }],
        results: vec![DsfResult {
            parameter_number: None,
            result_number: 0,
            result_shape: None,
            update_shape: None,
            update_config: None,
            update_offsets: vec![],
        }],
        parameter_buffers: vec![s(7, 0, 64), s(8, 0, 64)],
        result_buffers: vec![s(9, 0, 4)],
        embedded_allocations: vec![],
        embedded: vec![embedded],
        verify_offsets: false,
    }));
    assert_eq!(
        d.uses(),
        vec![(s(8, 0, 64), Access::Read), (s(9, 0, 4), Access::Write)]
    );
    assert_eq!(d.kind_name(), "dynamic_slice_fusion");
    // Without synthetic allocations, a use touches its whole slice.
    assert_eq!(
        d.own_uses_touched(),
        vec![
            (s(8, 0, 64), Access::Read, 64),
            (s(9, 0, 4), Access::Write, 4)
        ]
    );
}

#[test]
fn dynamic_slice_fusion_touches_its_windows() {
    use xla_vmm::{AllocationRole, BufferAllocation, DsfParameter, DsfResult};
    let window = |index: usize, size: u64| BufferAllocation {
        index,
        size,
        role: AllocationRole::Temp,
        maybe_live_out: false,
        is_tuple: false,
        is_thread_local: false,
        color: 0,
    };
    // One layer (16 bytes) of a stacked weight of 64 copied into a
    // temporary; one row (8 bytes) of a stacked output of 32 updated.
    let param = |n: u64| DsfParameter {
        parameter_number: n,
        parameter_shape: None,
        slice_shape: None,
        slice_config: None,
        slice_offsets: vec![],
    };
    let d = thunk(ThunkKind::DynamicSliceFusion(DynamicSliceFusionThunk {
        parameters: vec![param(0), param(5)],
        results: vec![DsfResult {
            parameter_number: Some(1),
            result_number: 0,
            result_shape: None,
            update_shape: None,
            update_config: None,
            update_offsets: vec![],
        }],
        // Parameter 5 names no buffer: it has no use, and the windows keep
        // their positions (the result's is the third).
        parameter_buffers: vec![s(3, 0, 64)],
        result_buffers: vec![s(4, 32, 32)],
        embedded_allocations: vec![window(0, 16), window(1, 16), window(2, 8)],
        embedded: vec![],
        verify_offsets: false,
    }));
    assert_eq!(
        d.own_uses_touched(),
        vec![
            (s(3, 0, 64), Access::Read, 16),
            (s(4, 32, 32), Access::Write, 8)
        ]
    );
    assert_eq!(
        d.own_uses(),
        vec![(s(3, 0, 64), Access::Read), (s(4, 32, 32), Access::Write)]
    );
}

#[test]
fn slice_overlap() {
    assert!(s(0, 0, 8).overlaps(&s(0, 4, 8)));
    assert!(!s(0, 0, 8).overlaps(&s(0, 8, 8)));
    assert!(!s(0, 0, 8).overlaps(&s(1, 0, 8)));
    assert!(!s(0, 0, 0).overlaps(&s(0, 0, 8)));
}
