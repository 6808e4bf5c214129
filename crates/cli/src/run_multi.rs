//! `xla-vmm run --devices N`: one executable per device, each run from its
//! own thread (the ranks of a clique join together), one communicator set
//! for the process ([`Cliques`] over a [`LocalExchange`]), outputs compared
//! per device.
//!
//! Files: inputs `in_<arg>_<dev>`, expected outputs `out_<out>_<dev>`,
//! `<dev>` = position in the device assignment. The assignment is NAME.json's
//! `devices` next to the executable (1 replica x len partitions, or its
//! `replicas` / `partitions` when given), else 1 replica x N partitions with
//! ids 0..N; device `<dev>` runs on ordinal `<dev>`. NAME.json's
//! `stock_deterministic_outputs` (false = stock XLA does not reproduce that
//! output run to run) marks outputs whose difference is tolerated, unless
//! `--nondeterministic` is given.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use xla_vmm_device::blas::GemmEngine;
use xla_vmm_device::vmm::Buffer;
use xla_vmm_device::Backend;
use xla_vmm_runtime::npz::{self, NpyArray};
use xla_vmm_runtime::{Cliques, CollectiveEnv, DeviceAssignment, Executable, LocalExchange, Mode};

use crate::run::{Args, OutputCheck};

/// What one device thread brings back.
struct DeviceRun {
    arrays: Vec<(String, NpyArray)>,
    first_ms: f64,
    stats: Option<String>,
}

/// NAME.json next to `file`, if any.
fn fixture_json(file: &Path) -> anyhow::Result<Option<serde_json::Value>> {
    let path = file.with_extension("json");
    if !path.exists() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?,
    ))
}

/// The device assignment for `n` devices (see the module doc).
pub(crate) fn assignment(
    json: Option<&serde_json::Value>,
    n: usize,
) -> anyhow::Result<DeviceAssignment> {
    let Some(ids) = json.and_then(|j| j["devices"].as_array()) else {
        return Ok(DeviceAssignment {
            replicas: 1,
            partitions: n,
            ids: (0..n as i64).collect(),
        });
    };
    let ids: Vec<i64> = ids
        .iter()
        .map(|v| {
            v.as_i64()
                .ok_or_else(|| anyhow!("device id {v} is not an integer"))
        })
        .collect::<anyhow::Result<_>>()?;
    if ids.len() != n {
        bail!(
            "the fixture's device assignment has {} devices, --devices is {n}",
            ids.len()
        );
    }
    let get = |k: &str| json.and_then(|j| j[k].as_u64()).map(|v| v as usize);
    let (replicas, partitions) = match (get("replicas"), get("partitions")) {
        (Some(r), Some(p)) => (r, p),
        _ => (1, n),
    };
    if replicas * partitions != n {
        bail!("{replicas} replicas x {partitions} partitions is not {n} devices");
    }
    Ok(DeviceAssignment {
        replicas,
        partitions,
        ids,
    })
}

/// `out_i` for every false entry of `stock_deterministic_outputs`.
pub(crate) fn stock_nondeterministic(json: Option<&serde_json::Value>) -> Vec<String> {
    json.and_then(|j| j["stock_deterministic_outputs"].as_array())
        .map(|v| {
            v.iter()
                .enumerate()
                .filter(|(_, d)| d.as_bool() == Some(false))
                .map(|(i, _)| format!("out_{i}"))
                .collect()
        })
        .unwrap_or_default()
}

/// The `<name>_<dev>` arrays of `arrays` as `<name>`.
pub(crate) fn device_arrays(arrays: &[(String, NpyArray)], dev: usize) -> Vec<(String, NpyArray)> {
    let suffix = format!("_{dev}");
    arrays
        .iter()
        .filter_map(|(n, a)| {
            let base = n.strip_suffix(&suffix)?;
            // `out_3_1` -> `out_3`; not `out_31` (no separator).
            (base.matches('_').count() == 1).then(|| (base.to_string(), a.clone()))
        })
        .collect()
}

