//! Bytes → [`Plan`]: container layers (container.rs), the hand-read
//! `ThunkProto` (thunk.rs), conversion with validation (convert.rs), and
//! constant values from the HLO module (constants.rs), the reduction of
//! `collective_kernel` thunks from it (hlo_reduction.rs).

mod collective;
mod constants;
mod container;
mod convert;
mod ffi_attr;
mod hlo_reduction;
mod program;
mod thunk;
mod wire;

pub mod mutate;
pub use container::{
    is_riegeli, read_split_proto, strip_ifrt_header, write_split_proto, RIEGELI_SIGNATURE,
};

use prost::Message;

use crate::plan::Plan;
use crate::proto::xla::gpu::GpuExecutableProto;
use crate::proto::xla::ExecutableAndOptionsProto;

/// Why decoding failed. Every message says which layer failed and where.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("empty input: not an XLA serialized executable")]
    Empty,
    #[error("not an XLA serialized executable: {0}")]
    NotAnExecutable(String),
    #[error("riegeli container of {what}: {source}")]
    Riegeli {
        what: String,
        #[source]
        source: riegeli::RiegeliError,
    },
    #[error("split proto of {what}: {msg}")]
    SplitProto { what: String, msg: String },
    #[error("protobuf {what}: {source}")]
    Proto {
        what: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error("protobuf wire format: {0}")]
    Wire(String),
    #[error("invalid executable: {0}")]
    Invalid(String),
}

const OUTER_TYPE: &str = "xla.ExecutableAndOptionsProto";
const INNER_TYPE: &str = "xla.gpu.GpuExecutableProto";

/// Decodes the bytes `PJRT_Executable_Serialize` returns, or jax's
/// `serialize()` bytes (IFRT header + the same), into a [`Plan`].
///
/// Accepts the outer `ExecutableAndOptionsProto` as a split proto (what XLA
/// writes now) or, like XLA, as a plain serialized proto (legacy format).
///
/// Never panics on bad input. Nesting of thunk sequences is limited to 32
/// levels (real programs use a handful); the deepest accepted input needs
/// about 250 KiB of stack in release builds and 1 MiB in debug builds.
pub fn decode(bytes: &[u8]) -> Result<Plan, DecodeError> {
    let outer = decode_executable_and_options(bytes)?;
    if outer.serialized_executable.is_empty() {
        return Err(DecodeError::Invalid(
            "ExecutableAndOptionsProto has an empty serialized_executable".into(),
        ));
    }
    let exe = decode_gpu_executable_proto(&outer.serialized_executable)?;
    program::plan_from_proto(exe, outer.pjrt_client_name)
}

/// The outer layer: IFRT header (optional), then split or plain
/// `ExecutableAndOptionsProto`.
pub fn decode_executable_and_options(
    bytes: &[u8],
) -> Result<ExecutableAndOptionsProto, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    // The plain (legacy) form is decoded in place: no copy of the input.
    let message: std::borrow::Cow<'_, [u8]> = match strip_ifrt_header(bytes) {
        Some(riegeli) => std::borrow::Cow::Owned(read_split_proto(riegeli, OUTER_TYPE)?),
        None => std::borrow::Cow::Borrowed(bytes),
    };
    let outer = ExecutableAndOptionsProto::decode(&message[..]).map_err(|source| {
        if is_riegeli(bytes) || strip_ifrt_header(bytes).is_some() {
            DecodeError::Proto {
                what: OUTER_TYPE.into(),
                source,
            }
        } else {
            DecodeError::NotAnExecutable(format!(
                "no riegeli signature (with or without an IFRT header) and not a plain \
                 {OUTER_TYPE} ({source})"
            ))
        }
    })?;
    if outer.serialized_executable.is_empty() && !is_riegeli(bytes) {
        return Err(DecodeError::NotAnExecutable(
            "no riegeli signature (with or without an IFRT header), and no \
             serialized_executable if read as a plain ExecutableAndOptionsProto"
                .into(),
        ));
    }
    Ok(outer)
}

/// Decodes an already reassembled, serialized `GpuExecutableProto` (the
/// message, not a split proto) into a [`Plan`]. Used by the fuzz target that
/// skips the container layers.
pub fn decode_gpu_executable_message(bytes: &[u8]) -> Result<Plan, DecodeError> {
    let exe = GpuExecutableProto::decode(bytes).map_err(|source| DecodeError::Proto {
        what: INNER_TYPE.into(),
        source,
    })?;
    program::plan_from_proto(exe, String::new())
}

/// The inner layer: `serialized_executable`, a split `GpuExecutableProto`.
pub fn decode_gpu_executable_proto(bytes: &[u8]) -> Result<GpuExecutableProto, DecodeError> {
    if !is_riegeli(bytes) {
        return Err(DecodeError::NotAnExecutable(format!(
            "serialized_executable is not a riegeli split proto of {INNER_TYPE} \
             (XLA dropped the legacy plain format)"
        )));
    }
    let message = read_split_proto(bytes, INNER_TYPE)?;
    GpuExecutableProto::decode(&message[..]).map_err(|source| DecodeError::Proto {
        what: INNER_TYPE.into(),
        source,
    })
}
