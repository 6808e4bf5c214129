//! FFTs on the host backend, through an engine that transforms on the host
//! from the spec alone (lengths, embeds, distances, batch; the scaling of
//! inverse transforms): what the runtime hands it for XLA's four kinds
//! (the plan from the thunk's shapes, input and output, a work area of its
//! own in the program's scratch, a copy of a complex-to-real transform's
//! input, which the engine scribbles on as cuFFT may), the results, graph
//! modes capturing the transforms where the engine says a capture takes
//! them and running the program eager where not, and the errors at load.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use xla_vmm::*;
use xla_vmm_device::blas::GemmEngine;
use xla_vmm_device::error::Result as DeviceResult;
use xla_vmm_device::fft::{FftArgs, FftKind, FftPlanId, FftSpec};
use xla_vmm_device::host::{
    arg_ptr, arg_u64, HostFunction, HostKernelCtx, HostKernelFn, HostStream,
};
use xla_vmm_device::{Backend, HostBackend, ImageKind, LaunchConfig};
use xla_vmm_runtime::{DeviceBuffer, Executable, Mode};

/// The work area every plan asks for (not a multiple of the alignment).
const WORK: u64 = 100;

type C = (f64, f64);

/// `out[k] = sum_j in[j] e^(sign 2 pi i j k / n)` along one axis of a
/// row-major array of `dims`.
fn dft_axis(v: &mut [C], dims: &[usize], axis: usize, sign: f64) {
    let n = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let outer: usize = dims[..axis].iter().product();
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            let line: Vec<C> = (0..n).map(|j| v[at(j)]).collect();
            for k in 0..n {
                let mut acc = (0.0, 0.0);
                for (j, &(re, im)) in line.iter().enumerate() {
                    let a = sign * 2.0 * std::f64::consts::PI * (j * k) as f64 / n as f64;
                    acc.0 += re * a.cos() - im * a.sin();
                    acc.1 += re * a.sin() + im * a.cos();
                }
                v[at(k)] = acc;
            }
        }
    }
}

/// The multi-dimensional DFT of one transform.
fn dft(v: &mut [C], dims: &[usize], sign: f64) {
    for axis in 0..dims.len() {
        dft_axis(v, dims, axis, sign);
    }
}

/// Transforms on the host, through a host kernel enqueued on the stream (so
/// a capture takes it and a replay transforms again); records every spec
/// and call.
struct HostFft {
    backend: Arc<HostBackend>,
    kernel: HostFunction,
    /// What `library_calls_capturable` answers.
    capturable: bool,
    specs: Arc<Mutex<Vec<FftSpec>>>,
    runs: Mutex<Vec<(FftPlanId, FftArgs)>>,
    released: Mutex<Vec<FftPlanId>>,
    /// The library refuses the plan after this many.
    refuse_after: Option<usize>,
}