pub fn run(
    plan: xla_vmm::Plan,
    args: &Args,
    mode: Mode,
    mut check: OutputCheck,
) -> anyhow::Result<()> {
    if args.loop_steps > 0 || args.loop_ref.is_some() {
        bail!("--loop-steps is not implemented with --devices");
    }
    let json = fixture_json(&args.file)?;
    let assignment = assignment(json.as_ref(), args.devices)?;
    if args.nondeterministic.is_none() {
        check.nondeterministic = stock_nondeterministic(json.as_ref());
    }
    eprintln!(
        "device assignment: {} replica(s) x {} partition(s), ids {:?}",
        assignment.replicas, assignment.partitions, assignment.ids
    );
    run_backend(plan, args, mode, &check, assignment)
}

#[cfg(feature = "cuda")]
fn run_backend(
    plan: xla_vmm::Plan,
    args: &Args,
    mode: Mode,
    check: &OutputCheck,
    assignment: DeviceAssignment,
) -> anyhow::Result<()> {
    use xla_vmm_device::cuda::{blaslt::CudaGemm, CudaBackend};
    // Before any thread starts or any device opens.
    let visible = CudaBackend::device_count()?;
    if assignment.ids.len() > visible {
        bail!(
            "--devices {}: this machine has {visible} CUDA device(s)",
            assignment.ids.len()
        );
    }
    let needs_gemm = crate::run::needs_engine(&plan);
    let make = move |k: usize| -> anyhow::Result<(Arc<CudaBackend>, Gemm<CudaBackend>)> {
        let b = Arc::new(CudaBackend::new(k)?);
        let g: Gemm<CudaBackend> = if needs_gemm {
            Some(Arc::new(CudaGemm::new(&b)?))
        } else {
            None
        };
        Ok((b, g))
    };
    replay_multi(&make, plan, args, mode, check, assignment)
}

#[cfg(not(feature = "cuda"))]
fn run_backend(
    plan: xla_vmm::Plan,
    args: &Args,
    mode: Mode,
    check: &OutputCheck,
    assignment: DeviceAssignment,
) -> anyhow::Result<()> {
    use xla_vmm_device::HostBackend;
    let make = |_k: usize| -> anyhow::Result<(Arc<HostBackend>, Gemm<HostBackend>)> {
        Ok((Arc::new(HostBackend::default()), None))
    };
    replay_multi(&make, plan, args, mode, check, assignment)
}

type Gemm<B> = Option<Arc<dyn GemmEngine<B>>>;
type MakeBackend<'a, B> = dyn Fn(usize) -> anyhow::Result<(Arc<B>, Gemm<B>)> + Sync + 'a;

/// Load, bind, run (and time `--steps`) on every device in its own thread;
/// then compare each device's outputs.
pub(crate) fn replay_multi<B: Backend>(
    make: &MakeBackend<'_, B>,
    plan: xla_vmm::Plan,
    args: &Args,
    mode: Mode,
    check: &OutputCheck,
    assignment: DeviceAssignment,
) -> anyhow::Result<()> {
    let n = assignment.ids.len();
    let inputs = npz::read_npz(&args.inputs)?;

    let cliques = Cliques::<B>::new(LocalExchange::new());
    let gate = Gate::new(n);
    let results: Vec<anyhow::Result<DeviceRun>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|k| {
                let (plan, cliques, assignment, inputs, gate) = (
                    plan.clone(),
                    cliques.clone(),
                    assignment.clone(),
                    &inputs,
                    &gate,
                );
                s.spawn(move || {
                    let device_id = assignment.ids[k];
                    let env = CollectiveEnv {
                        assignment,
                        device_id,
                        cliques,
                    };
                    device_run(make, k, plan, env, inputs, args, mode, gate)
                        .with_context(|| format!("device {k}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("device thread panicked")))
            })
            .collect()
    });
    let expected = match &args.compare {
        Some(p) => Some(npz::read_npz(p)?),
        None => None,
    };
    let mut failed = Vec::new();
    let mut written = Vec::new();
    for (k, r) in results.into_iter().enumerate() {
        println!("== device {k} (id {})", assignment.ids[k]);
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                println!("device {k}: error: {e:#}");
                failed.push(k);
                continue;
            }
        };
        println!("device {k}: first run ({mode:?}) in {:.1} ms", r.first_ms);
        if let Some(line) = &r.stats {
            println!("device {k}: {line}");
        }
        if let (Some(e), Some(p)) = (&expected, &args.compare) {
            if !crate::run::compare(&r.arrays, &device_arrays(e, k), p, check)? {
                failed.push(k);
            }
        }
        written.extend(
            r.arrays
                .into_iter()
                .map(|(name, a)| (format!("{name}_{k}"), a)),
        );
    }
    if let Some(path) = &args.outputs {
        npz::write_npz(path, &written)?;
        eprintln!("wrote {} outputs to {}", written.len(), path.display());
    }
    if !failed.is_empty() {
        bail!("devices {failed:?} failed or differ");
    }
    if expected.is_some() {
        println!("ALL {n} DEVICES MATCH");
    }
    Ok(())
}

