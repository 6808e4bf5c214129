//! cuDNN's backend API, loaded at run time, for XLA's convolution thunks:
//! the same operation graph XLA's runner builds (`cuda_dnn.cc`,
//! `GetCudnnOperationGraph` through cudnn-frontend's builders), the engine
//! by the global index the autotuner recorded with its knob choices, the
//! execution plan from that engine config alone, and per run a variant pack
//! of the three tensors (UIDs `'x'`, `'w'`, `'y'`) and the thunk's scratch
//! buffer as workspace. No heuristic runs at load or at run time.
//!
//! Attribute by attribute (XLA sets them in this order):
//! - tensors x, y, w: data type, dimensions, strides, unique id, byte
//!   alignment 32;
//! - the convolution: compute type, mode, spatial dims, pre- and
//!   post-paddings (the same array), dilations, filter strides;
//! - the operation (forward, backward data or backward filter): its three
//!   tensors, the convolution, alpha 1 and beta 0 (as FLOAT, DOUBLE for an
//!   f64 convolution);
//! - the operation graph (the op, the handle), the engine (graph, global
//!   index), the engine config (engine; the knob choices of every knob the
//!   engine supports, -1 where none was recorded, when any was), the plan
//!   (its engine config, and the handle).
//!
//! A fused convolution (XLA's `GetCudnnFusedOperationGraph`) adds the side
//! input z (y's dims, strides and type, only where the side-input add is
//! part of the graph), the bias b and the virtual tensors C, A and B (each
//! with `IS_VIRTUAL`); the convolution writes C instead of y, then come the
//! pointwise operations (mode, math precision and, for relu, NaN
//! propagation and clips; x, y, the two alphas as FLOAT, b for an add): the
//! side-input add C, z -> A, the bias add -> y or B, the activation B -> y.
//! Its variant pack is x, w, (z,) b, y.
//!
//! The library (`libcudnn.so.9`) is found where cuBLASLt is looked for,
//! plus the `nvidia-cudnn` wheel's `nvidia/cudnn/lib`; it is loaded the
//! first time a program with a convolution is loaded. Every handle and
//! descriptor is owned by an RAII type here.

use std::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, Mutex};

use xla_vmm_ffi::cuda::cudnn as sys;

use crate::blas::xla_type;
use crate::dnn::{Activation, ConvArgs, ConvFusion, ConvOp, ConvSpec, ConvTensor};
use crate::error::{DeviceError, Result};

use sys::cudnnBackendAttributeName_t as A;
use sys::cudnnBackendAttributeType_t as T;
use sys::cudnnBackendDescriptorType_t as D;

type Status = u32;
type Desc = *mut c_void;
type Handle = *mut c_void;

const LIB_NAMES: &[&str] = &["libcudnn.so.9", "libcudnn.so"];

/// The unique ids XLA gives the tensors: `'x'`, `'w'`, `'y'`; a fused
/// convolution's side input `'z'` and bias `'b'`, and its virtual tensors
/// (the convolution's result `'C'`, the side-input sum `'A'`, the biased
/// sum `'B'`).
const UID_X: i64 = b'x' as i64;
const UID_W: i64 = b'w' as i64;
const UID_Y: i64 = b'y' as i64;
const UID_Z: i64 = b'z' as i64;
const UID_B: i64 = b'b' as i64;
const UID_CONV: i64 = b'C' as i64;
const UID_ADD: i64 = b'A' as i64;
const UID_BIAS: i64 = b'B' as i64;

/// The cuDNN entry points we call (C signatures of `cudnn_graph.h`; enums as
/// `u32`, descriptors and handles as pointers).
struct Api {
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> Status,
    get_version: unsafe extern "C" fn() -> usize,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    desc_create: unsafe extern "C" fn(u32, *mut Desc) -> Status,
    desc_destroy: unsafe extern "C" fn(Desc) -> Status,
    set_attribute: unsafe extern "C" fn(Desc, u32, u32, i64, *const c_void) -> Status,
    get_attribute: unsafe extern "C" fn(Desc, u32, u32, i64, *mut i64, *mut c_void) -> Status,
    finalize: unsafe extern "C" fn(Desc) -> Status,
    execute: unsafe extern "C" fn(Handle, Desc, Desc) -> Status,
    /// Keeps the library mapped for the life of the process.
    _lib: libloading::Library,
}

fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T> {
    // SAFETY: every `T` used with this is the C signature `cudnn_graph.h`
    // declares for `name` (enums as u32); the library stays loaded as long
    // as the `Api` that owns it.
    unsafe {
        lib.get::<T>(name.as_bytes())
            .map(|s| *s)
            .map_err(|e| DeviceError::NotAvailable(format!("cuDNN symbol {name}: {e}")))
    }
}

impl Api {
    fn load() -> Result<(Api, String)> {
        let mut tried = Vec::new();
        for path in crate::libsearch::cuda(LIB_NAMES) {
            // SAFETY: loading cuDNN runs its initializers, which have no
            // preconditions beyond a sane process environment.
            let lib = match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => lib,
                Err(e) => {
                    tried.push(format!("{}: {e}", path.display()));
                    continue;
                }
            };
            let api = Api {
                create: sym(&lib, "cudnnCreate")?,
                destroy: sym(&lib, "cudnnDestroy")?,
                set_stream: sym(&lib, "cudnnSetStream")?,
                get_version: sym(&lib, "cudnnGetVersion")?,
                error_string: sym(&lib, "cudnnGetErrorString")?,
                desc_create: sym(&lib, "cudnnBackendCreateDescriptor")?,
                desc_destroy: sym(&lib, "cudnnBackendDestroyDescriptor")?,
                set_attribute: sym(&lib, "cudnnBackendSetAttribute")?,
                get_attribute: sym(&lib, "cudnnBackendGetAttribute")?,
                finalize: sym(&lib, "cudnnBackendFinalize")?,
                execute: sym(&lib, "cudnnBackendExecute")?,
                _lib: lib,
            };
            return Ok((api, path.display().to_string()));
        }
        Err(DeviceError::NotAvailable(format!(
            "cuDNN not found (tried {})",
            tried.join("; ")
        )))
    }

    fn check(&self, call: &'static str, s: Status) -> Result<()> {
        if s == 0 {
            return Ok(());
        }
        // SAFETY: cudnnGetErrorString returns a static string for any value.
        let name = unsafe { CStr::from_ptr((self.error_string)(s)) }
            .to_string_lossy()
            .into_owned();
        Err(DeviceError::Driver {
            call,
            code: i64::from(s),
            name,
            message: String::new(),
        })
    }
}

/// A backend descriptor, destroyed on drop.
struct Descriptor<'a> {
    api: &'a Api,
    raw: Desc,
    /// Its type, named in errors.
    kind: D,
}

impl<'a> Descriptor<'a> {
    fn new(api: &'a Api, kind: D) -> Result<Self> {
        let mut raw: Desc = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer.
        api.check("cudnnBackendCreateDescriptor", unsafe {
            (api.desc_create)(kind as u32, &mut raw)
        })?;
        Ok(Descriptor { api, raw, kind })
    }

    /// Set `name` to `values` (elements of the attribute type `ty`).
    fn set<V>(&self, name: A, ty: T, values: &[V]) -> Result<()> {
        // SAFETY: `values` holds `values.len()` elements of the C type `ty`
        // names (the callers pair them: i64 for INT64, f32 for FLOAT, u32
        // enums, descriptor pointers for BACKEND_DESCRIPTOR); cuDNN copies
        // them before returning.
        let s = unsafe {
            (self.api.set_attribute)(
                self.raw,
                name as u32,
                ty as u32,
                values.len() as i64,
                values.as_ptr().cast(),
            )
        };
        self.api
            .check("cudnnBackendSetAttribute", s)
            .map_err(|e| self.name(e, Some(name)))
    }

    fn finalize(self) -> Result<Self> {
        // SAFETY: a descriptor of ours, not yet finalized.
        let s = unsafe { (self.api.finalize)(self.raw) };
        self.api
            .check("cudnnBackendFinalize", s)
            .map_err(|e| self.name(e, None))?;
        Ok(self)
    }

