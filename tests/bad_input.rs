//! Bad input gives a clear error (or an `Unsupported` thunk), never a panic.

mod common;

use common::{
    exe_with_thunks, executable, fixture, pseudo_random, riegeli_file, split_proto, thunk_bytes,
};
use prost::Message;
use xla_vmm::proto::xla::{self as px, buffer_assignment::BufferAllocationSliceProto};
use xla_vmm::{decode, DecodeError, ThunkKind};

fn err(bytes: &[u8]) -> DecodeError {
    match decode(bytes) {
        Ok(p) => panic!(
            "decoded {} bytes of bad input into a plan: {p:?}",
            bytes.len()
        ),
        Err(e) => e,
    }
}

#[test]
fn empty_input() {
    assert!(matches!(err(&[]), DecodeError::Empty));
}

#[test]
fn truncated_files() {
    let bytes = fixture("mlp_adam_donated");
    for cut in [
        1,
        4,
        63,
        64,
        65,
        100,
        bytes.len() / 3,
        bytes.len() / 2,
        bytes.len() - 1,
    ] {
        let e = err(&bytes[..cut]);
        assert!(!e.to_string().is_empty(), "cut at {cut}");
    }
}

#[test]
fn random_bytes() {
    for seed in 1..50u64 {
        let bytes = pseudo_random(seed, 1 + (seed as usize * 97) % 5000);
        let e = err(&bytes);
        assert!(
            matches!(
                e,
                DecodeError::NotAnExecutable(_) | DecodeError::Proto { .. }
            ),
            "seed {seed}: {e}"
        );
    }
    // Random bytes behind a valid riegeli signature.
    let mut b = common::RIEGELI_PREFIX.to_vec();
    b.extend(pseudo_random(7, 4000));
    assert!(
        matches!(err(&b), DecodeError::Riegeli { .. }),
        "{}",
        err(&b)
    );
}

#[test]
fn riegeli_file_of_another_proto_type() {
    let e = err(&split_proto("xla.HloModuleProto", vec![0x0a, 0x01, b'x']));
    assert!(e.to_string().contains("xla.HloModuleProto"), "{e}");
    // A riegeli file whose first record is not a split-proto manifest.
    let e = err(&riegeli_file(&[pseudo_random(3, 50), vec![1, 2, 3]]));
    assert!(matches!(e, DecodeError::SplitProto { .. }), "{e}");
    // A riegeli file with no records at all.
    let e = err(&riegeli_file(&[]));
    assert!(e.to_string().contains("no records"), "{e}");
    // Outer layer fine, but the inner executable is another type.
    let inner = split_proto("xla.HloModuleProto", vec![]);
    let outer = px::ExecutableAndOptionsProto {
        serialized_executable: inner,
        pjrt_client_name: String::new(),
    };
    let e = err(&split_proto(
        "xla.ExecutableAndOptionsProto",
        outer.encode_to_vec(),
    ));
    assert!(e.to_string().contains("xla.gpu.GpuExecutableProto"), "{e}");
}

#[test]
fn corrupted_chunks() {
    let bytes = fixture("loop");
    // Flip bytes in the chunk headers and data (the riegeli hashes catch it).
    for pos in [70, 200, 1000, bytes.len() / 2, bytes.len() - 20] {
        let mut b = bytes.clone();
        b[pos] ^= 0x5a;
        let e = err(&b);
        assert!(!e.to_string().is_empty(), "flip at {pos}");
    }
}

#[test]
fn manifest_promising_more_records_than_present() {
    let manifest = px::SplitProtoManifest {
        result_proto_type: "xla.ExecutableAndOptionsProto".into(),
        records: vec![
            px::Record {
                record_type: Some(px::record::RecordType::ProtoMergeRecord(Default::default())),
            };
            3
        ],
    };
    let e = err(&riegeli_file(&[manifest.encode_to_vec(), vec![]]));
    assert!(e.to_string().contains("file ends"), "{e}");
}

