//! Host-offloaded compute (`host_execute_start` / `host_execute_done`) on
//! the host backend, with a host program that stands in for the CPU
//! compiler: what the program is given (element types, dimensions, the
//! staged bytes, sub-byte types packed), results landing in their slices
//! before the work after the done, graph modes running the program eager,
//! and the load-time and run-time errors.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use xla_vmm::*;
use xla_vmm_device::{Backend, HostBackend};
use xla_vmm_runtime::{
    BoundCall, CallSite, CustomCallRegistry, DeviceBuffer, Executable, HostArray, HostArrayMut,
    HostProgram, Mode, RuntimeError,
};

/// Result 0 = operand 0 (S32) * 2; result 1 = operand 1's packed bytes, in
/// reverse order. Records what it was given; fails when asked to.
#[derive(Debug, Default)]
struct Doubler {
    seen: Mutex<Vec<String>>,
    fail: bool,
}

impl HostProgram for Doubler {
    fn run(&self, args: &[HostArray<'_>], results: &mut [HostArrayMut<'_>]) -> Result<(), String> {
        self.seen.lock().unwrap().push(format!(
            "args={:?} results={:?}",
            args.iter()
                .map(|a| (a.dtype.name().unwrap(), a.dims.to_vec(), a.bytes.len()))
                .collect::<Vec<_>>(),
            results
                .iter()
                .map(|r| (r.dtype.name().unwrap(), r.dims.to_vec(), r.bytes.len()))
                .collect::<Vec<_>>()
        ));
        if self.fail {
            return Err("the CPU said no".into());
        }
        for (o, i) in results[0].bytes.chunks_mut(4).zip(args[0].bytes.chunks(4)) {
            let v = i32::from_le_bytes([i[0], i[1], i[2], i[3]]) * 2;
            o.copy_from_slice(&v.to_le_bytes());
        }
        for (o, i) in results[1].bytes.iter_mut().zip(args[1].bytes.iter().rev()) {
            *o = *i;
        }
        Ok(())
    }
}

/// What a binding was given: the module, XLA:CPU's code, the thunk's name.
type Bound = (Vec<u8>, Option<Vec<u8>>, String);

/// Gives `program` for every host computation (and records the modules).
#[derive(Default)]
struct Registry {
    program: Arc<Doubler>,
    modules: Mutex<Vec<Bound>>,
    none: bool,
}

impl CustomCallRegistry for Registry {
    fn bind(&self, _: &CallSite<'_>) -> Result<Option<Arc<dyn BoundCall>>, String> {
        Ok(None)
    }

    fn bind_host_program(
        &self,
        program: &HostExecuteStartThunk,
        name: &str,
    ) -> Result<Option<Arc<dyn HostProgram>>, String> {
        self.modules.lock().unwrap().push((
            program.hlo_module.to_vec(),
            program.aot_result.as_ref().map(|a| a.to_vec()),
            name.to_string(),
        ));
        if self.none {
            return Ok(None);
        }
        Ok(Some(self.program.clone()))
    }
}

fn array(t: ElementType, dims: &[i64]) -> Shape {
    Shape {
        element_type: t,
        dimensions: dims.to_vec(),
        minor_to_major: Some((0..dims.len() as i64).rev().collect()),
        ..Default::default()
    }
}

const U4: ElementType = ElementType(22);

/// Operands: param 0 (s32[2,3], 24 B) and param 1 (u4[5], 3 B packed);
/// results into temps, then the work after the done copies them to the
/// outputs (it must see the results).
fn host_plan() -> Plan {
    let allocs = vec![
        alloc(0, 24, param(0, false)),
        alloc(1, 3, param(1, false)),
        alloc(2, 24, AllocationRole::Output { outputs: vec![] }),
        alloc(3, 3, AllocationRole::Output { outputs: vec![] }),
        alloc(4, 32, AllocationRole::Temp),
    ];
    let shaped = |slice, shape| ShapedSlice {
        slice,
        shape: Some(shape),
    };
    let start = HostExecuteStartThunk {
        hlo_module: Blob(b"an HloModuleProto".to_vec()),
        executable_type: 2,
        aot_result: Some(Blob(b"native code".to_vec())),
        args: vec![
            shaped(sl(0, 0, 24), array(ElementType::S32, &[2, 3])),
            shaped(sl(1, 0, 3), array(U4, &[5])),
        ],
        results: vec![
            shaped(sl(4, 0, 24), array(ElementType::S32, &[2, 3])),
            shaped(sl(4, 24, 3), array(U4, &[5])),
        ],
        async_events_unique_id: 77,
    };
    plan(
        allocs,
        vec![array(ElementType::S32, &[2, 3]), array(U4, &[5])],
        vec![(2, array(ElementType::S32, &[2, 3])), (3, array(U4, &[5]))],
        vec![
            thunk(
                "host-call.call-start",
                ThunkKind::HostExecuteStart(Box::new(start)),
            ),
            thunk(
                "host-call.call-done",
                ThunkKind::HostExecuteDone {
                    async_events_unique_id: 77,
                },
            ),
            copy("copy.1", sl(4, 0, 24), sl(2, 0, 24)),
            copy("copy.2", sl(4, 24, 3), sl(3, 0, 3)),
        ],
    )
}

