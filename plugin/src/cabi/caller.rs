//! The only place in the plugin that touches raw memory handed over by the C
//! caller. Each helper turns a (pointer, length) pair from an args struct
//! into a checked Rust view; the rest of the crate is safe code.
//!
//! The contract these rely on is the PJRT C API's: a pointer in an args
//! struct points to `len` valid elements for the duration of the call (or
//! is null with `len == 0`).
#![allow(unsafe_code)]

use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use xla_vmm_ffi::pjrt::PJRT_NamedValue;

use crate::cabi::error::{Error, Result};

/// Most dimensions an array of the C API may have (XLA's shapes stay far
/// below): a larger count is an absurd length, not an allocation.
pub const MAX_RANK: usize = 64;

/// Lowest address a caller's pointer may have: the null page is no object.
const MIN_ADDRESS: usize = 4096;
/// Above this no user-space object lives on x86-64 or aarch64 (48 to 52 bit
/// virtual addresses): a larger value is garbage, refused unread.
const MAX_ADDRESS: usize = 1 << 56;
/// Most bytes one caller array may span (1 TiB): larger is an absurd length
/// (a count taken from a pointer, an uninitialized field), refused unread.
pub const MAX_SPAN: usize = 1 << 40;

/// Is `[ptr, ptr + bytes)` where a caller's object can be? Not a guarantee
/// that it is mapped (nothing in-process can promise that), but garbage,
/// small integers and counts too large for memory are refused before use.
fn plausible(ptr: usize, bytes: usize, what: &str) -> Result<()> {
    if bytes > MAX_SPAN {
        return Err(Error::invalid(format!(
            "{what}: absurd length ({bytes} bytes)"
        )));
    }
    if !(MIN_ADDRESS..MAX_ADDRESS).contains(&ptr)
        || ptr.checked_add(bytes).is_none_or(|e| e > MAX_ADDRESS)
    {
        return Err(Error::invalid(format!("{what}: {ptr:#x} is not a pointer")));
    }
    Ok(())
}

/// `ptr[..len]` as a slice; a null `ptr` is an error unless `len == 0`, and
/// so is a length no array in this address space can have.
pub fn slice<'a, T>(ptr: *const T, len: usize, what: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::invalid(format!("{what} is null (length {len})")));
    }
    let Some(bytes) = len.checked_mul(std::mem::size_of::<T>().max(1)) else {
        return Err(Error::invalid(format!("{what}: absurd length {len}")));
    };
    plausible(ptr as usize, bytes, what)?;
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Error::invalid(format!("{what} is misaligned")));
    }
    // SAFETY: non-null and aligned (checked above); the C API contract makes
    // `ptr` valid for `len` reads of `T` during this call, and the caller
    // does not write it concurrently.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// `ptr[..len]` copied into a vector of at most `max` elements: a longer
/// caller-supplied length is an error naming it, and the copy's allocation
/// is fallible (an error, not an abort, when memory runs out).
pub fn vec_at_most<T: Copy>(ptr: *const T, len: usize, max: usize, what: &str) -> Result<Vec<T>> {
    if len > max {
        return Err(Error::invalid(format!(
            "{what}: {len} elements, at most {max} allowed"
        )));
    }
    let s = slice(ptr, len, what)?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        Error::new(
            xla_vmm_ffi::pjrt::PJRT_Error_Code_RESOURCE_EXHAUSTED,
            format!("{what}: no host memory for {len} elements"),
        )
    })?;
    v.extend_from_slice(s);
    Ok(v)
}

/// `ptr[..len]` as a mutable byte slice (a destination the caller owns).
pub fn slice_mut<'a>(ptr: *mut u8, len: usize, what: &str) -> Result<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(Error::invalid(format!("{what} is null (length {len})")));
    }
    plausible(ptr as usize, len, what)?;
    // SAFETY: non-null; the C API contract makes `ptr` valid for `len` byte
    // writes during this call and not aliased by anything we hold.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// A (pointer, length) string, UTF-8 checked.
pub fn str<'a>(ptr: *const c_char, len: usize, what: &str) -> Result<&'a str> {
    let bytes = slice(ptr.cast::<u8>(), len, what)?;
    std::str::from_utf8(bytes).map_err(|_| Error::invalid(format!("{what} is not UTF-8")))
}