    /// `e` with this descriptor's type (and the attribute) in its message.
    fn name(&self, e: DeviceError, attr: Option<A>) -> DeviceError {
        e.with_message(|| match attr {
            Some(a) => format!("{:?} {a:?}", self.kind),
            None => format!("{:?}", self.kind),
        })
    }

    fn get_i64(&self, name: A) -> Result<i64> {
        let (mut v, mut n) = (0i64, 0i64);
        // SAFETY: room for one INT64.
        self.api.check("cudnnBackendGetAttribute", unsafe {
            (self.api.get_attribute)(
                self.raw,
                name as u32,
                T::CUDNN_TYPE_INT64 as u32,
                1,
                &mut n,
                (&mut v as *mut i64).cast(),
            )
        })?;
        Ok(v)
    }
}

impl Drop for Descriptor<'_> {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once.
        let s = unsafe { (self.api.desc_destroy)(self.raw) };
        if s != 0 {
            tracing::warn!(status = s, "cudnnBackendDestroyDescriptor failed");
        }
    }
}

fn data_type(t: i32) -> Result<sys::cudnnDataType_t> {
    use sys::cudnnDataType_t::*;
    Ok(match t {
        xla_type::F32 => CUDNN_DATA_FLOAT,
        xla_type::F64 => CUDNN_DATA_DOUBLE,
        xla_type::F16 => CUDNN_DATA_HALF,
        xla_type::BF16 => CUDNN_DATA_BFLOAT16,
        other => {
            return Err(DeviceError::Unsupported(format!(
                "convolution in element type {other} (XLA PrimitiveType; F16, BF16, F32 and F64 \
                 are run)"
            )))
        }
    })
}

/// The library and one handle of one device; plans made from it.
struct Inner {
    api: Api,
    handle: Handle,
    /// Serializes set-stream + execute on the handle.
    lock: Mutex<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `Cudnn::new`; plans (which hold
        // an Arc of this) are gone.
        let s = unsafe { (self.api.destroy)(self.handle) };
        if s != 0 {
            tracing::warn!(status = s, "cudnnDestroy failed");
        }
    }
}

/// A finalized execution plan. Its descriptor lives as long as the plan;
/// the descriptors it was built from are destroyed after finalizing (cuDNN
/// copies what a finalized descriptor needs).
pub struct ConvPlan {
    inner: Arc<Inner>,
    plan: Desc,
    workspace: u64,
    /// None: unfused (x, w, y); else whether the side input z is a tensor
    /// of the graph (x, w, z, b, y, or x, w, b, y).
    fused_side_input: Option<bool>,
}

// SAFETY: a finalized plan descriptor is immutable; executions on it are
// serialized by `Inner::lock`.
unsafe impl Send for ConvPlan {}
// SAFETY: see above.
unsafe impl Sync for ConvPlan {}
// SAFETY: the handle is only used under `Inner::lock` or at creation and
// destruction (exclusive).
unsafe impl Send for Inner {}
// SAFETY: see above.
unsafe impl Sync for Inner {}

impl Drop for ConvPlan {
    fn drop(&mut self) {
        // SAFETY: the plan descriptor is ours, destroyed once.
        let s = unsafe { (self.inner.api.desc_destroy)(self.plan) };
        if s != 0 {
            tracing::warn!(status = s, "destroying a cuDNN plan failed");
        }
    }
}

impl ConvPlan {
    /// Workspace bytes the plan needs.
    pub fn workspace_size(&self) -> u64 {
        self.workspace
    }

