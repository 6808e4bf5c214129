//! A loaded program on one device, behind an object-safe trait: the
//! runtime's [`Executable`] is generic over the backend, the C-facing
//! executable is not.

use std::sync::{Arc, Mutex, MutexGuard};

use xla_vmm::Plan;
use xla_vmm_device::blas::GemmEngine;
use xla_vmm_device::{Backend, DevicePtr, MemLocation};
use xla_vmm_runtime::{CallContext, Executable, RunConfig, RuntimeError};

use crate::cabi::assignment::MultiDevice;
use crate::cabi::error::{Error, Result};
use crate::runtime::collectives::{self, Cliques};
use crate::runtime::handle::{BufferHandle, PluginBackend};

/// One result leaf of a run (valid until the next run).
#[derive(Clone, Debug)]
pub struct RunOutput {
    pub ptr: DevicePtr,
    pub bytes: u64,
    /// The entry parameter whose buffer holds it (aliasing / donation).
    pub parameter: Option<usize>,
}

pub trait Program: Send {
    /// Bind `args` (pointer, bytes per entry parameter) and enqueue a run
    /// on the client's stream (asynchronous: the outputs are written once
    /// the stream reaches this point).
    fn run(&mut self, args: &[(DevicePtr, u64)]) -> Result<Vec<RunOutput>>;

    /// Like [`Program::run`], with each argument's handle (from
    /// `Allocation::handle`) where there is one, so VA-stable graph mode
    /// can map the caller's physical memory instead of copying.
    fn run_bound(
        &mut self,
        args: &[(DevicePtr, u64)],
        _handles: Vec<Option<BufferHandle>>,
    ) -> Result<Vec<RunOutput>> {
        self.run(args)
    }

    /// Before its first run: does [`Program::placement`] have anything to
    /// say?
    fn placement_pending(&self) -> bool {
        false
    }

    /// Before its first run, the arguments whose memory should move between
    /// device and host memory for its plan under the device budget
    /// (`Executable::placement`): `args[i]` is argument `i`'s location and
    /// whether it can move. (argument, location) pairs, those leaving the
    /// device first (the program's own buffers that leave it have moved).
    /// `reclaim`: the device's other programs give back what they hold
    /// between runs (asked by the device's heaviest program, its stream
    /// waited for); the bytes freed and the arguments' movability again.
    fn placement(
        &mut self,
        _args: &[(Option<MemLocation>, bool)],
        _reclaim: &mut dyn FnMut() -> xla_vmm_runtime::Reclaimed,
    ) -> Result<Vec<(usize, MemLocation)>> {
        Ok(Vec::new())
    }

    /// Between its runs (none in flight: the device's stream waited for),
    /// give back the device memory it holds and can rebuild
    /// (`Executable::yield_device_memory`); the bytes freed.
    fn yield_device_memory(&mut self) -> u64 {
        0
    }

    /// The execute context the next runs' custom calls read (their user
    /// data), `None` for none.
    fn set_call_context(&mut self, _context: Option<Arc<dyn CallContext>>) {}

    /// The key of this program's binding stats in the runtime's registry
    /// (`name#n`), once it has some (after its first VA-stable run).
    fn stats_key(&self) -> Option<String> {
        None
    }
}

impl From<RuntimeError> for Error {
    fn from(e: RuntimeError) -> Self {
        use xla_vmm_ffi::pjrt::*;
        let code = match &e {
            RuntimeError::Device(d) => return Error::from(d.clone()),
            RuntimeError::Unsupported(_) => PJRT_Error_Code_UNIMPLEMENTED,
            RuntimeError::InvalidProgram(_) => PJRT_Error_Code_INVALID_ARGUMENT,
            RuntimeError::InvalidArgument(_) => PJRT_Error_Code_INVALID_ARGUMENT,
            RuntimeError::Io { .. } | RuntimeError::Handler(_) => PJRT_Error_Code_INTERNAL,
        };
        Error::new(code, e.to_string())
    }
}

pub struct RuntimeProgram<B: Backend> {
    backend: Arc<B>,
    exe: Option<Executable<B>>,
    /// The client's stream: runs are ordered with the buffers' copies.
    stream: Arc<SharedStream<B>>,
}