#[test]
fn unknown_thunk_kinds_become_unsupported() {
    let send = thunk_bytes("send.1", 44, &[]);
    let future = thunk_bytes("future-op", 999, &[0x08, 0x01]);
    let memset = {
        let m = px::gpu::Memset32BitValueThunkProto {
            dest_buffer: Some(BufferAllocationSliceProto {
                offset: 16,
                size: 64,
                buffer_allocation_index: 0,
                element_type: 0,
            }),
            value: 0x3f80_0000,
        };
        thunk_bytes("memset", 28, &m.encode_to_vec())
    };
    // An unknown kind nested inside a sequential thunk.
    let seq = px::gpu::SequentialThunkProto {
        thunks: vec![thunk_bytes("nested-norm", 24, &[])],
    };
    let seq = thunk_bytes("seq", 2, &seq.encode_to_vec());
    let plan = decode(&executable(&exe_with_thunks(vec![
        send, future, memset, seq,
    ])))
    .expect("decodes");
    let unsupported: Vec<_> = plan
        .unsupported()
        .into_iter()
        .map(|t| match &t.kind {
            ThunkKind::Unsupported {
                kind_name,
                field_number,
            } => (
                kind_name.clone(),
                *field_number,
                t.info.profile_annotation.clone(),
            ),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(
        unsupported,
        vec![
            ("send".to_string(), 44, "send.1".to_string()),
            ("unknown".to_string(), 999, "future-op".to_string()),
            ("norm".to_string(), 24, "nested-norm".to_string()),
        ]
    );
    assert!(matches!(
        plan.thunks[2].kind,
        ThunkKind::Memset32 {
            value: 0x3f80_0000,
            ..
        }
    ));
    assert_eq!(plan.kind_counts()["sequential"], 1);
}

#[test]
fn fft_thunks_decode_with_their_shapes_and_bad_ones_are_errors() {
    let slice = |offset, size| BufferAllocationSliceProto {
        offset,
        size,
        buffer_allocation_index: 0,
        element_type: 0,
    };
    let shape = |t: i32, dims: &[i64]| px::ShapeProto {
        element_type: t,
        dimensions: dims.to_vec(),
        ..Default::default()
    };
    // RFFT of f32[2, 8] at 0 into c64[2, 5] at 256.
    let m = |fft_type: i32| px::gpu::FftThunkProto {
        fft_type,
        fft_length: vec![8],
        input_buffer: Some(slice(0, 64)),
        output_buffer: Some(slice(256, 80)),
        input_shape: Some(shape(11, &[2, 8])),
        output_shape: Some(shape(15, &[2, 5])),
    };
    let plan = decode(&executable(&exe_with_thunks(vec![thunk_bytes(
        "rfft.1",
        27,
        &m(2).encode_to_vec(),
    )])))
    .expect("decodes");
    let ThunkKind::Fft(f) = &plan.thunks[0].kind else {
        panic!("{:?}", plan.thunks[0].kind);
    };
    assert_eq!(f.fft_type, xla_vmm::FftType::Rfft);
    assert_eq!(
        (f.input.offset, f.output.offset, f.output.size),
        (0, 256, 80)
    );
    assert_eq!(f.output_shape.dimensions, [2, 5]);
    assert_eq!(plan.thunks[0].kind_name(), "fft");
    let bad = |m: px::gpu::FftThunkProto| {
        err(&executable(&exe_with_thunks(vec![thunk_bytes(
            "bad-fft",
            27,
            &m.encode_to_vec(),
        )])))
        .to_string()
    };
    let e = bad(m(7));
    assert!(e.contains("bad-fft") && e.contains("fft type 7"), "{e}");
    let e = bad(px::gpu::FftThunkProto {
        output_shape: None,
        ..m(2)
    });
    assert!(e.contains("fft without output_shape"), "{e}");
    let e = bad(px::gpu::FftThunkProto {
        output_buffer: Some(slice(1000, 80)),
        ..m(2)
    });
    assert!(e.contains("bad-fft"), "{e}");
}

#[test]
fn out_of_bounds_slices_are_rejected() {
    for (offset, size, index) in [(1000, 64, 0), (0, 2048, 0), (0, 4, 5), (-8, 4, 0)] {
        let m = px::gpu::Memset32BitValueThunkProto {
            dest_buffer: Some(BufferAllocationSliceProto {
                offset,
                size,
                buffer_allocation_index: index,
                element_type: 0,
            }),
            value: 0,
        };
        let t = thunk_bytes("bad-memset", 28, &m.encode_to_vec());
        let e = err(&executable(&exe_with_thunks(vec![t])));
        assert!(
            matches!(e, DecodeError::Invalid(_)) && e.to_string().contains("bad-memset"),
            "{e}"
        );
    }
}

#[test]
fn malformed_thunk_payloads_are_errors() {
    // A custom kernel payload that is not a valid message.
    let t = thunk_bytes("broken", 36, &[0x0a, 0xff, 0xff, 0xff, 0x0f]);
    let e = err(&executable(&exe_with_thunks(vec![t])));
    assert!(e.to_string().contains("broken"), "{e}");
    // A thunk whose own bytes are truncated mid-field.
    let mut t = thunk_bytes("cut", 36, &[]);
    t.push(0x0a);
    let e = err(&executable(&exe_with_thunks(vec![t])));
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn deep_nesting_is_rejected_without_overflow() {
    let mut t = thunk_bytes("leaf", 58, &[]);
    for _ in 0..500 {
        let seq = px::gpu::SequentialThunkProto { thunks: vec![t] };
        t = thunk_bytes("seq", 2, &seq.encode_to_vec());
    }
    let e = err(&executable(&exe_with_thunks(vec![t])));
    assert!(e.to_string().contains("nested deeper"), "{e}");
}

#[test]
fn mutated_fixtures_never_panic() {
    let bytes = fixture("small");
    let noise = pseudo_random(42, 4096);
    for i in 0..300 {
        let mut b = bytes.clone();
        let pos = (noise[i % noise.len()] as usize * 131 + i * 977) % b.len();
        b[pos] = noise[(i * 7) % noise.len()];
        let _ = decode(&b); // must return, Ok or Err
    }
}

#[test]
fn host_space_copies_decode_and_a_missing_copy_is_an_error() {
    let slice = |offset, size| {
        Some(px::ShapedSliceProto {
            slice: Some(BufferAllocationSliceProto {
                offset,
                size,
                buffer_allocation_index: 0,
                element_type: 0,
            }),
            shape: None,
        })
    };
    let copy = Some(px::gpu::CopyThunkProto {
        source_buffer: slice(0, 256),
        destination_buffer: slice(512, 256),
        mem_size: 256,
    });
    let d2h = px::gpu::DeviceToHostCopyThunkProto {
        copy_thunk: copy.clone(),
    };
    let h2d = px::gpu::HostToDeviceCopyThunkProto { copy_thunk: copy };
    let plan = decode(&executable(&exe_with_thunks(vec![
        thunk_bytes("copy-start", 4, &d2h.encode_to_vec()),
        thunk_bytes("copy-start.1", 5, &h2d.encode_to_vec()),
    ])))
    .expect("decodes");
    assert!(plan.unsupported().is_empty());
    for (t, want) in plan
        .thunks
        .iter()
        .zip(["device_to_host_copy", "host_to_device_copy"])
    {
        assert_eq!(t.kind_name(), want);
        match &t.kind {
            ThunkKind::DeviceToHostCopy(c) | ThunkKind::HostToDeviceCopy(c) => {
                assert_eq!(
                    (
                        c.source.slice.offset,
                        c.destination.slice.offset,
                        c.mem_size
                    ),
                    (0, 512, 256)
                );
            }
            k => panic!("{k:?}"),
        }
    }
    // Without its copy: an error naming the thunk.
    let empty = px::gpu::DeviceToHostCopyThunkProto { copy_thunk: None };
    let e = err(&executable(&exe_with_thunks(vec![thunk_bytes(
        "copy-start.2",
        4,
        &empty.encode_to_vec(),
    )])));
    assert!(
        e.to_string().contains("copy-start.2") && e.to_string().contains("copy_thunk"),
        "{e}"
    );
}

#[test]
fn triangular_solves_decode_with_their_sizes_and_bad_ones_are_named() {
    // b: f32[2,3,4,2] at 0 (256 bytes), a: f32[2,3,4,4] at 256 (512 bytes),
    // temp: 6 pointers x 2 arrays at 768 (96 bytes).
    let shaped = |offset, size, dims: &[i64]| {
        Some(px::ShapedSliceProto {
            slice: Some(BufferAllocationSliceProto {
                offset,
                size,
                buffer_allocation_index: 0,
                element_type: 0,
            }),
            shape: Some(px::ShapeProto {
                element_type: 11,
                dimensions: dims.to_vec(),
                ..Default::default()
            }),
        })
    };
    let solve = |transpose_a, b_size| px::gpu::TriangularSolveThunkProto {
        options: Some(px::TriangularSolveOptions {
            left_side: true,
            lower: true,
            unit_diagonal: false,
            transpose_a,
        }),
        a_buffer: shaped(256, 512, &[2, 3, 4, 4]),
        b_buffer: shaped(0, b_size, &[2, 3, 4, 2]),
        temp_buffer: shaped(768, 96, &[96]),
    };
    let one = |name: &str, m: &px::gpu::TriangularSolveThunkProto| {
        executable(&exe_with_thunks(vec![thunk_bytes(
            name,
            11,
            &m.encode_to_vec(),
        )]))
    };
    let plan = decode(&one("triangular-solve", &solve(3, 192))).expect("decodes");
    assert!(plan.unsupported().is_empty());
    assert_eq!(plan.thunks[0].kind_name(), "triangular_solve");
    match &plan.thunks[0].kind {
        ThunkKind::TriangularSolve(t) => {
            assert_eq!((t.batch, t.m, t.n), (6, 4, 2));
            assert_eq!(t.transpose_a, xla_vmm::SolveTranspose::Adjoint);
            assert!(t.left_side && t.lower && !t.unit_diagonal);
            assert_eq!((t.a.slice.offset, t.b.slice.offset), (256, 0));
            assert_eq!(
                (t.a_batch_stride(4), t.b_batch_stride(4)),
                (Some(64), Some(32))
            );
            let uses = plan.thunks[0].uses();
            assert_eq!(uses.len(), 3);
        }
        k => panic!("{k:?}"),
    }
    // An invalid transpose, a b slice too small for its shape: errors that
    // name the thunk and what is wrong.
    let e = err(&one("ts.bad", &solve(0, 192))).to_string();
    assert!(e.contains("ts.bad") && e.contains("transpose_a 0"), "{e}");
    let e = err(&one("ts.small", &solve(1, 100))).to_string();
    assert!(
        e.contains("ts.small") && e.contains("b needs 192 bytes") && e.contains("100"),
        "{e}"
    );
    // A batch without room for its pointer arrays.
    let mut m = solve(1, 192);
    m.temp_buffer = shaped(768, 64, &[64]);
    let e = err(&one("ts.temp", &m)).to_string();
    assert!(e.contains("temp needs 96 bytes"), "{e}");
    // b of rank 1, and an absurd batch.
    let mut m = solve(1, 192);
    m.b_buffer = shaped(0, 192, &[48]);
    let e = err(&one("ts.rank", &m)).to_string();
    assert!(e.contains("rank 2 or more"), "{e}");
    let mut m = solve(1, 192);
    m.b_buffer = shaped(0, 192, &[i64::MAX, 4, 4, 2]);
    let e = err(&one("ts.huge", &m)).to_string();
    assert!(e.contains("ts.huge") && e.contains("overflow"), "{e}");
}

#[test]
fn convolutions_decode_their_descriptor_and_a_missing_one_is_named() {
    use xla_vmm::proto::stream_executor::dnn::AlgorithmProto;
    let shaped = |offset, size| px::ShapedSliceProto {
        slice: Some(BufferAllocationSliceProto {
            offset,
            size,
            buffer_allocation_index: 0,
            element_type: 0,
        }),
        shape: None,
    };
    let f32s = |dims: &[i64]| px::ShapeProto {
        element_type: 11,
        dimensions: dims.to_vec(),
        layout: Some(px::LayoutProto {
            minor_to_major: (0..dims.len() as i64).rev().collect(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let dim = px::WindowDimension {
        size: 3,
        stride: 1,
        padding_low: 1,
        padding_high: 1,
        window_dilation: 1,
        base_dilation: 1,
        window_reversal: false,
    };
    let m = px::gpu::ConvolutionThunkProto {
        conv_descriptor: Some(px::gpu::GpuConvDescriptorProto {
            kind: 2,
            backend_config: Some(px::gpu::CudnnConvBackendConfig {
                conv_result_scale: 1.0,
                algorithm: Some(AlgorithmProto {
                    algo_id: 12,
                    tuning_knobs: [(5, 1), (2, 3)].into_iter().collect(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            operand0_shape: Some(f32s(&[1, 2, 4, 4])),
            operand1_shape: Some(f32s(&[1, 3, 4, 4])),
            result_shape: Some(f32s(&[3, 2, 3, 3])),
            scratch_size: 64,
            window: Some(px::Window {
                dimensions: vec![dim, dim],
            }),
            dnums: Some(px::ConvolutionDimensionNumbers {
                input_feature_dimension: 1,
                input_spatial_dimensions: vec![2, 3],
                kernel_input_feature_dimension: 1,
                kernel_spatial_dimensions: vec![2, 3],
                output_feature_dimension: 1,
                output_spatial_dimensions: vec![2, 3],
                ..Default::default()
            }),
            feature_group_count: 1,
        }),
        operand_buffers: vec![shaped(0, 128), shaped(128, 192)],
        result_buffers: vec![shaped(320, 216)],
        scratch_buffer: Some(BufferAllocationSliceProto {
            offset: 576,
            size: 64,
            buffer_allocation_index: 0,
            element_type: 0,
        }),
    };
    let plan = decode(&executable(&exe_with_thunks(vec![thunk_bytes(
        "conv.bwd-filter",
        25,
        &m.encode_to_vec(),
    )])))
    .expect("decodes");
    assert!(plan.unsupported().is_empty());
    assert_eq!(plan.thunks[0].kind_name(), "convolution");
    match &plan.thunks[0].kind {
        ThunkKind::Convolution(c) => {
            assert_eq!(c.kind, xla_vmm::ConvKind::BackwardFilter);
            assert_eq!(c.algorithm.algo_id, 12);
            assert_eq!(c.algorithm.knobs, vec![(2, 3), (5, 1)]);
            assert_eq!(
                (c.operands.len(), c.results.len(), c.scratch.offset),
                (2, 1, 576)
            );
            assert_eq!(c.window.len(), 2);
            assert_eq!(c.result_shape.dimensions, vec![3, 2, 3, 3]);
            assert_eq!(plan.thunks[0].uses().len(), 4);
        }
        k => panic!("{k:?}"),
    }
    let mut bad = m.clone();
    bad.conv_descriptor = None;
    let e = err(&executable(&exe_with_thunks(vec![thunk_bytes(
        "conv.7",
        25,
        &bad.encode_to_vec(),
    )])))
    .to_string();
    assert!(e.contains("conv.7") && e.contains("conv_descriptor"), "{e}");
    let mut bad = m;
    bad.conv_descriptor.as_mut().unwrap().kind = 9;
    let e = err(&executable(&exe_with_thunks(vec![thunk_bytes(
        "conv.8",
        25,
        &bad.encode_to_vec(),
    )])))
    .to_string();
    assert!(e.contains("convolution kind 9"), "{e}");
}

#[test]
fn select_k_decodes_and_a_wrong_argument_count_or_slice_is_named() {
    let slice = |offset, size| BufferAllocationSliceProto {
        offset,
        size,
        buffer_allocation_index: 0,
        element_type: 0,
    };
    // f32[2, 20] at 0, values f32[2, 3] at 256, indices s32[2, 3] at 512; newer XLA adds a scratch slice.
    let m = |args: Vec<BufferAllocationSliceProto>| px::gpu::SelectKThunkProto {
        args,
        batch_size: 2,
        num_elements: 20,
        k: 3,
        dtype: 11,
    };
    let three = vec![slice(0, 160), slice(256, 24), slice(512, 24)];
    let mut four = three.clone();
    four.push(slice(768, 64));
    for args in [three.clone(), four] {
        let plan = decode(&executable(&exe_with_thunks(vec![thunk_bytes(
            "custom-call.1",
            20,
            &m(args).encode_to_vec(),
        )])))
        .expect("decodes");
        assert!(plan.unsupported().is_empty());
        match &plan.thunks[0].kind {
            ThunkKind::SelectK(s) => {
                assert_eq!((s.batch, s.num_elements, s.k), (2, 20, 3));
                assert_eq!(
                    (s.input.offset, s.values.offset, s.indices.offset),
                    (0, 256, 512)
                );
                assert_eq!(s.element_type, xla_vmm::ElementType::F32);
            }
            k => panic!("{k:?}"),
        }
    }
    let e = err(&executable(&exe_with_thunks(vec![thunk_bytes(
        "custom-call.2",
        20,
        &m(three[..2].to_vec()).encode_to_vec(),
    )])));
    assert!(
        e.to_string().contains("custom-call.2") && e.to_string().contains("2 buffer arguments"),
        "{e}"
    );
    let e = err(&executable(&exe_with_thunks(vec![thunk_bytes(
        "custom-call.3",
        20,
        &m(vec![slice(0, 160), slice(1000, 48), slice(512, 24)]).encode_to_vec(),
    )])));
    assert!(e.to_string().contains("custom-call.3"), "{e}");
}
