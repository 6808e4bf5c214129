//! Host binding time of VA-stable mode per step (`VaStable::run`, as its
//! own stats measure it: everything but setup, capture and the launch
//! call), on the host backend, for 10 / 100 / 400 parameter slots:
//! - `skip`: allocator buffers bound once (threshold 0): every slot skips;
//! - `copy`: raw buffers (copy-only slots) on the copy-kernel path, the
//!   same buffers every step (the tables already hold the copies);
//! - `copy-churn`: raw buffers alternating among three sets, so the copy
//!   tables are rewritten every step;
//! - `remap-churn`: allocator buffers rotating among three sets, so every
//!   slot remaps every step (host backend VMM calls, not a GPU's).
//!
//! Target (issue 6): at most 10 µs + 0.1 µs per slot.
//! Run: `cargo bench -p xla-vmm-runtime --bench binding`.

use std::sync::Arc;
use std::time::Instant;

use xla_vmm::*;
use xla_vmm_device::vmm::Buffer;
use xla_vmm_device::{Backend, HostBackend, VmmAllocator, VmmConfig};
use xla_vmm_policy::Threshold;
use xla_vmm_runtime::copykernel::register_host_copy_kernel;
use xla_vmm_runtime::slots::DeviceBuffer;
use xla_vmm_runtime::{BindingConfig, Executable, Mode, UserBuffer};

const SLOT_BYTES: u64 = 256;

fn u8s(n: u64) -> Shape {
    Shape {
        element_type: ElementType(6),
        dimensions: vec![n as i64],
        ..Default::default()
    }
}

fn allocation(index: usize, size: u64, role: AllocationRole) -> BufferAllocation {
    BufferAllocation::new(index, size, role)
}

/// `n` parameters; one thunk copies parameter 0 to the output.
fn plan(n: usize) -> Plan {
    let mut allocations: Vec<_> = (0..n)
        .map(|i| {
            allocation(
                i,
                SLOT_BYTES,
                AllocationRole::Parameter {
                    number: i as u64,
                    shape_index: vec![],
                    aliased_with_output: false,
                },
            )
        })
        .collect();
    allocations.push(allocation(
        n,
        SLOT_BYTES,
        AllocationRole::Output { outputs: vec![] },
    ));
    let s = |allocation| ShapedSlice {
        slice: Slice {
            allocation,
            offset: 0,
            size: SLOT_BYTES,
        },
        shape: None,
    };
    let copy = Thunk {
        info: ThunkInfo {
            profile_annotation: "copy".into(),
            ..Default::default()
        },
        kind: ThunkKind::DeviceToDeviceCopy(CopyThunk {
            source: s(0),
            destination: s(n),
            mem_size: SLOT_BYTES,
        }),
    };
    Plan {
        module_name: format!("bench{n}"),
        pjrt_client_name: String::new(),
        compute_capability: ComputeCapability::Unknown,
        allocations,
        program_shape: ProgramShape {
            parameters: (0..n).map(|_| u8s(SLOT_BYTES)).collect(),
            result: Shape {
                element_type: ElementType::TUPLE,
                tuple_shapes: vec![u8s(SLOT_BYTES)],
                ..Default::default()
            },
            parameter_names: vec![],
        },
        outputs: vec![OutputInfo {
            shape_index: vec![0],
            allocation: n,
            passthrough: false,
            alias: None,
        }],
        kernels: KernelBinaries::default(),
        thunks: vec![copy],
    }
}

enum Bufs {
    Vmm(Vec<Buffer<HostBackend>>),
    Raw(Vec<DeviceBuffer<HostBackend>>),
}

impl Bufs {
    fn user(&self, i: usize) -> UserBuffer<HostBackend> {
        match self {
            Bufs::Vmm(v) => UserBuffer::from_vmm(&v[i]),
            Bufs::Raw(v) => UserBuffer::raw(v[i].ptr(), SLOT_BYTES),
        }
    }
}

