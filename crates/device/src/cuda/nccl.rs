//! Collectives on CUDA through NCCL (loaded at run time by
//! [`xla_vmm_ffi::nccl`]); the communicator itself is shared with RCCL
//! (`crate::nccl_common`).
//!
//! Our [`CudaBackend`] uses the device's *primary* context (cudarc's
//! `CudaContext::new` retains it). NCCL is a CUDA runtime API user: the
//! runtime adopts the context current on the calling thread, so every call
//! first makes this backend's context current, which makes NCCL's
//! `cudaGetDevice` report this device.

use std::ffi::c_int;
use std::sync::Arc;

use cudarc::driver::CudaContext;
use xla_vmm_ffi::cuda::driver as sys;
use xla_vmm_ffi::nccl::{self as ffi, NcclLib};

use super::result::check;
use super::{CudaBackend, CudaStream};
use crate::collective::{CliqueId, Communicator};
use crate::error::{DeviceError, Result};
use crate::nccl_common::{self as common, to_int, CommDevice};

/// The process' NCCL, or [`DeviceError::NotAvailable`].
pub fn library() -> Result<&'static NcclLib> {
    NcclLib::nccl().map_err(|e| DeviceError::NotAvailable(e.message))
}

/// Path and `ncclGetVersion` of the NCCL in use (e.g. 22809 = 2.28.9).
pub fn version() -> Result<(std::path::PathBuf, i32)> {
    let lib = library()?;
    let v = lib
        .version()
        .map_err(|code| common::error(lib, "ncclGetVersion", code, std::ptr::null_mut()))?;
    Ok((lib.path.clone(), v))
}

/// A CUDA device as NCCL sees it: our (primary) context, current on the
/// calling thread.
#[derive(Clone)]
pub(crate) struct NcclDevice(Arc<CudaContext>);

impl CommDevice for NcclDevice {
    type Backend = CudaBackend;
    const LIBRARY: &'static str = "NCCL";

    fn select(&self) -> Result<()> {
        self.0
            .bind_to_thread()
            .map_err(|e| super::result::from_cudarc("cuCtxSetCurrent", e))
    }

    fn stream(stream: &CudaStream) -> (u64, ffi::ncclStream_t) {
        (stream.owner, stream.cu_stream() as ffi::ncclStream_t)
    }
}

impl CudaBackend {
    pub(super) fn nccl_clique_id(&self) -> Result<CliqueId> {
        let lib = library()?;
        self.bind()?;
        common::clique_id(lib)
    }

    pub(super) fn nccl_comm_init_rank(
        &self,
        id: &CliqueId,
        nranks: usize,
        rank: usize,
    ) -> Result<Box<dyn Communicator<CudaStream>>> {
        let lib = library()?;
        let comm = common::init_rank(lib, id, nranks, rank, NcclDevice(self.ctx.clone()), self.id)?;
        tracing::info!(ordinal = self.ordinal, rank, nranks, library = %lib.path.display(),
            "NCCL communicator ready");
        Ok(Box::new(comm))
    }

    /// `cuCtxEnablePeerAccess` from our context to device `peer`'s primary
    /// context. The peer's primary context is retained for the rest of the
    /// process (peer mappings need it alive).
    pub(super) fn cuda_enable_peer_access(&self, peer: usize) -> Result<()> {
        let peer_i = to_int("peer", peer)?;
        if peer_i == self.ordinal {
            return Ok(());
        }
        self.bind()?;
        let mut dev: sys::CUdevice = 0;
        let mut can: c_int = 0;
        let mut pctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out pointers; our context is current.
        unsafe {
            check("cuDeviceGet", sys::cuDeviceGet(&mut dev, peer_i))?;
            check(
                "cuDeviceCanAccessPeer",
                sys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), dev),
            )?;
        }
        if can == 0 {
            return Err(DeviceError::Unsupported(format!(
                "peer access from CUDA device {} to device {peer}",
                self.ordinal
            )));
        }
        // SAFETY: `dev` is a valid device; `pctx` a valid out pointer.
        unsafe {
            check(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut pctx, dev),
            )?;
        }
        // SAFETY: `pctx` is a live (retained) context; ours is current.
        let r = unsafe { sys::cuCtxEnablePeerAccess(pctx, 0) };
        if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check("cuCtxEnablePeerAccess", r)
    }
}
