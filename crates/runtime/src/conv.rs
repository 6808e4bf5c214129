//! A convolution thunk → the cuDNN graph XLA's runner builds for it
//! (`gpu_conv_runner.cc` `GetGpuConvConfig`, `stream_executor` `dnn.cc`
//! descriptors): which buffers are x, w and y for the thunk's kind, their
//! cuDNN dimensions in logical order with the strides of their XLA layout,
//! the window, and for the fused kind (`cudnn-conv-bias-activation`) what
//! XLA's fused runner adds after the convolution: the side-input add where
//! it takes one, the bias, the activation. What XLA's runner refuses is
//! refused here, with the reason; a geometry that does not add up (which
//! would mean we read the descriptor wrong) is an error too, never a guess.

use xla_vmm::{ConvKind, ConvolutionThunk, ElementType, Shape, ShapedSlice, Slice};
use xla_vmm_device::blas::xla_type;
use xla_vmm_device::dnn::{Activation, ConvFusion, ConvOp, ConvSpec, ConvTensor};

use crate::error::{Result, RuntimeError};
use crate::slots::SlotTable;
use xla_vmm_device::blas::GemmEngine;
use xla_vmm_device::dnn::{ConvArgs, ConvPlanId, FusedArgs};
use xla_vmm_device::Backend;

/// A convolution as loaded: the spec and the buffers in its roles.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvRun {
    pub name: String,
    pub spec: ConvSpec,
    pub x: Slice,
    pub w: Slice,
    pub y: Slice,
    pub scratch: Slice,
    /// A fused convolution's side input and bias.
    pub fused: Option<FusedRun>,
}

/// The extra buffers of a fused convolution: the side input (operand 3, or
/// y's buffer when there is none: XLA's runner passes it, and cuDNN does not
/// read it at side-input scale 0) and the bias (operand 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedRun {
    pub side_input: Slice,
    pub bias: Slice,
}

fn unsupported(what: String) -> RuntimeError {
    RuntimeError::unsupported(format!("convolution: {what}"))
}

/// The memory layout of one tensor, as cuDNN's runner classifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Batch (output feature), feature (input feature), spatial.. (NCHW /
    /// OIHW), major to minor.
    FeatureMajor,
    /// Batch, spatial.., feature (NHWC / OHWI).
    FeatureMinor,
}

/// The cuDNN tensor of `shape` whose logical dims are `[outer, inner,
/// spatial..]` (batch and feature for activations, output and input
/// feature for filters): dims and the strides of its layout. Tensors of a
/// convolution with fewer than two spatial dimensions get trailing spatial
/// dimensions of 1, placed right after the real ones in memory order (XLA's
/// runner expresses 1D and 0D as 2D).
fn tensor(
    shape: &Shape,
    outer: i64,
    inner: i64,
    spatial: &[i64],
    dtype: i32,
    what: &str,
) -> Result<(ConvTensor, Layout)> {
    let rank = shape.dimensions.len();
    let dim_ok = |d: i64| usize::try_from(d).ok().filter(|&d| d < rank);
    let logical: Vec<usize> = std::iter::once(outer)
        .chain(std::iter::once(inner))
        .chain(spatial.iter().copied())
        .map(|d| {
            dim_ok(d).ok_or_else(|| unsupported(format!("{what} dimension {d} of rank {rank}")))
        })
        .collect::<Result<_>>()?;
    if rank != logical.len() {
        return Err(unsupported(format!(
            "{what} of rank {rank} with {} dimensions named",
            logical.len()
        )));
    }
    let mtm = shape
        .minor_to_major
        .as_ref()
        .ok_or_else(|| unsupported(format!("{what} without a layout")))?;
    let major_to_minor: Vec<usize> = mtm.iter().rev().map(|&d| d as usize).collect();
    let feature_major: Vec<usize> = logical.clone();
    let mut feature_minor: Vec<usize> = vec![logical[0]];
    feature_minor.extend(&logical[2..]);
    feature_minor.push(logical[1]);
    let layout = if major_to_minor == feature_major {
        Layout::FeatureMajor
    } else if major_to_minor == feature_minor {
        Layout::FeatureMinor
    } else {
        return Err(unsupported(format!(
            "{what} layout {{{}}} (cuDNN's runner takes NCHW / NHWC and OIHW / OHWI)",
            mtm.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
        )));
    };
    // Sizes in logical order, plus singletons up to two spatial dimensions.
    let mut dims: Vec<i64> = logical.iter().map(|&d| shape.dimensions[d]).collect();
    dims.resize(dims.len().max(4), 1);
    let strides = dense_strides(&dims, layout)
        .ok_or_else(|| unsupported(format!("{what} of dimensions {dims:?} overflows")))?;
    Ok((
        ConvTensor {
            dtype,
            dims,
            strides,
        },
        layout,
    ))
}

