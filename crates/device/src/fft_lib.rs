//! FFTs through a vendor library loaded at run time: cuFFT on CUDA
//! (`cuda::cufft`), hipFFT on ROCm (`hip::hipfft`), driven as XLA's FFT
//! thunk drives them (`RunFft`, stream_executor's `CUDAFftPlan`):
//!
//! - a plan per distinct [`FftSpec`] (XLA keeps one per thunk; equal specs
//!   give the same plan): create, automatic work-area allocation off,
//!   `MakePlanMany64` with the spec's lengths, embeds, unit strides and
//!   distances, which reports the work area it needs; each `prepare` counts
//!   one more user, each [`FftLib::release`] one less, and the plan is
//!   destroyed with its last user (a plan holds device memory of its own);
//! - per run, under the plan's lock (a plan is not safe to use from two
//!   threads at once): the stream, the work area (the caller's memory),
//!   `Exec{C2C,R2C,C2R,Z2Z,D2Z,Z2D}` out of place, complex transforms with
//!   their direction; the scaling of an inverse transform follows on the
//!   BLAS (`trsm_lib::Solver::scal`).
//!
//! Both libraries have that C shape; a handle is an `int` in cuFFT and a
//! pointer in hipFFT (the `H` parameter). The caller keeps the input of a
//! complex-to-real transform intact (XLA copies it first: cuFFT may write
//! its input).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::error::{DeviceError, Result};
use crate::fft::{FftArgs, FftKind, FftPlanId, FftSpec};
use crate::trsm_lib::{library_status, symbol, Solver};

