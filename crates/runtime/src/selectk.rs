//! XLA's `select_k` thunk: the TopK custom call when XLA's emitter picks
//! raft's `select_k` (f32 with n < 1024, n == 1024 and k > 12, or
//! n > 1024 and k >= 8; `lax.top_k(..., is_stable=False)`). Per row of a
//! `[batch, n]` input, the `k` largest elements in descending order and
//! their indices.
//!
//! Our kernel ([`KERNEL_SOURCE`], `selectk.cu`) orders by XLA's total order
//! on floats (+NaN first, then +inf, ..., +0, -0, ..., -inf, -NaN; u64 as
//! unsigned) and puts equal keys lowest index first. Stock runs raft's
//! warp-sort kernels, which order equal keys as their sorting network
//! leaves them: values are the same bits either way (equal keys are the
//! same bits), and so are the indices on inputs without ties; on ties the
//! indices are a different, equally valid answer (measured against stock in
//! `integration/results/select_k/`). The op is one kernel launch, so it is
//! captured into graphs like any kernel (XLA runs the thunk outside its
//! command buffers).
//!
//! XLA's own TopK kernel (a `custom_kernel` thunk whose code is the
//! in-process symbol `topk_k<K>_float_<index type>`, for f32 with n >= 1024
//! and smaller k) runs on the same kernel with that kernel's order: float
//! comparison, equal values lowest index first (so -0 and +0 tie), NaN
//! below every number ([`load_xla_top_k`]). Measured against stock: the same
//! values and indices on distinct, tied, signed-zero and sparsely-NaN
//! inputs; where NaNs crowd the top k they differ (XLA's kernel compares
//! with `>`, so a NaN lands where its insertion sequence leaves it).
//!
//! Kernels: CUDA runs [`PTX`] (`selectk.ptx`, made from `selectk.cu` by
//! [`PTX_COMMAND`]; a test checks they agree), HIP compiles
//! [`KERNEL_SOURCE`] with hiprtc (**unverified on AMD hardware**), the host
//! backend runs [`host_kernel`] (the same order, by a sort), registered
//! with [`register_host_select_k`].

use std::sync::Arc;

use xla_vmm::{CustomKernelThunk, ElementType, KernelParam, SelectKThunk, Slice};
use xla_vmm_device::host::{arg_ptr, arg_u32, HostKernelFn};
use xla_vmm_device::{HostBackend, ImageKind, LaunchConfig};

use crate::error::{Result, RuntimeError};
use crate::params::ParamSpec;

/// The kernels' source (CUDA, HIP and NVRTC from one file).
pub const KERNEL_SOURCE: &str = include_str!("selectk.cu");
/// `selectk.cu` compiled for NVPTX by [`PTX_COMMAND`].
pub const PTX: &str = include_str!("selectk.ptx");
/// How `selectk.ptx` is made (run in `crates/runtime/src`). No CUDA
/// installation is used (`--cuda-path` names none): clang otherwise finds
/// one through a `ptxas` on `PATH` and writes that CUDA's PTX ISA version.
pub const PTX_COMMAND: &[&str] = &[
    "clang-15",
    "-x",
    "cuda",
    "--cuda-device-only",
    "-nocudainc",
    "-nocudalib",
    "--cuda-path=/nonexistent",
    "--cuda-gpu-arch=sm_70",
    "-include",
    "__clang_cuda_builtin_vars.h",
    "-O3",
    "-S",
    "-o",
    "selectk.ptx",
    "selectk.cu",
];

/// Threads per block (`XV_BLOCK` in the source).
pub const BLOCK: u32 = 1024;
/// The largest k: each thread sorts at most `XV_SORT_PER_THREAD` (8) of
/// the keys above the k-th.
pub const MAX_K: u32 = BLOCK * 8;

/// What a kernel orders by: one entry of `selectk.cu` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keys {
    /// select_k on f32: XLA's total order.
    F32,
    /// select_k on bf16: XLA's total order.
    Bf16,
    /// select_k on u64: unsigned.
    U64,
    /// XLA's TopK kernel on f32: float comparison, NaN lowest.
    F32FloatOrder,
}

const ALL_KEYS: [Keys; 4] = [Keys::F32, Keys::Bf16, Keys::U64, Keys::F32FloatOrder];

impl Keys {
    /// select_k's keys for `element_type`.
    pub fn of(element_type: ElementType) -> Result<Keys> {
        Ok(match element_type {
            ElementType::F32 => Keys::F32,
            ElementType::BF16 => Keys::Bf16,
            ElementType::U64 => Keys::U64,
            other => {
                return Err(RuntimeError::unsupported(format!(
                    "select_k of {} (XLA's select_k takes F32, BF16 and U64)",
                    other.name().unwrap_or("an unknown element type")
                )))
            }
        })
    }

