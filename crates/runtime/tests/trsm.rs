//! Triangular solves on the host backend, through a BLAS engine that solves
//! on the host: what the runtime hands it (the spec from the thunk, the
//! matrices directly or, for a batch, the pointer arrays it writes into the
//! thunk's temp buffer), the result in place in `b`, graph modes capturing
//! the solve where the engine says a capture takes it and running the
//! program eager where not, and the errors at load (no engine, a type the BLAS does
//! not solve in).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use xla_vmm::*;
use xla_vmm_device::blas::{GemmEngine, Transpose, TrsmArgs, TrsmSpec};
use xla_vmm_device::error::{DeviceError, Result as DeviceResult};
use xla_vmm_device::host::{arg_ptr, arg_u32, HostFunction, HostKernelCtx, HostStream};
use xla_vmm_device::{Backend, DevicePtr, HostBackend, ImageKind, LaunchConfig};
use xla_vmm_runtime::{DeviceBuffer, Executable, Mode};

/// Solves `a x = b` for lower-triangular, non-unit, untransposed
/// column-major f32 matrices through a host kernel enqueued on the stream
/// (so a capture takes it, and a replay solves again with what the pointer
/// tables then hold); records every call.
struct HostSolver {
    backend: Arc<HostBackend>,
    kernel: HostFunction,
    /// What `library_calls_capturable` answers.
    capturable: bool,
    /// Its next this many solves fail (as a library call refused under a
    /// capture would).
    failures: AtomicUsize,
    calls: Mutex<Vec<(TrsmSpec, TrsmArgs)>>,
}

/// The solver's kernel: args (a, b, batched: u32, m: u32, n: u32, batch:
/// u32); batched: a and b are tables of `batch` pointers.
fn solve_kernel(ctx: &HostKernelCtx<'_>, args: &[&[u8]], _: &LaunchConfig) -> DeviceResult<()> {
    let (a, b) = (arg_ptr(args, 0)?, arg_ptr(args, 1)?);
    let batched = arg_u32(args, 2)? != 0;
    let (m, n, batch) = (
        arg_u32(args, 3)? as usize,
        arg_u32(args, 4)? as usize,
        arg_u32(args, 5)? as usize,
    );
    let table = |p: DevicePtr| -> DeviceResult<Vec<DevicePtr>> {
        Ok(ctx
            .read_vec(p, 8 * batch)?
            .chunks(8)
            .map(|c| DevicePtr(u64::from_le_bytes(c.try_into().unwrap())))
            .collect())
    };
    let (a_ptrs, b_ptrs) = if batched {
        (table(a)?, table(b)?)
    } else {
        (vec![a], vec![b])
    };
    for (pa, pb) in a_ptrs.into_iter().zip(b_ptrs) {
        let a = ctx.read_f32(pa, m * m)?;
        let mut x = ctx.read_f32(pb, m * n)?;
        // Forward substitution, column by column (column-major: a[i, k] is
        // a[i + k * m]).
        for j in 0..n {
            for i in 0..m {
                let mut v = x[i + j * m];
                for k in 0..i {
                    v -= a[i + k * m] * x[k + j * m];
                }
                x[i + j * m] = v / a[i + i * m];
            }
        }
        ctx.write_f32(pb, &x)?;
    }
    Ok(())
}

impl GemmEngine<HostBackend> for HostSolver {
    no_matmul!();

    fn prepare_trsm(&self, spec: &TrsmSpec) -> DeviceResult<()> {
        if spec.dtype == xla_vmm_device::blas::xla_type::F32 {
            Ok(())
        } else {
            Err(DeviceError::Unsupported(format!("dtype {}", spec.dtype)))
        }
    }

    fn library_calls_capturable(&self) -> bool {
        self.capturable
    }