/// How one FFT library spells its API.
pub(crate) struct FftAbi {
    /// The library's name in errors and logs ("cuFFT").
    pub label: &'static str,
    pub create: &'static str,
    pub destroy: &'static str,
    pub set_auto_allocation: &'static str,
    pub make_plan_many64: &'static str,
    pub set_work_area: &'static str,
    pub set_stream: &'static str,
    /// Exec entry points: C2C, R2C, C2R, Z2Z, D2Z, Z2D.
    pub exec: [&'static str; 6],
    /// The library's transform type numbers, in the same order.
    pub types: [c_int; 6],
    /// Forward, inverse.
    pub directions: [c_int; 2],
}

type Status = c_int;

/// `MakePlanMany64(plan, rank, n, inembed, istride, idist, onembed,
/// ostride, odist, type, batch, &work_size)`.
type MakePlanFn<H> = unsafe extern "C" fn(
    H,
    c_int,
    *mut i64,
    *mut i64,
    i64,
    i64,
    *mut i64,
    i64,
    i64,
    c_int,
    i64,
    *mut usize,
) -> Status;
/// `ExecC2C` / `ExecZ2Z`: input, output, direction.
type ExecComplexFn<H> = unsafe extern "C" fn(H, *mut c_void, *mut c_void, c_int) -> Status;
/// `ExecR2C`, `ExecC2R`, `ExecD2Z`, `ExecZ2D`: input, output.
type ExecRealFn<H> = unsafe extern "C" fn(H, *mut c_void, *mut c_void) -> Status;

struct Api<H> {
    create: unsafe extern "C" fn(*mut H) -> Status,
    destroy: unsafe extern "C" fn(H) -> Status,
    set_auto_allocation: unsafe extern "C" fn(H, c_int) -> Status,
    make_plan_many64: MakePlanFn<H>,
    set_work_area: unsafe extern "C" fn(H, *mut c_void) -> Status,
    set_stream: unsafe extern "C" fn(H, *mut c_void) -> Status,
    /// C2C, Z2Z.
    exec_complex: [ExecComplexFn<H>; 2],
    /// R2C, C2R, D2Z, Z2D.
    exec_real: [ExecRealFn<H>; 4],
    /// Keeps the library mapped for the life of the process (`None`: the
    /// unit tests' stand-in functions).
    _lib: Option<libloading::Library>,
}

impl<H: Copy> Api<H> {
    fn open(abi: &FftAbi, path: &std::path::Path) -> std::result::Result<Self, String> {
        // SAFETY: loading the library runs its initializers, which have no
        // preconditions beyond a sane process environment.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let l = abi.label;
        let e = &abi.exec;
        // SAFETY: each type is the header's signature of its name, with the
        // library's handle type as `H`; the functions live in `Api` beside
        // the library.
        let api = unsafe {
            (|| -> Result<Self> {
                Ok(Api {
                    create: symbol(&lib, l, abi.create)?,
                    destroy: symbol(&lib, l, abi.destroy)?,
                    set_auto_allocation: symbol(&lib, l, abi.set_auto_allocation)?,
                    make_plan_many64: symbol(&lib, l, abi.make_plan_many64)?,
                    set_work_area: symbol(&lib, l, abi.set_work_area)?,
                    set_stream: symbol(&lib, l, abi.set_stream)?,
                    exec_complex: [symbol(&lib, l, e[0])?, symbol(&lib, l, e[3])?],
                    exec_real: [
                        symbol(&lib, l, e[1])?,
                        symbol(&lib, l, e[2])?,
                        symbol(&lib, l, e[4])?,
                        symbol(&lib, l, e[5])?,
                    ],
                    _lib: Some(lib),
                })
            })()
        };
        api.map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// A plan and the addresses it ran on, for an error that names them.
fn describe(spec: &FftSpec, workspace: u64, args: &FftArgs) -> String {
    let area = match workspace {
        0 => "no work area".to_string(),
        n => format!("work area {n} bytes at {:#x}", args.workspace.0),
    };
    format!(
        "{:?}{} transform of lengths {:?}, batch {}: input embed {:?} (distance {}) at {:#x}, \
         output embed {:?} (distance {}) at {:#x}, {area}",
        spec.kind,
        if spec.double { " (double)" } else { "" },
        spec.n,
        spec.batch,
        spec.inembed,
        spec.idist,
        args.input.0,
        spec.onembed,
        spec.odist,
        args.output.0,
    )
}

/// One plan: its spec, its handle (locked while used) and the work area it
/// asked for; destroyed when the last reference goes (its last user
/// released it and no enqueue holds it).
struct Plan<H: Copy> {
    spec: FftSpec,
    handle: Mutex<H>,
    workspace: u64,
    destroy: unsafe extern "C" fn(H) -> Status,
    label: &'static str,
}

impl<H: Copy> Drop for Plan<H> {
    fn drop(&mut self) {
        let handle = *self.handle.get_mut().unwrap_or_else(|p| p.into_inner());
        // SAFETY: made by `prepare`; this is its last reference, so nothing
        // uses it; the device is current (every `FftLib` method and its drop
        // run with it current, and a plan goes in one of them).
        let s = unsafe { (self.destroy)(handle) };
        if s != 0 {
            tracing::warn!(status = s, "{} plan destroy failed", self.label);
        }
    }
}

/// A plan in the table and how many loaded programs use it.
struct Entry<H: Copy> {
    plan: Arc<Plan<H>>,
    users: usize,
}

/// The plans by id (ids never reused: a stale one is an error).
struct Plans<H: Copy> {
    by_id: HashMap<usize, Entry<H>>,
    next: usize,
}

/// One device's FFT library and its plans. The device must be current on
/// the calling thread for every method and for drop.
pub(crate) struct FftLib<H: Copy> {
    /// First field: dropped (its plans destroyed) before the library goes.
    plans: Mutex<Plans<H>>,
    abi: &'static FftAbi,
    api: Api<H>,
}

// SAFETY: a handle is used only under its plan's mutex (stream, work area,
// exec), and destroyed by its plan's `Drop` with exclusive access; cuFFT and
// hipFFT plans may move between threads.
unsafe impl<H: Copy> Send for FftLib<H> {}
// SAFETY: see above.
unsafe impl<H: Copy> Sync for FftLib<H> {}

impl<H: Copy> FftLib<H> {
    /// Open the first of `candidates` that has every entry point.
    pub fn new(abi: &'static FftAbi, candidates: Vec<PathBuf>) -> Result<Self> {
        let mut tried = Vec::new();
        for path in candidates {
            match Api::open(abi, &path) {
                Ok(api) => {
                    tracing::info!(library = %path.display(), "{} loaded for FFTs", abi.label);
                    return Ok(Self::with_api(abi, api));
                }
                Err(e) => tried.push(e),
            }
        }
        Err(DeviceError::NotAvailable(format!(
            "{} not found (tried {})",
            abi.label,
            tried.join("; ")
        )))
    }

    fn with_api(abi: &'static FftAbi, api: Api<H>) -> Self {
        FftLib {
            plans: Mutex::new(Plans {
                by_id: HashMap::new(),
                next: 0,
            }),
            abi,
            api,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Plans<H>> {
        self.plans.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check(&self, call: &'static str, s: Status) -> Result<()> {
        library_status(self.abi.label, call, s)
    }

    /// Index of `spec`'s transform in the ABI's exec and type tables.
    fn type_index(spec: &FftSpec) -> usize {
        let i = match spec.kind {
            FftKind::Forward | FftKind::Inverse => 0,
            FftKind::RealToComplex => 1,
            FftKind::ComplexToReal => 2,
        };
        i + if spec.double { 3 } else { 0 }
    }

    /// The plan for `spec`, made the first time; one more user of it until
    /// [`FftLib::release`].
    pub fn prepare(&self, spec: &FftSpec) -> Result<FftPlanId> {
        let rank = spec.n.len();
        if !(1..=3).contains(&rank) || spec.inembed.len() != rank || spec.onembed.len() != rank {
            return Err(DeviceError::InvalidArgument(format!(
                "FFT of rank {rank} (embeds {:?}, {:?}): 1 to 3 dimensions",
                spec.inembed, spec.onembed
            )));
        }
        let mut plans = self.lock();
        if let Some((&id, e)) = plans.by_id.iter_mut().find(|(_, e)| e.plan.spec == *spec) {
            e.users += 1;
            return Ok(FftPlanId(id));
        }
        let mut h = MaybeUninit::<H>::uninit();
        // SAFETY: `h` is a valid out pointer; the device is current.
        self.check("create", unsafe { (self.api.create)(h.as_mut_ptr()) })?;
        // SAFETY: written by the successful create.
        let handle = unsafe { h.assume_init() };
        let (mut n, mut inembed, mut onembed) =
            (spec.n.clone(), spec.inembed.clone(), spec.onembed.clone());
        let mut work = 0usize;
        // SAFETY: the handle was just created; the arrays hold `rank`
        // elements each and outlive the call; `work` is a valid out pointer.
        let made = unsafe {
            self.check(
                "set auto allocation",
                (self.api.set_auto_allocation)(handle, 0),
            )
            .and_then(|()| {
                let status = (self.api.make_plan_many64)(
                    handle,
                    rank as c_int,
                    n.as_mut_ptr(),
                    inembed.as_mut_ptr(),
                    1,
                    spec.idist,
                    onembed.as_mut_ptr(),
                    1,
                    spec.odist,
                    self.abi.types[Self::type_index(spec)],
                    spec.batch,
                    &mut work,
                );
                self.check("make plan", status)
            })
        };
        if let Err(e) = made {
            // SAFETY: created above, used by nobody else.
            unsafe { (self.api.destroy)(handle) };
            return Err(e);
        }
        let plan = Arc::new(Plan {
            spec: spec.clone(),
            handle: Mutex::new(handle),
            workspace: work as u64,
            destroy: self.api.destroy,
            label: self.abi.label,
        });
        let id = plans.next;
        plans.next += 1;
        plans.by_id.insert(id, Entry { plan, users: 1 });
        Ok(FftPlanId(id))
    }

    /// One user of plan `id` is gone (its program dropped or failed to
    /// load): with the last, the plan is destroyed. The caller's runs of it
    /// have completed. An unknown id is ignored.
    pub fn release(&self, id: FftPlanId) {
        let gone = {
            let mut plans = self.lock();
            let Some(e) = plans.by_id.get_mut(&id.0) else {
                return;
            };
            e.users -= 1;
            if e.users > 0 {
                return;
            }
            plans.by_id.remove(&id.0)
        };
        // Destroyed here, outside the table's lock.
        drop(gone);
    }

    /// Plans kept (those of loaded programs).
    pub fn live(&self) -> usize {
        self.lock().by_id.len()
    }

    fn plan(&self, id: FftPlanId) -> Result<Arc<Plan<H>>> {
        self.lock()
            .by_id
            .get(&id.0)
            .map(|e| e.plan.clone())
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no FFT plan {}", id.0)))
    }

    /// The work area plan `id` needs.
    pub fn workspace(&self, id: FftPlanId) -> Result<u64> {
        Ok(self.plan(id)?.workspace)
    }

    /// Enqueue plan `id` on `stream`, then, for an inverse transform, its
    /// scaling on `blas`.
    ///
    /// # Safety
    /// `stream` is a live stream of the current device; the arguments
    /// address the spec's input and output and a work area of
    /// [`FftLib::workspace`] bytes, valid until the transform ran.
    pub unsafe fn run(
        &self,
        id: FftPlanId,
        args: &FftArgs,
        stream: *mut c_void,
        blas: Option<&Solver>,
    ) -> Result<()> {
        let plan = self.plan(id)?;
        let spec = &plan.spec;
        let (input, output) = (args.input.0 as *mut c_void, args.output.0 as *mut c_void);
        {
            // Held until the transform is enqueued: stream, work area and
            // exec are one use of the plan.
            let guard = plan.handle.lock().unwrap_or_else(|p| p.into_inner());
            let handle = *guard;
            self.check("set stream", (self.api.set_stream)(handle, stream))?;
            // No work area where the plan asked for none, as XLA's plans
            // get (a pointer there would be the input's copy, which follows).
            let area = if plan.workspace == 0 {
                std::ptr::null_mut()
            } else {
                args.workspace.0 as *mut c_void
            };
            self.check("set work area", (self.api.set_work_area)(handle, area))?;
            let status = match (spec.kind, spec.double) {
                (FftKind::Forward | FftKind::Inverse, d) => {
                    let dir = self.abi.directions[usize::from(spec.kind == FftKind::Inverse)];
                    (self.api.exec_complex[usize::from(d)])(handle, input, output, dir)
                }
                (FftKind::RealToComplex, false) => (self.api.exec_real[0])(handle, input, output),
                (FftKind::ComplexToReal, false) => (self.api.exec_real[1])(handle, input, output),
                (FftKind::RealToComplex, true) => (self.api.exec_real[2])(handle, input, output),
                (FftKind::ComplexToReal, true) => (self.api.exec_real[3])(handle, input, output),
            };
            self.check("exec", status)
                .map_err(|e| e.with_message(|| describe(spec, plan.workspace, args)))?;
        }
        let Some(alpha) = spec.scale_alpha() else {
            return Ok(());
        };
        let blas = blas.ok_or_else(|| {
            DeviceError::NotAvailable(format!(
                "the BLAS that scales an inverse {} transform",
                self.abi.label
            ))
        })?;
        blas.scal(
            spec.dtypes().1,
            spec.output_elements(),
            &alpha,
            args.output,
            stream,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static ABI: FftAbi = FftAbi {
        label: "testFFT",
        create: "c",
        destroy: "d",
        set_auto_allocation: "a",
        make_plan_many64: "m",
        set_work_area: "w",
        set_stream: "s",
        exec: ["e"; 6],
        types: [0; 6],
        directions: [-1, 1],
    };

    #[test]
    fn a_missing_library_is_an_error_naming_it() {
        let e = FftLib::<c_int>::new(&ABI, vec![PathBuf::from("/nonexistent/libtestfft.so")])
            .err()
            .expect("no library")
            .to_string();
        assert!(
            e.contains("testFFT not found") && e.contains("libtestfft"),
            "{e}"
        );
    }

    #[test]
    fn transforms_pick_their_entry_point() {
        let spec = |kind, double| FftSpec {
            kind,
            double,
            n: vec![4],
            inembed: vec![4],
            idist: 4,
            onembed: vec![4],
            odist: 4,
            batch: 1,
        };
        let idx = |k, d| FftLib::<c_int>::type_index(&spec(k, d));
        assert_eq!(idx(FftKind::Forward, false), 0);
        assert_eq!(idx(FftKind::Inverse, false), 0);
        assert_eq!(idx(FftKind::RealToComplex, false), 1);
        assert_eq!(idx(FftKind::ComplexToReal, false), 2);
        assert_eq!(idx(FftKind::Inverse, true), 3);
        assert_eq!(idx(FftKind::RealToComplex, true), 4);
        assert_eq!(idx(FftKind::ComplexToReal, true), 5);
    }

    mod stand_in {
        //! The library's entry points as counters: plans made and destroyed.
        use super::*;
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

        pub static MADE: AtomicUsize = AtomicUsize::new(0);
        pub static DESTROYED: AtomicUsize = AtomicUsize::new(0);

        pub unsafe extern "C" fn create(h: *mut c_int) -> Status {
            *h = MADE.fetch_add(1, SeqCst) as c_int;
            0
        }
        pub unsafe extern "C" fn destroy(_: c_int) -> Status {
            DESTROYED.fetch_add(1, SeqCst);
            0
        }
        pub unsafe extern "C" fn set_int(_: c_int, _: c_int) -> Status {
            0
        }
        /// Fails for a batch of 13; asks for no work area for a batch of 7,
        /// 64 bytes for the others.
        pub unsafe extern "C" fn make(
            _: c_int,
            _: c_int,
            _: *mut i64,
            _: *mut i64,
            _: i64,
            _: i64,
            _: *mut i64,
            _: i64,
            _: i64,
            _: c_int,
            batch: i64,
            work: *mut usize,
        ) -> Status {
            *work = if batch == 7 { 0 } else { 64 };
            if batch == 13 {
                5
            } else {
                0
            }
        }
        pub unsafe extern "C" fn set_ptr(_: c_int, _: *mut c_void) -> Status {
            0
        }
        pub unsafe extern "C" fn exec_c(
            _: c_int,
            _: *mut c_void,
            _: *mut c_void,
            _: c_int,
        ) -> Status {
            0
        }
        pub unsafe extern "C" fn exec_r(_: c_int, _: *mut c_void, _: *mut c_void) -> Status {
            0
        }

        /// The entry points above (another stand-in replaces some).
        pub fn api() -> Api<c_int> {
            Api {
                create,
                destroy,
                set_auto_allocation: set_int,
                make_plan_many64: make,
                set_work_area: set_ptr,
                set_stream: set_ptr,
                exec_complex: [exec_c; 2],
                exec_real: [exec_r; 4],
                _lib: None,
            }
        }

        pub fn lib() -> FftLib<c_int> {
            FftLib::with_api(&ABI, api())
        }
    }

    #[test]
    fn a_plan_is_shared_by_equal_specs_and_destroyed_with_its_last_user() {
        use stand_in::{DESTROYED, MADE};
        use std::sync::atomic::Ordering::SeqCst;
        let spec = |batch| FftSpec {
            kind: FftKind::Forward,
            double: false,
            n: vec![8],
            inembed: vec![8],
            idist: 8,
            onembed: vec![8],
            odist: 8,
            batch,
        };
        let lib = stand_in::lib();
        let a = lib.prepare(&spec(2)).unwrap();
        assert_eq!(
            lib.prepare(&spec(2)).unwrap(),
            a,
            "equal specs share a plan"
        );
        let b = lib.prepare(&spec(3)).unwrap();
        assert_ne!(a, b);
        assert_eq!((MADE.load(SeqCst), lib.live()), (2, 2));
        assert_eq!(lib.workspace(a).unwrap(), 64);

        lib.release(a);
        assert_eq!(
            (DESTROYED.load(SeqCst), lib.live()),
            (0, 2),
            "one user left"
        );
        lib.release(a);
        assert_eq!(
            (DESTROYED.load(SeqCst), lib.live()),
            (1, 1),
            "its last user gone"
        );
        assert!(lib.workspace(a).is_err(), "a released plan's id is stale");
        lib.release(a); // ignored
        assert_eq!(DESTROYED.load(SeqCst), 1);

        let again = lib.prepare(&spec(2)).unwrap();
        assert!(again != a && again != b, "ids are not reused");
        // A plan the library refuses is destroyed at once and not kept.
        assert!(lib.prepare(&spec(13)).is_err());
        assert_eq!(
            (MADE.load(SeqCst), DESTROYED.load(SeqCst), lib.live()),
            (4, 2, 2)
        );

        drop(lib);
        assert_eq!(
            DESTROYED.load(SeqCst),
            4,
            "the library's drop destroys what is left"
        );
    }

    mod runs {
        //! [`super::stand_in`]'s entry points, with a work area setter that
        //! records what a run set and an exec that fails (status 6,
        //! cuFFT's EXEC_FAILED) on input 0xdead.
        use super::*;
        use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

        pub static AREA: AtomicU64 = AtomicU64::new(u64::MAX);

        pub unsafe extern "C" fn create(h: *mut c_int) -> Status {
            *h = 1;
            0
        }
        pub unsafe extern "C" fn ok(_: c_int) -> Status {
            0
        }
        pub unsafe extern "C" fn set_area(_: c_int, p: *mut c_void) -> Status {
            AREA.store(p as u64, SeqCst);
            0
        }
        pub unsafe extern "C" fn exec_r(_: c_int, i: *mut c_void, _: *mut c_void) -> Status {
            if i as u64 == 0xdead {
                6
            } else {
                0
            }
        }

        pub fn lib() -> FftLib<c_int> {
            FftLib::with_api(
                &ABI,
                Api {
                    create,
                    destroy: ok,
                    set_work_area: set_area,
                    exec_real: [exec_r; 4],
                    ..super::stand_in::api()
                },
            )
        }
    }

    #[test]
    fn a_plan_without_work_area_gets_none_and_a_failed_exec_names_its_plan() {
        use crate::DevicePtr;
        use runs::AREA;
        use std::sync::atomic::Ordering::SeqCst;
        let spec = |kind, batch| FftSpec {
            kind,
            double: false,
            n: vec![2, 2],
            inembed: vec![2, 2],
            idist: 4,
            onembed: vec![2, 2],
            odist: 4,
            batch,
        };
        let lib = runs::lib();
        let args = |input| FftArgs {
            input: DevicePtr(input),
            output: DevicePtr(0x2000),
            workspace: DevicePtr(0x1000),
        };
        let run = |id, input| unsafe { lib.run(id, &args(input), std::ptr::null_mut(), None) };
        let with_area = lib.prepare(&spec(FftKind::RealToComplex, 2)).unwrap();
        run(with_area, 0x3000).unwrap();
        assert_eq!(AREA.load(SeqCst), 0x1000);
        let without = lib.prepare(&spec(FftKind::RealToComplex, 7)).unwrap();
        run(without, 0x3000).unwrap();
        assert_eq!(AREA.load(SeqCst), 0, "no work area asked for, none given");

        let c2r = lib.prepare(&spec(FftKind::ComplexToReal, 7)).unwrap();
        let e = run(c2r, 0xdead).unwrap_err().to_string();
        for part in [
            "exec failed: testFFT status 6 (6): ",
            "ComplexToReal transform of lengths [2, 2], batch 7",
            "input embed [2, 2] (distance 4) at 0xdead",
            "output embed [2, 2] (distance 4) at 0x2000",
            "at 0x2000, no work area",
        ] {
            assert!(e.contains(part), "{part:?} not in {e:?}");
        }
    }
}
