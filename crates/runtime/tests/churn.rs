//! Issue 34, item 2 on the host backend: 2,000 distinct programs (shapes
//! varied) loaded, run in each mode and dropped in one process leave the
//! device as they found it (memory, mappings, VA ranges, streams, events,
//! modules, graphs and their instances), the binding stats of dropped
//! programs bounded, and no report line behind.

mod common;

use common::*;
use xla_vmm::*;
use xla_vmm_device::Backend;
use xla_vmm_runtime::binding::{all_stats, KEPT_DROPPED};
use xla_vmm_runtime::{DeviceBuffer, Executable, Mode};

/// out = 2 * x through a temporary, x of `n` floats; named `churn_{k}`.
fn churn_plan(n: usize, k: usize) -> Plan {
    let bytes = 4 * n as u64;
    let mut p = plan(
        vec![
            alloc(0, bytes, param(0, false)),
            alloc(1, bytes, AllocationRole::Output { outputs: vec![] }),
            alloc(2, bytes, AllocationRole::Temp),
        ],
        vec![f32s(n)],
        vec![(1, f32s(n))],
        vec![
            kernel(
                "scale2",
                vec![(sl(0, 0, bytes), false), (sl(2, 0, bytes), true)],
                Some(n as u32),
                1,
            ),
            copy("copy", sl(2, 0, bytes), sl(1, 0, bytes)),
        ],
    );
    p.module_name = format!("churn_{k}");
    p
}

#[test]
fn two_thousand_programs_loaded_run_and_dropped_leave_nothing_behind() {
    let b = backend();
    let stream = b.stream_create().unwrap();
    let modes = [Mode::Graph, Mode::GraphRecapture, Mode::Eager];
    let run_one = |k: usize| {
        let n = 1 + k % 97;
        let mut exe = Executable::load(b.clone(), churn_plan(n, k), None, &stream).unwrap();
        let x = DeviceBuffer::alloc(&b, 4 * n as u64).unwrap();
        let v: Vec<f32> = (0..n).map(|i| (i + k) as f32).collect();
        b.write_sync(x.ptr(), &bytes(&v), &stream).unwrap();
        exe.bind_parameter(0, x.ptr(), x.size()).unwrap();
        for _ in 0..2 {
            let outs = exe.run(&stream, modes[k % 3]).unwrap();
            b.stream_synchronize(&stream).unwrap();
            let mut d = vec![0u8; 4 * n];
            b.read_sync(&mut d, outs[0].ptr, &stream).unwrap();
            assert_eq!(
                d[..4],
                (2.0 * k as f32).to_le_bytes(),
                "program {k} in {:?}",
                modes[k % 3]
            );
        }
        // Alive, it holds memory and (VA-stable) address ranges.
        let live = b.budget().usage();
        assert!(live.allocations > 0, "{live:?}");
        if modes[k % 3] == Mode::Graph {
            assert!(live.va_ranges > 0, "{live:?}");
        }
        drop(exe);
        x.free().unwrap();
    };
    // Whatever the first program of a process makes once stays.
    for k in 0..3 {
        run_one(k);
    }
    let (base, usage) = (b.outstanding(), b.budget().usage());
    for k in 3..2000 {
        run_one(k);
    }
    assert_eq!(b.outstanding(), base);
    // What report() shows of the device: the same allocations and VA.
    let now = b.budget().usage();
    assert_eq!(
        (
            now.allocations,
            now.va_ranges,
            now.va_bytes,
            now.device_bytes
        ),
        (
            usage.allocations,
            usage.va_ranges,
            usage.va_bytes,
            usage.device_bytes
        )
    );
    // Dropped programs: their stats bounded, their report lines gone.
    let kept = all_stats().keys().filter(|k| k.contains("churn_")).count();
    assert!(kept <= KEPT_DROPPED, "{kept} dropped programs' stats kept");
    let alive = xla_vmm_runtime::report::all_reports()
        .iter()
        .filter(|r| r.program.starts_with("churn_"))
        .count();
    assert_eq!(alive, 0);
    b.stream_destroy(stream).unwrap();
}