    fn trsm(&self, spec: &TrsmSpec, args: TrsmArgs, stream: &HostStream) -> DeviceResult<()> {
        self.calls.lock().unwrap().push((*spec, args));
        let fail = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(DeviceError::Unsupported("test: the solve fails".into()));
        }
        assert!(spec.left_side && spec.lower && !spec.unit_diagonal);
        assert_eq!(spec.transpose, Transpose::NoTranspose);
        let (a, b, batched) = match args {
            TrsmArgs::Single { a, b } => (a, b, 0u32),
            TrsmArgs::Batched { a_ptrs, b_ptrs } => (a_ptrs, b_ptrs, 1),
        };
        let u = |v: i32| (v as u32).to_le_bytes();
        let (a, b) = (a.0.to_le_bytes(), b.0.to_le_bytes());
        let (batched, m, n, count) = (batched.to_le_bytes(), u(spec.m), u(spec.n), u(spec.batch));
        let config = LaunchConfig {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            ..Default::default()
        };
        self.backend.launch(
            &self.kernel,
            &config,
            &[&a, &b, &batched, &m, &n, &count],
            stream,
        )
    }
}

const BATCH: usize = 3;
const M: usize = 4;
const N: usize = 2;

/// out = solve(a, b) as XLA emits it: the copy of b into the result, then
/// the solve in place there; temp holds the pointer arrays.
fn solve_plan(batch: usize, element_type: ElementType) -> Plan {
    let (a_bytes, b_bytes) = ((batch * M * M * 4) as u64, (batch * M * N * 4) as u64);
    let temp_bytes = (2 * 8 * batch) as u64;
    let shape = |dims: &[usize]| Shape {
        element_type,
        dimensions: dims.iter().map(|&d| d as i64).collect(),
        ..Default::default()
    };
    let ss = |slice, dims: &[usize]| ShapedSlice {
        slice,
        shape: Some(shape(dims)),
    };
    let (a_dims, b_dims) = ([batch, M, M], [batch, M, N]);
    let solve = TriangularSolveThunk {
        left_side: true,
        lower: true,
        unit_diagonal: false,
        transpose_a: SolveTranspose::NoTranspose,
        a: ss(sl(0, 0, a_bytes), &a_dims),
        b: ss(sl(2, 0, b_bytes), &b_dims),
        temp: ss(sl(3, 0, temp_bytes), &[2 * 8 * batch]),
        element_type,
        batch: batch as i64,
        m: M as i64,
        n: N as i64,
    };
    plan(
        vec![
            alloc(0, a_bytes, param(0, false)),
            alloc(1, b_bytes, param(1, false)),
            alloc(2, b_bytes, AllocationRole::Output { outputs: vec![] }),
            alloc(3, temp_bytes, AllocationRole::Temp),
        ],
        vec![shape(&a_dims), shape(&b_dims)],
        vec![(2, shape(&b_dims))],
        vec![
            copy("copy.b", sl(1, 0, b_bytes), sl(2, 0, b_bytes)),
            thunk(
                "triangular-solve.1",
                ThunkKind::TriangularSolve(Box::new(solve)),
            ),
        ],
    )
}

/// Batch i: a lower triangle with (i + 2) on the diagonal and 0.5 below it,
/// junk (99) above it (a solve must not read it); b counts up from
/// 1 + 10 * step (each step of a run solves a new right-hand side).
fn inputs(batch: usize, step: usize) -> (Vec<f32>, Vec<f32>) {
    let mut a = Vec::new();
    for i in 0..batch {
        for col in 0..M {
            for row in 0..M {
                a.push(match row.cmp(&col) {
                    std::cmp::Ordering::Equal => (i + 2) as f32,
                    std::cmp::Ordering::Greater => 0.5,
                    std::cmp::Ordering::Less => 99.0,
                });
            }
        }
    }
    let b = (0..batch * M * N)
        .map(|v| (v + 1 + 10 * step) as f32)
        .collect();
    (a, b)
}

