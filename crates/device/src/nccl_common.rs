//! One rank of a clique over NCCL's C API, as NCCL (CUDA) and RCCL (ROCm)
//! both export it; the library is loaded at run time by
//! [`xla_vmm_ffi::nccl`]. The backends differ only in how a thread makes
//! their device current and how a stream is handed over ([`CommDevice`]):
//! `cuda/nccl.rs` and `hip/rccl.rs`.

use std::ffi::c_int;
use std::sync::Mutex;

use xla_vmm_ffi::nccl::{self as ffi, ncclComm_t, NcclLib};

use crate::backend::{Backend, DevicePtr};
use crate::collective::{destroy_timeout, CliqueId, CommType, Communicator, Reaper, ReduceOp};
use crate::error::{DeviceError, Result};

/// What a backend tells the shared communicator code.
pub(crate) trait CommDevice: Clone + Send + Sync + 'static {
    type Backend: Backend;
    /// "NCCL" or "RCCL", for messages.
    const LIBRARY: &'static str;
    /// Make this device current on the calling thread: the library works on
    /// the current device (CUDA: our primary context; HIP: `hipSetDevice`).
    fn select(&self) -> Result<()>;
    /// The id of the backend that made `stream`, and the stream as the
    /// library takes it.
    fn stream(stream: &<Self::Backend as Backend>::Stream) -> (u64, ffi::ncclStream_t);
}