/// Could `args` be an args struct of at least `size` bytes (see
/// [`plausible`])? Checked before its `struct_size` is read.
pub fn plausible_args(args: usize, size: usize) -> Result<()> {
    plausible(args, size, "args")
}

/// Read the leading `size_t struct_size` of a non-null args struct.
///
/// # Safety
/// `args` must be non-null and point to a PJRT args struct (all of which
/// begin with `size_t struct_size`).
pub unsafe fn struct_size<A>(args: *const A) -> usize {
    // SAFETY: guaranteed by the caller (see above).
    unsafe { args.cast::<usize>().read_unaligned() }
}

/// Turn a checked args pointer into a reference.
///
/// # Safety
/// `args` must be non-null, aligned, and point to a struct of type `A` whose
/// `struct_size` is at least `A`'s header `STRUCT_SIZE`: the caller's struct
/// is the same C type (or a newer, longer version of it), so every field of
/// `A` lies inside it.
pub unsafe fn args_mut<'a, A>(args: *mut A) -> &'a mut A {
    // SAFETY: guaranteed by the caller (see above).
    unsafe { &mut *args }
}

/// Run `f` on a zeroed `A` holding the first `caller_size` bytes of the
/// caller's (shorter, older) struct, then copy those bytes back.
///
/// # Safety
/// `args` must be non-null, aligned, valid for reads and writes of
/// `caller_size` bytes, and `A` must be plain C data for which all-zero
/// bytes are a valid value (the bindgen PJRT args structs are).
pub unsafe fn with_prefix<A, T>(
    args: *mut A,
    caller_size: usize,
    f: impl FnOnce(&mut A) -> T,
) -> T {
    let n = caller_size.min(std::mem::size_of::<A>());
    let mut local = std::mem::MaybeUninit::<A>::zeroed();
    // SAFETY: `args` is valid for `n <= caller_size` bytes of reads (caller
    // contract); `local` has `size_of::<A>() >= n` bytes; no overlap.
    unsafe { std::ptr::copy_nonoverlapping(args.cast::<u8>(), local.as_mut_ptr().cast::<u8>(), n) };
    // SAFETY: all-zero is a valid `A` (caller contract) and the copied prefix
    // holds the caller's valid field values.
    let local = unsafe { local.assume_init_mut() };
    let r = f(local);
    // SAFETY: `args` is valid for `n` bytes of writes (caller contract).
    unsafe {
        std::ptr::copy_nonoverlapping((local as *const A).cast::<u8>(), args.cast::<u8>(), n)
    };
    r
}

/// A raw pointer that is only ever handed to the C side (never dereferenced
/// by us), so it may live in shared objects.
#[repr(transparent)]
#[derive(Debug, PartialEq, Eq)]
pub struct CPtr<T>(pub *mut T);

impl<T> Clone for CPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for CPtr<T> {}

// SAFETY: a `CPtr` is an opaque address given to C callers; Rust code never
// dereferences it, so sharing it across threads cannot cause a data race.
unsafe impl<T> Send for CPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for CPtr<T> {}

/// Attribute values in the C API's (name, typed value) form.
#[derive(Clone, Debug)]
pub enum Value {
    Str(String),
    Int(i64),
    Ints(Vec<i64>),
    Float(f32),
    Bool(bool),
}

/// An owned `PJRT_NamedValue` array whose pointers point into itself.
pub struct NamedValues {
    // Backing storage; never mutated after construction.
    _names: Vec<CString>,
    _strs: Vec<CString>,
    _ints: Vec<Vec<i64>>,
    values: Vec<PJRT_NamedValue>,
}

// SAFETY: the raw pointers inside `values` point into the owned, immutable
// storage of the same object; nothing mutates it after construction.
unsafe impl Send for NamedValues {}
// SAFETY: as above (read-only after construction).
unsafe impl Sync for NamedValues {}