    /// Enqueue the convolution on `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream of the handle's context, which is current;
    /// the buffers hold the plan's tensors and stay valid until it ran.
    pub unsafe fn execute(&self, args: &ConvArgs, stream: *mut c_void) -> Result<()> {
        if args.workspace_bytes < self.workspace {
            return Err(DeviceError::InvalidArgument(format!(
                "convolution plan needs {} bytes of workspace, the scratch buffer has {}",
                self.workspace, args.workspace_bytes
            )));
        }
        let api = &self.inner.api;
        let pack = Descriptor::new(api, D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        let ptr = |p: crate::backend::DevicePtr| p.0 as *mut c_void;
        // XLA's order: x, w, (z,) b, y for a fused convolution.
        let mut ptrs = vec![ptr(args.x), ptr(args.w)];
        let mut uids = vec![UID_X, UID_W];
        match (self.fused_side_input, args.fused) {
            (None, None) => {}
            (Some(side), Some(f)) => {
                if side {
                    ptrs.push(ptr(f.side_input));
                    uids.push(UID_Z);
                }
                ptrs.push(ptr(f.bias));
                uids.push(UID_B);
            }
            (plan, run) => {
                return Err(DeviceError::InvalidArgument(format!(
                    "convolution plan {} run {} bias / side-input buffers",
                    if plan.is_some() {
                        "fused, "
                    } else {
                        "unfused, "
                    },
                    if run.is_some() { "with" } else { "without" }
                )))
            }
        }
        ptrs.push(ptr(args.y));
        uids.push(UID_Y);
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            T::CUDNN_TYPE_VOID_PTR,
            &ptrs,
        )?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
            T::CUDNN_TYPE_INT64,
            &uids,
        )?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            T::CUDNN_TYPE_VOID_PTR,
            &[args.workspace.0 as *mut c_void],
        )?;
        let pack = pack.finalize()?;
        let _guard = self.inner.lock.lock().unwrap_or_else(|p| p.into_inner());
        api.check(
            "cudnnSetStream",
            (api.set_stream)(self.inner.handle, stream),
        )?;
        api.check(
            "cudnnBackendExecute",
            (api.execute)(self.inner.handle, self.plan, pack.raw),
        )
    }
}

/// cuDNN for one device: the library, a handle, and how plans are built.
pub struct Cudnn {
    inner: Arc<Inner>,
    library: String,
}

impl Cudnn {
    /// Load the library and create a handle. The device's CUDA context must
    /// be current on this thread.
    pub fn new() -> Result<Self> {
        let (api, library) = Api::load()?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out pointer; the context is current.
        api.check("cudnnCreate", unsafe { (api.create)(&mut handle) })?;
        // SAFETY: no preconditions.
        let version = unsafe { (api.get_version)() };
        tracing::info!(library = %library, version, "cuDNN loaded for convolutions");
        Ok(Cudnn {
            inner: Arc::new(Inner {
                api,
                handle,
                lock: Mutex::new(()),
            }),
            library,
        })
    }

    /// Path (or name) of the loaded library.
    pub fn library(&self) -> &str {
        &self.library
    }

