//! xla-vmm decoder: turns the bytes `PJRT_Executable_Serialize` returns (or
//! jax's IFRT-wrapped `serialize()` bytes) into a typed, owned [`Plan`].
//!
//! Pipeline: [`decode()`] strips an optional IFRT header, reads the riegeli
//! container, reassembles XLA's split proto (`ExecutableAndOptionsProto`,
//! whose `serialized_executable` is itself a split `GpuExecutableProto`),
//! decodes it with our prost subset of XLA's protos (proto/), and converts
//! it into [`plan`] types that validate every index and size.
//!
//! Who validates what: the decoder rejects malformed containers and protos
//! with [`DecodeError`] and checks that every slice is in bounds of its
//! allocation; thunk kinds we do not execute become
//! [`ThunkKind::Unsupported`] and it is the runtime's job to refuse them.
#![deny(unsafe_code)]

pub mod decode;
pub mod plan;
#[doc(hidden)]
pub mod proto;
pub mod testdata;

pub use decode::{decode, DecodeError};
pub use plan::*;
