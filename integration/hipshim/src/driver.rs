//! The CUDA driver side: whether libcuda is there, the per-thread current
//! device, the retained primary contexts, and the wrapper every export
//! runs its body in ([`entry`]: no panic crosses into C).

use std::cell::Cell;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys as cu;
use hip_runtime_sys::hipError_t;

use crate::errors;

/// A HIP result: `Err` carries the code the export returns.
pub(crate) type HipResult<T> = Result<T, hipError_t>;

/// `Ok(())` for `CUDA_SUCCESS`, else its HIP twin.
pub(crate) fn check(r: cu::CUresult) -> HipResult<()> {
    match errors::from_cuda(r) {
        hipError_t::hipSuccess => Ok(()),
        e => Err(e),
    }
}

/// Is libcuda loadable? Asked once; cudarc panics on every call otherwise.
pub(crate) fn cuda_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: only tries to load the library (its initialisers are
        // meant to run in any process).
        catch_unwind(|| unsafe { cu::is_culib_present() }).unwrap_or(false)
    })
}

/// Run an export's body: `hipErrorNotInitialized` without libcuda, the
/// body's error, or `hipErrorUnknown` for a panic (e.g. cudarc finding a
/// symbol missing from an old driver), never an unwind into C.
pub(crate) fn entry(body: impl FnOnce() -> HipResult<()>) -> hipError_t {
    let run = AssertUnwindSafe(|| {
        if !cuda_present() {
            return Err(hipError_t::hipErrorNotInitialized);
        }
        body()
    });
    match catch_unwind(run) {
        Ok(Ok(())) => hipError_t::hipSuccess,
        Ok(Err(e)) => e,
        Err(_) => hipError_t::hipErrorUnknown,
    }
}

/// `cuInit(0)` once it has succeeded (a failure is retried on next call).
pub(crate) fn init() -> HipResult<()> {
    static DONE: OnceLock<()> = OnceLock::new();
    if DONE.get().is_some() {
        return Ok(());
    }
    // SAFETY: cuInit has no preconditions.
    check(unsafe { cu::cuInit(0) })?;
    let _ = DONE.set(());
    Ok(())
}

/// The number of CUDA devices (after [`init`]).
pub(crate) fn device_count() -> HipResult<c_int> {
    init()?;
    let mut n: c_int = 0;
    // SAFETY: valid out pointer.
    check(unsafe { cu::cuDeviceGetCount(&mut n) })?;
    Ok(n)
}

/// The CUDA device of HIP ordinal `ordinal` (validated).
pub(crate) fn device(ordinal: c_int) -> HipResult<cu::CUdevice> {
    if ordinal < 0 || ordinal >= device_count()? {
        return Err(hipError_t::hipErrorInvalidDevice);
    }
    let mut d: cu::CUdevice = 0;
    // SAFETY: valid out pointer; the ordinal is in range.
    check(unsafe { cu::cuDeviceGet(&mut d, ordinal) })?;
    Ok(d)
}

thread_local! {
    /// HIP's per-thread current device.
    static CURRENT: Cell<c_int> = const { Cell::new(0) };
}

/// This thread's current HIP device.
pub(crate) fn current() -> c_int {
    CURRENT.with(Cell::get)
}

/// A retained primary context (a pointer the driver owns; it is used from
/// any thread, as the CUDA API allows).
#[derive(Clone, Copy)]
struct Ctx(cu::CUcontext);
// SAFETY: a CUcontext is a handle the driver lets any thread make current.
unsafe impl Send for Ctx {}

/// The primary context of `ordinal`, retained on first use and kept for the
/// life of the process (HIP has no primary-context release in our API).
pub(crate) fn primary_context(ordinal: c_int) -> HipResult<cu::CUcontext> {
    static CONTEXTS: Mutex<Vec<(c_int, Ctx)>> = Mutex::new(Vec::new());
    let dev = device(ordinal)?;
    let mut list = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, c)) = list.iter().find(|(o, _)| *o == ordinal) {
        return Ok(c.0);
    }
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out pointer and device.
    check(unsafe { cu::cuDevicePrimaryCtxRetain(&mut ctx, dev) })?;
    list.push((ordinal, Ctx(ctx)));
    Ok(ctx)
}

/// Make `ordinal` this thread's current device (validated), with its
/// primary context current.
pub(crate) fn set_current(ordinal: c_int) -> HipResult<()> {
    let ctx = primary_context(ordinal)?;
    // SAFETY: a retained (live) primary context.
    check(unsafe { cu::cuCtxSetCurrent(ctx) })?;
    CURRENT.with(|c| c.set(ordinal));
    Ok(())
}

/// An export that is one driver call: [`entry`], the current device's
/// context made current, then `call`'s result translated.
pub(crate) fn forward(call: impl FnOnce() -> cu::CUresult) -> hipError_t {
    entry(|| {
        bind()?;
        check(call())
    })
}

/// Make this thread's current device's primary context current: the
/// prologue of every call that needs a context.
pub(crate) fn bind() -> HipResult<()> {
    set_current(current())
}

/// `*p = v`, `hipErrorInvalidValue` for a null `p`.
///
/// # Safety
/// `p` is null or valid for a write of `T`.
pub(crate) unsafe fn put<T>(p: *mut T, v: T) -> HipResult<()> {
    if p.is_null() {
        return Err(hipError_t::hipErrorInvalidValue);
    }
    // SAFETY: non-null, and valid for a write by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// A driver call that writes a 4-byte C enum through `out`, its value read
/// back as an integer (the driver may write a value newer than the bindings'
/// enum: reading it as the Rust enum would be undefined behaviour).
pub(crate) fn enum_out<T>(call: impl FnOnce(*mut T) -> cu::CUresult) -> HipResult<u32> {
    const { assert!(std::mem::size_of::<T>() == 4) };
    let mut raw: u32 = u32::MAX;
    check(call((&mut raw as *mut u32).cast::<T>()))?;
    Ok(raw)
}

/// Read a `#[repr(u32)]` enum field of a caller's struct as its integer, so
/// that a value the Rust enum does not list is an error, not undefined
/// behaviour.
///
/// # Safety
/// `p` is valid for a read of 4 bytes.
pub(crate) unsafe fn raw_u32<T>(p: *const T) -> u32 {
    const { assert!(std::mem::size_of::<T>() == 4) };
    // SAFETY: the caller's contract; every bit pattern is a valid u32.
    unsafe { p.cast::<u32>().read_unaligned() }
}