/// Every device arrives once, loaded or failed; nobody runs (and joins
/// cliques) unless all loaded.
pub(crate) struct Gate {
    barrier: std::sync::Barrier,
    failed: std::sync::atomic::AtomicBool,
}

impl Gate {
    pub(crate) fn new(n: usize) -> Self {
        Gate {
            barrier: std::sync::Barrier::new(n),
            failed: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

struct Arrival<'a> {
    gate: &'a Gate,
    done: bool,
}

impl Arrival<'_> {
    fn arrive(&mut self) -> anyhow::Result<()> {
        self.done = true;
        self.gate.barrier.wait();
        if self.gate.failed.load(std::sync::atomic::Ordering::SeqCst) {
            bail!("not run: another device failed to load");
        }
        Ok(())
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.gate
                .failed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            self.gate.barrier.wait();
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn device_run<B: Backend>(
    make: &MakeBackend<'_, B>,
    k: usize,
    plan: xla_vmm::Plan,
    env: CollectiveEnv<B>,
    inputs: &[(String, NpyArray)],
    args: &Args,
    mode: Mode,
    gate: &Gate,
) -> anyhow::Result<DeviceRun> {
    // Until the gate, an error still arrives (as a failure), so that no
    // device waits for a peer that will never join its cliques.
    let mut arrival = Arrival { gate, done: false };
    let (backend, gemm) = make(k)?;
    let be = &*backend;
    let stream = be.stream_create()?;
    let config = crate::run::run_config(args)?;
    let mut exe = Executable::load_with(backend.clone(), plan, gemm, None, &config, &stream)?;
    exe.set_collectives(env)?;
    let allocator = crate::run::setup_binding(&backend, &exe)?;
    let mut params: Vec<Buffer<B>> = Vec::new();
    let result = (|| -> anyhow::Result<DeviceRun> {
        let names = |i: usize| format!("in_{i}_{k}");
        // Per device, in its thread: a device whose inputs are wrong fails
        // without leaving its peers waiting (the gate).
        crate::run::check_inputs(exe.parameter_shapes(), inputs, &names, &args.inputs)?;
        crate::run::bind_inputs(
            be,
            &allocator,
            &mut exe,
            &stream,
            inputs,
            &names,
            &args.inputs,
            &mut params,
        )?;
        arrival.arrive()?;
        let t = Instant::now();
        let outs = exe.run(&stream, mode)?;
        be.stream_synchronize(&stream)?;
        let first_ms = t.elapsed().as_secs_f64() * 1e3;
        let arrays = crate::run::read_outputs(be, &outs, &stream)?;
        if args.steps > 0 {
            crate::run::time_steps(
                be,
                &mut exe,
                &stream,
                Some(mode),
                args.steps,
                args.pipelined,
            )?;
        }
        Ok(DeviceRun {
            arrays,
            first_ms,
            stats: exe.stats().map(|s| s.line()),
        })
    })();
    be.stream_synchronize(&stream).ok();
    drop(exe);
    drop(params);
    be.stream_destroy(stream).ok();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arr(v: u8) -> NpyArray {
        NpyArray {
            descr: "|u1".into(),
            shape: vec![1],
            data: vec![v],
        }
    }

    fn f32_array(v: &[f32]) -> NpyArray {
        NpyArray {
            descr: "<f4".into(),
            shape: vec![v.len() as u64],
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// in f32[4] -> (all-reduce sum f32[4], all-gather f32[8]) over 2
    /// partitions, no kernels (the host backend runs it).
    fn collective_plan() -> xla_vmm::Plan {
        use xla_vmm::*;
        let f32s = |n: i64| Shape {
            element_type: ElementType::F32,
            dimensions: vec![n],
            ..Default::default()
        };
        let alloc = BufferAllocation::new;
        let sl = |allocation, size| ShapedSlice {
            slice: Slice {
                allocation,
                offset: 0,
                size,
            },
            shape: None,
        };
        let coll = |op, dst, count: u64, reduction| CollectiveThunk {
            op,
            replica_groups: vec![vec![0, 1]],
            group_mode: GroupMode::FlattenedId,
            operand_element_types: vec![ElementType::F32],
            use_symmetric_buffer: false,
            reduction,
            buffers: vec![CollectiveBuffer {
                element_count: count,
                element_type: Some(ElementType::F32),
                source: sl(0, 16),
                destination: dst,
                source_memory_space: 0,
                destination_memory_space: 0,
            }],
            source_target_pairs: vec![],
            has_split_dimension: false,
            has_dynamic_root: false,
            collectives_mode: 0,
            from_collective_kernel: false,
        };
        let thunk = |name: &str, c| Thunk {
            info: ThunkInfo {
                profile_annotation: name.into(),
                ..Default::default()
            },
            kind: ThunkKind::Collective(Box::new(c)),
        };
        let out = |i: i64, a| OutputInfo {
            shape_index: vec![i],
            allocation: a,
            passthrough: false,
            alias: None,
        };
        Plan {
            module_name: "multi".into(),
            pjrt_client_name: String::new(),
            compute_capability: ComputeCapability::Unknown,
            allocations: vec![
                alloc(
                    0,
                    16,
                    AllocationRole::Parameter {
                        number: 0,
                        shape_index: vec![],
                        aliased_with_output: false,
                    },
                ),
                alloc(1, 16, AllocationRole::Output { outputs: vec![] }),
                alloc(2, 32, AllocationRole::Output { outputs: vec![] }),
            ],
            program_shape: ProgramShape {
                parameters: vec![f32s(4)],
                result: Shape {
                    element_type: ElementType::TUPLE,
                    tuple_shapes: vec![f32s(4), f32s(8)],
                    ..Default::default()
                },
                parameter_names: vec![],
            },
            outputs: vec![out(0, 1), out(1, 2)],
            kernels: KernelBinaries::default(),
            thunks: vec![
                thunk(
                    "all-reduce",
                    coll(
                        CollectiveOp::AllReduce,
                        sl(1, 16),
                        4,
                        Some(ReductionKind::Sum),
                    ),
                ),
                thunk(
                    "all-gather",
                    coll(CollectiveOp::AllGather, sl(2, 32), 4, None),
                ),
            ],
        }
    }

    fn args(dir: &Path, compare: bool) -> Args {
        Args {
            file: dir.join("multi.pjrt"),
            inputs: dir.join("in.npz"),
            outputs: Some(dir.join("got.npz")),
            mode: Some("eager".into()),
            threshold: None,
            steps: 1,
            warmup: 0,
            pipelined: false,
            compare: compare.then(|| dir.join("want.npz")),
            loop_steps: 0,
            loop_ref: None,
            schedule: None,
            nondeterministic: None,
            device: 0,
            devices: 2,
            backend: crate::BackendKind::Host,
        }
    }

    /// Two host devices in threads: per-device inputs in, per-device
    /// outputs compared bit for bit (and a wrong expectation fails).
    #[test]
    fn two_host_devices_run_and_compare() {
        use xla_vmm_device::HostBackend;
        let dir = std::env::temp_dir().join(format!("xla-vmm-run-multi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let x = [[1.0f32, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]];
        let inputs = vec![
            ("in_0_0".to_string(), f32_array(&x[0])),
            ("in_0_1".to_string(), f32_array(&x[1])),
        ];
        npz::write_npz(&dir.join("in.npz"), &inputs).unwrap();
        let sum: Vec<f32> = (0..4).map(|i| x[0][i] + x[1][i]).collect();
        let cat: Vec<f32> = x[0].iter().chain(&x[1]).copied().collect();
        let mut want = Vec::new();
        for d in 0..2 {
            want.push((format!("out_0_{d}"), f32_array(&sum)));
            want.push((format!("out_1_{d}"), f32_array(&cat)));
        }
        npz::write_npz(&dir.join("want.npz"), &want).unwrap();
        let make = |_k: usize| -> anyhow::Result<(Arc<HostBackend>, Gemm<HostBackend>)> {
            Ok((Arc::new(HostBackend::default()), None))
        };
        let a = assignment(None, 2).unwrap();
        for mode in [Mode::Eager, Mode::GraphRecapture, Mode::Graph] {
            let mut args = args(&dir, true);
            // One mode times its step pipelined (`--pipelined`).
            args.pipelined = mode == Mode::Graph;
            replay_multi(
                &make,
                collective_plan(),
                &args,
                mode,
                &OutputCheck::default(),
                a.clone(),
            )
            .unwrap_or_else(|e| panic!("{mode:?}: {e:#}"));
            let got = npz::read_npz(&dir.join("got.npz")).unwrap();
            assert_eq!(got.len(), 4);
            for (name, arr) in &want {
                let g = got.iter().find(|(n, _)| n == name).unwrap();
                assert_eq!(g.1.data, arr.data, "{mode:?} {name}");
            }
        }
        // Device 1 without its input: it fails to load, device 0 does not
        // run (instead of waiting for its peer forever).
        npz::write_npz(&dir.join("in.npz"), &inputs[..1]).unwrap();
        let e = replay_multi(
            &make,
            collective_plan(),
            &args(&dir, true),
            Mode::Eager,
            &OutputCheck::default(),
            a.clone(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("[0, 1]"), "{e}");
        npz::write_npz(&dir.join("in.npz"), &inputs).unwrap();
        // A wrong expectation on device 1 fails the run.
        want[3].1.data[0] ^= 1;
        npz::write_npz(&dir.join("want.npz"), &want).unwrap();
        let e = replay_multi(
            &make,
            collective_plan(),
            &args(&dir, true),
            Mode::Eager,
            &OutputCheck::default(),
            a,
        )
        .unwrap_err();
        assert!(e.to_string().contains("[1]"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn assignment_from_the_fixture_json_or_default() {
        let j: serde_json::Value = serde_json::json!({"devices": [4, 6]});
        let a = assignment(Some(&j), 2).unwrap();
        assert_eq!((a.replicas, a.partitions, a.ids), (1, 2, vec![4, 6]));
        assert!(assignment(Some(&j), 3).is_err());
        let j2 = serde_json::json!({"devices": [0, 1, 2, 3], "replicas": 2, "partitions": 2});
        let a = assignment(Some(&j2), 4).unwrap();
        assert_eq!((a.replicas, a.partitions), (2, 2));
        let d = assignment(None, 3).unwrap();
        assert_eq!((d.replicas, d.partitions, d.ids), (1, 3, vec![0, 1, 2]));
    }

    #[test]
    fn stock_nondeterministic_outputs_from_the_fixture_json() {
        let j = serde_json::json!({"stock_deterministic_outputs": [true, false, true, false]});
        assert_eq!(stock_nondeterministic(Some(&j)), vec!["out_1", "out_3"]);
        assert!(stock_nondeterministic(None).is_empty());
    }

    #[test]
    fn per_device_arrays_drop_the_device_suffix() {
        let all = vec![
            ("out_0_0".to_string(), arr(1)),
            ("out_0_1".to_string(), arr(2)),
            ("out_11_1".to_string(), arr(3)),
            ("out_1".to_string(), arr(4)),
            ("in_0_1".to_string(), arr(5)),
        ];
        let d1 = device_arrays(&all, 1);
        let names: Vec<_> = d1.iter().map(|(n, a)| (n.as_str(), a.data[0])).collect();
        assert_eq!(names, vec![("out_0", 2), ("out_11", 3), ("in_0", 5)]);
    }
}