impl<B: Backend> RuntimeProgram<B> {
    /// `run`: how the client runs its programs (mode, guard, binding).
    pub fn load(
        backend: Arc<B>,
        plan: Plan,
        gemm: Option<Arc<dyn GemmEngine<B>>>,
        run: &RunConfig,
        stream: Arc<SharedStream<B>>,
        multi: Option<(&MultiDevice, Arc<Cliques<B>>)>,
    ) -> Result<Self> {
        let exe = stream.with(|s| {
            // PJRT buffers never change content except through donation.
            let mut config = run.clone();
            config.binding.immutable_buffers = true;
            let mut exe = Executable::load_with(
                backend.clone(),
                plan,
                gemm,
                Some(&crate::xla_ffi::api::Registry),
                &config,
                s,
            )?;
            if let Some((m, cliques)) = multi {
                collectives::attach(&mut exe, m, cliques)?;
            }
            backend.stream_synchronize(s)?;
            Ok::<_, Error>(exe)
        })?;
        Ok(RuntimeProgram {
            backend,
            exe: Some(exe),
            stream,
        })
    }
}

impl<B: PluginBackend> Program for RuntimeProgram<B> {
    fn run(&mut self, args: &[(DevicePtr, u64)]) -> Result<Vec<RunOutput>> {
        self.run_bound(args, Vec::new())
    }

    fn stats_key(&self) -> Option<String> {
        Some(self.exe.as_ref()?.stats()?.executable.clone())
    }

    fn placement_pending(&self) -> bool {
        self.exe.as_ref().is_some_and(|e| e.placement_pending())
    }

    fn placement(
        &mut self,
        args: &[(Option<MemLocation>, bool)],
        reclaim: &mut dyn FnMut() -> xla_vmm_runtime::Reclaimed,
    ) -> Result<Vec<(usize, MemLocation)>> {
        let Some(exe) = self.exe.as_mut() else {
            return Ok(Vec::new());
        };
        self.stream.with(|s| Ok(exe.placement(args, s, reclaim)))
    }

    fn yield_device_memory(&mut self) -> u64 {
        self.exe.as_mut().map_or(0, |e| e.yield_device_memory())
    }

    fn set_call_context(&mut self, context: Option<Arc<dyn CallContext>>) {
        if let Some(exe) = self.exe.as_mut() {
            exe.set_call_context(context);
        }
    }

    fn run_bound(
        &mut self,
        args: &[(DevicePtr, u64)],
        mut handles: Vec<Option<BufferHandle>>,
    ) -> Result<Vec<RunOutput>> {
        let Some(exe) = self.exe.as_mut() else {
            return Err(Error::failed_precondition("the program was unloaded"));
        };
        let n = exe.parameter_shapes().len();
        if args.len() != n {
            return Err(Error::invalid(format!(
                "the program takes {n} arguments, {} given",
                args.len()
            )));
        }
        handles.resize_with(args.len(), || None);
        for (i, (&(ptr, bytes), h)) in args.iter().zip(handles).enumerate() {
            // No handle: memory VA-stable mode cannot map (pinned host
            // memory), bound by address and copied. A handle of another
            // backend's type is a bug, not a reason to copy silently.
            let user = match h.map(B::user_buffer) {
                None => None,
                Some(Some(u)) => Some(u),
                Some(None) => {
                    return Err(Error::internal(format!(
                        "argument {i}: its remap handle is not a buffer of this program's backend"
                    )))
                }
            };
            match user {
                // The handle's buffer covers exactly what is bound.
                Some(mut u) if u.ptr == ptr && u.bytes >= bytes => {
                    u.bytes = bytes;
                    exe.bind_user_buffer(i, u)?
                }
                _ => exe.bind_parameter(i, ptr, bytes)?,
            }
        }
        let outs = self.stream.with(|s| Ok(exe.step(s)?))?;
        Ok(outs
            .into_iter()
            .map(|o| RunOutput {
                ptr: o.ptr,
                bytes: o.bytes,
                parameter: o.parameter,
            })
            .collect())
    }
}

impl<B: Backend> Drop for RuntimeProgram<B> {
    fn drop(&mut self) {
        // Its memory may be in use by queued runs: wait for them.
        let r = self
            .stream
            .with(|s| Ok(self.backend.stream_synchronize(s)?));
        if let Err(e) = r {
            tracing::warn!("unloading a program: {}", e.message);
        }
        self.exe = None;
    }
}

/// The client's stream, shared by its device memory and its programs
/// (`None` once shut down).
pub struct SharedStream<B: Backend>(Mutex<Option<B::Stream>>);

impl<B: Backend> SharedStream<B> {
    pub fn new(stream: B::Stream) -> Self {
        SharedStream(Mutex::new(Some(stream)))
    }

    pub fn lock(&self) -> MutexGuard<'_, Option<B::Stream>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `f` with the stream (callers are serialized).
    pub fn with<T>(&self, f: impl FnOnce(&B::Stream) -> Result<T>) -> Result<T> {
        let guard = self.lock();
        let stream = guard
            .as_ref()
            .ok_or_else(|| Error::failed_precondition("device memory is shut down"))?;
        f(stream)
    }
}