impl NamedValues {
    pub fn new(items: Vec<(&str, Value)>) -> Self {
        use xla_vmm_ffi::pjrt::*;
        let mut names = Vec::new();
        let mut strs = Vec::new();
        let mut ints = Vec::new();
        let mut values = Vec::new();
        for (name, value) in items {
            let cname = CString::new(name.replace('\0', "")).unwrap_or_default();
            let name_ptr = cname.as_ptr();
            let name_size = cname.as_bytes().len();
            names.push(cname);
            let (type_, anon, value_size) = match value {
                Value::Str(s) => {
                    let c = CString::new(s.replace('\0', "")).unwrap_or_default();
                    let len = c.as_bytes().len();
                    let anon = PJRT_NamedValue__bindgen_ty_1 {
                        string_value: c.as_ptr(),
                    };
                    strs.push(c);
                    (PJRT_NamedValue_kString, anon, len)
                }
                Value::Int(v) => (
                    PJRT_NamedValue_kInt64,
                    PJRT_NamedValue__bindgen_ty_1 { int64_value: v },
                    1,
                ),
                Value::Ints(v) => {
                    let anon = PJRT_NamedValue__bindgen_ty_1 {
                        int64_array_value: v.as_ptr(),
                    };
                    let len = v.len();
                    ints.push(v);
                    (PJRT_NamedValue_kInt64List, anon, len)
                }
                Value::Float(v) => (
                    PJRT_NamedValue_kFloat,
                    PJRT_NamedValue__bindgen_ty_1 { float_value: v },
                    1,
                ),
                Value::Bool(v) => (
                    PJRT_NamedValue_kBool,
                    PJRT_NamedValue__bindgen_ty_1 { bool_value: v },
                    1,
                ),
            };
            values.push(PJRT_NamedValue {
                struct_size: PJRT_NamedValue_STRUCT_SIZE as usize,
                extension_start: std::ptr::null_mut(),
                name: name_ptr,
                name_size,
                type_,
                __bindgen_anon_1: anon,
                value_size,
            });
        }
        NamedValues {
            _names: names,
            _strs: strs,
            _ints: ints,
            values,
        }
    }

    pub fn as_ptr(&self) -> *const PJRT_NamedValue {
        self.values.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }
}

/// Read a caller's `PJRT_NamedValue` list into owned values.
pub fn read_named_values(ptr: *const PJRT_NamedValue, len: usize) -> Result<Vec<(String, Value)>> {
    use xla_vmm_ffi::pjrt::*;
    let mut out = Vec::new();
    for nv in slice(ptr, len, "create_options")? {
        if nv.struct_size < PJRT_NamedValue_STRUCT_SIZE as usize {
            return Err(Error::invalid(format!(
                "PJRT_NamedValue.struct_size is {}, expected at least {}",
                nv.struct_size, PJRT_NamedValue_STRUCT_SIZE
            )));
        }
        let name = str(nv.name, nv.name_size, "option name")?.to_string();
        let value = match nv.type_ {
            PJRT_NamedValue_kString => {
                // SAFETY: `type_` is kString, so the caller wrote `string_value`.
                let p = unsafe { nv.__bindgen_anon_1.string_value };
                Value::Str(str(p, nv.value_size, &name)?.to_string())
            }
            // SAFETY: `type_` is kInt64, so the caller wrote `int64_value`.
            PJRT_NamedValue_kInt64 => Value::Int(unsafe { nv.__bindgen_anon_1.int64_value }),
            PJRT_NamedValue_kInt64List => {
                // SAFETY: `type_` is kInt64List: the caller wrote `int64_array_value`.
                let p = unsafe { nv.__bindgen_anon_1.int64_array_value };
                Value::Ints(slice(p, nv.value_size, &name)?.to_vec())
            }
            // SAFETY: `type_` is kFloat, so the caller wrote `float_value`.
            PJRT_NamedValue_kFloat => Value::Float(unsafe { nv.__bindgen_anon_1.float_value }),
            // SAFETY: `type_` is kBool, so the caller wrote `bool_value`.
            PJRT_NamedValue_kBool => Value::Bool(unsafe { nv.__bindgen_anon_1.bool_value }),
            other => {
                return Err(Error::invalid(format!(
                    "option {name}: unknown value type {other}"
                )))
            }
        };
        out.push((name, value));
    }
    Ok(out)
}

/// A caller's `PJRT_Event_OnReady` callback with its user argument.
#[derive(Copy, Clone)]
pub struct OnReady {
    callback: unsafe extern "C" fn(*mut xla_vmm_ffi::pjrt::PJRT_Error, *mut std::ffi::c_void),
    user_arg: CPtr<std::ffi::c_void>,
}