/// Bind set `k % sets` (when `rebind`) and run one VA-stable step.
fn step(
    exe: &mut Executable<HostBackend>,
    sets: &[Bufs],
    s: &<HostBackend as Backend>::Stream,
    k: usize,
    rebind: bool,
) {
    let set = &sets[k % sets.len()];
    if rebind {
        for i in 0..exe.parameter_shapes().len() {
            exe.bind_user_buffer(i, set.user(i)).expect("bind");
        }
    }
    exe.run(s, Mode::Graph).expect("run");
}

/// (binding µs per step, wall µs per `Executable::run`) over `steps`
/// steps after two warm-up steps.
fn measure(n: usize, scenario: &str, steps: usize) -> (f64, f64, &'static str) {
    let b = HostBackend::new(xla_vmm_device::HostConfig {
        capacity: 64 << 30,
        ..Default::default()
    })
    .expect("host backend");
    register_host_copy_kernel(&b);
    let b = Arc::new(b);
    let alloc = VmmAllocator::new(
        b.clone(),
        VmmConfig {
            small_threshold: 0,
            ..Default::default()
        },
    )
    .expect("allocator");
    let s = b.stream_create().expect("stream");
    let mut exe = Executable::load(b.clone(), plan(n), None, &s).expect("load");
    let (vmm, sets) = match scenario {
        "skip" => (true, 1),
        "copy" => (false, 1),
        "copy-churn" => (false, 3),
        _ => (true, 3),
    };
    exe.set_binding_config(BindingConfig {
        threshold: Threshold::from(if vmm { 0 } else { 1 }),
        costs: None,
        immutable_buffers: false,
        ..Default::default()
    })
    .expect("config");
    let sets: Vec<Bufs> = (0..sets)
        .map(|_| {
            if vmm {
                Bufs::Vmm(
                    (0..n)
                        .map(|_| alloc.alloc(SLOT_BYTES).expect("alloc"))
                        .collect(),
                )
            } else {
                Bufs::Raw(
                    (0..n)
                        .map(|_| DeviceBuffer::alloc(&b, SLOT_BYTES).expect("alloc"))
                        .collect(),
                )
            }
        })
        .collect();
    for k in 0..2 {
        step(&mut exe, &sets, &s, k, k == 0 || sets.len() > 1);
    }
    let before = exe.stats().expect("stats").counters;
    let t = Instant::now();
    for k in 2..2 + steps {
        step(&mut exe, &sets, &s, k, sets.len() > 1);
    }
    let wall = t.elapsed().as_secs_f64() * 1e6 / steps as f64;
    let st = exe.stats().expect("stats").clone();
    let after = st.counters;
    let ns = after.host_binding_ns - before.host_binding_ns;
    let bind_us = ns as f64 / 1e3 / (after.steps - before.steps) as f64;
    drop(exe);
    b.stream_synchronize(&s).ok();
    for set in sets {
        match set {
            Bufs::Vmm(v) => v.into_iter().for_each(|x| alloc.free(x, &s).expect("free")),
            Bufs::Raw(v) => v.into_iter().for_each(|x| x.free().expect("free")),
        }
    }
    (bind_us, wall, st.copy_path)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter word limits the scenarios.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    println!(
        "{:>5} {:>12} {:>7} {:>12} {:>12} {:>14}",
        "slots", "scenario", "path", "bind µs", "target µs", "run wall µs"
    );
    for n in [10usize, 100, 400] {
        for scenario in ["skip", "copy", "copy-churn", "remap-churn"] {
            if filter.as_deref().is_some_and(|f| !scenario.contains(f)) {
                continue;
            }
            let steps = if scenario == "remap-churn" { 200 } else { 2000 };
            let (bind, wall, path) = measure(n, scenario, steps);
            let target = 10.0 + 0.1 * n as f64;
            println!(
                "{n:>5} {scenario:>12} {path:>7} {bind:>12.2} {target:>12.1} {wall:>14.1}{}",
                if bind <= target { "" } else { "  over target" }
            );
        }
    }
}