/// One transform of `spec` (what the engine's kernel does when it runs).
fn transform(ctx: &HostKernelCtx<'_>, spec: &FftSpec, args: &FftArgs) -> DeviceResult<()> {
    assert!(!spec.double, "the test transforms single precision");
    // The work area is the engine's to use.
    ctx.write(args.workspace, &[0xab; WORK as usize])?;
    let n: Vec<usize> = spec.n.iter().map(|&d| d as usize).collect();
    let full: usize = n.iter().product();
    let (idist, odist) = (spec.idist as usize, spec.odist as usize);
    let complex_in = spec.kind != FftKind::RealToComplex;
    let complex_out = spec.kind != FftKind::ComplexToReal;
    let per = |complex| if complex { 2 } else { 1 };
    let batch = spec.batch as usize;
    let input = ctx.read_f32(args.input, batch * idist * per(complex_in))?;
    let mut out = Vec::new();
    for b in 0..batch {
        let x = &input[b * idist * per(complex_in)..][..idist * per(complex_in)];
        // The full complex array of the transform's input.
        let mut v: Vec<C> = vec![(0.0, 0.0); full];
        let last = *n.last().unwrap();
        let half = last / 2 + 1;
        for (i, c) in v.iter_mut().enumerate() {
            *c = match spec.kind {
                FftKind::Forward | FftKind::Inverse => (x[2 * i] as f64, x[2 * i + 1] as f64),
                FftKind::RealToComplex => (x[i] as f64, 0.0),
                FftKind::ComplexToReal => {
                    // Hermitian: X[k] = conj(X[n - k]) (1-D here).
                    let k = i % last;
                    let (k, conj) = if k < half { (k, 1.0) } else { (last - k, -1.0) };
                    let j = i / last * half + k;
                    (x[2 * j] as f64, conj * x[2 * j + 1] as f64)
                }
            };
        }
        let sign = if spec.is_inverse() { 1.0 } else { -1.0 };
        dft(&mut v, &n, sign);
        let scale = if spec.is_inverse() {
            1.0 / odist as f64
        } else {
            1.0
        };
        for (i, &(re, im)) in v.iter().enumerate() {
            match spec.kind {
                FftKind::Forward | FftKind::Inverse => {
                    out.extend([(re * scale) as f32, (im * scale) as f32])
                }
                FftKind::RealToComplex if i % last < half => out.extend([re as f32, im as f32]),
                FftKind::RealToComplex => {}
                FftKind::ComplexToReal => out.push((re * scale) as f32),
            }
        }
    }
    assert_eq!(out.len(), batch * odist * per(complex_out));
    ctx.write_f32(args.output, &out)?;
    if spec.kind == FftKind::ComplexToReal {
        // cuFFT may write the input of a C2R transform.
        let junk = vec![0x7fu8; 4 * input.len()];
        ctx.write(args.input, &junk)?;
    }
    Ok(())
}

/// The engine's kernel: args (plan, input, output, work area); the plan's
/// spec from `specs`.
fn fft_kernel(specs: Arc<Mutex<Vec<FftSpec>>>) -> HostKernelFn {
    Arc::new(move |ctx, args, _| {
        let plan = arg_u64(args, 0)? as usize;
        let spec = specs.lock().unwrap()[plan].clone();
        let (input, output, workspace) = (arg_ptr(args, 1)?, arg_ptr(args, 2)?, arg_ptr(args, 3)?);
        transform(
            ctx,
            &spec,
            &FftArgs {
                input,
                output,
                workspace,
            },
        )
    })
}

impl GemmEngine<HostBackend> for HostFft {
    no_matmul!();

    fn prepare_fft(&self, spec: &FftSpec) -> DeviceResult<FftPlanId> {
        let mut specs = self.specs.lock().unwrap();
        if Some(specs.len()) == self.refuse_after {
            return Err(xla_vmm_device::DeviceError::NotAvailable(
                "test: no plan".into(),
            ));
        }
        specs.push(spec.clone());
        Ok(FftPlanId(specs.len() - 1))
    }

    fn fft_workspace(&self, _: FftPlanId) -> DeviceResult<u64> {
        Ok(WORK)
    }

    fn release_fft(&self, plan: FftPlanId) {
        self.released.lock().unwrap().push(plan);
    }

    fn library_calls_capturable(&self) -> bool {
        self.capturable
    }

    fn run_fft(&self, plan: FftPlanId, args: &FftArgs, s: &HostStream) -> DeviceResult<()> {
        self.runs.lock().unwrap().push((plan, *args));
        let words = [
            (plan.0 as u64).to_le_bytes(),
            args.input.0.to_le_bytes(),
            args.output.0.to_le_bytes(),
            args.workspace.0.to_le_bytes(),
        ];
        let config = LaunchConfig {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            ..Default::default()
        };
        let argv: Vec<&[u8]> = words.iter().map(|w| &w[..]).collect();
        self.backend.launch(&self.kernel, &config, &argv, s)
    }
}

const B: usize = 2;
const N: usize = 8;
const R: usize = 3;
const H: usize = N / 2 + 1;

fn shape(t: ElementType, dims: &[usize]) -> Shape {
    Shape {
        element_type: t,
        dimensions: dims.iter().map(|&d| d as i64).collect(),
        minor_to_major: Some((0..dims.len() as i64).rev().collect()),
        ..Default::default()
    }
}