/// Load the solve of `batch` matrices and run it `steps` times in `mode`,
/// each step on a new right-hand side in a new buffer; the solutions, and
/// why the program is kept out of graphs if it is.
fn run(
    b: &Arc<HostBackend>,
    engine: Arc<HostSolver>,
    batch: usize,
    mode: Mode,
    steps: usize,
) -> (Vec<Vec<f32>>, Option<String>) {
    let stream = b.stream_create().unwrap();
    let engine: Arc<dyn GemmEngine<HostBackend>> = engine;
    let mut exe = Executable::load_with(
        b.clone(),
        solve_plan(batch, ElementType::F32),
        Some(engine),
        None,
        &xla_vmm_runtime::RunConfig::default(),
        &stream,
    )
    .unwrap();
    let blocker = exe.program().capture_blocker().map(str::to_string);
    let solutions = solve_steps(b, &mut exe, &stream, mode, batch, steps);
    drop(exe);
    b.stream_destroy(stream).unwrap();
    (solutions, blocker)
}

/// Run the loaded solve `steps` times in `mode`, each step on a new
/// right-hand side in a new buffer: the solutions.
fn solve_steps(
    b: &Arc<HostBackend>,
    exe: &mut Executable<HostBackend>,
    stream: &HostStream,
    mode: Mode,
    batch: usize,
    steps: usize,
) -> Vec<Vec<f32>> {
    let (a, _) = inputs(batch, 0);
    let pa = DeviceBuffer::alloc(b, 4 * a.len() as u64).unwrap();
    b.write_sync(pa.ptr(), &bytes(&a), stream).unwrap();
    exe.bind_parameter(0, pa.ptr(), pa.size()).unwrap();
    let mut solutions = Vec::new();
    for step in 0..steps {
        let (_, rhs) = inputs(batch, step);
        let pb = DeviceBuffer::alloc(b, 4 * rhs.len() as u64).unwrap();
        b.write_sync(pb.ptr(), &bytes(&rhs), stream).unwrap();
        exe.bind_parameter(1, pb.ptr(), pb.size()).unwrap();
        let outs = exe.run(stream, mode).unwrap();
        b.stream_synchronize(stream).unwrap();
        let mut d = vec![0u8; 4 * rhs.len()];
        b.read_sync(&mut d, outs[0].ptr, stream).unwrap();
        drop(outs);
        pb.free().unwrap();
        solutions.push(
            d.chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        );
    }
    pa.free().unwrap();
    solutions
}

