//! Collectives on ROCm through RCCL (NCCL's C API, loaded at run time by
//! [`xla_vmm_ffi::nccl`]): **unverified on AMD hardware** (compiled in CI
//! only; no AMD GPU is available to this project).
//!
//! Mirrors `cuda/nccl.rs`: RCCL uses the HIP runtime's current device, so
//! every call first selects this backend's device (`hipSetDevice`).

use std::ffi::c_int;
use std::sync::Mutex;

use xla_vmm_ffi::hip::runtime as sys;
use xla_vmm_ffi::nccl::{self as ffi, ncclComm_t, NcclLib};

use super::result::check;
use super::{HipBackend, HipStream};
use crate::backend::DevicePtr;
use crate::collective::{destroy_timeout, CliqueId, CommType, Communicator, Reaper, ReduceOp};
use crate::error::{DeviceError, Result};

/// The process' RCCL, or [`DeviceError::NotAvailable`].
pub fn library() -> Result<&'static NcclLib> {
    NcclLib::rccl().map_err(|e| DeviceError::NotAvailable(e.message))
}

fn rccl_error(lib: &NcclLib, call: &'static str, code: c_int, comm: ncclComm_t) -> DeviceError {
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

fn rccl_check(lib: &NcclLib, call: &'static str, code: c_int, comm: ncclComm_t) -> Result<()> {
    if code == ffi::ncclSuccess {
        Ok(())
    } else {
        Err(rccl_error(lib, call, code, comm))
    }
}

fn data_type(ty: CommType) -> ffi::ncclDataType_t {
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

fn red_op(op: ReduceOp) -> ffi::ncclRedOp_t {
    match op {
        ReduceOp::Sum => ffi::ncclSum,
        ReduceOp::Prod => ffi::ncclProd,
        ReduceOp::Max => ffi::ncclMax,
        ReduceOp::Min => ffi::ncclMin,
    }
}

fn to_int(what: &str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| DeviceError::InvalidArgument(format!("{what} {v} too large")))
}

impl HipBackend {
    pub(super) fn rccl_clique_id(&self) -> Result<CliqueId> {
        let lib = library()?;
        self.bind()?;
        let mut id = ffi::ncclUniqueId { internal: [0; 128] };
        // SAFETY: `id` is a valid out pointer of the right size.
        let r = unsafe { (lib.get_unique_id)(&mut id) };
        rccl_check(lib, "ncclGetUniqueId", r, std::ptr::null_mut())?;
        Ok(CliqueId(id.internal.map(|c| c as u8)))
    }

    pub(super) fn rccl_comm_init_rank(
        &self,
        id: &CliqueId,
        nranks: usize,
        rank: usize,
    ) -> Result<Box<dyn Communicator<HipBackend>>> {
        if nranks == 0 || rank >= nranks {
            return Err(DeviceError::InvalidArgument(format!(
                "comm_init_rank: rank {rank} of {nranks}"
            )));
        }
        let lib = library()?;
        let (n, r) = (to_int("nranks", nranks)?, to_int("rank", rank)?);
        self.bind()?;
        let uid = ffi::ncclUniqueId {
            internal: id.0.map(|b| b as std::ffi::c_char),
        };
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out pointer; our device is current.
        let code = unsafe { (lib.comm_init_rank)(&mut comm, n, uid, r) };
        rccl_check(lib, "ncclCommInitRank", code, std::ptr::null_mut())?;
        if comm.is_null() {
            return Err(DeviceError::Driver {
                call: "ncclCommInitRank",
                code: 0,
                name: "ncclSuccess".into(),
                message: "RCCL returned a null communicator".into(),
            });
        }
        tracing::info!(ordinal = self.ordinal, rank, nranks, library = %lib.path.display(),
            "RCCL communicator ready (unverified on hardware)");
        Ok(Box::new(RcclComm {
            lib,
            comm: Mutex::new(RawComm(comm)),
            ordinal: self.ordinal,
            owner: self.id,
            rank,
            size: nranks,
        }))
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

/// An `ncclComm_t` that may move between threads (see [`RcclComm`]).
struct RawComm(ncclComm_t);

// SAFETY: an RCCL communicator may be used from any thread, but not
// concurrently; `RcclComm` keeps it behind a mutex held for every call.
unsafe impl Send for RawComm {}

/// One rank of an RCCL clique on one HIP device (unverified on hardware).
///
/// Thread safety as for the NCCL communicator: every call holds the
/// communicator's mutex; a group is per-thread RCCL state.
pub struct RcclComm {
    lib: &'static NcclLib,
    comm: Mutex<RawComm>,
    ordinal: i32,
    owner: u64,
    rank: usize,
    size: usize,
}

impl RcclComm {
    fn select_device(&self) -> Result<()> {
        // SAFETY: `ordinal` was validated when the backend was created.
        unsafe { super::result::device::set(self.ordinal) }
    }

    fn call(
        &self,
        call: &'static str,
        stream: &HipStream,
        f: impl FnOnce(&NcclLib, ncclComm_t, ffi::ncclStream_t) -> c_int,
    ) -> Result<()> {
        if stream.owner != self.owner {
            return Err(DeviceError::InvalidArgument(format!(
                "{call}: the stream belongs to another backend than the communicator"
            )));
        }
        self.select_device()?;
        let guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        let code = f(self.lib, guard.0, stream.raw as ffi::ncclStream_t);
        rccl_check(self.lib, call, code, guard.0)
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

impl Drop for RcclComm {
    /// As the NCCL communicator: destroyed on a thread of its own, waited
    /// for a bounded time (see [`Reaper`]).
    fn drop(&mut self) {
        let comm = std::mem::replace(
            &mut self.comm.get_mut().unwrap_or_else(|e| e.into_inner()).0,
            std::ptr::null_mut(),
        );
        let raw = RawComm(comm);
        let (lib, ordinal, rank, size) = (self.lib, self.ordinal, self.rank, self.size);
        let what = format!("RCCL rank {rank} of {size}");
        Reaper::process().destroy(&what, destroy_timeout(), move || {
            let raw = raw;
            // SAFETY: `ordinal` was validated when the backend was created.
            if let Err(e) = unsafe { super::result::device::set(ordinal) } {
                tracing::warn!(error = %e, "ncclCommDestroy (RCCL): could not select the device");
            }
            // SAFETY: `raw.0` is live and destroyed exactly once, here (the
            // communicator's own field was nulled above).
            let code = unsafe { (lib.comm_destroy)(raw.0) };
            if code != ffi::ncclSuccess {
                tracing::error!(code, message = %lib.error_string(code), rank,
                    "ncclCommDestroy (RCCL) failed");
            }
        });
    }
}

fn ptr(p: DevicePtr) -> *mut std::ffi::c_void {
    p.0 as usize as *mut std::ffi::c_void
}

impl Communicator<HipBackend> for RcclComm {
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
        stream: &HipStream,
    ) -> Result<()> {
        let (t, o) = (data_type(ty), red_op(op));
        self.call("ncclAllReduce", stream, |lib, comm, s| {
            // SAFETY: device addresses of this device (caller); comm live
            // and locked; stream live and of our device.
            unsafe { (lib.all_reduce)(ptr(src), ptr(dst), count, t, o, comm, s) }
        })
    }

    fn all_gather(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        stream: &HipStream,
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
        stream: &HipStream,
    ) -> Result<()> {
        let (t, o) = (data_type(ty), red_op(op));
        self.call("ncclReduceScatter", stream, |lib, comm, s| {
            // SAFETY: as in `all_reduce`.
            unsafe { (lib.reduce_scatter)(ptr(src), ptr(dst), count, t, o, comm, s) }
        })
    }

    fn broadcast(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        root: usize,
        stream: &HipStream,
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
        stream: &HipStream,
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
        stream: &HipStream,
    ) -> Result<()> {
        let peer = self.check_peer("ncclRecv", peer)?;
        self.call("ncclRecv", stream, |lib, comm, s| {
            // SAFETY: as in `all_reduce`.
            unsafe { (lib.recv)(ptr(dst), count, data_type(ty), peer, comm, s) }
        })
    }

    fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments; per-thread RCCL state.
        let code = unsafe { (self.lib.group_start)() };
        rccl_check(self.lib, "ncclGroupStart", code, std::ptr::null_mut())
    }

    fn group_end(&self) -> Result<()> {
        self.select_device()?;
        let guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: no arguments; the group's operations were issued by this
        // thread with our device selected.
        let code = unsafe { (self.lib.group_end)() };
        rccl_check(self.lib, "ncclGroupEnd", code, guard.0)
    }
}
