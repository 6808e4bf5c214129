//! Backend-agnostic description of a convolution as XLA's cuDNN runner
//! hands it to the library (`stream_executor/cuda/cuda_dnn.cc`,
//! `GetCudnnOperationGraph`): three tensors in cuDNN's logical order
//! (`[N, C, spatial..]` for x and y, `[O, I, spatial..]` for w) with the
//! strides of their memory layout, the convolution's geometry, and the
//! engine the autotuner chose (global index and knob choices), and for a
//! fused convolution the pointwise operations after it
//! (`GetCudnnFusedOperationGraph`). The engine
//! builds the same operation graph and execution plan from it
//! (`cuda::cudnn`); this file holds only plain data.

use crate::backend::DevicePtr;

/// Which cuDNN convolution operation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConvOp {
    /// y = conv(x, w).
    Forward,
    /// x (dx) from y (dy) and w.
    BackwardData,
    /// w (dw) from x and y (dy).
    BackwardFilter,
}

/// One tensor of the graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvTensor {
    /// XLA `PrimitiveType` of the elements.
    pub dtype: i32,
    /// cuDNN's logical order.
    pub dims: Vec<i64>,
    /// Elements between neighbours along each of `dims`.
    pub strides: Vec<i64>,
}

impl ConvTensor {
    /// Elements the tensor spans (the furthest element plus one; 0 when a
    /// dimension is 0).
    pub fn span(&self) -> Option<u64> {
        if self.dims.contains(&0) {
            return Some(0);
        }
        self.dims
            .iter()
            .zip(&self.strides)
            .try_fold(1u64, |acc, (&d, &s)| {
                let last = u64::try_from(d - 1)
                    .ok()?
                    .checked_mul(u64::try_from(s).ok()?)?;
                acc.checked_add(last)
            })
    }
}

/// The activation at the end of a fused convolution (the
/// `stream_executor.dnn.ActivationMode`s XLA's fused runner takes).
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Activation {
    /// Identity: the bias add writes y.
    None,
    Relu,
    /// Relu clipped at 6 from above.
    Relu6,
    Elu,
    /// Relu with this slope below 0.
    LeakyRelu(f64),
}

/// What XLA's fused runner (`GetCudnnFusedOperationGraph`) adds after the
/// convolution, which then writes a virtual accumulator tensor: optionally
/// `conv_scale * conv + side_input_scale * z` (z: the side input, y's dims,
/// strides and type), then `+ b` (the bias, `[1, C, 1, 1]` in y's layout),
/// then the activation into y. The virtual tensors after the convolution
/// and the pointwise math are in `activation_type`.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvFusion {
    pub bias: ConvTensor,
    /// XLA `PrimitiveType` of the pointwise math.
    pub activation_type: i32,
    pub activation: Activation,
    /// `(conv_scale, side_input_scale)` when the side-input add is part of
    /// the graph (XLA: `SideInputNeeded`).
    pub side_input: Option<(f64, f64)>,
}

/// A convolution as cuDNN's backend API takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvSpec {
    pub op: ConvOp,
    pub x: ConvTensor,
    pub w: ConvTensor,
    pub y: ConvTensor,
    /// XLA `PrimitiveType` of the accumulation (F32, or F64 for f64).
    pub compute: i32,
    /// `CUDNN_CROSS_CORRELATION` (XLA's convolution), else `CUDNN_CONVOLUTION`
    /// (a reversed window).
    pub cross_correlation: bool,
    /// Per spatial dimension; cuDNN gets the same array as pre- and
    /// post-padding (XLA's runner only takes symmetric padding).
    pub padding: Vec<i64>,
    pub strides: Vec<i64>,
    pub dilations: Vec<i64>,
    /// cuDNN global engine index.
    pub engine: i64,
    /// (`cudnnBackendKnobType_t`, choice), sorted.
    pub knobs: Vec<(i64, i64)>,
    /// Bias, side input and activation fused after a forward convolution.
    pub fusion: Option<ConvFusion>,
}

/// A prepared convolution: its execution plan built. Index into the
/// engine's table.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvPlanId(pub usize);

/// The device buffers of one run (x, w, y in the spec's roles).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ConvArgs {
    pub x: DevicePtr,
    pub w: DevicePtr,
    pub y: DevicePtr,
    pub workspace: DevicePtr,
    pub workspace_bytes: u64,
    /// A fused convolution's extra tensors.
    pub fused: Option<FusedArgs>,
}

/// The side input (z; read only when the spec's fusion has a side-input
/// add) and the bias (b) of a fused convolution.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FusedArgs {
    pub side_input: DevicePtr,
    pub bias: DevicePtr,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_is_the_furthest_element_plus_one() {
        let nhwc = ConvTensor {
            dtype: 11,
            dims: vec![2, 3, 4, 5],
            strides: vec![60, 1, 15, 3],
        };
        assert_eq!(nhwc.span(), Some(120));
        let empty = ConvTensor {
            dims: vec![0, 3, 4, 5],
            ..nhwc.clone()
        };
        assert_eq!(empty.span(), Some(0));
        let huge = ConvTensor {
            dims: vec![i64::MAX, 2],
            strides: vec![i64::MAX, 1],
            ..nhwc
        };
        assert_eq!(huge.span(), None);
    }
}