/// The strides of a dense tensor of logical `dims` (`[outer, inner,
/// spatial..]`) laid out as `layout`; None on overflow.
fn dense_strides(dims: &[i64], layout: Layout) -> Option<Vec<i64>> {
    // Memory order of the logical positions, major to minor.
    let n = dims.len();
    let spatial_pos: Vec<usize> = (2..n).collect();
    let order: Vec<usize> = match layout {
        Layout::FeatureMajor => [0, 1].into_iter().chain(spatial_pos).collect(),
        Layout::FeatureMinor => std::iter::once(0)
            .chain(spatial_pos)
            .chain(std::iter::once(1))
            .collect(),
    };
    let mut strides = vec![0i64; n];
    let mut stride = 1i64;
    for &pos in order.iter().rev() {
        strides[pos] = stride;
        stride = stride.checked_mul(dims[pos].max(1))?;
    }
    Some(strides)
}

fn element_bytes(t: ElementType) -> u64 {
    u64::from(t.bit_width().unwrap_or(8) / 8).max(1)
}

/// The cuDNN convolution of `c`, or why our runtime does not run it.
/// The cuDNN operation of a thunk's kind, whether it is fused, and its
/// element types as XLA's runner takes them: (x and w's, y's, compute).
fn op_and_types(c: &ConvolutionThunk) -> Result<(ConvOp, bool, ElementType, ElementType, i32)> {
    let fused = c.kind == ConvKind::ForwardActivation;
    let op = match c.kind {
        ConvKind::Forward | ConvKind::ForwardActivation => ConvOp::Forward,
        ConvKind::BackwardInput => ConvOp::BackwardData,
        ConvKind::BackwardFilter => ConvOp::BackwardFilter,
        ConvKind::ForwardGraph => {
            return Err(unsupported(
                "a serialized cuDNN graph (forward graph kind) is not run".into(),
            ))
        }
    };
    if c.operands.len() < 2 + usize::from(fused) || c.results.is_empty() {
        return Err(RuntimeError::invalid(format!(
            "{}convolution with {} operands and {} results",
            if fused { "fused " } else { "" },
            c.operands.len(),
            c.results.len()
        )));
    }
    if !fused && c.conv_result_scale != 1.0 {
        return Err(unsupported(format!(
            "result scale {} (XLA's runner only scales fused convolutions)",
            c.conv_result_scale
        )));
    }
    // XLA: x and w in the input type (operand 0's), y in the output type.
    let input = c.operand0_shape.element_type;
    let output = c.result_shape.element_type;
    let float = [xla_type::F16, xla_type::BF16, xla_type::F32, xla_type::F64];
    for t in [input, output] {
        if !float.contains(&t.0) {
            return Err(unsupported(format!(
                "element type {} (F16, BF16, F32 and F64 are run)",
                t.name().unwrap_or("unknown")
            )));
        }
    }
    let compute = if input.0 == xla_type::F64 {
        xla_type::F64
    } else {
        xla_type::F32
    };
    Ok((op, fused, input, output, compute))
}

/// The window as XLA's runner takes it (at least two spatial dimensions:
/// the missing ones of size 1).
struct ConvWindow {
    padding: Vec<i64>,
    strides: Vec<i64>,
    dilations: Vec<i64>,
    /// A convolution, not a cross-correlation.
    reversal: bool,
}

