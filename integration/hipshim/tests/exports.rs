//! The built shim (`libamdhip64.so`, the cdylib next to this test binary)
//! exports every entry point our HIP loaders resolve, the backend's own
//! loader finds it, and without libcuda every call is an error, not a
//! panic or an abort. No GPU needed (these run in CI).

use std::collections::BTreeSet;
use std::ffi::{c_int, CStr};
use std::path::PathBuf;

use amdhip64::{HIPRTC_ENTRY_POINTS, HIP_ALIASES, HIP_ENTRY_POINTS};

/// The cdylib cargo built with this package (target/<profile>/deps or its parent).
fn shim_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.join("libamdhip64.so"), deps.join("../libamdhip64.so")]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no libamdhip64.so next to {}", exe.display()))
}

fn repo_file(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The entry point names in `ffi/src/hip/runtime.rs`'s `hip_entry_points!` table.
fn ffi_hip_names() -> BTreeSet<String> {
    let text = repo_file("ffi/src/hip/runtime.rs");
    let start = text
        .find("hip_entry_points! {")
        .expect("the hip_entry_points! table");
    let body = &text[start..];
    let body = &body[..body.find("\n}").expect("the table's end")];
    body.lines()
        .skip(1)
        .filter_map(|l| {
            let l = l.trim();
            let (name, rest) = l.split_once(' ')?;
            rest.starts_with('[').then(|| name.to_string())
        })
        .collect()
}

/// The symbols `ffi/src/hiprtc.rs` resolves.
fn ffi_hiprtc_names() -> BTreeSet<String> {
    let text = repo_file("ffi/src/hiprtc.rs");
    text.split("symbol(&lib, \"")
        .skip(1)
        .filter_map(|s| s.split_once('"').map(|(n, _)| n.to_string()))
        .collect()
}

#[test]
fn the_shim_lists_exactly_what_our_loaders_resolve() {
    let ours: BTreeSet<String> = HIP_ENTRY_POINTS.iter().map(|s| s.to_string()).collect();
    assert_eq!(ours.len(), HIP_ENTRY_POINTS.len(), "duplicate names");
    assert_eq!(ours, ffi_hip_names(), "ffi/src/hip/runtime.rs changed");
    let rtc: BTreeSet<String> = HIPRTC_ENTRY_POINTS.iter().map(|s| s.to_string()).collect();
    assert_eq!(rtc, ffi_hiprtc_names(), "ffi/src/hiprtc.rs changed");
    // The alias the loader tries first.
    assert!(repo_file("ffi/src/hip/runtime.rs").contains("\"hipGetDevicePropertiesR0000\""));
}

#[test]
fn the_built_library_exports_them_and_our_loader_takes_it() {
    let path = shim_path();
    // SAFETY: our own library; its initialisers do nothing.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    for name in HIP_ENTRY_POINTS
        .iter()
        .chain(&HIP_ALIASES)
        .chain(&HIPRTC_ENTRY_POINTS)
    {
        // SAFETY: only the address is taken.
        let s = unsafe { lib.get::<*const ()>(name.as_bytes()) };
        assert!(s.is_ok(), "{} does not export {name}", path.display());
    }

    // The backend's loader prefers a mapped libamdhip64: this one, now
    // (nothing else in this test binary touches the ffi loader).
    let loaded = xla_vmm_ffi::hip::runtime::load().expect("the ffi loader opens the shim");
    assert_eq!(
        loaded.canonicalize().unwrap(),
        path.canonicalize().unwrap(),
        "the ffi loader took another HIP runtime"
    );
    use xla_vmm_ffi::hip::runtime as hip;
    let mut n: c_int = 7;
    // SAFETY: valid out pointer.
    let e = unsafe { hip::hipGetDeviceCount(&mut n) };
    if !cuda_present() {
        assert_eq!((e, n), (hip::hipError_t::hipErrorNoDevice, 0));
        // SAFETY: no arguments to trust.
        let e = unsafe { hip::hipInit(0) };
        assert_eq!(e, hip::hipError_t::hipErrorNotInitialized);
        // SAFETY: static strings.
        let (name, text) = unsafe { (hip::hipGetErrorName(e), hip::hipGetErrorString(e)) };
        assert!(!name.is_null() && !text.is_null());
        // SAFETY: non-null static NUL-terminated strings.
        let (name, text) = unsafe { (CStr::from_ptr(name), CStr::from_ptr(text)) };
        assert_eq!(name.to_str(), Ok("hipErrorNotInitialized"));
        assert!(
            text.to_str().unwrap().contains("no CUDA driver"),
            "{text:?}"
        );
    }

    // The hiprtc loader resolves its 8 symbols from the same library.
    let rtc = xla_vmm_ffi::hiprtc::Hiprtc::open(&path).expect("hiprtc entry points");
    if !nvrtc_present() {
        let e = rtc
            .compile(
                "k.hip",
                "extern \"C\" __attribute__((global)) void k() {}",
                &[],
            )
            .unwrap_err();
        assert!(e.contains("NVRTC"), "{e}");
    }
}

fn cuda_present() -> bool {
    ["libcuda.so", "libcuda.so.1"]
        .iter()
        // SAFETY: probing only.
        .any(|n| unsafe { libloading::Library::new(n) }.is_ok())
}

fn nvrtc_present() -> bool {
    amdhip64::rtc::nvrtc_candidates()
        .iter()
        // SAFETY: probing only.
        .any(|n| unsafe { libloading::Library::new(n) }.is_ok())
}

/// The same calls into the rlib (this process's copy of the shim), with
/// every kind of argument: errors without libcuda, never a panic.
#[test]
fn without_libcuda_every_call_is_an_error() {
    use amdhip64::runtime::*;
    use hip_runtime_sys::hipError_t as E;
    if cuda_present() {
        eprintln!("libcuda present: the no-driver answers are not checked here");
        return;
    }
    let mut n: c_int = 5;
    // SAFETY (all calls below): valid or null pointers, as each allows.
    unsafe {
        assert_eq!(hipGetDeviceCount(&mut n), E::hipErrorNoDevice);
        assert_eq!(n, 0);
        assert_eq!(
            hipGetDeviceCount(std::ptr::null_mut()),
            E::hipErrorInvalidValue
        );
        assert_eq!(hipInit(0), E::hipErrorNotInitialized);
        assert_eq!(hipSetDevice(0), E::hipErrorNotInitialized);
        let mut v: c_int = 0;
        assert_eq!(
            hipDeviceGetAttribute(&mut v, 0, 0),
            E::hipErrorNotInitialized
        );
        let mut s = std::ptr::null_mut();
        assert_eq!(
            hipStreamCreateWithFlags(&mut s, 1),
            E::hipErrorNotInitialized
        );
        assert_eq!(hipStreamSynchronize(s), E::hipErrorNotInitialized);
        let mut p = std::ptr::null_mut();
        assert_eq!(hipHostMalloc(&mut p, 64, 1), E::hipErrorNotInitialized);
        assert_eq!(hipMemGetInfo(&mut 0, &mut 0), E::hipErrorNotInitialized);
        assert_eq!(
            hipModuleLaunchKernel(
                std::ptr::null_mut(),
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            E::hipErrorNotInitialized
        );
        for code in [0u32, 1, 3, 100, 801, 999, 123_456] {
            assert!(!hipGetErrorString(code).is_null());
            assert!(!hipGetErrorName(code).is_null());
        }
        let s = CStr::from_ptr(amdhip64::rtc::hiprtcGetErrorString(11));
        assert!(s
            .to_str()
            .unwrap()
            .starts_with("HIPRTC_ERROR_INTERNAL_ERROR"));
    }
}

/// The hipBLASLt symbols `crates/device/src/hip/blaslt.rs` resolves, and its
/// `sys` constants (`pub const NAME: T = VALUE;`).
fn device_blaslt() -> (BTreeSet<String>, Vec<(String, i64)>) {
    let text = repo_file("crates/device/src/hip/blaslt.rs");
    let names = text
        .split("sym(&lib, \"")
        .skip(1)
        .filter_map(|s| s.split_once('"').map(|(n, _)| n.to_string()))
        .collect();
    let consts = text
        .lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("pub const ")?;
            let (name, rest) = l.split_once(':')?;
            let value = rest.split_once('=')?.1.trim().trim_end_matches(';');
            Some((name.to_string(), value.parse::<i64>().ok()?))
        })
        .collect();
    (names, consts)
}