impl OnReady {
    pub fn new(
        callback: xla_vmm_ffi::pjrt::PJRT_Event_OnReadyCallback,
        user_arg: *mut std::ffi::c_void,
    ) -> Result<Self> {
        let callback = callback.ok_or_else(|| Error::invalid("callback is null"))?;
        Ok(OnReady {
            callback,
            user_arg: CPtr(user_arg),
        })
    }

    /// Call it once; it takes ownership of `error` (null = success).
    pub fn call(self, error: *mut xla_vmm_ffi::pjrt::PJRT_Error) {
        // SAFETY: the caller registered this function with this argument
        // for exactly one call when the event completes; the C API makes the
        // callback responsible for `error`.
        unsafe { (self.callback)(error, self.user_arg.0) }
    }
}

/// Copy `src` into the caller's array `dst[..src.len()]`.
pub fn write_slice<T: Copy>(dst: *mut T, src: &[T], what: &str) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    if dst.is_null() {
        return Err(Error::invalid(format!("{what} is null")));
    }
    plausible(dst as usize, std::mem::size_of_val(src), what)?;
    if !(dst as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Error::invalid(format!("{what} is misaligned")));
    }
    // SAFETY: non-null and aligned (checked); the C API contract gives us
    // room for at least `src.len()` elements (the caller checked the size).
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
    Ok(())
}

/// The caller's `PJRT_Program` (in/out struct of `OptimizedProgram`).
pub fn program_mut<'a>(
    p: *mut xla_vmm_ffi::pjrt::PJRT_Program,
) -> Result<&'a mut xla_vmm_ffi::pjrt::PJRT_Program> {
    if p.is_null() {
        return Err(Error::invalid("program is null"));
    }
    plausible(
        p as usize,
        std::mem::size_of::<xla_vmm_ffi::pjrt::PJRT_Program>(),
        "program",
    )?;
    if !(p as usize).is_multiple_of(std::mem::align_of::<xla_vmm_ffi::pjrt::PJRT_Program>()) {
        return Err(Error::invalid("program is misaligned"));
    }
    // SAFETY: non-null and aligned; the C API contract: the caller owns a
    // PJRT_Program there for the duration of the call.
    Ok(unsafe { &mut *p })
}

/// A caller's `PJRT_Buffer_MemoryLayout`, its union resolved.
pub enum HostLayout<'a> {
    Strides(&'a [i64]),
    Tiled {
        minor_to_major: &'a [i64],
        num_tiles: usize,
    },
}

/// Read a non-null `PJRT_Buffer_MemoryLayout`.
pub fn host_layout<'a>(
    layout: *const xla_vmm_ffi::pjrt::PJRT_Buffer_MemoryLayout,
) -> Result<HostLayout<'a>> {
    use xla_vmm_ffi::pjrt::*;
    let layout = slice(layout, 1, "layout")?
        .first()
        .ok_or_else(|| Error::invalid("layout is null"))?;
    match layout.type_ {
        PJRT_Buffer_MemoryLayout_Type_Strides => {
            // SAFETY: `type_` is Strides, so the caller filled `strides`.
            let s = unsafe { layout.__bindgen_anon_1.strides };
            Ok(HostLayout::Strides(slice(
                s.byte_strides,
                s.num_byte_strides,
                "byte_strides",
            )?))
        }
        PJRT_Buffer_MemoryLayout_Type_Tiled => {
            // SAFETY: `type_` is Tiled, so the caller filled `tiled`.
            let t = unsafe { layout.__bindgen_anon_1.tiled };
            Ok(HostLayout::Tiled {
                minor_to_major: slice(t.minor_to_major, t.minor_to_major_size, "minor_to_major")?,
                num_tiles: t.num_tiles,
            })
        }
        other => Err(Error::invalid(format!("unknown layout type {other}"))),
    }
}

/// Run an exported function's body: null, or its error (or panic) as a C
/// string to free with `xla_vmm_stats_free`.
pub(crate) fn exported(body: impl FnOnce() -> Result<(), String>) -> *mut c_char {
    let r = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| Err("panic in xla-vmm".into()));
    match r {
        Ok(()) => std::ptr::null_mut(),
        Err(m) => CString::new(m.replace('\0', " "))
            .unwrap_or_default()
            .into_raw(),
    }
}
