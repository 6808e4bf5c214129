//! Collective communication between devices (NCCL on CUDA, RCCL on ROCm, an
//! in-process emulation on the host backend).
//!
//! A [`Communicator`] is one rank of a clique: the devices that take part in
//! a collective, in rank order. Cliques are made with a [`CliqueId`] that one
//! rank creates ([`crate::Backend::clique_id`]) and every
//! rank receives (in-process, or through jax's key-value store across
//! processes); then every rank calls
//! [`crate::Backend::comm_init_rank`] at the same
//! time (the call blocks until all ranks have joined).
//!
//! Every operation is enqueued on a stream of the communicator's device and
//! may be captured into that device's graph. Buffers are device addresses
//! of that device.

use crate::error::Result;
use crate::ptr::DevicePtr;

mod teardown;
pub use teardown::{destroy_timeout, Destroyed, Reaper};

/// The opaque id every rank of a clique needs to join it (`ncclUniqueId`:
/// 128 bytes).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CliqueId(pub [u8; 128]);

impl std::fmt::Debug for CliqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h: u64 = self.0[..8]
            .iter()
            .fold(0u64, |a, &b| a.wrapping_mul(131).wrapping_add(b as u64));
        write!(f, "CliqueId({h:016x}..)")
    }
}

impl CliqueId {
    /// Hex text (for a key-value store that holds strings).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parse [`CliqueId::to_hex`] output.
    pub fn from_hex(s: &str) -> Option<CliqueId> {
        let s = s.trim();
        if s.len() != 256 {
            return None;
        }
        let mut out = [0u8; 128];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(CliqueId(out))
    }
}

/// Element types a collective can carry (NCCL's `ncclDataType_t`). Ops that
/// only move data (all-gather, all-to-all, send/recv, broadcast) may use
/// [`CommType::U8`] with the byte count, whatever the element type is.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CommType {
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
    F16,
    F32,
    F64,
    Bf16,
    F8E4M3,
    F8E5M2,
}

impl CommType {
    pub fn size(self) -> usize {
        match self {
            CommType::I8 | CommType::U8 | CommType::F8E4M3 | CommType::F8E5M2 => 1,
            CommType::F16 | CommType::Bf16 => 2,
            CommType::I32 | CommType::U32 | CommType::F32 => 4,
            CommType::I64 | CommType::U64 | CommType::F64 => 8,
        }
    }
}

/// Reduction of all-reduce / reduce-scatter.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Min,
    Max,
}

/// One rank of a clique on one device, enqueuing on streams `S` (its
/// backend's). `count`s are elements of `ty`.
///
/// Several operations between [`Communicator::group_start`] and
/// [`Communicator::group_end`] are issued as one (NCCL group semantics):
/// needed for send/recv pairs (all-to-all, collective permute) so that no
/// rank blocks on a peer that is itself blocked.
pub trait Communicator<S>: Send + Sync {
    /// This rank (0-based position in the clique).
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// `dst[i] = op over ranks of src[i]`, `count` elements each.
    fn all_reduce(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        op: ReduceOp,
        stream: &S,
    ) -> Result<()>;
    /// `dst` = the `count`-element `src` of rank 0, then rank 1, ...
    fn all_gather(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        stream: &S,
    ) -> Result<()>;
    /// `dst` (`count` elements) = rank-th `count`-element chunk of the
    /// reduction over ranks of `src` (`count × size` elements).
    fn reduce_scatter(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        op: ReduceOp,
        stream: &S,
    ) -> Result<()>;
    /// `buf` on every rank = `buf` of `root` (in place; `count` elements).
    fn broadcast(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        root: usize,
        stream: &S,
    ) -> Result<()>;
    /// Point-to-point (inside a group).
    fn send(
        &self,
        src: DevicePtr,
        count: usize,
        ty: CommType,
        peer: usize,
        stream: &S,
    ) -> Result<()>;
    fn recv(
        &self,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        peer: usize,
        stream: &S,
    ) -> Result<()>;
    fn group_start(&self) -> Result<()>;
    fn group_end(&self) -> Result<()>;
}
