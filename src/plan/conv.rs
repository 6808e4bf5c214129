//! `ConvolutionThunkProto`: a cuDNN convolution as XLA's autotuner left it
//! (xla/backends/gpu/runtime/convolution_thunk.cc, gpu_conv_runner.cc).

use serde::Serialize;

use super::{Shape, ShapedSlice, Slice};

/// `CudnnConvKindProto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvKind {
    /// y = conv(x, w): operands (x, w), result y.
    Forward,
    /// dx from (dy, w): operands (dy, w), result dx.
    BackwardInput,
    /// dw from (x, dy): operands (x, dy), result dw.
    BackwardFilter,
    /// Forward fused with bias, side input and activation.
    ForwardActivation,
    /// Forward fused with a serialized cuDNN graph.
    ForwardGraph,
}

/// `xla.WindowDimension`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WindowDim {
    pub size: i64,
    pub stride: i64,
    pub padding_low: i64,
    pub padding_high: i64,
    pub window_dilation: i64,
    pub base_dilation: i64,
    pub window_reversal: bool,
}

/// `xla.ConvolutionDimensionNumbers`: which dimension of each shape is the
/// batch, the feature and each spatial dimension.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ConvDims {
    pub input_batch: i64,
    pub input_feature: i64,
    pub input_spatial: Vec<i64>,
    pub kernel_input_feature: i64,
    pub kernel_output_feature: i64,
    pub kernel_spatial: Vec<i64>,
    pub output_batch: i64,
    pub output_feature: i64,
    pub output_spatial: Vec<i64>,
}

/// The cuDNN engine the autotuner chose (`stream_executor.dnn.AlgorithmProto`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ConvAlgorithm {
    /// cuDNN global engine index.
    pub algo_id: i64,
    /// (`cudnnBackendKnobType_t`, choice), sorted by knob type.
    pub knobs: Vec<(i64, i64)>,
    /// Workspace the autotuner measured, when recorded.
    pub workspace_size: Option<u64>,
}

/// `ConvolutionThunkProto` with its `GpuConvDescriptorProto`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConvolutionThunk {
    pub kind: ConvKind,
    /// The custom call's operands, in order.
    pub operands: Vec<ShapedSlice>,
    /// Its results but the last (the scratch buffer, [`Self::scratch`]).
    pub results: Vec<ShapedSlice>,
    pub scratch: Slice,
    pub operand0_shape: Shape,
    pub operand1_shape: Shape,
    pub result_shape: Shape,
    pub window: Vec<WindowDim>,
    pub dnums: ConvDims,
    pub feature_group_count: i64,
    pub algorithm: ConvAlgorithm,
    pub conv_result_scale: f64,
    pub side_input_scale: f64,
    /// `stream_executor.dnn.ActivationMode` (0 = none).
    pub activation_mode: i32,
    /// Slope below 0 of a leaky relu activation.
    pub leakyrelu_alpha: f64,
    /// A forward-graph convolution's serialized cuDNN graph is present.
    pub has_serialized_graph: bool,
}