const C64: ElementType = ElementType(15);

fn fft(name: &str, t: FftType, input: (Slice, Shape), output: (Slice, Shape)) -> Thunk {
    thunk(
        name,
        ThunkKind::Fft(Box::new(FftThunk {
            fft_type: t,
            fft_length: vec![N as i64],
            input: input.0,
            output: output.0,
            input_shape: input.1,
            output_shape: output.1,
        })),
    )
}

/// x (complex [2, 8]) and r (real [3, 8]) in; out: FFT(x), IFFT(FFT(x)),
/// RFFT(r), IRFFT(RFFT(r)).
fn fft_plan() -> Plan {
    let cx = shape(C64, &[B, N]);
    let re = shape(ElementType::F32, &[R, N]);
    let half = shape(C64, &[R, H]);
    let size = |s: &Shape| s.byte_size().unwrap();
    let out = || AllocationRole::Output { outputs: vec![] };
    let s = |a: usize, sh: &Shape| (sl(a, 0, size(sh)), sh.clone());
    plan(
        vec![
            alloc(0, size(&cx), param(0, false)),
            alloc(1, size(&re), param(1, false)),
            alloc(2, size(&cx), out()),
            alloc(3, size(&cx), out()),
            alloc(4, size(&half), out()),
            alloc(5, size(&re), out()),
        ],
        vec![cx.clone(), re.clone()],
        vec![
            (2, cx.clone()),
            (3, cx.clone()),
            (4, half.clone()),
            (5, re.clone()),
        ],
        vec![
            fft("fft.1", FftType::Fft, s(0, &cx), s(2, &cx)),
            fft("ifft.2", FftType::Ifft, s(2, &cx), s(3, &cx)),
            fft("rfft.3", FftType::Rfft, s(1, &re), s(4, &half)),
            fft("irfft.4", FftType::Irfft, s(4, &half), s(5, &re)),
        ],
    )
}

fn inputs() -> (Vec<f32>, Vec<f32>) {
    let x = (0..B * N * 2)
        .map(|i| ((i * 7) % 11) as f32 - 5.0)
        .collect();
    // Row i: a cosine of frequency i + 1, plus i.
    let r = (0..R * N)
        .map(|v| {
            let (i, j) = (v / N, v % N);
            let a = 2.0 * std::f64::consts::PI * ((i + 1) * j) as f64 / N as f64;
            (a.cos() + i as f64) as f32
        })
        .collect();
    (x, r)
}

struct Ran {
    outs: Vec<Vec<f32>>,
    blocker: Option<String>,
}

fn run(b: &Arc<HostBackend>, engine: Arc<HostFft>, mode: Mode) -> Ran {
    let stream = b.stream_create().unwrap();
    let dyn_engine: Arc<dyn GemmEngine<HostBackend>> = engine;
    let mut exe = Executable::load_with(
        b.clone(),
        fft_plan(),
        Some(dyn_engine),
        None,
        &xla_vmm_runtime::RunConfig::default(),
        &stream,
    )
    .unwrap();
    let blocker = exe.program().capture_blocker().map(str::to_string);
    let (x, r) = inputs();
    let px = DeviceBuffer::alloc(b, 4 * x.len() as u64).unwrap();
    let pr = DeviceBuffer::alloc(b, 4 * r.len() as u64).unwrap();
    b.write_sync(px.ptr(), &bytes(&x), &stream).unwrap();
    b.write_sync(pr.ptr(), &bytes(&r), &stream).unwrap();
    exe.bind_parameter(0, px.ptr(), px.size()).unwrap();
    exe.bind_parameter(1, pr.ptr(), pr.size()).unwrap();
    let mut outs = Vec::new();
    for _ in 0..3 {
        let o = exe.run(&stream, mode).unwrap();
        b.stream_synchronize(&stream).unwrap();
        outs = o
            .iter()
            .map(|o| {
                let mut d = vec![0u8; o.bytes as usize];
                b.read_sync(&mut d, o.ptr, &stream).unwrap();
                d.chunks(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            })
            .collect();
    }
    drop(exe);
    px.free().unwrap();
    pr.free().unwrap();
    b.stream_destroy(stream).unwrap();
    Ran { outs, blocker }
}

/// An engine whose transforms a capture takes or not.
fn engine_capturable(b: &Arc<HostBackend>, capturable: bool) -> Arc<HostFft> {
    let specs = Arc::new(Mutex::default());
    b.register_kernel("host_fft", fft_kernel(Arc::clone(&specs)));
    let module = b.module_load(b"host_fft\n", ImageKind::Host).unwrap();
    Arc::new(HostFft {
        backend: b.clone(),
        kernel: b.module_function(&module, "host_fft").unwrap(),
        capturable,
        specs,
        runs: Mutex::default(),
        released: Mutex::default(),
        refuse_after: None,
    })
}

fn engine(b: &Arc<HostBackend>) -> Arc<HostFft> {
    engine_capturable(b, false)
}

fn close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() < 1e-4, "{what}[{i}]: {x} != {y}");
    }
}

