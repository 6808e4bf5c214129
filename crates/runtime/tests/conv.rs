//! Convolutions on the host backend, through an engine that convolves on the
//! host from the spec alone (dims, strides, window, fusion): what the runtime
//! hands it for a fused convolution (the spec XLA's fused runner builds, the
//! x, w, side-input, bias and y buffers in their roles), the result it gets
//! back, graph modes running the program eager, the workspace check at
//! load, and the library plans (convolution, GEMM) a program prepared given
//! back to the engine when it goes or fails to load.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use xla_vmm::*;
use xla_vmm_device::blas::{xla_type, GemmEngine, GemmPlanId};
use xla_vmm_device::dnn::{Activation, ConvArgs, ConvOp, ConvPlanId, ConvSpec, ConvTensor};
use xla_vmm_device::error::Result as DeviceResult;
use xla_vmm_device::host::HostStream;
use xla_vmm_device::{Backend, DevicePtr, HostBackend};
use xla_vmm_runtime::{DeviceBuffer, Executable, Mode};

/// Forward 2D f32 convolutions (one feature group), fused or not, computed
/// on the host by reading every tensor through its spec's strides.
struct HostConv {
    backend: Arc<HostBackend>,
    workspace: u64,
    specs: Mutex<Vec<ConvSpec>>,
    runs: Mutex<Vec<ConvArgs>>,
    /// Plans released (convolution ids; GEMM ids + 1000).
    released: Mutex<Vec<usize>>,
    /// GEMM plans prepared.
    gemms: Mutex<usize>,
}