/// a[i] x[i] = b[i] for every matrix of the batch (the lower triangle of a
/// only) with step `step`'s b, to 1e-5 relative.
fn check_solution(batch: usize, step: usize, x: &[f32]) {
    let (a, rhs) = inputs(batch, step);
    for i in 0..batch {
        let (a, x, rhs) = (
            &a[i * M * M..][..M * M],
            &x[i * M * N..][..M * N],
            &rhs[i * M * N..][..M * N],
        );
        for j in 0..N {
            for row in 0..M {
                let ax: f32 = (0..=row).map(|k| a[row + k * M] * x[k + j * M]).sum();
                let want = rhs[row + j * M];
                assert!(
                    (ax - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "batch {i} ({row}, {j}): {ax} != {}",
                    rhs[row + j * M]
                );
            }
        }
    }
}

/// A solver whose solves a capture takes or not.
fn solver_capturable(b: &Arc<HostBackend>, capturable: bool) -> Arc<HostSolver> {
    b.register_kernel("host_trsm", Arc::new(solve_kernel));
    let module = b.module_load(b"host_trsm\n", ImageKind::Host).unwrap();
    Arc::new(HostSolver {
        backend: b.clone(),
        kernel: b.module_function(&module, "host_trsm").unwrap(),
        capturable,
        failures: AtomicUsize::new(0),
        calls: Mutex::default(),
    })
}

fn solver(b: &Arc<HostBackend>) -> Arc<HostSolver> {
    solver_capturable(b, false)
}

#[test]
fn a_batch_is_solved_in_place_through_the_pointer_arrays_the_runtime_writes() {
    let b = backend();
    let engine = solver(&b);
    let (x, blocker) = run(&b, engine.clone(), BATCH, Mode::Eager, 1);
    check_solution(BATCH, 0, &x[0]);
    let calls = engine.calls.lock().unwrap();
    assert_eq!(calls.len(), 1);
    let (spec, args) = calls[0];
    assert_eq!(
        (spec.m, spec.n, spec.batch, spec.lda()),
        (M as i32, N as i32, BATCH as i32, M as i32)
    );
    assert!(matches!(args, TrsmArgs::Batched { a_ptrs, b_ptrs }
        if b_ptrs.0 == a_ptrs.0 + 8 * BATCH as u64));
    // Two 32-bit memsets per pointer, a's and b's.
    assert!(
        b.call_count("memset_d32") >= 4 * BATCH as u64,
        "{:?}",
        b.call_counts()
    );
    let why = blocker.expect("a solver that is not captured keeps the program out of graphs");
    assert!(
        why.contains("triangular solve triangular-solve.1") && why.contains("does not capture"),
        "{why}"
    );
}

#[test]
fn one_matrix_is_solved_directly_and_graph_modes_run_eager_without_a_capturable_solver() {
    let b = backend();
    for mode in [Mode::Eager, Mode::Graph, Mode::GraphRecapture] {
        let engine = solver(&b);
        let (x, _) = run(&b, engine.clone(), 1, mode, 3);
        for (step, x) in x.iter().enumerate() {
            check_solution(1, step, x);
        }
        let calls = engine.calls.lock().unwrap();
        assert_eq!(calls.len(), 3, "{mode:?}: one solve a step, eager");
        assert!(
            calls.iter().all(|c| matches!(c.1, TrsmArgs::Single { .. })),
            "{mode:?}: {calls:?}"
        );
    }
    assert_eq!(b.call_count("graph_launch"), 0, "{:?}", b.call_counts());
}

/// A solver a capture takes: the program runs as a graph, and its replays
/// solve each step's new right-hand side (a batch through the pointer
/// tables the captured memsets write again) without calling the solver.
#[test]
fn graph_modes_capture_the_solves_of_a_capturable_solver_and_replays_solve_each_step() {
    const STEPS: usize = 6;
    for batch in [1, BATCH] {
        for mode in [Mode::Graph, Mode::GraphRecapture] {
            let b = backend();
            let engine = solver_capturable(&b, true);
            let (x, blocker) = run(&b, engine.clone(), batch, mode, STEPS);
            assert_eq!(blocker, None, "{mode:?}");
            for (step, x) in x.iter().enumerate() {
                check_solution(batch, step, x);
            }
            let calls = engine.calls.lock().unwrap().len();
            let launches = b.call_count("graph_launch");
            assert!(
                launches > 0 && (calls as u64) + launches >= STEPS as u64,
                "{mode:?} batch {batch}: {calls} solver calls, {launches} graph launches"
            );
            if mode == Mode::Graph {
                assert!(
                    calls < STEPS,
                    "batch {batch}: the VA-stable graph replays without the solver ({calls} calls)"
                );
            }
        }
    }
}

/// The solve program of `batch` matrices on a capturable host solver whose
/// first `failures` calls fail.
fn load_failing_solve(
    b: &Arc<HostBackend>,
    failures: usize,
    batch: usize,
    stream: &HostStream,
) -> (Arc<HostSolver>, Executable<HostBackend>) {
    let engine = Arc::new(HostSolver {
        failures: AtomicUsize::new(failures),
        ..Arc::into_inner(solver_capturable(b, true)).unwrap()
    });
    let dyn_engine: Arc<dyn GemmEngine<HostBackend>> = engine.clone();
    let exe = Executable::load_with(
        b.clone(),
        solve_plan(batch, ElementType::F32),
        Some(dyn_engine),
        None,
        &xla_vmm_runtime::RunConfig::default(),
        stream,
    )
    .unwrap();
    (engine, exe)
}

/// Destroys `stream` and checks that no graph (nor graph exec) is left.
fn no_graph_left(b: &Arc<HostBackend>, stream: HostStream, mode: Mode) {
    b.stream_destroy(stream).unwrap();
    let o = b.outstanding();
    assert_eq!((o.graphs, o.graph_execs), (0, 0), "{mode:?}: {o:?}");
}

/// A solve that fails while the stream captures and again eager: the step
/// fails with its error, and the capture leaves no graph behind (nothing
/// leaks once the program is gone).
#[test]
fn a_solve_failing_in_a_capture_fails_the_step_and_leaves_no_graph() {
    for mode in [Mode::Graph, Mode::GraphRecapture] {
        let b = backend();
        let stream = b.stream_create().unwrap();
        let (_, mut exe) = load_failing_solve(&b, usize::MAX, 1, &stream);
        let (a, rhs) = inputs(1, 0);
        let pa = DeviceBuffer::alloc(&b, 4 * a.len() as u64).unwrap();
        let pb = DeviceBuffer::alloc(&b, 4 * rhs.len() as u64).unwrap();
        exe.bind_parameter(0, pa.ptr(), pa.size()).unwrap();
        exe.bind_parameter(1, pb.ptr(), pb.size()).unwrap();
        let e = exe.run(&stream, mode).expect_err("the solve fails");
        assert!(
            e.to_string().contains("test: the solve fails"),
            "{mode:?}: {e}"
        );
        b.stream_synchronize(&stream).unwrap();
        drop(exe);
        pa.free().unwrap();
        pb.free().unwrap();
        no_graph_left(&b, stream, mode);
    }
}

/// A solve that fails only while the stream captures (its first call): the
/// step runs again eager and gives the solution, and the program runs eager
/// from then on, saying why; no graph is left.
#[test]
fn a_solve_failing_only_in_a_capture_runs_the_program_eager_from_then_on() {
    for mode in [Mode::Graph, Mode::GraphRecapture] {
        let b = backend();
        let stream = b.stream_create().unwrap();
        let (engine, mut exe) = load_failing_solve(&b, 1, BATCH, &stream);
        let solutions = solve_steps(&b, &mut exe, &stream, mode, BATCH, 3);
        for (step, x) in solutions.iter().enumerate() {
            check_solution(BATCH, step, x);
        }
        // The failed capture, then one eager solve a step.
        assert_eq!(engine.calls.lock().unwrap().len(), 4, "{mode:?}");
        assert_eq!(exe.runner_name(), "eager", "{mode:?}");
        let why = exe.report_line().reason.unwrap_or_default();
        assert!(
            why.contains("graph step failed") && why.contains("test: the solve fails"),
            "{mode:?}: {why}"
        );
        drop(exe);
        no_graph_left(&b, stream, mode);
    }
}

#[test]
fn loading_a_solve_needs_an_engine_that_solves_in_its_type() {
    let b = backend();
    let stream = b.stream_create().unwrap();
    let e = load_error_without_engines(&b, solve_plan(BATCH, ElementType::F32), &stream);
    assert!(e.contains("no BLAS engine"), "{e}");
    // BF16: the runtime's own check, before any engine (as check_support).
    let bf16 = solve_plan(BATCH, ElementType(16));
    let e = xla_vmm_runtime::ops::check_support(&bf16)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("triangular-solve.1") && e.contains("BF16") && e.contains("F32, F64"),
        "{e}"
    );
    let engine: Arc<dyn GemmEngine<HostBackend>> = solver(&b);
    let e = Executable::load_with(
        b.clone(),
        bf16,
        Some(engine),
        None,
        &xla_vmm_runtime::RunConfig::default(),
        &stream,
    )
    .err()
    .expect("bf16")
    .to_string();
    assert!(e.contains("BF16"), "{e}");
    b.stream_destroy(stream).unwrap();
}