#[test]
fn the_four_kinds_run_with_xlas_plans_their_own_work_areas_and_a_copy_of_a_c2r_input() {
    let b = backend();
    let e = engine(&b);
    let ran = run(&b, e.clone(), Mode::Eager);
    let (x, r) = inputs();
    // FFT(x) against the definition, one transform per row.
    let mut want = Vec::new();
    for row in x.chunks(2 * N) {
        let mut v: Vec<C> = row.chunks(2).map(|c| (c[0] as f64, c[1] as f64)).collect();
        dft(&mut v, &[N], -1.0);
        want.extend(v.iter().flat_map(|&(re, im)| [re as f32, im as f32]));
    }
    close(&ran.outs[0], &want, "fft");
    close(&ran.outs[1], &x, "ifft(fft(x))");
    // A cosine of frequency f has N/2 at term f (real), nothing elsewhere
    // but the mean at term 0.
    for i in 0..R {
        let row = &ran.outs[2][i * 2 * H..][..2 * H];
        for k in 0..H {
            let re = if k == i + 1 { N as f32 / 2.0 } else { 0.0 }
                + if k == 0 { (i * N) as f32 } else { 0.0 };
            close(
                &row[2 * k..][..2],
                &[re, 0.0],
                &format!("rfft row {i} term {k}"),
            );
        }
    }
    // The C2R transform ran on a copy: its input (the RFFT output) is intact.
    close(&ran.outs[3], &r, "irfft(rfft(r))");
    let specs = e.specs.lock().unwrap();
    let kinds: Vec<FftKind> = specs.iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            FftKind::Forward,
            FftKind::Inverse,
            FftKind::RealToComplex,
            FftKind::ComplexToReal
        ]
    );
    assert_eq!(
        (
            specs[2].batch,
            specs[2].idist,
            specs[2].odist,
            &specs[2].onembed
        ),
        (R as i64, N as i64, H as i64, &vec![H as i64])
    );
    // Per step: four transforms, each with its own work area at 256-byte
    // steps of the program's scratch; the C2R one after its input's copy.
    let runs = e.runs.lock().unwrap();
    assert_eq!(runs.len(), 12);
    let first = &runs[..4];
    let base = first[0].1.workspace.0;
    let offsets: Vec<u64> = first.iter().map(|(_, a)| a.workspace.0 - base).collect();
    assert_eq!(offsets, [0, 256, 512, 768]);
    let c2r = first[3].1;
    assert_eq!(
        c2r.input.0,
        c2r.workspace.0 + 256,
        "the copy follows the work area"
    );
    assert_ne!(c2r.input, first[2].1.output);
    let why = ran.blocker.expect("an FFT keeps the program out of graphs");
    assert!(why.contains("fft fft.1"), "{why}");
}

