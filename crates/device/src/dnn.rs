//! Backend-agnostic description of a convolution as XLA's cuDNN runner
//! hands it to the library (`stream_executor/cuda/cuda_dnn.cc`,
//! `GetCudnnOperationGraph`): three tensors in cuDNN's logical order
//! (`[N, C, spatial..]` for x and y, `[O, I, spatial..]` for w) with the
//! strides of their memory layout, the convolution's geometry, and the
//! engine the autotuner chose (global index and knob choices). The engine
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

/// A convolution as cuDNN's backend API takes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
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
