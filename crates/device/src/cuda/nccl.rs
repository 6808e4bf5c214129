//! Collectives on CUDA through NCCL (loaded at run time by
//! [`xla_vmm_ffi::nccl`]).
//!
//! Our [`CudaBackend`] uses the device's *primary* context (cudarc's
//! `CudaContext::new` retains it). NCCL is a CUDA runtime API user: the
//! runtime adopts the context current on the calling thread, so every call
//! below first makes this backend's context current (`bind`), which makes
//! NCCL's `cudaGetDevice` report this device.

use std::ffi::c_int;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;
use xla_vmm_ffi::cuda::driver as sys;
use xla_vmm_ffi::nccl::{self as ffi, ncclComm_t, NcclLib};

use super::result::check;
use super::{CudaBackend, CudaStream};
use crate::backend::DevicePtr;
use crate::collective::{destroy_timeout, CliqueId, CommType, Communicator, Reaper, ReduceOp};
use crate::error::{DeviceError, Result};

/// The process' NCCL, or [`DeviceError::NotAvailable`].
pub fn library() -> Result<&'static NcclLib> {
    NcclLib::nccl().map_err(|e| DeviceError::NotAvailable(e.message))
}

/// Path and `ncclGetVersion` of the NCCL in use (e.g. 22809 = 2.28.9).
pub fn version() -> Result<(std::path::PathBuf, i32)> {
    let lib = library()?;
    let v = lib
        .version()
        .map_err(|code| nccl_error(lib, "ncclGetVersion", code, std::ptr::null_mut()))?;
    Ok((lib.path.clone(), v))
}

fn nccl_error(lib: &NcclLib, call: &'static str, code: c_int, comm: ncclComm_t) -> DeviceError {
    let mut message = lib.error_string(code);
    // SAFETY: `comm` is null or a live communicator of `lib`.
    if let Some(last) = unsafe { lib.last_error(comm) } {
        message = format!("{message}: {last}");
    }
    DeviceError::Driver {
        call,
        code: code as i64,
        name: ffi::result_name(code).into(),
        message,
    }
}

fn nccl_check(lib: &NcclLib, call: &'static str, code: c_int, comm: ncclComm_t) -> Result<()> {
    if code == ffi::ncclSuccess {
        Ok(())
    } else {
        Err(nccl_error(lib, call, code, comm))
    }
}

pub(crate) fn data_type(ty: CommType) -> ffi::ncclDataType_t {
    match ty {
        CommType::I8 => ffi::ncclInt8,
        CommType::U8 => ffi::ncclUint8,
        CommType::I32 => ffi::ncclInt32,
        CommType::U32 => ffi::ncclUint32,
        CommType::I64 => ffi::ncclInt64,
        CommType::U64 => ffi::ncclUint64,
        CommType::F16 => ffi::ncclFloat16,
        CommType::F32 => ffi::ncclFloat32,
        CommType::F64 => ffi::ncclFloat64,
        CommType::Bf16 => ffi::ncclBfloat16,
        CommType::F8E4M3 => ffi::ncclFloat8e4m3,
        CommType::F8E5M2 => ffi::ncclFloat8e5m2,
    }
}

pub(crate) fn red_op(op: ReduceOp) -> ffi::ncclRedOp_t {
    match op {
        ReduceOp::Sum => ffi::ncclSum,
        ReduceOp::Prod => ffi::ncclProd,
        ReduceOp::Max => ffi::ncclMax,
        ReduceOp::Min => ffi::ncclMin,
    }
}

pub(crate) fn to_int(what: &str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| DeviceError::InvalidArgument(format!("{what} {v} too large")))
}

pub(crate) fn unique_id(id: &CliqueId) -> ffi::ncclUniqueId {
    ffi::ncclUniqueId {
        internal: id.0.map(|b| b as std::ffi::c_char),
    }
}