#[test]
fn graph_modes_run_a_program_with_ffts_eager_without_a_capturable_engine() {
    let b = backend();
    let eager = run(&b, engine(&b), Mode::Eager);
    for mode in [Mode::Graph, Mode::GraphRecapture] {
        let e = engine(&b);
        let ran = run(&b, e.clone(), mode);
        assert_eq!(ran.outs, eager.outs, "{mode:?}");
        assert_eq!(
            e.runs.lock().unwrap().len(),
            12,
            "{mode:?}: four a step, eager"
        );
    }
    assert_eq!(b.call_count("graph_launch"), 0, "{:?}", b.call_counts());
}

/// An engine a capture takes: the program runs as a graph whose replays
/// transform again, the C2R input copied again before its transform
/// scribbles on the copy, with the eager results, without calling the
/// engine.
#[test]
fn graph_modes_capture_the_transforms_of_a_capturable_engine_with_the_eager_results() {
    let b = backend();
    let eager = run(&b, engine(&b), Mode::Eager);
    for mode in [Mode::Graph, Mode::GraphRecapture] {
        let b = backend();
        let e = engine_capturable(&b, true);
        let ran = run(&b, e.clone(), mode);
        assert_eq!(ran.blocker, None, "{mode:?}");
        assert_eq!(ran.outs, eager.outs, "{mode:?}");
        let runs = e.runs.lock().unwrap().len();
        assert!(
            b.call_count("graph_launch") > 0,
            "{mode:?}: {:?}",
            b.call_counts()
        );
        assert!(
            runs < 12,
            "{mode:?}: the replays run without the engine ({runs} calls)"
        );
    }
}

/// A program's FFT plans go back to the engine when it goes, and when its
/// load fails after some were prepared (the engine frees a plan with its
/// last user: programs compiled and dropped for hours keep none).
#[test]
fn a_programs_fft_plans_go_back_to_the_engine_when_it_goes_or_fails_to_load() {
    let b = backend();
    let e = engine(&b);
    run(&b, e.clone(), Mode::Graph);
    let released = |e: &HostFft| {
        let mut r: Vec<usize> = e.released.lock().unwrap().iter().map(|p| p.0).collect();
        r.sort();
        r
    };
    assert_eq!(released(&e), [0, 1, 2, 3], "one release per prepared plan");

    // The library refuses the third transform's plan: the two prepared
    // before it go back.
    let stream = b.stream_create().unwrap();
    let e = Arc::new(HostFft {
        refuse_after: Some(2),
        ..Arc::into_inner(engine(&b)).unwrap()
    });
    let dyn_engine: Arc<dyn GemmEngine<HostBackend>> = e.clone();
    let cfg = xla_vmm_runtime::RunConfig::default();
    let loaded =
        Executable::load_with(b.clone(), fft_plan(), Some(dyn_engine), None, &cfg, &stream);
    let err = loaded
        .err()
        .expect("the refused plan fails the load")
        .to_string();
    assert!(err.contains("test: no plan"), "{err}");
    assert_eq!(e.specs.lock().unwrap().len(), 2);
    assert_eq!(released(&e), [0, 1]);
    b.stream_destroy(stream).unwrap();
}

#[test]
fn loading_without_an_fft_engine_or_with_a_mismatched_thunk_says_why() {
    let b = backend();
    let stream = b.stream_create().unwrap();
    let e = load_error_without_engines(&b, fft_plan(), &stream);
    assert!(
        e.contains("fft thunk 'fft.1'") && e.contains("no FFT engine"),
        "{e}"
    );
    let mut p = fft_plan();
    if let ThunkKind::Fft(f) = &mut p.thunks[2].kind {
        f.fft_length = vec![4];
    }
    let engine: Arc<dyn GemmEngine<HostBackend>> = engine(&b);
    let e = Executable::load_with(
        b.clone(),
        p,
        Some(engine),
        None,
        &xla_vmm_runtime::RunConfig::default(),
        &stream,
    )
    .err()
    .expect("a mismatched transform is refused")
    .to_string();
    assert!(e.contains("rfft.3") && e.contains("lengths [4]"), "{e}");
    b.stream_destroy(stream).unwrap();
}