fn window(c: &ConvolutionThunk) -> Result<ConvWindow> {
    // The window, as XLA's runner takes it.
    let nd = c.window.len();
    let d = &c.dnums;
    if nd > 3 {
        return Err(unsupported(format!(
            "{nd} spatial dimensions (up to 3 are run)"
        )));
    }
    if [
        d.input_spatial.len(),
        d.kernel_spatial.len(),
        d.output_spatial.len(),
    ] != [nd; 3]
    {
        return Err(RuntimeError::invalid(format!(
            "convolution window of {nd} dimensions against {} / {} / {} spatial dimensions",
            d.input_spatial.len(),
            d.kernel_spatial.len(),
            d.output_spatial.len()
        )));
    }
    let reversal = c.window.first().is_some_and(|w| w.window_reversal);
    let mut padding = Vec::with_capacity(nd + 1);
    let mut strides = Vec::with_capacity(nd + 1);
    let mut dilations = Vec::with_capacity(nd + 1);
    for (i, w) in c.window.iter().enumerate() {
        if w.window_reversal != reversal {
            return Err(unsupported(
                "a window reversed in some dimensions only".into(),
            ));
        }
        if w.padding_low != w.padding_high || w.padding_low < 0 {
            return Err(unsupported(format!(
                "padding {} / {} in spatial dimension {i} (cuDNN's runner takes symmetric padding)",
                w.padding_low, w.padding_high
            )));
        }
        if w.base_dilation > 1 {
            return Err(unsupported(format!(
                "base dilation {} in spatial dimension {i}",
                w.base_dilation
            )));
        }
        if w.stride < 1 || w.window_dilation < 1 {
            return Err(RuntimeError::invalid(format!(
                "convolution stride {} / dilation {} in spatial dimension {i}",
                w.stride, w.window_dilation
            )));
        }
        padding.push(w.padding_low);
        strides.push(w.stride);
        dilations.push(w.window_dilation);
    }
    for _ in nd..2 {
        padding.push(0);
        strides.push(1);
        dilations.push(1);
    }
    Ok(ConvWindow {
        padding,
        strides,
        dilations,
        reversal,
    })
}

/// The buffers and shapes in the roles x, w, y of operation `op`.
fn roles(
    op: ConvOp,
    c: &ConvolutionThunk,
) -> (
    &ShapedSlice,
    &ShapedSlice,
    &ShapedSlice,
    &Shape,
    &Shape,
    &Shape,
) {
    // Roles per kind: (x, w, y) buffers and shapes.
    match op {
        ConvOp::Forward => (
            &c.operands[0],
            &c.operands[1],
            &c.results[0],
            &c.operand0_shape,
            &c.operand1_shape,
            &c.result_shape,
        ),
        ConvOp::BackwardData => (
            &c.results[0],
            &c.operands[1],
            &c.operands[0],
            &c.result_shape,
            &c.operand1_shape,
            &c.operand0_shape,
        ),
        ConvOp::BackwardFilter => (
            &c.operands[0],
            &c.results[0],
            &c.operands[1],
            &c.operand0_shape,
            &c.result_shape,
            &c.operand1_shape,
        ),
    }
}

/// The geometry must add up: y's spatial sizes from x's, w's and the
/// window; features and batch consistent with the group count.
fn check_geometry(
    name: &str,
    c: &ConvolutionThunk,
    (x, w, y): (&ConvTensor, &ConvTensor, &ConvTensor),
    (padding, strides, dilations): (&[i64], &[i64], &[i64]),
) -> Result<()> {
    let nd = c.window.len();
    let groups = c.feature_group_count.max(1);
    let bad = |what: String| RuntimeError::invalid(format!("convolution {name}: {what}"));
    if x.dims[0] != y.dims[0] || y.dims[1] != w.dims[0] || x.dims[1] != w.dims[1] * groups {
        return Err(bad(format!(
            "input {:?}, filter {:?} and output {:?} do not fit {groups} feature group(s)",
            x.dims, w.dims, y.dims
        )));
    }
    for i in 0..nd {
        let (xi, ki, yi) = (x.dims[2 + i], w.dims[2 + i], y.dims[2 + i]);
        let span = (ki - 1) * dilations[i] + 1;
        let want = (xi + 2 * padding[i] - span).div_euclid(strides[i]) + 1;
        if xi + 2 * padding[i] >= span && want != yi {
            return Err(bad(format!(
                "output size {yi} in spatial dimension {i}, the window gives {want}"
            )));
        }
    }
    Ok(())
}