    /// The kernel entry.
    pub fn entry(self) -> &'static str {
        match self {
            Keys::F32 => "xla_vmm_select_k_f32",
            Keys::Bf16 => "xla_vmm_select_k_bf16",
            Keys::U64 => "xla_vmm_select_k_u64",
            Keys::F32FloatOrder => "xla_vmm_top_k_f32",
        }
    }

    /// Bytes per element.
    pub fn element_bytes(self) -> u64 {
        match self {
            Keys::Bf16 => 2,
            Keys::U64 => 8,
            Keys::F32 | Keys::F32FloatOrder => 4,
        }
    }

    /// The order key of one element's bits (larger = earlier), as the
    /// kernel computes it.
    pub fn key(self, bits: u64) -> u64 {
        let total_f32 = |b: u32| {
            u64::from(if b & 0x8000_0000 != 0 {
                !b
            } else {
                b | 0x8000_0000
            })
        };
        match self {
            Keys::F32 => total_f32(bits as u32),
            Keys::Bf16 => {
                let b = bits as u16;
                u64::from(if b & 0x8000 != 0 { !b } else { b | 0x8000 })
            }
            Keys::U64 => bits,
            Keys::F32FloatOrder => {
                let magnitude = bits as u32 & 0x7fff_ffff;
                if magnitude > 0x7f80_0000 {
                    0
                } else {
                    total_f32(if magnitude == 0 { 0 } else { bits as u32 })
                }
            }
        }
    }
}

/// What a loaded select_k is: the entry to launch and its launch.
pub struct Loaded {
    pub entry: &'static str,
    pub config: LaunchConfig,
    pub params: Vec<ParamSpec>,
}

/// Checks the thunk (types, k <= n, k within [`MAX_K`], slices large
/// enough for the shapes) and gives its launch, or `None` when there is
/// nothing to select (no rows or k = 0).
pub fn load(s: &SelectKThunk) -> Result<Option<Loaded>> {
    let keys = Keys::of(s.element_type)?;
    launch(
        keys,
        [s.input, s.values, s.indices],
        s.batch,
        s.num_elements,
        s.k,
    )
}

/// For a custom kernel thunk whose code is XLA's TopK kernel
/// (`topk_k<K>_float_uint16_t` / `_uint32_t`: parameters `(input, n,
/// values, indices, k)`, one block per row), the same kernel's launch in
/// that kernel's order; `None` for any other symbol.
pub fn load_xla_top_k(symbol: &str, t: &CustomKernelThunk) -> Option<Result<Option<Loaded>>> {
    let bucket: u32 = symbol
        .strip_prefix("topk_k")?
        .strip_suffix("_float_uint32_t")
        .or_else(|| {
            symbol
                .strip_prefix("topk_k")?
                .strip_suffix("_float_uint16_t")
        })?
        .parse()
        .ok()?;
    Some((|| {
        let bad = |why: &str| RuntimeError::invalid(format!("XLA's TopK kernel {symbol}: {why}"));
        let word = |p: Option<&KernelParam>| match p {
            Some(KernelParam::Bytes { data }) if data.len() == 8 => {
                Ok(u64::from_le_bytes(data[..].try_into().expect("8 bytes")))
            }
            _ => Err(bad("expected (input, n, values, indices, k) parameters")),
        };
        let address = |p: Option<&KernelParam>, i: u32| match p {
            Some(KernelParam::ArgAddress { arg_index }) if *arg_index == i => Ok(()),
            _ => Err(bad("expected (input, n, values, indices, k) parameters")),
        };
        let params = t.spec.packing.as_deref().unwrap_or(&[]);
        // (input, values, indices and, unused by the kernel, a scratch buffer)
        if params.len() != 5 || !(3..=4).contains(&t.args.len()) {
            return Err(bad("expected (input, n, values, indices, k) parameters"));
        }
        address(params.first(), 0)?;
        address(params.get(2), 1)?;
        address(params.get(3), 2)?;
        let to_u32 = |v: u64, what: &str| {
            u32::try_from(v).map_err(|_| bad(&format!("{what} = {v} does not fit 32 bits")))
        };
        let n = to_u32(word(params.get(1))?, "n")?;
        let k = to_u32(word(params.get(4))?, "k")?;
        if k > bucket {
            return Err(bad(&format!(
                "k = {k} is larger than the kernel's {bucket}"
            )));
        }
        let b = &t.launch.blocks;
        if b.y != 1 || b.z != 1 {
            return Err(bad("expected a grid of one block per row"));
        }
        let batch = to_u32(b.x, "rows")?;
        launch(
            Keys::F32FloatOrder,
            [t.args[0].slice, t.args[1].slice, t.args[2].slice],
            batch,
            n,
            k,
        )
    })())
}