#[test]
fn the_blaslt_shim_matches_our_hip_gemm_engine() {
    use amdhip64::blaslt::HIP_VALUES;
    use amdhip64::HIPBLASLT_ENTRY_POINTS;
    let (names, consts) = device_blaslt();
    let ours: BTreeSet<String> = HIPBLASLT_ENTRY_POINTS
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(ours.len(), HIPBLASLT_ENTRY_POINTS.len(), "duplicate names");
    assert_eq!(ours, names, "crates/device/src/hip/blaslt.rs changed");
    // Every number the shim translates is the engine's, name for name.
    for (name, value) in HIP_VALUES {
        let theirs: Vec<i64> = consts
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(theirs, vec![value], "{name}");
    }
    // The built library exports them.
    let path = shim_path();
    // SAFETY: our own library; its initialisers do nothing.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    for name in HIPBLASLT_ENTRY_POINTS {
        // SAFETY: only the address is taken.
        let s = unsafe { lib.get::<*const ()>(name.as_bytes()) };
        assert!(s.is_ok(), "{} does not export {name}", path.display());
    }
}

/// Without libcuda (CI), hipBLASLt calls are errors, never a panic.
#[test]
fn without_libcuda_blaslt_calls_are_errors() {
    use amdhip64::blaslt::*;
    if cuda_present() {
        eprintln!("libcuda present: the no-driver answers are not checked here");
        return;
    }
    let mut h = std::ptr::null_mut();
    // SAFETY: valid or null pointers, as each call allows.
    unsafe {
        assert_eq!(hipblasLtCreate(&mut h), HIPBLAS_STATUS_NOT_INITIALIZED);
        assert_eq!(
            hipblasLtCreate(std::ptr::null_mut()),
            HIPBLAS_STATUS_NOT_INITIALIZED
        );
        let mut d = std::ptr::null_mut();
        assert_eq!(
            hipblasLtMatmulDescCreate(&mut d, 2, 0),
            HIPBLAS_STATUS_NOT_INITIALIZED
        );
        let mut found: c_int = 3;
        assert_eq!(
            hipblasLtMatmulAlgoGetHeuristic(
                h,
                d,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                1_000_000,
                std::ptr::null_mut(),
                &mut found,
            ),
            HIPBLAS_STATUS_NOT_INITIALIZED
        );
        assert_eq!(found, 3, "nothing written");
    }
}
