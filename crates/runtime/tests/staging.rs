//! Staging on the host backend: a program whose parameters are in host
//! memory runs with them staged through a device area, in every mode, with
//! the results of the same program with everything in device memory; with
//! no room for an area it reads host memory in place, with the same results.

mod common;

use std::sync::Arc;

use common::*;
use xla_vmm::*;
use xla_vmm_device::vmm::VmmContext;
use xla_vmm_device::{Backend, HostBackend, MemLocation, MemoryLimits};
use xla_vmm_runtime::{DeviceBuffer, Executable, Mode, StagingSummary, UserBuffer};

/// p0, p1 read; p2 donated and incremented; a temp in two segments;
/// out0 = 2·p1, out1 = 2·p0 (through the temp), p2 += 1.
fn program() -> Plan {
    let allocs = vec![
        alloc(0, 16, param(0, false)),
        alloc(1, 16, param(1, false)),
        alloc(2, 16, param(2, true)),
        alloc(3, 16, AllocationRole::Output { outputs: vec![] }),
        alloc(4, 64, AllocationRole::Temp),
        alloc(5, 16, AllocationRole::Output { outputs: vec![] }),
    ];
    let thunks = vec![thunk(
        "seq",
        ThunkKind::Sequential {
            thunks: vec![
                copy("copy.0", sl(0, 0, 16), sl(4, 0, 16)),
                kernel(
                    "scale2",
                    vec![(sl(4, 0, 16), false), (sl(4, 32, 16), true)],
                    Some(4),
                    1,
                ),
                kernel(
                    "scale2",
                    vec![(sl(1, 0, 16), false), (sl(3, 0, 16), true)],
                    Some(4),
                    1,
                ),
                copy("copy.3", sl(4, 32, 16), sl(5, 0, 16)),
            ],
        },
    )];
    let mut thunks = thunks;
    thunks.push(kernel("inc", vec![(sl(2, 0, 16), true)], None, 4));
    plan(
        allocs,
        vec![f32s(4), f32s(4), f32s(4)],
        vec![(3, f32s(4)), (5, f32s(4)), (2, f32s(4))],
        thunks,
    )
}

fn f32s_of(
    b: &Arc<HostBackend>,
    ptr: xla_vmm_device::DevicePtr,
    stream: &<HostBackend as Backend>::Stream,
) -> Vec<f32> {
    let mut d = vec![0u8; 16];
    b.read_sync(&mut d, ptr, stream).unwrap();
    d.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Two steps of `program` in `mode` with the parameters at `at`, under a
/// device limit of `limit` bytes: the outputs of the second step and
/// whether it was staged.
fn two_steps(
    mode: Mode,
    at: MemLocation,
    limit: Option<u64>,
) -> (Vec<Vec<f32>>, Option<StagingSummary>) {
    let b = backend();
    b.budget().set_limits(MemoryLimits {
        device: limit,
        host: None,
        staging_reserve: Some(0),
    });
    let ctx = VmmContext::new(b.clone());
    let stream = b.stream_create().unwrap();
    let mut exe = Executable::load(b.clone(), program(), None, &stream).unwrap();
    let inputs = [
        [1.0f32, 2.0, 3.0, 4.0],
        [5.0, 6.0, 7.0, 8.0],
        [10.0, 20.0, 30.0, 40.0],
    ];
    let mut bufs = Vec::new();
    for (i, v) in inputs.iter().enumerate() {
        let buf = DeviceBuffer::alloc_at(&ctx, 16, at).unwrap();
        b.write_sync(buf.ptr(), &bytes(v), &stream).unwrap();
        let mut user = UserBuffer::raw(buf.ptr(), 16);
        user.location = Some(buf.location());
        exe.bind_user_buffer(i, user).unwrap();
        bufs.push(buf);
    }
    let mut outs = Vec::new();
    for _ in 0..2 {
        outs = exe.run(&stream, mode).unwrap();
    }
    b.stream_synchronize(&stream).unwrap();
    let got = outs.iter().map(|o| f32s_of(&b, o.ptr, &stream)).collect();
    let staged = exe.program().staging_summary().cloned();
    drop(exe);
    for buf in bufs {
        buf.free().unwrap();
    }
    b.stream_destroy(stream).unwrap();
    (got, staged)
}

#[test]
fn parameters_in_host_memory_are_staged_in_every_mode_with_the_same_results() {
    let want = vec![
        vec![10.0, 12.0, 14.0, 16.0],
        vec![2.0, 4.0, 6.0, 8.0],
        vec![12.0, 22.0, 32.0, 42.0],
    ];
    for mode in [Mode::Eager, Mode::GraphRecapture, Mode::Graph] {
        let (on_device, staged) = two_steps(mode, MemLocation::Device, None);
        assert_eq!(on_device, want, "{mode:?} on the device");
        assert!(staged.is_none(), "nothing in host memory: no staging");
        let (on_host, staged) = two_steps(mode, MemLocation::Host, Some(64 << 20));
        let s = staged.expect("parameters in host memory are staged");
        // The three parameters in, the incremented one home, each step.
        assert_eq!((s.staged, s.staged_bytes), (3, 48), "{mode:?}");
        assert_eq!((s.bytes_in_per_step, s.bytes_out_per_step), (48, 16));
        assert_eq!(on_host, want, "{mode:?} staged");
    }
}

#[test]
fn with_no_room_for_an_area_host_memory_is_read_in_place() {
    // The program's own three buffers take the whole device limit.
    for mode in [Mode::Eager, Mode::Graph] {
        let (got, staged) = two_steps(mode, MemLocation::Host, Some(6 << 20));
        assert!(staged.is_none());
        assert_eq!(got[2], vec![12.0, 22.0, 32.0, 42.0]);
        assert_eq!(got[0], vec![10.0, 12.0, 14.0, 16.0]);
    }
}
