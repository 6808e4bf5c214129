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
use std::sync::Once;

use nix::libc;

const SIGNALS: [c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
];

/// The actions in place before ours, restored when a signal arrives:
/// written once, each before our handler for its signal is installed, and
/// only read afterwards (by the handler).
static mut PREVIOUS: [Option<libc::sigaction>; 5] = [None; 5];

extern "C" {
    // glibc <execinfo.h>.
    fn backtrace(buffer: *mut *mut c_void, size: c_int) -> c_int;
    fn backtrace_symbols_fd(buffer: *const *mut c_void, size: c_int, fd: c_int);
}

/// Install the report when `wanted` (`XLA_VMM_CRASH_REPORT` set to
/// something other than `0`: `ProcessOptions::crash_report`), once per
/// process; later calls do nothing.
pub fn install_if(wanted: bool) {
    if wanted {
        static ONCE: Once = Once::new();
        ONCE.call_once(install);
    }
}

fn install() {
    // Load the unwinder now: its first call allocates.
    let mut warm = [std::ptr::null_mut::<c_void>(); 4];
    // SAFETY: `warm` holds 4 pointers, as the size says.
    unsafe { backtrace(warm.as_mut_ptr(), warm.len() as c_int) };
    for (i, &sig) in SIGNALS.iter().enumerate() {
        // SAFETY: all-zero is a valid sigaction (no handler, empty mask).
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reading the current action (a null new action changes
        // nothing) into a valid out struct.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            tracing::warn!("XLA_VMM_CRASH_REPORT: cannot read the action of signal {sig}");
            continue;
        }
        // SAFETY: the slot of `sig` is written before our handler for `sig`
        // exists (so before anything reads it), once (install runs once).
        unsafe { (*std::ptr::addr_of_mut!(PREVIOUS))[i] = Some(old) };
        // SAFETY: as above; `report` only calls async-signal-safe functions
        // (write, sigaction, raise) and glibc's backtrace, loaded above.
        let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = report;
        ours.sa_sigaction = handler as usize;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: installing a valid action for a valid signal.
        if unsafe { libc::sigaction(sig, &ours, std::ptr::null_mut()) } != 0 {
            tracing::warn!("XLA_VMM_CRASH_REPORT: cannot install the handler of signal {sig}");
        }
    }
    tracing::info!("XLA_VMM_CRASH_REPORT: native stacks are written to stderr on a fatal signal");
}

fn write_stderr(bytes: &[u8]) {
    // SAFETY: writing a valid buffer to fd 2 (async-signal-safe).
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
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

extern "C" fn report(sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
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
    write_stderr(digits(unsafe { libc::gettid() } as u64, 10, &mut buf));
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
    // SAFETY: PREVIOUS is only written before our handlers are installed.
    let previous = unsafe { &*std::ptr::addr_of!(PREVIOUS) };
    if let Some(Some(old)) = SIGNALS.iter().position(|&s| s == sig).map(|i| previous[i]) {
        // SAFETY: reinstalling the action that was there before ours.
        unsafe { libc::sigaction(sig, &old, std::ptr::null_mut()) };
    } else {
        // SAFETY: the default action for a signal we do not know the
        // previous action of (none: install read it before installing).
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    // SAFETY: raise is async-signal-safe; the signal is blocked until this
    // handler returns, then delivered to the restored handler.
    unsafe { libc::raise(sig) };
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
