//! Opt-in native crash report (`XLA_VMM_CRASH_REPORT=1`): on SIGSEGV, SIGBUS,
//! SIGILL, SIGFPE or SIGABRT the dying thread's native stack is written to
//! stderr (each frame as `module(symbol+offset)[address]`, glibc's
//! `backtrace_symbols_fd`), then the handler that was there before (Python's
//! faulthandler, absl's) runs as if ours had not been. For machines without
//! a debugger: a frame in a stripped module reads `module(+offset)`, which
//! `addr2line -f -e <unstripped module> offset` names.
//!
//! The handler allocates nothing and takes no lock, except glibc's
//! `backtrace`, whose first call loads libgcc's unwinder: that call is made
//! when the handler is installed, not in the signal.
//!
//! Unsafe: signal actions and glibc's unwinder are OS calls, kept here at
//! the process boundary like the C ABI layer's.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};

const SIGNALS: [Signal; 5] = [
    Signal::SIGSEGV,
    Signal::SIGBUS,
    Signal::SIGILL,
    Signal::SIGFPE,
    Signal::SIGABRT,
];

/// The actions in place before ours, restored when a signal arrives.
static PREVIOUS: Mutex<Vec<(Signal, SigAction)>> = Mutex::new(Vec::new());
/// The same, readable from the handler without a lock (written once, before
/// any handler of ours is installed).
static mut PREVIOUS_RAW: [Option<(Signal, SigAction)>; 5] = [None; 5];

extern "C" {
    // glibc <execinfo.h>.
    fn backtrace(buffer: *mut *mut c_void, size: c_int) -> c_int;
    fn backtrace_symbols_fd(buffer: *const *mut c_void, size: c_int, fd: c_int);
}

/// Install the report when `XLA_VMM_CRASH_REPORT` is set to something other
/// than `0` (once per process; later calls do nothing).
pub fn install_from_env() {
    match std::env::var("XLA_VMM_CRASH_REPORT") {
        Ok(v) if !v.is_empty() && v != "0" => install(),
        _ => {}
    }
}

fn install() {
    let mut previous = PREVIOUS.lock().unwrap_or_else(|p| p.into_inner());
    if !previous.is_empty() {
        return;
    }
    // Load the unwinder now: its first call allocates.
    let mut warm = [std::ptr::null_mut::<c_void>(); 4];
    // SAFETY: `warm` holds 4 pointers, as the size says.
    unsafe { backtrace(warm.as_mut_ptr(), warm.len() as c_int) };
    let ours = SigAction::new(
        SigHandler::SigAction(report),
        SaFlags::SA_SIGINFO | SaFlags::SA_ONSTACK,
        SigSet::empty(),
    );
    // Read every previous action before installing any of ours, so that the
    // handler finds them all.
    for (i, &sig) in SIGNALS.iter().enumerate() {
        // SAFETY: reading the current action (installed back at once).
        let old = match unsafe { signal::sigaction(sig, &ours) } {
            Ok(old) => old,
            Err(e) => {
                tracing::warn!("XLA_VMM_CRASH_REPORT: no handler for {sig}: {e}");
                continue;
            }
        };
        // SAFETY: put back what was there until every slot is written.
        let _ = unsafe { signal::sigaction(sig, &old) };
        // SAFETY: written before any handler of ours exists (none reads it yet).
        unsafe { PREVIOUS_RAW[i] = Some((sig, old)) };
        previous.push((sig, old));
    }
    for &(sig, _) in previous.iter() {
        // SAFETY: `report` only calls async-signal-safe functions (write,
        // sigaction, raise) and glibc's backtrace, already loaded above.
        if let Err(e) = unsafe { signal::sigaction(sig, &ours) } {
            tracing::warn!("XLA_VMM_CRASH_REPORT: no handler for {sig}: {e}");
        }
    }
    tracing::info!("XLA_VMM_CRASH_REPORT: native stacks are written to stderr on a fatal signal");
}

fn write_stderr(bytes: &[u8]) {
    // SAFETY: writing a valid buffer to fd 2 (async-signal-safe).
    unsafe { nix::libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

/// Decimal or hex digits of `v` into `buf`, returning the filled tail.
fn digits(mut v: u64, radix: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(v % radix) as usize];
        v /= radix;
        if v == 0 || i == 0 {
            break;
        }
    }
    &buf[i..]
}

extern "C" fn report(sig: c_int, info: *mut nix::libc::siginfo_t, _ctx: *mut c_void) {
    let mut buf = [0u8; 20];
    write_stderr(b"\n*** xla-vmm crash report: signal ");
    write_stderr(digits(sig as u64, 10, &mut buf));
    if !info.is_null() {
        // SAFETY: the kernel's siginfo for this signal.
        let addr = unsafe { (*info).si_addr() } as u64;
        write_stderr(b" at address 0x");
        write_stderr(digits(addr, 16, &mut buf));
    }
    write_stderr(b", thread ");
    // SAFETY: gettid has no preconditions.
    write_stderr(digits(unsafe { nix::libc::gettid() } as u64, 10, &mut buf));
    write_stderr(b" ***\n");
    let mut frames = [std::ptr::null_mut::<c_void>(); 64];
    // SAFETY: `frames` holds 64 pointers, as the size says; the unwinder was
    // loaded at install time.
    let n = unsafe { backtrace(frames.as_mut_ptr(), frames.len() as c_int) };
    // SAFETY: the first `n` entries were just written; fd 2 is stderr.
    unsafe { backtrace_symbols_fd(frames.as_ptr(), n, 2) };
    write_stderr(b"*** end of xla-vmm crash report ***\n");
    // The previous handler takes over: restored, then the signal again (a
    // synchronous fault also recurs when this returns).
    // SAFETY: PREVIOUS_RAW was written before this handler was installed.
    let previous = unsafe { &*std::ptr::addr_of!(PREVIOUS_RAW) };
    for (s, old) in previous.iter().flatten() {
        if *s as c_int == sig {
            // SAFETY: reinstalling the action that was there before ours.
            let _ = unsafe { signal::sigaction(*s, old) };
        }
    }
    // SAFETY: raise is async-signal-safe; the signal is blocked until this
    // handler returns, then delivered to the restored handler.
    unsafe { nix::libc::raise(sig) };
}

#[cfg(test)]
mod tests {
    use super::digits;

    #[test]
    fn digits_in_both_radixes() {
        let mut b = [0u8; 20];
        assert_eq!(digits(0, 10, &mut b), b"0");
        assert_eq!(digits(1234, 10, &mut b), b"1234");
        assert_eq!(digits(0xdead_beef, 16, &mut b), b"deadbeef");
        assert_eq!(digits(u64::MAX, 10, &mut b), b"18446744073709551615");
    }
}