fn launch(
    keys: Keys,
    [input, values, indices]: [Slice; 3],
    batch: u32,
    n: u32,
    k: u32,
) -> Result<Option<Loaded>> {
    if k > n {
        return Err(RuntimeError::invalid(format!(
            "select_k k = {k} is larger than the row ({n} elements)"
        )));
    }
    if k > MAX_K {
        return Err(RuntimeError::unsupported(format!(
            "select_k with k = {k} (this runtime's kernel takes k <= {MAX_K})"
        )));
    }
    let elem = keys.element_bytes();
    let need = |slice: &Slice, what: &str, cols: u32, bytes: u64| {
        if slice.size < bytes {
            Err(RuntimeError::invalid(format!(
                "select_k {what} slice has {} bytes, [{batch}, {cols}] needs {bytes}",
                slice.size
            )))
        } else {
            Ok(())
        }
    };
    // Saturating: a corrupt thunk's huge shape fails the size check instead of wrapping.
    let bytes = |cols: u32, elem: u64| {
        u64::from(batch)
            .saturating_mul(u64::from(cols))
            .saturating_mul(elem)
    };
    need(&input, "input", n, bytes(n, elem))?;
    need(&values, "values", k, bytes(k, elem))?;
    need(&indices, "indices", k, bytes(k, 4))?;
    if batch == 0 || k == 0 {
        return Ok(None);
    }
    if n > i32::MAX as u32 {
        return Err(RuntimeError::unsupported(format!(
            "select_k over rows of {n} elements (indices are S32)"
        )));
    }
    if batch > i32::MAX as u32 {
        return Err(RuntimeError::unsupported(format!(
            "select_k with {batch} rows (one block per row; the grid takes 2^31 - 1)"
        )));
    }
    Ok(Some(Loaded {
        entry: keys.entry(),
        config: LaunchConfig {
            grid: [batch, 1, 1],
            block: [BLOCK, 1, 1],
            ..Default::default()
        },
        params: vec![
            ParamSpec::Address(input),
            ParamSpec::Address(values),
            ParamSpec::Address(indices),
            ParamSpec::Bytes(n.to_le_bytes().to_vec()),
            ParamSpec::Bytes(k.to_le_bytes().to_vec()),
        ],
    }))
}

/// The kernel image for a backend: (bytes, kind).
pub fn image(backend: &str) -> Result<(Vec<u8>, ImageKind)> {
    Ok(match backend {
        "cuda" => (PTX.as_bytes().to_vec(), ImageKind::Ptx),
        "hip" => (KERNEL_SOURCE.as_bytes().to_vec(), ImageKind::HipSource),
        "host" => (
            ALL_KEYS.map(Keys::entry).join("\n").into_bytes(),
            ImageKind::Host,
        ),
        other => {
            return Err(RuntimeError::unsupported(format!(
                "no select_k kernel for the {other} backend"
            )))
        }
    })
}

/// The host backend's kernel for `keys`: each row's k largest by
/// [`Keys::key`], equal keys lowest index first (a stable sort of the row).
pub fn host_kernel(keys: Keys) -> HostKernelFn {
    Arc::new(move |ctx, args, cfg| {
        let (input, values, indices) = (arg_ptr(args, 0)?, arg_ptr(args, 1)?, arg_ptr(args, 2)?);
        let (n, k) = (arg_u32(args, 3)? as usize, arg_u32(args, 4)? as usize);
        let elem = keys.element_bytes() as usize;
        for row in 0..cfg.grid[0] as u64 {
            let data = ctx.read_vec(input.offset(row * (n * elem) as u64), n * elem)?;
            let bits: Vec<u64> = data
                .chunks_exact(elem)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b[..elem].copy_from_slice(c);
                    u64::from_le_bytes(b)
                })
                .collect();
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(keys.key(bits[i])));
            let mut vals = Vec::with_capacity(k * elem);
            let mut idx = Vec::with_capacity(k * 4);
            for &i in &order[..k] {
                vals.extend_from_slice(&bits[i].to_le_bytes()[..elem]);
                idx.extend_from_slice(&(i as u32).to_le_bytes());
            }
            ctx.write(values.offset(row * (k * elem) as u64), &vals)?;
            ctx.write(indices.offset(row * (k * 4) as u64), &idx)?;
        }
        Ok(())
    })
}

/// Make the select_k kernels available on a host backend.
pub fn register_host_select_k(b: &HostBackend) {
    for keys in ALL_KEYS {
        b.register_kernel(keys.entry(), host_kernel(keys));
    }
}
