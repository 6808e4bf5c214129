//! Collectives on ROCm through RCCL (NCCL's C API, loaded at run time by
//! [`xla_vmm_ffi::nccl`]): **unverified on AMD hardware** (compiled in CI
//! only; no AMD GPU is available to this project).
//!
//! The communicator is the one NCCL uses (`crate::nccl_common`); RCCL
//! works on the HIP runtime's current device, so every call first selects
//! this backend's device (`hipSetDevice`).

use std::ffi::c_int;

use xla_vmm_ffi::hip::runtime as sys;
use xla_vmm_ffi::nccl::{self as ffi, NcclLib};

use super::result::check;
use super::{HipBackend, HipStream};
use crate::collective::{CliqueId, Communicator};
use crate::error::{DeviceError, Result};
use crate::nccl_common::{self as common, to_int, CommDevice};

/// The process' RCCL, or [`DeviceError::NotAvailable`].
pub fn library() -> Result<&'static NcclLib> {
    NcclLib::rccl().map_err(|e| DeviceError::NotAvailable(e.message))
}

/// A HIP device as RCCL sees it: its ordinal, selected on the calling thread.
#[derive(Clone)]
pub(crate) struct RcclDevice(i32);

impl CommDevice for RcclDevice {
    type Backend = HipBackend;
    const LIBRARY: &'static str = "RCCL";

    fn select(&self) -> Result<()> {
        // SAFETY: the ordinal was validated when the backend was created.
        unsafe { super::result::device::set(self.0) }
    }

    fn stream(stream: &HipStream) -> (u64, ffi::ncclStream_t) {
        (stream.owner, stream.raw as ffi::ncclStream_t)
    }
}

impl HipBackend {
    pub(super) fn rccl_clique_id(&self) -> Result<CliqueId> {
        let lib = library()?;
        self.bind()?;
        common::clique_id(lib)
    }

    pub(super) fn rccl_comm_init_rank(
        &self,
        id: &CliqueId,
        nranks: usize,
        rank: usize,
    ) -> Result<Box<dyn Communicator<HipStream>>> {
        let lib = library()?;
        let comm = common::init_rank(lib, id, nranks, rank, RcclDevice(self.ordinal), self.id)?;
        tracing::info!(ordinal = self.ordinal, rank, nranks, library = %lib.path.display(),
            "RCCL communicator ready (unverified on hardware)");
        Ok(Box::new(comm))
    }

    /// `hipDeviceEnablePeerAccess` from this device to `peer`.
    pub(super) fn hip_enable_peer_access(&self, peer: usize) -> Result<()> {
        let peer_i = to_int("peer", peer)?;
        if peer_i == self.ordinal {
            return Ok(());
        }
        self.bind()?;
        let mut can: c_int = 0;
        // SAFETY: valid out pointer; device ids are plain integers (HIP
        // validates them).
        check("hipDeviceCanAccessPeer", unsafe {
            sys::hipDeviceCanAccessPeer(&mut can, self.ordinal, peer_i)
        })?;
        if can == 0 {
            return Err(DeviceError::Unsupported(format!(
                "peer access from HIP device {} to device {peer}",
                self.ordinal
            )));
        }
        // SAFETY: our device is current; `peer_i` is a device HIP accepted.
        let r = unsafe { sys::hipDeviceEnablePeerAccess(peer_i, 0) };
        if r == sys::hipError_t::hipErrorPeerAccessAlreadyEnabled {
            return Ok(());
        }
        check("hipDeviceEnablePeerAccess", r)
    }
}