/// Every tensor fits its slice.
fn check_sizes(name: &str, checks: &[(&str, &ConvTensor, Slice, ElementType)]) -> Result<()> {
    let bad = |what: String| RuntimeError::invalid(format!("convolution {name}: {what}"));
    for &(what, t, s, ty) in checks {
        let bytes = t
            .span()
            .and_then(|e| e.checked_mul(element_bytes(ty)))
            .ok_or_else(|| bad(format!("{what} of dimensions {:?} overflows", t.dims)))?;
        if bytes > s.size {
            return Err(bad(format!(
                "{what} needs {bytes} bytes, its slice has {}",
                s.size
            )));
        }
    }
    Ok(())
}

pub fn load(name: &str, c: &ConvolutionThunk) -> Result<ConvRun> {
    let (op, fused, input, output, compute) = op_and_types(c)?;
    let ConvWindow {
        padding,
        strides,
        dilations,
        reversal,
    } = window(c)?;
    let d = &c.dnums;
    let (xs, ws, ys, x_shape, w_shape, y_shape) = roles(op, c);
    let (x, _) = tensor(
        x_shape,
        d.input_batch,
        d.input_feature,
        &d.input_spatial,
        input.0,
        "input",
    )?;
    let (w, _) = tensor(
        w_shape,
        d.kernel_output_feature,
        d.kernel_input_feature,
        &d.kernel_spatial,
        input.0,
        "filter",
    )?;
    let (y, y_layout) = tensor(
        y_shape,
        d.output_batch,
        d.output_feature,
        &d.output_spatial,
        output.0,
        "output",
    )?;
    check_geometry(name, c, (&x, &w, &y), (&padding, &strides, &dilations))?;
    let fusion = if fused {
        Some(fusion(c, &y, y_layout, input.0)?)
    } else {
        None
    };
    let fused = fusion.as_ref().map(|_| FusedRun {
        side_input: c.operands.get(3).unwrap_or(ys).slice,
        bias: c.operands[2].slice,
    });
    let mut checks = vec![
        ("input", &x, xs.slice, input),
        ("filter", &w, ws.slice, input),
        ("output", &y, ys.slice, output),
    ];
    if let (Some(f), Some(run)) = (&fusion, &fused) {
        checks.push(("bias", &f.bias, run.bias, input));
        if f.side_input.is_some() {
            checks.push(("side input", &y, run.side_input, output));
        }
    }
    check_sizes(name, &checks)?;
    Ok(ConvRun {
        name: name.to_string(),
        spec: ConvSpec {
            op,
            x,
            w,
            y,
            compute,
            cross_correlation: !reversal,
            padding,
            strides,
            dilations,
            engine: c.algorithm.algo_id,
            knobs: c.algorithm.knobs.clone(),
            fusion,
        },
        x: xs.slice,
        w: ws.slice,
        y: ys.slice,
        scratch: c.scratch,
        fused,
    })
}

/// What XLA's fused runner adds after the convolution
/// (`RunGpuConvForwardActivation`, `GetCudnnFusedOperationGraph`), for an
/// output `y` laid out as `layout` and convolution inputs of type `input`.
fn fusion(c: &ConvolutionThunk, y: &ConvTensor, layout: Layout, input: i32) -> Result<ConvFusion> {
    let activation = match c.activation_mode {
        0 => Activation::None,
        2 => Activation::Relu,
        3 => Activation::Relu6,
        7 => Activation::Elu,
        8 => Activation::LeakyRelu(c.leakyrelu_alpha),
        other => {
            return Err(unsupported(format!(
                "fused activation mode {other} (XLA's fused runner takes none, relu, relu6, elu \
                 and leaky relu)"
            )))
        }
    };
    let (conv_scale, side_scale) = (c.conv_result_scale, c.side_input_scale);
    if c.operands.len() < 4 && side_scale != 0.0 {
        return Err(RuntimeError::invalid(format!(
            "fused convolution with side-input scale {side_scale} and no side input"
        )));
    }
    // XLA's `SideInputNeeded`: cuDNN's precompiled conv-add-bias-act
    // kernels (identity and relu) take the add, the others only a scale.
    let side_input = (matches!(activation, Activation::None | Activation::Relu)
        || conv_scale != 1.0
        || side_scale != 0.0)
        .then_some((conv_scale, side_scale));
    // The bias: [1, C, 1, 1(, 1)] in the output's layout, in the input's
    // type (`BiasTypeForInputType` for floating point).
    let mut dims = vec![1; y.dims.len()];
    dims[1] = y.dims[1];
    let strides = dense_strides(&dims, layout)
        .ok_or_else(|| unsupported(format!("bias of dimensions {dims:?} overflows")))?;
    if let Some(t) = c.operands[2].shape.as_ref().map(|s| s.element_type) {
        if t.0 != input {
            return Err(unsupported(format!(
                "bias of element type {} against the input's {input} (XLA PrimitiveType)",
                t.name().unwrap_or("unknown")
            )));
        }
    }
    // `GetConvActivationType`: f32 for half-precision inputs.
    let activation_type = match input {
        xla_type::F64 => xla_type::F64,
        _ => xla_type::F32,
    };
    Ok(ConvFusion {
        bias: ConvTensor {
            dtype: input,
            dims,
            strides,
        },
        activation_type,
        activation,
        side_input,
    })
}

