//! Host kernels: Rust closures registered by name that stand in for GPU
//! kernels, so runtime tests can run synthetic programs on the host backend.
//!
//! A module image of kind [`ImageKind::Host`](crate::ImageKind::Host) is a
//! UTF-8 list of kernel names (one per line); each must have been registered
//! with [`HostBackend::register_kernel`](super::HostBackend::register_kernel)
//! before the module is loaded.

use std::cell::RefCell;
use std::sync::Arc;

use super::memory::Memory;
use crate::backend::{DevicePtr, LaunchConfig};
use crate::error::{DeviceError, Result};

/// A host kernel: `(ctx, args, config)`; `args[i]` holds the bytes of kernel
/// parameter `i`, as passed to `Backend::launch`.
pub type HostKernelFn =
    Arc<dyn Fn(&HostKernelCtx<'_>, &[&[u8]], &LaunchConfig) -> Result<()> + Send + Sync>;

/// What a host kernel sees: device memory, addressed by device pointers
/// (checked exactly like copies: unmapped or inaccessible bytes are errors).
pub struct HostKernelCtx<'a> {
    mem: RefCell<&'a mut Memory>,
}

impl<'a> HostKernelCtx<'a> {
    pub(crate) fn new(mem: &'a mut Memory) -> Self {
        HostKernelCtx {
            mem: RefCell::new(mem),
        }
    }

    /// Read `out.len()` bytes at `ptr`.
    pub fn read(&self, ptr: DevicePtr, out: &mut [u8]) -> Result<()> {
        self.mem.borrow().read(ptr, out)
    }

    pub fn read_vec(&self, ptr: DevicePtr, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0; len];
        self.read(ptr, &mut v)?;
        Ok(v)
    }

    /// Write `data` at `ptr`.
    pub fn write(&self, ptr: DevicePtr, data: &[u8]) -> Result<()> {
        self.mem.borrow_mut().write(ptr, data)
    }

    /// Read `n` little-endian `f32` values at `ptr`.
    pub fn read_f32(&self, ptr: DevicePtr, n: usize) -> Result<Vec<f32>> {
        let bytes = self.read_vec(ptr, n * 4)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    pub fn write_f32(&self, ptr: DevicePtr, values: &[f32]) -> Result<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(ptr, &bytes)
    }
}

fn arg<'b>(args: &[&'b [u8]], i: usize, len: usize) -> Result<&'b [u8]> {
    match args.get(i) {
        Some(a) if a.len() == len => Ok(a),
        Some(a) => Err(DeviceError::InvalidArgument(format!(
            "kernel argument {i} has {} bytes, expected {len}",
            a.len()
        ))),
        None => Err(DeviceError::InvalidArgument(format!(
            "kernel argument {i} missing ({} given)",
            args.len()
        ))),
    }
}

/// Kernel argument `i` as a device pointer (8 bytes, little endian).
pub fn arg_ptr(args: &[&[u8]], i: usize) -> Result<DevicePtr> {
    Ok(DevicePtr(arg_u64(args, i)?))
}

pub fn arg_u64(args: &[&[u8]], i: usize) -> Result<u64> {
    let a = arg(args, i, 8)?;
    Ok(u64::from_le_bytes(a.try_into().expect("length checked")))
}

pub fn arg_u32(args: &[&[u8]], i: usize) -> Result<u32> {
    let a = arg(args, i, 4)?;
    Ok(u32::from_le_bytes(a.try_into().expect("length checked")))
}

/// Parse a host module image: kernel names, one per line (blank lines and
/// `#` comments ignored).
pub(crate) fn parse_image(image: &[u8]) -> Result<Vec<String>> {
    if image.starts_with(b"\x7fELF") {
        return Err(DeviceError::Unsupported(
            "the host backend runs no GPU code, and this module is a GPU code object (ELF)".into(),
        ));
    }
    let text = std::str::from_utf8(image)
        .map_err(|_| DeviceError::InvalidArgument("host module image is not UTF-8 text".into()))?;
    let names: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    if names.is_empty() {
        return Err(DeviceError::InvalidArgument(
            "host module image names no kernels".into(),
        ));
    }
    Ok(names)
}