    fn tensor(&self, t: &ConvTensor, uid: i64) -> Result<Descriptor<'_>> {
        self.tensor_desc(t, uid, false)
    }

    /// A tensor of the graph only (no buffer): `t`'s dims and strides.
    fn virtual_tensor(&self, t: &ConvTensor, dtype: i32, uid: i64) -> Result<Descriptor<'_>> {
        let t = ConvTensor { dtype, ..t.clone() };
        self.tensor_desc(&t, uid, true)
    }

    fn tensor_desc(&self, t: &ConvTensor, uid: i64, is_virtual: bool) -> Result<Descriptor<'_>> {
        let d = Descriptor::new(&self.inner.api, D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        d.set(
            A::CUDNN_ATTR_TENSOR_DATA_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[data_type(t.dtype)? as u32],
        )?;
        d.set(
            A::CUDNN_ATTR_TENSOR_DIMENSIONS,
            T::CUDNN_TYPE_INT64,
            &t.dims,
        )?;
        d.set(
            A::CUDNN_ATTR_TENSOR_STRIDES,
            T::CUDNN_TYPE_INT64,
            &t.strides,
        )?;
        d.set(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, T::CUDNN_TYPE_INT64, &[uid])?;
        d.set(
            A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
            T::CUDNN_TYPE_INT64,
            &[32i64],
        )?;
        if is_virtual {
            d.set(
                A::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
                T::CUDNN_TYPE_BOOLEAN,
                &[true],
            )?;
        }
        d.finalize()
    }

    /// Build the execution plan of `spec` (the device's context current).
    pub fn plan(&self, spec: &ConvSpec) -> Result<ConvPlan> {
        // XLA's creation order: x, y, (z,) w, (b and the virtual tensors).
        let x = self.tensor(&spec.x, UID_X)?;
        let y = self.tensor(&spec.y, UID_Y)?;
        let z = match &spec.fusion {
            Some(ConvFusion {
                side_input: Some(_),
                ..
            }) => Some(self.tensor(&spec.y, UID_Z)?),
            _ => None,
        };
        let w = self.tensor(&spec.w, UID_W)?;
        let compute = data_type(spec.compute)?;
        // A fused convolution writes a virtual tensor in the accumulator
        // type, which the pointwise operations read.
        let conv_out = match &spec.fusion {
            Some(_) => Some(self.virtual_tensor(&spec.y, spec.compute, UID_CONV)?),
            None => None,
        };
        let conv = self.conv_descriptor(spec, compute)?;
        let y_out = conv_out.as_ref().unwrap_or(&y);
        let op = self.conv_operation(spec, [&x, &w, y_out, &conv], compute)?;
        let mut ops = vec![op];
        // The fused graph's other descriptors, kept until the plan is built.
        let mut keep = Vec::new();
        if let (Some(f), Some(conv_out)) = (&spec.fusion, &conv_out) {
            self.fused_ops(f, &spec.y, conv_out, z.as_ref(), &y, &mut ops, &mut keep)?;
        }
        self.execution_plan(spec, &ops)
    }

    /// The convolution descriptor: compute type, mode, spatial dimensions,
    /// padding, dilations, strides.
    fn conv_descriptor(
        &self,
        spec: &ConvSpec,
        compute: sys::cudnnDataType_t,
    ) -> Result<Descriptor<'_>> {
        let api = &self.inner.api;
        let conv = Descriptor::new(api, D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
        let mode = if spec.cross_correlation {
            sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION
        } else {
            sys::cudnnConvolutionMode_t::CUDNN_CONVOLUTION
        };
        let nd = spec.padding.len() as i64;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[compute as u32],
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
            T::CUDNN_TYPE_CONVOLUTION_MODE,
            &[mode as u32],
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
            T::CUDNN_TYPE_INT64,
            &[nd],
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
            T::CUDNN_TYPE_INT64,
            &spec.padding,
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
            T::CUDNN_TYPE_INT64,
            &spec.padding,
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_DILATIONS,
            T::CUDNN_TYPE_INT64,
            &spec.dilations,
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
            T::CUDNN_TYPE_INT64,
            &spec.strides,
        )?;
        conv.finalize()
    }

    /// The convolution operation of `spec.op` over x, w, y (a fused
    /// convolution's virtual output) and the convolution descriptor, alpha 1
    /// and beta 0 in the compute type.
    fn conv_operation(
        &self,
        spec: &ConvSpec,
        [x, w, y, conv]: [&Descriptor<'_>; 4],
        compute: sys::cudnnDataType_t,
    ) -> Result<Descriptor<'_>> {
        let api = &self.inner.api;
        let (kind, [ax, aw, ay, ac, aa, ab]) = match spec.op {
            ConvOp::Forward => (
                D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                [
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                ],
            ),
            ConvOp::BackwardData => (
                D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                [
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                ],
            ),
            ConvOp::BackwardFilter => (
                D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                [
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                ],
            ),
        };
        let op = Descriptor::new(api, kind)?;
        let bd = T::CUDNN_TYPE_BACKEND_DESCRIPTOR;
        op.set(ax, bd, &[x.raw])?;
        op.set(aw, bd, &[w.raw])?;
        op.set(ay, bd, &[y.raw])?;
        op.set(ac, bd, &[conv.raw])?;
        if compute == sys::cudnnDataType_t::CUDNN_DATA_DOUBLE {
            op.set(aa, T::CUDNN_TYPE_DOUBLE, &[1.0f64])?;
            op.set(ab, T::CUDNN_TYPE_DOUBLE, &[0.0f64])?;
        } else {
            op.set(aa, T::CUDNN_TYPE_FLOAT, &[1.0f32])?;
            op.set(ab, T::CUDNN_TYPE_FLOAT, &[0.0f32])?;
        }
        op.finalize()
    }

    /// The operation graph of `ops`, the engine the autotuner chose with its
    /// knobs, and the execution plan with its workspace size.
    fn execution_plan(&self, spec: &ConvSpec, ops: &[Descriptor<'_>]) -> Result<ConvPlan> {
        let api = &self.inner.api;
        let bd = T::CUDNN_TYPE_BACKEND_DESCRIPTOR;
        let op_raw: Vec<Desc> = ops.iter().map(|o| o.raw).collect();

        let graph = Descriptor::new(api, D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        graph.set(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, bd, &op_raw)?;
        graph.set(
            A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
            T::CUDNN_TYPE_HANDLE,
            &[self.inner.handle],
        )?;
        let graph = graph.finalize()?;

        let engine = Descriptor::new(api, D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
        engine.set(A::CUDNN_ATTR_ENGINE_OPERATION_GRAPH, bd, &[graph.raw])?;
        engine.set(
            A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
            T::CUDNN_TYPE_INT64,
            &[spec.engine],
        )?;
        let engine = engine.finalize()?;

        let choices = self.knob_choices(&engine, &spec.knobs)?;
        let cfg = Descriptor::new(api, D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)?;
        cfg.set(A::CUDNN_ATTR_ENGINECFG_ENGINE, bd, &[engine.raw])?;
        if !choices.is_empty() {
            let raw: Vec<Desc> = choices.iter().map(|c| c.raw).collect();
            cfg.set(A::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, bd, &raw)?;
        }
        let cfg = cfg.finalize()?;

        let plan = Descriptor::new(api, D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
        // cudnn-frontend 1.x leaves the plan's handle unset (it is for
        // deserializing plans); older cuDNN 9 releases want it to finalize
        // a plan. It picks no kernel, so we set it.
        plan.set(
            A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
            T::CUDNN_TYPE_HANDLE,
            &[self.inner.handle],
        )?;
        plan.set(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, bd, &[cfg.raw])?;
        let plan = plan.finalize()?;
        let workspace =
            u64::try_from(plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?).unwrap_or(0);
        let raw = plan.raw;
        std::mem::forget(plan); // owned by the ConvPlan from here
        Ok(ConvPlan {
            inner: self.inner.clone(),
            plan: raw,
            workspace,
            fused_side_input: spec.fusion.as_ref().map(|f| f.side_input.is_some()),
        })
    }

    /// The pointwise operations XLA's fused runner puts after the
    /// convolution (which wrote `conv_out`): the side-input add (alpha =
    /// the convolution's scale, alpha2 = the side input's) when `z` is
    /// there, the bias add, and the activation into `y` (the bias add
    /// writes `y` itself when there is none). The operations go to `ops`,
    /// the descriptors they refer to to `keep`.
    #[allow(clippy::too_many_arguments)]
    fn fused_ops<'a>(
        &'a self,
        f: &ConvFusion,
        y_tensor: &ConvTensor,
        conv_out: &Descriptor<'a>,
        z: Option<&Descriptor<'a>>,
        y: &Descriptor<'a>,
        ops: &mut Vec<Descriptor<'a>>,
        keep: &mut Vec<Descriptor<'a>>,
    ) -> Result<()> {
        let prec = data_type(f.activation_type)?;
        let b = self.tensor(&f.bias, UID_B)?;
        let sum = self.virtual_tensor(y_tensor, f.activation_type, UID_ADD)?;
        let biased = self.virtual_tensor(y_tensor, f.activation_type, UID_BIAS)?;
        let side = match (z, f.side_input) {
            (Some(z), Some((conv_scale, side_scale))) => {
                let add = self.pointwise(None, prec)?;
                // cudnn-frontend passes a pointwise op's alphas as FLOAT.
                let scales = [conv_scale as f32, side_scale as f32];
                ops.push(self.pointwise_op(&add, conv_out, Some(z), &sum, scales)?);
                keep.push(add);
                true
            }
            _ => false,
        };
        let bias_in = if side { &sum } else { conv_out };
        let identity = f.activation == Activation::None;
        let bias_out = if identity { y } else { &biased };
        let bias_add = self.pointwise(None, prec)?;
        ops.push(self.pointwise_op(&bias_add, bias_in, Some(&b), bias_out, [1.0, 1.0])?);
        keep.push(bias_add);
        if !identity {
            let act = self.pointwise(Some(f.activation), prec)?;
            ops.push(self.pointwise_op(&act, &biased, None, y, [1.0, 1.0])?);
            keep.push(act);
        }
        keep.extend([b, sum, biased]);
        Ok(())
    }

    /// A pointwise descriptor as cudnn-frontend's builder makes it: an add
    /// (`act` None) or the activation, in precision `prec`; a relu with
    /// NaN propagation, lower clip 0, upper clip (f32's largest value for
    /// FLOAT math, else f64's, or 6) and lower-clip slope (0, or leaky
    /// relu's); an elu with alpha 1.
    fn pointwise(
        &self,
        act: Option<Activation>,
        prec: sys::cudnnDataType_t,
    ) -> Result<Descriptor<'_>> {
        use sys::cudnnPointwiseMode_t as M;
        let d = Descriptor::new(&self.inner.api, D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        let mode = match act {
            None => M::CUDNN_POINTWISE_ADD,
            Some(Activation::Relu | Activation::Relu6 | Activation::LeakyRelu(_)) => {
                M::CUDNN_POINTWISE_RELU_FWD
            }
            Some(Activation::Elu) => M::CUDNN_POINTWISE_ELU_FWD,
            Some(Activation::None) => {
                return Err(DeviceError::InvalidArgument(
                    "an identity activation has no pointwise operation".into(),
                ))
            }
        };
        d.set(
            A::CUDNN_ATTR_POINTWISE_MODE,
            T::CUDNN_TYPE_POINTWISE_MODE,
            &[mode as u32],
        )?;
        d.set(
            A::CUDNN_ATTR_POINTWISE_MATH_PREC,
            T::CUDNN_TYPE_DATA_TYPE,
            &[prec as u32],
        )?;
        match act {
            Some(a @ (Activation::Relu | Activation::Relu6 | Activation::LeakyRelu(_))) => {
                let mut upper = if a == Activation::Relu6 {
                    6.0
                } else {
                    f64::MAX
                };
                if prec == sys::cudnnDataType_t::CUDNN_DATA_FLOAT {
                    upper = upper.min(f64::from(f32::MAX));
                }
                let slope = match a {
                    Activation::LeakyRelu(s) => s,
                    _ => 0.0,
                };
                d.set(
                    A::CUDNN_ATTR_POINTWISE_NAN_PROPAGATION,
                    T::CUDNN_TYPE_NAN_PROPOGATION,
                    &[sys::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN as u32],
                )?;
                d.set(
                    A::CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP,
                    T::CUDNN_TYPE_DOUBLE,
                    &[0.0f64],
                )?;
                d.set(
                    A::CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP,
                    T::CUDNN_TYPE_DOUBLE,
                    &[upper],
                )?;
                d.set(
                    A::CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE,
                    T::CUDNN_TYPE_DOUBLE,
                    &[slope],
                )?;
            }
            Some(Activation::Elu) => d.set(
                A::CUDNN_ATTR_POINTWISE_ELU_ALPHA,
                T::CUDNN_TYPE_DOUBLE,
                &[1.0f64],
            )?,
            _ => {}
        }
        d.finalize()
    }

    /// A pointwise operation: its descriptor, x, y, the two alphas (FLOAT)
    /// and, for an add, b.
    fn pointwise_op<'a>(
        &'a self,
        pw: &Descriptor<'a>,
        x: &Descriptor<'a>,
        b: Option<&Descriptor<'a>>,
        y: &Descriptor<'a>,
        alphas: [f32; 2],
    ) -> Result<Descriptor<'a>> {
        let bd = T::CUDNN_TYPE_BACKEND_DESCRIPTOR;
        let op = Descriptor::new(
            &self.inner.api,
            D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
        )?;
        op.set(
            A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
            bd,
            &[pw.raw],
        )?;
        op.set(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, bd, &[x.raw])?;
        op.set(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, bd, &[y.raw])?;
        op.set(
            A::CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1,
            T::CUDNN_TYPE_FLOAT,
            &alphas[..1],
        )?;
        op.set(
            A::CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2,
            T::CUDNN_TYPE_FLOAT,
            &alphas[1..],
        )?;
        if let Some(b) = b {
            op.set(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, bd, &[b.raw])?;
        }
        op.finalize()
    }

    /// XLA's engine config: when any recorded knob is one the engine
    /// supports, a choice for every supported knob (the recorded value, else
    /// -1), in the engine's order; else none.
    fn knob_choices(
        &self,
        engine: &Descriptor<'_>,
        recorded: &[(i64, i64)],
    ) -> Result<Vec<Descriptor<'_>>> {
        let api = &self.inner.api;
        let cap = sys::cudnnBackendKnobType_t::CUDNN_KNOB_TYPE_COUNTS as usize;
        let infos = (0..cap)
            .map(|_| Descriptor::new(api, D::CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR))
            .collect::<Result<Vec<_>>>()?;
        let mut raw: Vec<Desc> = infos.iter().map(|d| d.raw).collect();
        let mut n = 0i64;
        // SAFETY: `raw` holds `cap` created KNOB_INFO descriptors for cuDNN
        // to fill; `n` receives how many it filled.
        api.check("cudnnBackendGetAttribute(ENGINE_KNOB_INFO)", unsafe {
            (api.get_attribute)(
                engine.raw,
                A::CUDNN_ATTR_ENGINE_KNOB_INFO as u32,
                T::CUDNN_TYPE_BACKEND_DESCRIPTOR as u32,
                cap as i64,
                &mut n,
                raw.as_mut_ptr().cast(),
            )
        })?;
        let mut types = Vec::new();
        for info in infos.iter().take(usize::try_from(n).unwrap_or(0).min(cap)) {
            let (mut ty, mut count) = (0u32, 0i64);
            // SAFETY: room for one knob type (a u32 enum).
            api.check("cudnnBackendGetAttribute(KNOB_INFO_TYPE)", unsafe {
                (api.get_attribute)(
                    info.raw,
                    A::CUDNN_ATTR_KNOB_INFO_TYPE as u32,
                    T::CUDNN_TYPE_KNOB_TYPE as u32,
                    1,
                    &mut count,
                    (&mut ty as *mut u32).cast(),
                )
            })?;
            types.push(ty);
        }
        let value = |ty: u32| {
            recorded
                .iter()
                .find(|(k, _)| *k == i64::from(ty))
                .map(|(_, v)| *v)
        };
        if !types.iter().any(|&t| value(t).is_some()) {
            return Ok(Vec::new());
        }
        types
            .iter()
            .map(|&ty| {
                let c = Descriptor::new(api, D::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR)?;
                c.set(
                    A::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                    T::CUDNN_TYPE_KNOB_TYPE,
                    &[ty],
                )?;
                c.set(
                    A::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
                    T::CUDNN_TYPE_INT64,
                    &[value(ty).unwrap_or(-1)],
                )?;
                c.finalize()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_xlas() {
        assert_eq!((UID_X, UID_W, UID_Y), (120, 119, 121));
    }

    #[test]
    fn data_types_run_are_the_float_ones() {
        assert_eq!(
            data_type(xla_type::BF16).unwrap(),
            sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16
        );
        let e = data_type(xla_type::S8).unwrap_err().to_string();
        assert!(e.contains("element type 2"), "{e}");
    }
}