fn start_of(p: &mut Plan) -> &mut HostExecuteStartThunk {
    match &mut p.thunks[0].kind {
        ThunkKind::HostExecuteStart(h) => h,
        _ => unreachable!(),
    }
}

fn run(
    b: &Arc<HostBackend>,
    reg: Option<&Registry>,
    p: Plan,
    mode: Mode,
) -> Result<(Vec<i32>, Vec<u8>), RuntimeError> {
    run_n(b, reg, p, mode, 1)
}

/// Load once, run `n` times; the last run's outputs.
fn run_n(
    b: &Arc<HostBackend>,
    reg: Option<&Registry>,
    p: Plan,
    mode: Mode,
    n: usize,
) -> Result<(Vec<i32>, Vec<u8>), RuntimeError> {
    let stream = b.stream_create()?;
    let reg = reg.map(|r| r as &dyn CustomCallRegistry);
    let mut exe = Executable::load_with(
        b.clone(),
        p,
        None,
        reg,
        &xla_vmm_runtime::RunConfig::default(),
        &stream,
    )?;
    let ints: Vec<u8> = (1..=6i32).flat_map(|v| v.to_le_bytes()).collect();
    let in0 = DeviceBuffer::alloc(b, 24)?;
    let in1 = DeviceBuffer::alloc(b, 3)?;
    b.write_sync(in0.ptr(), &ints, &stream)?;
    b.write_sync(in1.ptr(), &[0x21, 0x43, 0x05], &stream)?;
    exe.bind_parameter(0, in0.ptr(), 24)?;
    exe.bind_parameter(1, in1.ptr(), 3)?;
    let mut out = Err(RuntimeError::Handler("not run".into()));
    for _ in 0..n {
        out = exe.run(&stream, mode).and_then(|outs| {
            b.stream_synchronize(&stream)?;
            let mut d = vec![0u8; 24];
            b.read_sync(&mut d, outs[0].ptr, &stream)?;
            let mut u = vec![0u8; 3];
            b.read_sync(&mut u, outs[1].ptr, &stream)?;
            let ints = d
                .chunks(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            Ok((ints, u))
        });
    }
    drop(exe);
    in0.free()?;
    in1.free()?;
    b.stream_destroy(stream)?;
    out
}

#[test]
fn the_program_gets_the_staged_leaves_and_its_results_reach_the_work_after_the_done() {
    let b = backend();
    let reg = Registry::default();
    let (ints, u4) = run(&b, Some(&reg), host_plan(), Mode::Eager).unwrap();
    assert_eq!(ints, vec![2, 4, 6, 8, 10, 12]);
    assert_eq!(u4, vec![0x05, 0x43, 0x21]);
    assert_eq!(
        *reg.program.seen.lock().unwrap(),
        ["args=[(\"S32\", [2, 3], 24), (\"U4\", [5], 3)] results=[(\"S32\", [2, 3], 24), (\"U4\", [5], 3)]"]
    );
    // Bound once at load, with the thunk's module, XLA:CPU's code and name.
    assert_eq!(
        *reg.modules.lock().unwrap(),
        [(
            b"an HloModuleProto".to_vec(),
            Some(b"native code".to_vec()),
            "host-call.call-start".to_string()
        )]
    );
    // The staging memory went back with the program.
    assert_eq!(b.call_count("host_alloc"), b.call_count("host_free"));
    assert!(b.call_count("host_alloc") >= 1, "{:?}", b.call_counts());
}

#[test]
fn staging_memory_is_allocated_once_and_reused_by_later_runs() {
    let b = backend();
    let reg = Registry::default();
    let (ints, _) = run_n(&b, Some(&reg), host_plan(), Mode::Eager, 4).unwrap();
    assert_eq!(ints, vec![2, 4, 6, 8, 10, 12]);
    assert_eq!(reg.program.seen.lock().unwrap().len(), 4);
    assert_eq!(b.call_count("host_alloc"), 1, "{:?}", b.call_counts());
    assert_eq!(b.call_count("host_free"), 1);
}

#[test]
fn graph_modes_run_a_host_computation_eager_with_the_same_result() {
    let b = backend();
    for mode in [Mode::Graph, Mode::GraphRecapture] {
        let reg = Registry::default();
        let (ints, u4) = run(&b, Some(&reg), host_plan(), mode).unwrap();
        assert_eq!(ints, vec![2, 4, 6, 8, 10, 12], "{mode:?}");
        assert_eq!(u4, vec![0x05, 0x43, 0x21], "{mode:?}");
        assert_eq!(reg.program.seen.lock().unwrap().len(), 1, "{mode:?}");
    }
    let stream = b.stream_create().unwrap();
    let reg = Registry::default();
    let exe = Executable::load_with(
        b.clone(),
        host_plan(),
        None,
        Some(&reg),
        &xla_vmm_runtime::RunConfig::default(),
        &stream,
    )
    .unwrap();
    let why = exe.program().capture_blocker().unwrap();
    assert!(why.contains("host compute host-call.call-start"), "{why}");
    drop(exe);
    b.stream_destroy(stream).unwrap();
}

#[test]
fn a_failing_program_fails_the_run_naming_the_thunk_and_the_executable_runs_again() {
    let b = backend();
    let reg = Registry {
        program: Arc::new(Doubler {
            fail: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    let e = run(&b, Some(&reg), host_plan(), Mode::Eager).unwrap_err();
    assert!(matches!(e, RuntimeError::Handler(_)), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("host-call.call-start") && e.contains("the CPU said no"),
        "{e}"
    );
    assert_eq!(b.call_count("host_alloc"), b.call_count("host_free"));
}

#[test]
fn what_cannot_be_staged_or_compiled_is_refused_at_load_naming_it() {
    let b = backend();
    let load = |p: Plan, reg: Option<&Registry>| {
        let stream = b.stream_create().unwrap();
        let reg = reg.map(|r| r as &dyn CustomCallRegistry);
        let e = Executable::load_with(
            b.clone(),
            p,
            None,
            reg,
            &xla_vmm_runtime::RunConfig::default(),
            &stream,
        )
        .err()
        .map(|e| e.to_string());
        b.stream_destroy(stream).unwrap();
        e.expect("loaded")
    };
    let reg = Registry::default();
    // No registry, or one without a CPU compiler.
    let e = load(host_plan(), None);
    assert!(
        e.contains("host compute") && e.contains("host-call.call-start"),
        "{e}"
    );
    let none = Registry {
        none: true,
        ..Default::default()
    };
    let e = load(host_plan(), Some(&none));
    assert!(e.contains("no host-program source"), "{e}");
    // A column-major operand.
    let mut p = host_plan();
    start_of(&mut p).args[0]
        .shape
        .as_mut()
        .unwrap()
        .minor_to_major = Some(vec![0, 1]);
    let e = load(p, Some(&reg));
    assert!(
        e.contains("operand 0") && e.contains("layout [0, 1]"),
        "{e}"
    );
    // A slice that is not the shape's size.
    let mut p = host_plan();
    start_of(&mut p).results[1].shape = Some(array(U4, &[7]));
    let e = load(p, Some(&reg));
    assert!(
        e.contains("result 1") && e.contains("3 bytes, its shape 4"),
        "{e}"
    );
    // A token leaf.
    let mut p = host_plan();
    start_of(&mut p).args[1].shape = Some(Shape {
        element_type: ElementType::TOKEN,
        ..Default::default()
    });
    let e = load(p, Some(&reg));
    assert!(e.contains("element type TOKEN"), "{e}");
    // No module.
    let mut p = host_plan();
    start_of(&mut p).hlo_module = Blob::default();
    let e = load(p, Some(&reg));
    assert!(e.contains("without its HLO module"), "{e}");
    // A start without its done.
    let mut p = host_plan();
    p.thunks.remove(1);
    let e = load(p, Some(&reg));
    assert!(e.contains("do not pair up"), "{e}");
    assert!(reg.program.seen.lock().unwrap().is_empty());
}
