//! Static table of XLA's `ThunkProto.impl` oneof fields (thunk.proto at the
//! XLA version named in the header of proto/xla/backends/gpu/runtime/thunk.proto),
//! used to name kinds we do not decode.

/// (field number, oneof field name without `_thunk`). Numbers reserved in
/// the current XLA are listed with the names XLA's `reserved` lines give.
pub const THUNK_KINDS: &[(u32, &str)] = &[
    (2, "sequential"),
    (3, "copy"),
    (4, "device_to_host_copy"),
    (5, "host_to_device_copy"),
    (6, "conditional"),
    (7, "while"),
    (8, "kernel"),
    (9, "gemm"),
    (11, "triangular_solve"),
    (12, "replica_id"),
    (13, "device_to_device_copy"),
    (14, "partition_id"),
    (15, "cudnn"),
    (16, "host_execute_start"),
    (17, "host_execute_done"),
    (19, "memzero"),
    (20, "select_k"),
    (21, "infeed"),
    (22, "cublas_lt_matmul"),
    (23, "outfeed"),
    (24, "norm"),
    (25, "convolution"),
    (26, "convolution_reorder"),
    (27, "fft"),
    (28, "memset32bit_value"),
    (30, "custom_call"),
    (32, "host_send"),
    (33, "host_send_done"),
    (34, "host_recv"),
    (35, "host_recv_done"),
    (36, "custom_kernel"),
    (38, "all_gather"),
    (39, "all_reduce"),
    (40, "reduce_scatter"),
    (41, "all_to_all"),
    (42, "ragged_all_to_all"),
    (43, "collective_permute"),
    (44, "send"),
    (45, "recv"),
    (46, "collective_broadcast"),
    (47, "collective_group"),
    (57, "async_start"),
    (58, "async_done"),
    (59, "collective_kernel"),
    (60, "dynamic_slice_fusion"),
    (61, "rng_seed"),
];

/// The kind name for a `ThunkProto` field number, if XLA defines one.
pub fn thunk_kind_name(field_number: u32) -> Option<&'static str> {
    THUNK_KINDS
        .iter()
        .find(|(n, _)| *n == field_number)
        .map(|(_, name)| *name)
}