impl HostConv {
    fn read(&self, p: DevicePtr, t: &ConvTensor, s: &HostStream) -> DeviceResult<Vec<f32>> {
        let mut v = vec![0u8; 4 * t.span().unwrap() as usize];
        self.backend.read_sync(&mut v, p, s)?;
        Ok(v.chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// Element `idx` (logical order) of a tensor read into `v`.
fn at(v: &[f32], t: &ConvTensor, idx: [i64; 4]) -> f32 {
    let off: i64 = idx.iter().zip(&t.strides).map(|(i, s)| i * s).sum();
    v[off as usize]
}

impl GemmEngine<HostBackend> for HostConv {
    /// GEMMs are prepared (never run here): their plans are counted.
    fn prepare(
        &self,
        _: &xla_vmm_device::blas::GemmConfig,
        _: xla_vmm_device::blas::Epilogue,
        _: usize,
        _: usize,
        _: u64,
    ) -> DeviceResult<GemmPlanId> {
        let mut n = self.gemms.lock().unwrap();
        *n += 1;
        Ok(GemmPlanId(*n - 1))
    }

    fn workspace_needed(&self, _: GemmPlanId) -> DeviceResult<u64> {
        Ok(0)
    }

    fn run(
        &self,
        _: GemmPlanId,
        _: &xla_vmm_device::blas::MatmulArgs,
        _: &HostStream,
    ) -> DeviceResult<()> {
        unreachable!("the GEMM programs here are loaded, never run")
    }

    fn release(&self, plan: GemmPlanId) {
        self.released.lock().unwrap().push(1000 + plan.0);
    }

    fn release_conv(&self, plan: ConvPlanId) {
        self.released.lock().unwrap().push(plan.0);
    }

    fn prepare_conv(&self, spec: &ConvSpec) -> DeviceResult<ConvPlanId> {
        let mut specs = self.specs.lock().unwrap();
        specs.push(spec.clone());
        Ok(ConvPlanId(specs.len() - 1))
    }

    fn conv_workspace(&self, _: ConvPlanId) -> DeviceResult<u64> {
        Ok(self.workspace)
    }

    fn run_conv(&self, plan: ConvPlanId, args: &ConvArgs, s: &HostStream) -> DeviceResult<()> {
        self.runs.lock().unwrap().push(*args);
        let spec = self.specs.lock().unwrap()[plan.0].clone();
        assert_eq!((spec.op, spec.x.dims.len()), (ConvOp::Forward, 4));
        let (x, w) = (
            self.read(args.x, &spec.x, s)?,
            self.read(args.w, &spec.w, s)?,
        );
        let fused = spec.fusion.as_ref().zip(args.fused);
        let (bias, side) = match fused {
            Some((f, a)) => (
                Some(self.read(a.bias, &f.bias, s)?),
                match f.side_input {
                    Some(_) => Some(self.read(a.side_input, &spec.y, s)?),
                    None => None,
                },
            ),
            None => (None, None),
        };
        let y_dims = &spec.y.dims;
        let mut y = vec![0f32; spec.y.span().unwrap() as usize];
        for n in 0..y_dims[0] {
            for k in 0..y_dims[1] {
                for oh in 0..y_dims[2] {
                    for ow in 0..y_dims[3] {
                        let mut acc = 0f32;
                        for c in 0..spec.w.dims[1] {
                            for kh in 0..spec.w.dims[2] {
                                for kw in 0..spec.w.dims[3] {
                                    let ih = oh * spec.strides[0] - spec.padding[0]
                                        + kh * spec.dilations[0];
                                    let iw = ow * spec.strides[1] - spec.padding[1]
                                        + kw * spec.dilations[1];
                                    if ih < 0
                                        || iw < 0
                                        || ih >= spec.x.dims[2]
                                        || iw >= spec.x.dims[3]
                                    {
                                        continue;
                                    }
                                    acc += at(&x, &spec.x, [n, c, ih, iw])
                                        * at(&w, &spec.w, [k, c, kh, kw]);
                                }
                            }
                        }
                        let idx = [n, k, oh, ow];
                        if let Some((f, _)) = fused {
                            if let Some((conv_scale, side_scale)) = f.side_input {
                                let z = at(side.as_ref().unwrap(), &spec.y, idx);
                                acc = conv_scale as f32 * acc + side_scale as f32 * z;
                            }
                            acc += at(bias.as_ref().unwrap(), &f.bias, [0, k, 0, 0]);
                            acc = match f.activation {
                                Activation::None => acc,
                                Activation::Relu => acc.max(0.0),
                                other => panic!("activation {other:?}"),
                            };
                        }
                        let off: i64 = idx.iter().zip(&spec.y.strides).map(|(i, s)| i * s).sum();
                        y[off as usize] = acc;
                    }
                }
            }
        }
        self.backend.write_sync(args.y, &bytes(&y), s)
    }
}

const N: usize = 1;
const C: usize = 2;
const K: usize = 3;
const H: usize = 4;
const SCRATCH: u64 = 256;

fn shape(dims: &[usize]) -> Shape {
    Shape {
        element_type: ElementType::F32,
        dimensions: dims.iter().map(|&d| d as i64).collect(),
        minor_to_major: Some((0..dims.len() as i64).rev().collect()),
        ..Default::default()
    }
}

/// y = act(conv(x, w) [+ side_scale * z] + b): NCHW x f32[1,2,4,4], OIHW
/// w f32[3,2,3,3], a 3x3 SAME window, bias f32[3], as XLA's fused rewriter
/// emits it (`cudnn-conv-bias-activation`, operands x, w, b[, z]; results
/// y and the scratch buffer).
fn conv_plan(activation_mode: i32, side_input: bool) -> Plan {
    let (x_dims, w_dims, y_dims) = ([N, C, H, H], [K, C, 3, 3], [N, K, H, H]);
    let elems = |d: &[usize]| d.iter().product::<usize>() as u64 * 4;
    let ss = |a: usize, d: &[usize]| ShapedSlice {
        slice: sl(a, 0, elems(d)),
        shape: Some(shape(d)),
    };
    let dim = WindowDim {
        size: 3,
        stride: 1,
        padding_low: 1,
        padding_high: 1,
        window_dilation: 1,
        base_dilation: 1,
        window_reversal: false,
    };
    let mut operands = vec![ss(0, &x_dims), ss(1, &w_dims), ss(2, &[K])];
    let mut allocs = vec![
        alloc(0, elems(&x_dims), param(0, false)),
        alloc(1, elems(&w_dims), param(1, false)),
        alloc(2, elems(&[K]), param(2, false)),
        alloc(
            3,
            elems(&y_dims),
            AllocationRole::Output { outputs: vec![] },
        ),
        alloc(4, SCRATCH, AllocationRole::Temp),
    ];
    let mut params = vec![shape(&x_dims), shape(&w_dims), shape(&[K])];
    if side_input {
        operands.push(ss(5, &y_dims));
        allocs.push(alloc(5, elems(&y_dims), param(3, false)));
        params.push(shape(&y_dims));
    }
    let conv = ConvolutionThunk {
        kind: ConvKind::ForwardActivation,
        operands,
        results: vec![ss(3, &y_dims)],
        scratch: sl(4, 0, SCRATCH),
        operand0_shape: shape(&x_dims),
        operand1_shape: shape(&w_dims),
        result_shape: shape(&y_dims),
        window: vec![dim, dim],
        dnums: ConvDims {
            input_batch: 0,
            input_feature: 1,
            input_spatial: vec![2, 3],
            kernel_input_feature: 1,
            kernel_output_feature: 0,
            kernel_spatial: vec![2, 3],
            output_batch: 0,
            output_feature: 1,
            output_spatial: vec![2, 3],
        },
        feature_group_count: 1,
        algorithm: ConvAlgorithm::default(),
        conv_result_scale: 1.0,
        side_input_scale: if side_input { 0.5 } else { 0.0 },
        activation_mode,
        leakyrelu_alpha: 0.0,
        has_serialized_graph: false,
    };
    plan(
        allocs,
        params,
        vec![(3, shape(&y_dims))],
        vec![thunk(
            "cudnn-conv-bias-activation.1",
            ThunkKind::Convolution(Box::new(conv)),
        )],
    )
}

fn iota(n: usize, scale: f32, shift: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32) * scale + shift).collect()
}

/// The inputs: x, w, b and (with a side input) z.
fn inputs(side_input: bool) -> Vec<Vec<f32>> {
    let mut v = vec![
        iota(N * C * H * H, 0.25, -2.0),
        iota(K * C * 9, 0.0625, -1.0),
        vec![0.5, -30.0, 2.0],
    ];
    if side_input {
        v.push(iota(N * K * H * H, 1.0, 0.0));
    }
    v
}

/// XLA's fused convolution, by its definition over NCHW / OIHW arrays.
fn reference(activation_mode: i32, side_input: bool) -> Vec<f32> {
    let inp = inputs(side_input);
    let (x, w, b) = (&inp[0], &inp[1], &inp[2]);
    let mut y = Vec::new();
    for k in 0..K {
        for oh in 0..H as i64 {
            for ow in 0..H as i64 {
                let mut acc = 0f32;
                for c in 0..C {
                    for kh in 0..3i64 {
                        for kw in 0..3i64 {
                            let (ih, iw) = (oh + kh - 1, ow + kw - 1);
                            if (0..H as i64).contains(&ih) && (0..H as i64).contains(&iw) {
                                acc += x[(c * H + ih as usize) * H + iw as usize]
                                    * w[((k * C + c) * 3 + kh as usize) * 3 + kw as usize];
                            }
                        }
                    }
                }
                if side_input {
                    acc += 0.5 * inp[3][(k * H + oh as usize) * H + ow as usize];
                }
                acc += b[k];
                y.push(if activation_mode == 2 {
                    acc.max(0.0)
                } else {
                    acc
                });
            }
        }
    }
    y
}

fn engine(b: &Arc<HostBackend>, workspace: u64) -> Arc<HostConv> {
    Arc::new(HostConv {
        backend: b.clone(),
        workspace,
        specs: Mutex::default(),
        runs: Mutex::default(),
        released: Mutex::default(),
        gemms: Mutex::default(),
    })
}

/// Run the fused convolution once; its output and the program's reason to
/// run eager.
fn run(
    b: &Arc<HostBackend>,
    conv: Arc<HostConv>,
    activation_mode: i32,
    side_input: bool,
    mode: Mode,
) -> (Vec<f32>, Option<String>, Vec<DevicePtr>) {
    let stream = b.stream_create().unwrap();
    let conv: Arc<dyn GemmEngine<HostBackend>> = conv;
    let mut exe = Executable::load_with(
        b.clone(),
        conv_plan(activation_mode, side_input),
        Some(conv),
        None,
        &xla_vmm_runtime::RunConfig::default(),
        &stream,
    )
    .unwrap();
    let blocker = exe.program().capture_blocker().map(str::to_string);
    let mut bufs = Vec::new();
    for (i, v) in inputs(side_input).iter().enumerate() {
        let d = DeviceBuffer::alloc(b, 4 * v.len() as u64).unwrap();
        b.write_sync(d.ptr(), &bytes(v), &stream).unwrap();
        exe.bind_parameter(i, d.ptr(), d.size()).unwrap();
        bufs.push(d);
    }
    let ptrs = bufs.iter().map(|d| d.ptr()).collect();
    let outs = exe.run(&stream, mode).unwrap();
    b.stream_synchronize(&stream).unwrap();
    let mut y = vec![0u8; 4 * N * K * H * H];
    b.read_sync(&mut y, outs[0].ptr, &stream).unwrap();
    drop(outs);
    drop(exe);
    for d in bufs {
        d.free().unwrap();
    }
    b.stream_destroy(stream).unwrap();
    let y = y
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (y, blocker, ptrs)
}

#[test]
fn a_fused_relu_convolution_gets_xlas_graph_and_its_buffers_in_their_roles() {
    let b = backend();
    let conv = engine(&b, 0);
    let (y, blocker, inputs) = run(&b, conv.clone(), 2, false, Mode::Eager);
    assert_eq!(y, reference(2, false));
    assert!(y.contains(&0.0) && y.iter().any(|&v| v > 0.0), "{y:?}");
    let spec = conv.specs.lock().unwrap()[0].clone();
    let f = spec.fusion.unwrap();
    assert_eq!(f.activation, Activation::Relu);
    assert_eq!(f.side_input, Some((1.0, 0.0)));
    assert_eq!(
        (f.bias.dims, f.bias.strides),
        (vec![1, 3, 1, 1], vec![3, 1, 1, 1])
    );
    assert_eq!(f.activation_type, xla_type::F32);
    let runs = conv.runs.lock().unwrap();
    assert_eq!(runs.len(), 1);
    let (a, fused) = (runs[0], runs[0].fused.unwrap());
    assert_eq!((a.x, a.w, fused.bias), (inputs[0], inputs[1], inputs[2]));
    // No side input operand: y's own buffer (read at scale 0), as XLA's runner.
    assert_eq!(fused.side_input, a.y);
    assert_eq!(a.workspace_bytes, SCRATCH);
    // The program is gone: so is its plan.
    assert_eq!(*conv.released.lock().unwrap(), [0]);
    let why = blocker.expect("a convolution keeps the program out of graphs");
    assert!(
        why.contains("convolution cudnn-conv-bias-activation.1"),
        "{why}"
    );
}

#[test]
fn a_side_input_is_scaled_and_graph_modes_run_eager() {
    let b = backend();
    for mode in [Mode::Eager, Mode::Graph, Mode::GraphRecapture] {
        let conv = engine(&b, 0);
        let (y, _, inputs) = run(&b, conv.clone(), 0, true, mode);
        assert_eq!(y, reference(0, true), "{mode:?}");
        let f = conv.specs.lock().unwrap()[0].fusion.clone().unwrap();
        assert_eq!(
            (f.activation, f.side_input),
            (Activation::None, Some((1.0, 0.5)))
        );
        let runs = conv.runs.lock().unwrap();
        assert_eq!(runs.len(), 1, "{mode:?}");
        assert_eq!(runs[0].fused.unwrap().side_input, inputs[3], "{mode:?}");
    }
}

#[test]
fn a_plan_needing_more_workspace_than_the_scratch_buffer_is_refused_at_load() {
    let b = backend();
    let stream = b.stream_create().unwrap();
    let conv: Arc<dyn GemmEngine<HostBackend>> = engine(&b, SCRATCH + 1);
    let e = Executable::load_with(
        b.clone(),
        conv_plan(2, false),
        Some(conv),
        None,
        &xla_vmm_runtime::RunConfig::default(),
        &stream,
    )
    .err()
    .expect("workspace")
    .to_string();
    assert!(
        e.contains("needs 257 bytes of workspace") && e.contains("scratch buffer has 256"),
        "{e}"
    );
    let e = load_error_without_engines(&b, conv_plan(2, false), &stream);
    assert!(e.contains("no DNN engine"), "{e}");
    b.stream_destroy(stream).unwrap();
}

/// `conv_plan` with a matmul (f32 [4,4] @ [4,4] into a fresh output) ahead
/// of the convolution.
fn gemm_then_conv_plan() -> Plan {
    let mut p = conv_plan(2, false);
    let n = p.allocations.len();
    let layout = MatrixLayout {
        order: 1,
        num_rows: 4,
        num_cols: 4,
        batch_size: 1,
        leading_dim_stride: 4,
        batch_stride: 16,
        transpose: 0,
        dtype: ElementType::F32,
    };
    let ss = |a: usize| ShapedSlice {
        slice: sl(a, 0, 64),
        shape: Some(shape(&[4, 4])),
    };
    let number = p.program_shape.parameters.len() as u64;
    p.allocations.push(alloc(n, 64, param(number, false)));
    p.program_shape.parameters.push(shape(&[4, 4]));
    p.allocations.push(alloc(n + 1, 64, AllocationRole::Temp));
    let m = CublasLtMatmulThunk {
        gemm_config: Some(GemmConfig {
            lhs_layout: layout.clone(),
            rhs_layout: layout.clone(),
            c_layout: layout.clone(),
            output_layout: layout,
            alpha_real: 1.0,
            ..Default::default()
        }),
        grouped: false,
        epilogue: 0,
        algorithm_idx: 0,
        canonical_hlo: String::new(),
        a: ss(n),
        b: ss(n),
        c: ss(n + 1),
        d: ss(n + 1),
        bias: None,
        aux: None,
        a_scale: None,
        b_scale: None,
        c_scale: None,
        d_scale: None,
        d_amax: None,
        workspace: None,
        group_sizes: None,
        autotune_workspace_size: 0,
    };
    p.thunks
        .insert(0, thunk("matmul.1", ThunkKind::CublasLtMatmul(Box::new(m))));
    p
}

/// Loaded programs hold their GEMM and convolution plans on the engine;
/// dropping a program, or a load that fails after some were prepared, gives
/// every one back (programs compiled and dropped for hours leave none).
#[test]
fn a_programs_library_plans_go_back_to_the_engine_when_it_goes_or_fails_to_load() {
    let b = backend();
    let stream = b.stream_create().unwrap();
    for (workspace, loads) in [(0, true), (SCRATCH + 1, false)] {
        let conv = engine(&b, workspace);
        let dyn_conv: Arc<dyn GemmEngine<HostBackend>> = conv.clone();
        let loaded = Executable::load_with(
            b.clone(),
            gemm_then_conv_plan(),
            Some(dyn_conv),
            None,
            &xla_vmm_runtime::RunConfig::default(),
            &stream,
        );
        assert_eq!(loaded.is_ok(), loads, "{:?}", loaded.as_ref().err());
        if let Ok(exe) = &loaded {
            assert!(conv.released.lock().unwrap().is_empty());
            assert_eq!(exe.program().plan().thunks.len(), 2);
        }
        drop(loaded);
        let mut released = conv.released.lock().unwrap().clone();
        released.sort();
        assert_eq!(released, [0, 1000], "workspace {workspace}");
        assert_eq!(*conv.gemms.lock().unwrap(), 1);
    }
    b.stream_destroy(stream).unwrap();
}