/// The error of `call` returning `code`, with the library's last message.
pub(crate) fn error(
    lib: &NcclLib,
    call: &'static str,
    code: c_int,
    comm: ncclComm_t,
) -> DeviceError {
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

/// `Ok` for `ncclSuccess`, else an error naming `call`, the code and the
/// library's last error message.
pub(crate) fn check(
    lib: &NcclLib,
    call: &'static str,
    code: c_int,
    comm: ncclComm_t,
) -> Result<()> {
    if code == ffi::ncclSuccess {
        Ok(())
    } else {
        Err(error(lib, call, code, comm))
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

pub(crate) fn to_int(what: &str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| DeviceError::InvalidArgument(format!("{what} {v} too large")))
}

fn ptr(p: DevicePtr) -> *mut std::ffi::c_void {
    p.0 as usize as *mut std::ffi::c_void
}

/// `ncclGetUniqueId`, with the caller's device current.
pub(crate) fn clique_id(lib: &NcclLib) -> Result<CliqueId> {
    let mut id = ffi::ncclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is a valid out pointer of the right size.
    let r = unsafe { (lib.get_unique_id)(&mut id) };
    check(lib, "ncclGetUniqueId", r, std::ptr::null_mut())?;
    Ok(CliqueId(id.internal.map(|c| c as u8)))
}

/// `ncclCommInitRank` on `device` (made current here): blocks until every
/// rank of the clique has joined. `owner` is the id of the backend whose
/// streams the communicator accepts.
pub(crate) fn init_rank<D: CommDevice>(
    lib: &'static NcclLib,
    id: &CliqueId,
    nranks: usize,
    rank: usize,
    device: D,
    owner: u64,
) -> Result<Comm<D>> {
    if nranks == 0 || rank >= nranks {
        return Err(DeviceError::InvalidArgument(format!(
            "comm_init_rank: rank {rank} of {nranks}"
        )));
    }
    let (n, r) = (to_int("nranks", nranks)?, to_int("rank", rank)?);
    device.select()?;
    let uid = ffi::ncclUniqueId {
        internal: id.0.map(|b| b as std::ffi::c_char),
    };
    let mut comm: ncclComm_t = std::ptr::null_mut();
    // SAFETY: `comm` is a valid out pointer; our device is current, so the
    // communicator binds to it.
    let code = unsafe { (lib.comm_init_rank)(&mut comm, n, uid, r) };
    check(lib, "ncclCommInitRank", code, std::ptr::null_mut())?;
    if comm.is_null() {
        return Err(DeviceError::Driver {
            call: "ncclCommInitRank",
            code: 0,
            name: "ncclSuccess".into(),
            message: format!("{} returned a null communicator", D::LIBRARY),
        });
    }
    Ok(Comm {
        lib,
        comm: Mutex::new(RawComm(comm)),
        device,
        owner,
        rank,
        size: nranks,
    })
}

/// An `ncclComm_t` that may move between threads (see [`Comm`]).
struct RawComm(ncclComm_t);

// SAFETY: a communicator may be used from any thread, but not concurrently;
// `Comm` keeps it behind a mutex held for every call.
unsafe impl Send for RawComm {}

/// One rank of a clique on one device.
///
/// Thread safety: the runtime uses each communicator from one device thread
/// at a time; in addition every library call holds the communicator's
/// mutex, so concurrent use is serialised rather than undefined. A group
/// (`group_start` .. `group_end`) is per-thread library state: issue a group
/// from one thread.
pub(crate) struct Comm<D: CommDevice> {
    lib: &'static NcclLib,
    comm: Mutex<RawComm>,
    device: D,
    owner: u64,
    rank: usize,
    size: usize,
}

impl<D: CommDevice> std::fmt::Debug for Comm<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(D::LIBRARY)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl<D: CommDevice> Comm<D> {
    /// Run `f` with the communicator locked and the device current, on a
    /// stream of our own backend.
    fn call(
        &self,
        call: &'static str,
        stream: &<D::Backend as Backend>::Stream,
        f: impl FnOnce(&NcclLib, ncclComm_t, ffi::ncclStream_t) -> c_int,
    ) -> Result<()> {
        let (owner, s) = D::stream(stream);
        if owner != self.owner {
            return Err(DeviceError::InvalidArgument(format!(
                "{call}: the stream belongs to another backend than the communicator"
            )));
        }
        self.device.select()?;
        let guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        let code = f(self.lib, guard.0, s);
        check(self.lib, call, code, guard.0)
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

impl<D: CommDevice> Drop for Comm<D> {
    /// Destroyed on a thread of its own, waited for a bounded time: the
    /// destroy waits for the peer processes (see [`Reaper`]). The thread
    /// holds the device handle (on CUDA the context), so it stays alive
    /// until the destroy returns.
    fn drop(&mut self) {
        let comm = std::mem::replace(
            &mut self.comm.get_mut().unwrap_or_else(|e| e.into_inner()).0,
            std::ptr::null_mut(),
        );
        let raw = RawComm(comm);
        let (lib, device, rank, size) = (self.lib, self.device.clone(), self.rank, self.size);
        let what = format!("{} rank {rank} of {size}", D::LIBRARY);
        Reaper::process().destroy(&what, destroy_timeout(), move || {
            let raw = raw;
            if let Err(e) = device.select() {
                tracing::warn!(error = %e, library = D::LIBRARY,
                    "ncclCommDestroy: could not make the device current");
            }
            // SAFETY: `raw.0` is live and destroyed exactly once, here (the
            // communicator's own field was nulled above).
            let code = unsafe { (lib.comm_destroy)(raw.0) };
            if code != ffi::ncclSuccess {
                tracing::error!(code, message = %lib.error_string(code), rank,
                    library = D::LIBRARY, "ncclCommDestroy failed");
            }
        });
    }
}

impl<D: CommDevice> Communicator<<D::Backend as Backend>::Stream> for Comm<D> {
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
        stream: &<D::Backend as Backend>::Stream,
    ) -> Result<()> {
        let (ty, op) = (data_type(ty), red_op(op));
        self.call("ncclAllReduce", stream, |lib, comm, s| {
            // SAFETY: device addresses of this device (caller); comm live
            // and locked; stream live and of our backend.
            unsafe { (lib.all_reduce)(ptr(src), ptr(dst), count, ty, op, comm, s) }
        })
    }

    fn all_gather(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        stream: &<D::Backend as Backend>::Stream,
    ) -> Result<()> {
        let ty = data_type(ty);
        self.call("ncclAllGather", stream, |lib, comm, s| {
            // SAFETY: as in `all_reduce`.
            unsafe { (lib.all_gather)(ptr(src), ptr(dst), count, ty, comm, s) }
        })
    }

    fn reduce_scatter(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        op: ReduceOp,
        stream: &<D::Backend as Backend>::Stream,
    ) -> Result<()> {
        let (ty, op) = (data_type(ty), red_op(op));
        self.call("ncclReduceScatter", stream, |lib, comm, s| {
            // SAFETY: as in `all_reduce`.
            unsafe { (lib.reduce_scatter)(ptr(src), ptr(dst), count, ty, op, comm, s) }
        })
    }

    fn broadcast(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        root: usize,
        stream: &<D::Backend as Backend>::Stream,
    ) -> Result<()> {
        let (ty, root) = (data_type(ty), self.check_peer("ncclBroadcast", root)?);
        self.call("ncclBroadcast", stream, |lib, comm, s| {
            // SAFETY: as in `all_reduce`.
            unsafe { (lib.broadcast)(ptr(src), ptr(dst), count, ty, root, comm, s) }
        })
    }

    fn send(
        &self,
        src: DevicePtr,
        count: usize,
        ty: CommType,
        peer: usize,
        stream: &<D::Backend as Backend>::Stream,
    ) -> Result<()> {
        let (ty, peer) = (data_type(ty), self.check_peer("ncclSend", peer)?);
        self.call("ncclSend", stream, |lib, comm, s| {
            // SAFETY: as in `all_reduce`.
            unsafe { (lib.send)(ptr(src), count, ty, peer, comm, s) }
        })
    }

    fn recv(
        &self,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        peer: usize,
        stream: &<D::Backend as Backend>::Stream,
    ) -> Result<()> {
        let (ty, peer) = (data_type(ty), self.check_peer("ncclRecv", peer)?);
        self.call("ncclRecv", stream, |lib, comm, s| {
            // SAFETY: as in `all_reduce`.
            unsafe { (lib.recv)(ptr(dst), count, ty, peer, comm, s) }
        })
    }

    fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments; per-thread library state.
        let code = unsafe { (self.lib.group_start)() };
        check(self.lib, "ncclGroupStart", code, std::ptr::null_mut())
    }

    fn group_end(&self) -> Result<()> {
        self.device.select()?;
        let guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: no arguments; the group's operations were issued by this
        // thread with our device current.
        let code = unsafe { (self.lib.group_end)() };
        check(self.lib, "ncclGroupEnd", code, guard.0)
    }
}