impl CudaBackend {
    pub(super) fn nccl_clique_id(&self) -> Result<CliqueId> {
        let lib = library()?;
        self.bind()?;
        let mut id = ffi::ncclUniqueId { internal: [0; 128] };
        // SAFETY: `id` is a valid out pointer of the right size.
        let r = unsafe { (lib.get_unique_id)(&mut id) };
        nccl_check(lib, "ncclGetUniqueId", r, std::ptr::null_mut())?;
        Ok(CliqueId(id.internal.map(|c| c as u8)))
    }

    pub(super) fn nccl_comm_init_rank(
        &self,
        id: &CliqueId,
        nranks: usize,
        rank: usize,
    ) -> Result<Box<dyn Communicator<CudaBackend>>> {
        if nranks == 0 || rank >= nranks {
            return Err(DeviceError::InvalidArgument(format!(
                "comm_init_rank: rank {rank} of {nranks}"
            )));
        }
        let lib = library()?;
        let (n, r) = (to_int("nranks", nranks)?, to_int("rank", rank)?);
        self.bind()?;
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out pointer; our (primary) context is
        // current, so NCCL binds the communicator to this device.
        let code = unsafe { (lib.comm_init_rank)(&mut comm, n, unique_id(id), r) };
        nccl_check(lib, "ncclCommInitRank", code, std::ptr::null_mut())?;
        if comm.is_null() {
            return Err(DeviceError::Driver {
                call: "ncclCommInitRank",
                code: 0,
                name: "ncclSuccess".into(),
                message: "NCCL returned a null communicator".into(),
            });
        }
        tracing::info!(ordinal = self.ordinal, rank, nranks, library = %lib.path.display(),
            "NCCL communicator ready");
        Ok(Box::new(NcclComm {
            lib,
            comm: Mutex::new(RawComm(comm)),
            ctx: self.ctx.clone(),
            owner: self.id,
            rank,
            size: nranks,
        }))
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

/// An `ncclComm_t` that may move between threads (see [`NcclComm`]).
struct RawComm(ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread, but not
// concurrently; `NcclComm` keeps it behind a mutex held for every call.
unsafe impl Send for RawComm {}

/// One rank of an NCCL clique on one CUDA device.
///
/// Thread safety: the runtime uses each communicator from one device thread
/// at a time; in addition every NCCL call holds the communicator's mutex,
/// so concurrent use is serialised rather than undefined. A group
/// (`group_start` .. `group_end`) is NCCL per-thread state: issue a group
/// from one thread.
pub struct NcclComm {
    lib: &'static NcclLib,
    comm: Mutex<RawComm>,
    ctx: Arc<CudaContext>,
    owner: u64,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl NcclComm {
    /// Bind our context, check the stream, lock the communicator and run
    /// `f(lib, comm, stream)`; a non-success result becomes an error naming
    /// `call`.
    fn call(
        &self,
        call: &'static str,
        stream: &CudaStream,
        f: impl FnOnce(&NcclLib, ncclComm_t, ffi::ncclStream_t) -> c_int,
    ) -> Result<()> {
        if stream.owner != self.owner {
            return Err(DeviceError::InvalidArgument(format!(
                "{call}: the stream belongs to another backend than the communicator"
            )));
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| super::result::from_cudarc("cuCtxSetCurrent", e))?;
        let guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        let code = f(self.lib, guard.0, stream.cu_stream() as ffi::ncclStream_t);
        nccl_check(self.lib, call, code, guard.0)
    }

    fn check_peer(&self, what: &str, peer: usize) -> Result<c_int> {
        if peer >= self.size {
            return Err(DeviceError::InvalidArgument(format!(
                "{what}: rank {peer} outside a clique of {}",
                self.size
            )));
        }
        to_int(what, peer)
    }
}

impl Drop for NcclComm {
    /// Destroyed on a thread of its own, waited for a bounded time: the
    /// destroy waits for the peer processes (see [`Reaper`]). The thread
    /// holds the context, so it stays alive until the destroy returns.
    fn drop(&mut self) {
        let comm = std::mem::replace(
            &mut self.comm.get_mut().unwrap_or_else(|e| e.into_inner()).0,
            std::ptr::null_mut(),
        );
        let raw = RawComm(comm);
        let (lib, ctx, rank, size) = (self.lib, self.ctx.clone(), self.rank, self.size);
        let what = format!("NCCL rank {rank} of {size}");
        Reaper::process().destroy(&what, destroy_timeout(), move || {
            let raw = raw;
            if let Err(e) = ctx.bind_to_thread() {
                tracing::warn!(error = ?e, "ncclCommDestroy: could not make the context current");
            }
            // SAFETY: `raw.0` is live and destroyed exactly once, here (the
            // communicator's own field was nulled above).
            let code = unsafe { (lib.comm_destroy)(raw.0) };
            if code != ffi::ncclSuccess {
                tracing::error!(code, message = %lib.error_string(code), rank,
                    "ncclCommDestroy failed");
            }
        });
    }
}

fn ptr(p: DevicePtr) -> *mut std::ffi::c_void {
    p.0 as usize as *mut std::ffi::c_void
}

impl Communicator<CudaBackend> for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<()> {
        self.call("ncclAllReduce", stream, |lib, comm, s| {
            // SAFETY: device addresses of this device (caller); comm live
            // and locked; stream live and of our context.
            unsafe {
                (lib.all_reduce)(
                    ptr(src),
                    ptr(dst),
                    count,
                    data_type(ty),
                    red_op(op),
                    comm,
                    s,
                )
            }
        })
    }

    fn all_gather(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        stream: &CudaStream,
    ) -> Result<()> {
        self.call("ncclAllGather", stream, |lib, comm, s| {
            // SAFETY: as in `all_reduce`.
            unsafe { (lib.all_gather)(ptr(src), ptr(dst), count, data_type(ty), comm, s) }
        })
    }

    fn reduce_scatter(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<()> {
        self.call("ncclReduceScatter", stream, |lib, comm, s| {
            // SAFETY: as in `all_reduce`.
            unsafe {
                (lib.reduce_scatter)(
                    ptr(src),
                    ptr(dst),
                    count,
                    data_type(ty),
                    red_op(op),
                    comm,
                    s,
                )
            }
        })
    }

    fn broadcast(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let root = self.check_peer("ncclBroadcast", root)?;
        self.call("ncclBroadcast", stream, |lib, comm, s| {
            // SAFETY: as in `all_reduce`.
            unsafe { (lib.broadcast)(ptr(src), ptr(dst), count, data_type(ty), root, comm, s) }
        })
    }

    fn send(
        &self,
        src: DevicePtr,
        count: usize,
        ty: CommType,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let peer = self.check_peer("ncclSend", peer)?;
        self.call("ncclSend", stream, |lib, comm, s| {
            // SAFETY: as in `all_reduce`.
            unsafe { (lib.send)(ptr(src), count, data_type(ty), peer, comm, s) }
        })
    }

    fn recv(
        &self,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let peer = self.check_peer("ncclRecv", peer)?;
        self.call("ncclRecv", stream, |lib, comm, s| {
            // SAFETY: as in `all_reduce`.
            unsafe { (lib.recv)(ptr(dst), count, data_type(ty), peer, comm, s) }
        })
    }

    fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments; per-thread NCCL state.
        let code = unsafe { (self.lib.group_start)() };
        nccl_check(self.lib, "ncclGroupStart", code, std::ptr::null_mut())
    }

    fn group_end(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| super::result::from_cudarc("cuCtxSetCurrent", e))?;
        let guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: no arguments; the group's operations were issued by this
        // thread with our context current.
        let code = unsafe { (self.lib.group_end)() };
        nccl_check(self.lib, "ncclGroupEnd", code, guard.0)
    }
}