/// A loaded convolution: the buffers in their roles and the engine's plan.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvOpLoaded {
    pub run: ConvRun,
    pub plan: ConvPlanId,
}

/// Load a convolution: the spec, the engine's plan, its workspace checked
/// against the executable's scratch buffer.
pub(crate) fn build<B: Backend>(
    engine: Option<&dyn GemmEngine<B>>,
    name: &str,
    c: &ConvolutionThunk,
) -> Result<ConvOpLoaded> {
    let engine = engine
        .ok_or_else(|| RuntimeError::unsupported("convolution: no DNN engine on this backend"))?;
    let run = crate::conv::load(name, c)?;
    let plan = engine.prepare_conv(&run.spec)?;
    let need = engine
        .conv_workspace(plan)
        .inspect_err(|_| engine.release_conv(plan))?;
    if need > run.scratch.size {
        engine.release_conv(plan);
        return Err(RuntimeError::unsupported(format!(
            "convolution {}: the cuDNN plan needs {need} bytes of workspace, the \
             executable's scratch buffer has {} (another cuDNN than the one it was \
             autotuned with?)",
            run.name, run.scratch.size
        )));
    }
    Ok(ConvOpLoaded { run, plan })
}

/// Enqueue a loaded convolution on `stream`.
pub(crate) fn run<B: Backend>(
    engine: Option<&dyn GemmEngine<B>>,
    c: &ConvOpLoaded,
    slots: &SlotTable,
    stream: &B::Stream,
) -> Result<()> {
    let engine = engine.ok_or_else(|| RuntimeError::unsupported("convolution: no DNN engine"))?;
    let args = ConvArgs {
        x: slots.resolve(&c.run.x)?,
        w: slots.resolve(&c.run.w)?,
        y: slots.resolve(&c.run.y)?,
        workspace: slots.resolve(&c.run.scratch)?,
        workspace_bytes: c.run.scratch.size,
        fused: match &c.run.fused {
            Some(f) => Some(FusedArgs {
                side_input: slots.resolve(&f.side_input)?,
                bias: slots.resolve(&f.bias)?,
            }),
            None => None,
        },
    };
    engine
        .run_conv(c.plan, &args, stream)
        .map_err(|e| RuntimeError::invalid(format!("convolution '{}': {e}", c.run.name)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use xla_vmm::{ConvAlgorithm, ConvDims, ShapedSlice, WindowDim};

    fn shape(dims: &[i64], minor_to_major: &[i64]) -> Shape {
        Shape {
            element_type: ElementType::F32,
            dimensions: dims.to_vec(),
            minor_to_major: Some(minor_to_major.to_vec()),
            ..Default::default()
        }
    }

    fn slice(allocation: usize, size: u64) -> ShapedSlice {
        ShapedSlice {
            slice: Slice {
                allocation,
                offset: 0,
                size,
            },
            shape: None,
        }
    }

    /// NHWC x f32[2,8,8,3], HWIO-as-OHWI... w f32[4,3,3,3] (O, H, W, I),
    /// y f32[2,8,8,4]: a 3x3 SAME convolution, as `jax.lax.conv_general_dilated`
    /// with ("NHWC", "OHWI", "NHWC") lowers.
    fn nhwc_forward() -> ConvolutionThunk {
        let dim = WindowDim {
            size: 3,
            stride: 1,
            padding_low: 1,
            padding_high: 1,
            window_dilation: 1,
            base_dilation: 1,
            window_reversal: false,
        };
        ConvolutionThunk {
            kind: ConvKind::Forward,
            operands: vec![slice(0, 2 * 8 * 8 * 3 * 4), slice(1, 4 * 3 * 3 * 3 * 4)],
            results: vec![slice(2, 2 * 8 * 8 * 4 * 4)],
            scratch: Slice {
                allocation: 3,
                offset: 0,
                size: 1024,
            },
            operand0_shape: shape(&[2, 8, 8, 3], &[3, 2, 1, 0]),
            operand1_shape: shape(&[4, 3, 3, 3], &[3, 2, 1, 0]),
            result_shape: shape(&[2, 8, 8, 4], &[3, 2, 1, 0]),
            window: vec![dim, dim],
            dnums: ConvDims {
                input_batch: 0,
                input_feature: 3,
                input_spatial: vec![1, 2],
                kernel_input_feature: 3,
                kernel_output_feature: 0,
                kernel_spatial: vec![1, 2],
                output_batch: 0,
                output_feature: 3,
                output_spatial: vec![1, 2],
            },
            feature_group_count: 1,
            algorithm: ConvAlgorithm {
                algo_id: 7,
                knobs: vec![(1, 2)],
                workspace_size: Some(0),
            },
            conv_result_scale: 1.0,
            side_input_scale: 0.0,
            activation_mode: 0,
            leakyrelu_alpha: 0.0,
            has_serialized_graph: false,
        }
    }

    #[test]
    fn nhwc_and_ohwi_become_nchw_dims_with_their_strides() {
        let r = load("conv.1", &nhwc_forward()).unwrap();
        let s = &r.spec;
        assert_eq!(s.op, ConvOp::Forward);
        assert_eq!(
            (s.x.dims.clone(), s.x.strides.clone()),
            (vec![2, 3, 8, 8], vec![192, 1, 24, 3])
        );
        assert_eq!(
            (s.w.dims.clone(), s.w.strides.clone()),
            (vec![4, 3, 3, 3], vec![27, 1, 9, 3])
        );
        assert_eq!(
            (s.y.dims.clone(), s.y.strides.clone()),
            (vec![2, 4, 8, 8], vec![256, 1, 32, 4])
        );
        assert_eq!(
            (s.padding.clone(), s.strides.clone(), s.dilations.clone()),
            (vec![1, 1], vec![1, 1], vec![1, 1])
        );
        assert!(s.cross_correlation);
        assert_eq!(
            (s.engine, s.knobs.clone(), s.compute),
            (7, vec![(1, 2)], xla_type::F32)
        );
        assert_eq!((r.x.allocation, r.w.allocation, r.y.allocation), (0, 1, 2));
    }

    #[test]
    fn nchw_one_d_gets_a_trailing_singleton() {
        // x f32[2,3,10] (N, C, W), w f32[4,3,3] (O, I, W), y f32[2,4,8].
        let mut c = nhwc_forward();
        c.operand0_shape = shape(&[2, 3, 10], &[2, 1, 0]);
        c.operand1_shape = shape(&[4, 3, 3], &[2, 1, 0]);
        c.result_shape = shape(&[2, 4, 8], &[2, 1, 0]);
        c.window = vec![WindowDim {
            padding_low: 0,
            padding_high: 0,
            ..c.window[0]
        }];
        c.dnums = ConvDims {
            input_batch: 0,
            input_feature: 1,
            input_spatial: vec![2],
            kernel_input_feature: 1,
            kernel_output_feature: 0,
            kernel_spatial: vec![2],
            output_batch: 0,
            output_feature: 1,
            output_spatial: vec![2],
        };
        let s = load("conv.2", &c).unwrap().spec;
        assert_eq!(
            (s.x.dims.clone(), s.x.strides.clone()),
            (vec![2, 3, 10, 1], vec![30, 10, 1, 1])
        );
        assert_eq!(s.y.dims, vec![2, 4, 8, 1]);
        assert_eq!(
            (s.padding, s.strides, s.dilations),
            (vec![0, 0], vec![1, 1], vec![1, 1])
        );
    }

    #[test]
    fn no_spatial_dimensions_become_two_singletons() {
        // x f32[2,3] (N, C), w f32[4,3] (O, I), y f32[2,4]: a dot as a conv.
        let mut c = nhwc_forward();
        c.operand0_shape = shape(&[2, 3], &[1, 0]);
        c.operand1_shape = shape(&[4, 3], &[1, 0]);
        c.result_shape = shape(&[2, 4], &[1, 0]);
        c.window = vec![];
        c.dnums = ConvDims {
            input_batch: 0,
            input_feature: 1,
            kernel_input_feature: 1,
            kernel_output_feature: 0,
            output_batch: 0,
            output_feature: 1,
            ..Default::default()
        };
        let s = load("conv.0d", &c).unwrap().spec;
        assert_eq!(
            (s.x.dims.clone(), s.x.strides.clone()),
            (vec![2, 3, 1, 1], vec![3, 1, 1, 1])
        );
        assert_eq!(
            (s.w.dims.clone(), s.y.dims.clone()),
            (vec![4, 3, 1, 1], vec![2, 4, 1, 1])
        );
        assert_eq!(
            (s.padding, s.strides, s.dilations),
            (vec![0, 0], vec![1, 1], vec![1, 1])
        );
    }

    #[test]
    fn backward_kinds_take_their_buffers_in_xlas_roles() {
        // Backward filter of the NHWC convolution: operands (x, dy), result dw.
        let f = nhwc_forward();
        let mut c = f.clone();
        c.kind = ConvKind::BackwardFilter;
        c.operands = vec![f.operands[0].clone(), f.results[0].clone()];
        c.results = vec![f.operands[1].clone()];
        c.operand1_shape = f.result_shape.clone();
        c.result_shape = f.operand1_shape.clone();
        let r = load("conv.3", &c).unwrap();
        assert_eq!(r.spec.op, ConvOp::BackwardFilter);
        assert_eq!((r.x.allocation, r.w.allocation, r.y.allocation), (0, 1, 2));
        assert_eq!(r.spec.w.dims, vec![4, 3, 3, 3]);
        // Backward input: operands (dy, w), result dx.
        let mut c = f.clone();
        c.kind = ConvKind::BackwardInput;
        c.operands = vec![f.results[0].clone(), f.operands[1].clone()];
        c.results = vec![f.operands[0].clone()];
        c.operand0_shape = f.result_shape.clone();
        c.result_shape = f.operand0_shape.clone();
        let r = load("conv.4", &c).unwrap();
        assert_eq!(r.spec.op, ConvOp::BackwardData);
        assert_eq!((r.x.allocation, r.w.allocation, r.y.allocation), (0, 1, 2));
        // The same buffers read as the other backward kind do not add up:
        // an error, not a wrong convolution.
        c.kind = ConvKind::BackwardFilter;
        let e = load("conv.5", &c).unwrap_err().to_string();
        assert!(e.contains("conv.5"), "{e}");
    }

    #[test]
    fn what_xlas_runner_refuses_is_refused_with_the_reason() {
        let mut c = nhwc_forward();
        c.window[1].padding_high = 2;
        let e = load("c", &c).unwrap_err().to_string();
        assert!(e.contains("symmetric padding"), "{e}");
        let mut c = nhwc_forward();
        c.kind = ConvKind::ForwardActivation; // without its bias operand
        assert!(load("c", &c)
            .unwrap_err()
            .to_string()
            .contains("fused convolution with 2 operands"));
        let mut c = nhwc_forward();
        c.conv_result_scale = 0.5;
        assert!(load("c", &c)
            .unwrap_err()
            .to_string()
            .contains("result scale"));
        let mut c = nhwc_forward();
        c.operand0_shape.minor_to_major = Some(vec![0, 1, 2, 3]);
        assert!(load("c", &c).unwrap_err().to_string().contains("layout"));
        let mut c = nhwc_forward();
        c.operand0_shape.element_type = ElementType(2);
        assert!(load("c", &c)
            .unwrap_err()
            .to_string()
            .contains("element type"));
        let mut c = nhwc_forward();
        c.results[0].slice.size = 100;
        assert!(load("c", &c)
            .unwrap_err()
            .to_string()
            .contains("output needs 2048 bytes"));
        let mut c = nhwc_forward();
        c.result_shape.dimensions = vec![2, 7, 8, 4];
        assert!(load("c", &c)
            .unwrap_err()
            .to_string()
            .contains("window gives 8"));
    }

    /// The NHWC convolution fused with a bias f32[4] and `mode`, as XLA's
    /// fused rewriter emits it (operands x, w, bias).
    fn fused(mode: i32) -> ConvolutionThunk {
        let mut c = nhwc_forward();
        c.kind = ConvKind::ForwardActivation;
        c.activation_mode = mode;
        c.operands.push(slice(4, 16));
        c
    }

    #[test]
    fn a_fused_relu_gets_xlas_side_input_add_and_a_bias_in_the_output_layout() {
        let r = load("fused.relu", &fused(2)).unwrap();
        let f = r.spec.fusion.as_ref().unwrap();
        assert_eq!(r.spec.op, ConvOp::Forward);
        assert_eq!(f.activation, Activation::Relu);
        // Relu (and identity) take cuDNN's conv-add-bias-act form: the add
        // at scales 1 and 0, its side input y's own buffer.
        assert_eq!(f.side_input, Some((1.0, 0.0)));
        let run = r.fused.unwrap();
        assert_eq!((run.bias.allocation, run.side_input.allocation), (4, 2));
        // [1, C, 1, 1] with NHWC's strides.
        assert_eq!(
            (f.bias.dims.clone(), f.bias.strides.clone()),
            (vec![1, 4, 1, 1], vec![4, 1, 4, 4])
        );
        assert_eq!(
            (f.bias.dtype, f.activation_type),
            (xla_type::F32, xla_type::F32)
        );
    }

    #[test]
    fn fused_activations_follow_xlas_runner() {
        let mut c = fused(8);
        c.leakyrelu_alpha = 0.25;
        let f = load("c", &c).unwrap().spec.fusion.unwrap();
        // Other activations drop the side-input add (XLA's SideInputNeeded).
        assert_eq!(
            (f.activation, f.side_input),
            (Activation::LeakyRelu(0.25), None)
        );
        let f = load("c", &fused(0)).unwrap().spec.fusion.unwrap();
        assert_eq!(
            (f.activation, f.side_input),
            (Activation::None, Some((1.0, 0.0)))
        );
        // A side input operand and its scale.
        let mut c = fused(3);
        c.operands.push(slice(5, 2 * 8 * 8 * 4 * 4));
        c.side_input_scale = 0.5;
        let r = load("c", &c).unwrap();
        let f = r.spec.fusion.unwrap();
        assert_eq!(
            (f.activation, f.side_input),
            (Activation::Relu6, Some((1.0, 0.5)))
        );
        assert_eq!(r.fused.unwrap().side_input.allocation, 5);
        // bf16 convolutions do their pointwise math in f32.
        let mut c = fused(2);
        for s in [
            &mut c.operand0_shape,
            &mut c.operand1_shape,
            &mut c.result_shape,
        ] {
            s.element_type = ElementType::BF16;
        }
        let f = load("c", &c).unwrap().spec.fusion.unwrap();
        assert_eq!(
            (f.bias.dtype, f.activation_type),
            (xla_type::BF16, xla_type::F32)
        );
    }

    #[test]
    fn fused_convolutions_xlas_runner_refuses_are_refused() {
        let e = load("c", &fused(1)).unwrap_err().to_string();
        assert!(e.contains("fused activation mode 1"), "{e}");
        let mut c = fused(2);
        c.side_input_scale = 1.0;
        let e = load("c", &c).unwrap_err().to_string();
        assert!(e.contains("no side input"), "{e}");
        let mut c = fused(2);
        c.operands[2].slice.size = 8;
        let e = load("c", &c).unwrap_err().to_string();
        assert!(e.contains("bias needs 16 bytes, its slice has 8"), "{e}");
        let mut c = fused(2);
        c.operands.push(slice(5, 64));
        let e = load("c", &c).unwrap_err().to_string();
        assert!(e.contains("side input needs 2048 bytes"), "{e}");
    }
}
