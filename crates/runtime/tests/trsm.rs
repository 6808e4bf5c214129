//! Triangular solves on the host backend, through a BLAS engine that solves
//! on the host: what the runtime hands it (the spec from the thunk, the
//! matrices directly or, for a batch, the pointer arrays it writes into the
//! thunk's temp buffer), the result in place in `b`, graph modes running the
//! program eager, and the errors at load (no engine, a type the BLAS does
//! not solve in).

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use xla_vmm::*;
use xla_vmm_device::blas::{GemmEngine, Transpose, TrsmArgs, TrsmSpec};
use xla_vmm_device::error::{DeviceError, Result as DeviceResult};
use xla_vmm_device::host::HostStream;
use xla_vmm_device::{Backend, DevicePtr, HostBackend};
use xla_vmm_runtime::{DeviceBuffer, Executable, Mode};

/// Solves `a x = b` for lower-triangular, non-unit, untransposed
/// column-major f32 matrices on the host; records every call.
struct HostSolver {
    backend: Arc<HostBackend>,
    calls: Mutex<Vec<(TrsmSpec, TrsmArgs)>>,
}

impl HostSolver {
    fn read(&self, p: DevicePtr, n: usize, s: &HostStream) -> DeviceResult<Vec<u8>> {
        let mut v = vec![0u8; n];
        self.backend.read_sync(&mut v, p, s)?;
        Ok(v)
    }

    fn f32s(&self, p: DevicePtr, n: usize, s: &HostStream) -> DeviceResult<Vec<f32>> {
        Ok(self
            .read(p, 4 * n, s)?
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn pointers(&self, p: DevicePtr, n: usize, s: &HostStream) -> DeviceResult<Vec<DevicePtr>> {
        Ok(self
            .read(p, 8 * n, s)?
            .chunks(8)
            .map(|c| DevicePtr(u64::from_le_bytes(c.try_into().unwrap())))
            .collect())
    }
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

    fn trsm(&self, spec: &TrsmSpec, args: TrsmArgs, stream: &HostStream) -> DeviceResult<()> {
        self.calls.lock().unwrap().push((*spec, args));
        assert!(spec.left_side && spec.lower && !spec.unit_diagonal);
        assert_eq!(spec.transpose, Transpose::NoTranspose);
        let (m, n, batch) = (spec.m as usize, spec.n as usize, spec.batch as usize);
        let (a_ptrs, b_ptrs) = match args {
            TrsmArgs::Single { a, b } => (vec![a], vec![b]),
            TrsmArgs::Batched { a_ptrs, b_ptrs } => (
                self.pointers(a_ptrs, batch, stream)?,
                self.pointers(b_ptrs, batch, stream)?,
            ),
        };
        for (pa, pb) in a_ptrs.into_iter().zip(b_ptrs) {
            let a = self.f32s(pa, m * m, stream)?;
            let mut x = self.f32s(pb, m * n, stream)?;
            // Forward substitution, column by column (column-major: a[i, k]
            // is a[i + k * m]).
            for j in 0..n {
                for i in 0..m {
                    let mut v = x[i + j * m];
                    for k in 0..i {
                        v -= a[i + k * m] * x[k + j * m];
                    }
                    x[i + j * m] = v / a[i + i * m];
                }
            }
            self.backend.write_sync(pb, &bytes(&x), stream)?;
        }
        Ok(())
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
/// junk (99) above it (a solve must not read it); b counts up from 1.
fn inputs(batch: usize) -> (Vec<f32>, Vec<f32>) {
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
    let b = (0..batch * M * N).map(|v| (v + 1) as f32).collect();
    (a, b)
}

fn run(
    b: &Arc<HostBackend>,
    engine: Arc<HostSolver>,
    batch: usize,
    mode: Mode,
) -> (Vec<f32>, Option<String>) {
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
    let (a, rhs) = inputs(batch);
    let pa = DeviceBuffer::alloc(b, 4 * a.len() as u64).unwrap();
    let pb = DeviceBuffer::alloc(b, 4 * rhs.len() as u64).unwrap();
    b.write_sync(pa.ptr(), &bytes(&a), &stream).unwrap();
    b.write_sync(pb.ptr(), &bytes(&rhs), &stream).unwrap();
    exe.bind_parameter(0, pa.ptr(), pa.size()).unwrap();
    exe.bind_parameter(1, pb.ptr(), pb.size()).unwrap();
    let outs = exe.run(&stream, mode).unwrap();
    b.stream_synchronize(&stream).unwrap();
    let mut d = vec![0u8; 4 * rhs.len()];
    b.read_sync(&mut d, outs[0].ptr, &stream).unwrap();
    drop(outs);
    drop(exe);
    pa.free().unwrap();
    pb.free().unwrap();
    b.stream_destroy(stream).unwrap();
    let x = d
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (x, blocker)
}

/// a[i] x[i] = b[i] for every matrix of the batch (the lower triangle of a
/// only), to 1e-5.
fn check_solution(batch: usize, x: &[f32]) {
    let (a, rhs) = inputs(batch);
    for i in 0..batch {
        let (a, x, rhs) = (
            &a[i * M * M..][..M * M],
            &x[i * M * N..][..M * N],
            &rhs[i * M * N..][..M * N],
        );
        for j in 0..N {
            for row in 0..M {
                let ax: f32 = (0..=row).map(|k| a[row + k * M] * x[k + j * M]).sum();
                assert!(
                    (ax - rhs[row + j * M]).abs() < 1e-5,
                    "batch {i} ({row}, {j}): {ax} != {}",
                    rhs[row + j * M]
                );
            }
        }
    }
}

fn solver(b: &Arc<HostBackend>) -> Arc<HostSolver> {
    Arc::new(HostSolver {
        backend: b.clone(),
        calls: Mutex::default(),
    })
}

#[test]
fn a_batch_is_solved_in_place_through_the_pointer_arrays_the_runtime_writes() {
    let b = backend();
    let engine = solver(&b);
    let (x, blocker) = run(&b, engine.clone(), BATCH, Mode::Eager);
    check_solution(BATCH, &x);
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
    let why = blocker.expect("a solve keeps the program out of graphs");
    assert!(why.contains("triangular solve triangular-solve.1"), "{why}");
}

#[test]
fn one_matrix_is_solved_directly_and_graph_modes_run_eager() {
    let b = backend();
    for mode in [Mode::Eager, Mode::Graph, Mode::GraphRecapture] {
        let engine = solver(&b);
        let (x, _) = run(&b, engine.clone(), 1, mode);
        check_solution(1, &x);
        let calls = engine.calls.lock().unwrap();
        assert_eq!(calls.len(), 1, "{mode:?}");
        assert!(
            matches!(calls[0].1, TrsmArgs::Single { .. }),
            "{mode:?}: {:?}",
            calls[0]
        );
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
