//! The copy kernel of VA-stable mode: the copies of a step run inside the
//! step's graph, driven by a descriptor table in pinned host memory that
//! the GPU reads directly (zero-copy), so binding a step makes no driver
//! call for its copies.
//!
//! Table layout (little endian, 8-byte words): `[count, 0]` then `count`
//! rows `(dst, src, bytes)`, 24 bytes each; a copy longer than
//! [`ROW_BYTES`] is split into several rows. Rows with `bytes == 0` copy
//! nothing. Rows run concurrently (one CTA each): destinations must not
//! overlap (the caller falls back to ordered copies otherwise). A step
//! whose copies need more rows than the table has runs that direction as a
//! batched driver copy instead.
//!
//! Each reservation's graph is captured once with two launches of the
//! kernel: the first node reads the IN table, the last the OUT table. The
//! host rewrites a table only after the reservation's previous launch has
//! finished (its `done` event), and only when its entries change.
//!
//! Kernels: CUDA runs [`COPY_KERNEL_PTX`] (JIT-compiled by the driver); HIP
//! runs [`COPY_KERNEL_HIP`] (compiled for the device by hiprtc at first use;
//! **unverified on AMD hardware**, compiled for several gfx targets in CI);
//! the host backend runs [`host_copy_kernel`], registered under the same
//! name with [`register_host_copy_kernel`], so tests exercise the very same
//! table path. Where the kernel cannot be loaded (no hiprtc, say), the
//! copies stay batched driver copies.

use std::sync::Arc;

use xla_vmm_device::host::{arg_ptr, HostKernelFn};
use xla_vmm_device::{Backend, DevicePtr, HostBackend, ImageKind, LaunchConfig};

use crate::error::{Result, RuntimeError};

/// The kernel's name (PTX entry and host kernel).
pub const COPY_KERNEL_NAME: &str = "xla_vmm_copy_table";
/// Bytes before the first entry.
pub const TABLE_HEADER: usize = 16;
/// Bytes per entry (row).
pub const ENTRY_BYTES: usize = 24;
/// Copies are split into rows of at most this many bytes (a multiple of
/// 16, so alignment is kept), one CTA per row.
pub const ROW_BYTES: u64 = 256 << 10;
/// Threads per CTA.
const BLOCK: u32 = 256;
/// CTAs per multiprocessor (grid-stride loops cover any size).
const CTAS_PER_SM: u32 = 4;

/// Bytes of a table with room for `cap` rows.
pub fn table_bytes(cap: usize) -> usize {
    TABLE_HEADER + ENTRY_BYTES * cap.max(1)
}

/// Rows a copy of `bytes` takes (at least one).
pub fn rows(bytes: u64) -> usize {
    bytes.div_ceil(ROW_BYTES).max(1) as usize
}

/// The copy kernel in PTX (sm_52+, 64-bit addresses), one parameter: the
/// table's device address.
///
/// Rows are spread over the CTAs (row `ctaid`, `ctaid + nctaid`, ...), so
/// the grid reads the table from host memory once (`ld.global.cv`: the host
/// rewrites it between launches). Threads 0..2 load a row's three words
/// into shared memory; the CTA then copies the row with a block-stride
/// loop: 16-byte vectors when `dst` and `src` are both 16-byte aligned, then
/// the remaining bytes (all of them otherwise) one by one. The host splits
/// big copies into rows of [`ROW_BYTES`] so that they spread over the GPU.
pub const COPY_KERNEL_PTX: &str = r#"
.version 7.0
.target sm_52
.address_size 64

.visible .entry xla_vmm_copy_table(
	.param .u64 p_table
)
{
	.reg .pred 	%p<8>;
	.reg .b16 	%rs<2>;
	.reg .b32 	%r<10>;
	.reg .b64 	%rd<24>;
	.shared .align 8 .b8 s_row[32];

	ld.param.u64 	%rd1, [p_table];
	cvta.to.global.u64 	%rd1, %rd1;
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, %ntid.x;
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %nctaid.x;
	cvt.u64.u32 	%rd2, %r1;
	cvt.u64.u32 	%rd3, %r2;
	cvt.u64.u32 	%rd4, %r3;
	cvt.u64.u32 	%rd5, %r4;
	mov.u64 	%rd10, s_row;
	setp.ne.u32 	%p1, %r1, 0;
	@%p1 bra 	$L_counted;
	ld.global.cv.u64 	%rd6, [%rd1];
	st.shared.u64 	[%rd10+24], %rd6;
$L_counted:
	bar.sync 	0;
	ld.shared.u64 	%rd6, [%rd10+24];
$L_row:
	setp.ge.u64 	%p2, %rd4, %rd6;
	@%p2 bra 	$L_done;
	setp.ge.u32 	%p3, %r1, 3;
	@%p3 bra 	$L_loaded;
	mul.lo.u64 	%rd7, %rd4, 24;
	add.u64 	%rd7, %rd7, %rd1;
	shl.b64 	%rd8, %rd2, 3;
	add.u64 	%rd7, %rd7, %rd8;
	ld.global.cv.u64 	%rd9, [%rd7+16];
	add.u64 	%rd8, %rd8, %rd10;
	st.shared.u64 	[%rd8], %rd9;
$L_loaded:
	bar.sync 	0;
	ld.shared.u64 	%rd11, [%rd10];
	ld.shared.u64 	%rd12, [%rd10+8];
	ld.shared.u64 	%rd13, [%rd10+16];
	bar.sync 	0;
	cvta.to.global.u64 	%rd11, %rd11;
	cvta.to.global.u64 	%rd12, %rd12;
	or.b64 	%rd14, %rd11, %rd12;
	and.b64 	%rd14, %rd14, 15;
	setp.eq.u64 	%p4, %rd14, 0;
	shr.u64 	%rd15, %rd13, 4;
	selp.b64 	%rd15, %rd15, 0, %p4;
	mov.u64 	%rd16, %rd2;
$L_vec:
	setp.ge.u64 	%p5, %rd16, %rd15;
	@%p5 bra 	$L_vec_done;
	shl.b64 	%rd17, %rd16, 4;
	add.u64 	%rd18, %rd12, %rd17;
	add.u64 	%rd19, %rd11, %rd17;
	ld.global.v4.u32 	{%r5, %r6, %r7, %r8}, [%rd18];
	st.global.v4.u32 	[%rd19], {%r5, %r6, %r7, %r8};
	add.u64 	%rd16, %rd16, %rd3;
	bra 	$L_vec;
$L_vec_done:
	shl.b64 	%rd20, %rd15, 4;
	add.u64 	%rd16, %rd20, %rd2;
$L_byte:
	setp.ge.u64 	%p6, %rd16, %rd13;
	@%p6 bra 	$L_byte_done;
	add.u64 	%rd18, %rd12, %rd16;
	add.u64 	%rd19, %rd11, %rd16;
	ld.global.u8 	%rs1, [%rd18];
	st.global.u8 	[%rd19], %rs1;
	add.u64 	%rd16, %rd16, %rd3;
	bra 	$L_byte;
$L_byte_done:
	add.u64 	%rd4, %rd4, %rd5;
	bra 	$L_row;
$L_done:
	ret;
}
"#;

/// The copy kernel as HIP C++ (`copykernel.hip`): the same table and
/// semantics as [`COPY_KERNEL_PTX`] (row `blockIdx`, `+ gridDim`, ...;
/// 16-byte vectors when both ends are 16-byte aligned, then bytes), written
/// with clang's AMDGPU builtins only, and reading the host-written table
/// with system-scope loads.
pub const COPY_KERNEL_HIP: &str = include_str!("copykernel.hip");

/// The host backend's copy kernel: the same table semantics as the PTX
/// (entries in order; the table is read through its window).
pub fn host_copy_kernel() -> HostKernelFn {
    Arc::new(|ctx, args, _cfg| {
        let table = arg_ptr(args, 0)?;
        let mut word = [0u8; 8];
        ctx.read(table, &mut word)?;
        let count = u64::from_le_bytes(word);
        let mut ent = [0u8; ENTRY_BYTES];
        for i in 0..count {
            let at = table.offset(TABLE_HEADER as u64 + ENTRY_BYTES as u64 * i);
            ctx.read(at, &mut ent)?;
            let w =
                |k: usize| u64::from_le_bytes(ent[8 * k..8 * k + 8].try_into().expect("8 bytes"));
            let (dst, src, n) = (DevicePtr(w(0)), DevicePtr(w(1)), w(2));
            if n > 0 {
                let len = usize::try_from(n).map_err(|_| {
                    xla_vmm_device::DeviceError::InvalidArgument("copy too large".into())
                })?;
                let data = ctx.read_vec(src, len)?;
                ctx.write(dst, &data)?;
            }
        }
        Ok(())
    })
}

/// Make the copy kernel available on a host backend (the kernel path is
/// then used by VA-stable executables created afterwards).
pub fn register_host_copy_kernel(b: &HostBackend) {
    b.register_kernel(COPY_KERNEL_NAME, host_copy_kernel());
}

/// The loaded kernel and its launch geometry.
pub(crate) struct CopyKernel<B: Backend> {
    module: Option<B::Module>,
    function: B::Function,
    config: LaunchConfig,
}

impl<B: Backend> CopyKernel<B> {
    /// Load the kernel where the backend runs it: CUDA (PTX), HIP (source
    /// for hiprtc) or host (a registered host kernel).
    pub(crate) fn load(be: &B) -> Result<Self> {
        let module = match be.info().backend {
            "cuda" => be.module_load(COPY_KERNEL_PTX.as_bytes(), ImageKind::Ptx)?,
            "hip" => be.module_load(COPY_KERNEL_HIP.as_bytes(), ImageKind::HipSource)?,
            "host" => be.module_load(COPY_KERNEL_NAME.as_bytes(), ImageKind::Host)?,
            other => {
                return Err(RuntimeError::invalid(format!(
                    "no copy kernel for the {other} backend"
                )))
            }
        };
        let function = match be.module_function(&module, COPY_KERNEL_NAME) {
            Ok(f) => f,
            Err(e) => {
                be.module_unload(module).ok();
                return Err(e.into());
            }
        };
        let sms = be.info().multiprocessor_count.max(1);
        let config = LaunchConfig {
            grid: [sms.saturating_mul(CTAS_PER_SM).clamp(1, 65535), 1, 1],
            block: [BLOCK, 1, 1],
            ..Default::default()
        };
        Ok(CopyKernel {
            module: Some(module),
            function,
            config,
        })
    }

    /// Enqueue (or capture) one run of the kernel over the table at `table`.
    pub(crate) fn launch(&self, be: &B, table: DevicePtr, stream: &B::Stream) -> Result<()> {
        be.launch(
            &self.function,
            &self.config,
            &[&table.0.to_le_bytes()],
            stream,
        )?;
        Ok(())
    }

    pub(crate) fn unload(mut self, be: &B) {
        if let Some(m) = self.module.take() {
            be.module_unload(m).ok();
        }
    }
}

/// The IN and OUT tables of one reservation, in one pinned buffer, with
/// the copies last written (to skip rewriting unchanged tables).
pub(crate) struct CopyTables<B: Backend> {
    buf: Option<B::HostBuffer>,
    /// Rows per table.
    cap: usize,
    /// Device addresses of the IN and OUT tables.
    pub(crate) dev: [DevicePtr; 2],
    written: [Vec<(DevicePtr, DevicePtr, u64)>; 2],
    /// The copies last written did not fit: the table is empty and they
    /// go through a batched copy every step.
    overflow: [bool; 2],
}

/// Table index of the copies in (before the step) and out (after).
pub(crate) const IN: usize = 0;
pub(crate) const OUT: usize = 1;

impl<B: Backend> CopyTables<B> {
    /// Room for `cap` rows per direction; both tables start empty.
    pub(crate) fn new(be: &B, cap: usize) -> Result<Self> {
        let cap = cap.max(1);
        let one = table_bytes(cap).next_multiple_of(64);
        let mut buf = be.host_alloc(2 * one)?;
        be.host_bytes_mut(&mut buf).fill(0);
        let base = match be.host_device_ptr(&buf) {
            Ok(p) => p,
            Err(e) => {
                be.host_free(buf).ok();
                return Err(e.into());
            }
        };
        Ok(CopyTables {
            buf: Some(buf),
            cap,
            dev: [base, base.offset(one as u64)],
            written: [Vec::new(), Vec::new()],
            overflow: [false; 2],
        })
    }

    /// The table `dir` was last written with exactly `copies`.
    pub(crate) fn holds(&self, dir: usize, copies: &[(DevicePtr, DevicePtr, u64)]) -> bool {
        self.written[dir] == copies
    }

    /// The copies of table `dir` did not fit: run them as a batch.
    pub(crate) fn overflowed(&self, dir: usize) -> bool {
        self.overflow[dir]
    }

    /// Write `copies` (split into rows) into table `dir`, or leave it empty
    /// and mark it overflowed when they need more rows than it has. The
    /// caller has made sure no launch reading it is in flight.
    pub(crate) fn write(&mut self, be: &B, dir: usize, copies: &[(DevicePtr, DevicePtr, u64)]) {
        let need: usize = copies.iter().map(|c| rows(c.2)).sum();
        let fits = need <= self.cap;
        let buf = self.buf.as_mut().expect("live until release");
        let one = table_bytes(self.cap).next_multiple_of(64);
        let bytes = &mut be.host_bytes_mut(buf)[dir * one..(dir + 1) * one];
        let mut k = 0usize;
        if fits {
            for &(d, s, n) in copies {
                let mut done = 0u64;
                loop {
                    let len = (n - done).min(ROW_BYTES);
                    let at = TABLE_HEADER + ENTRY_BYTES * k;
                    bytes[at..at + 8].copy_from_slice(&d.offset(done).0.to_le_bytes());
                    bytes[at + 8..at + 16].copy_from_slice(&s.offset(done).0.to_le_bytes());
                    bytes[at + 16..at + 24].copy_from_slice(&len.to_le_bytes());
                    k += 1;
                    done += len;
                    if done >= n {
                        break;
                    }
                }
            }
        }
        bytes[..8].copy_from_slice(&(k as u64).to_le_bytes());
        self.overflow[dir] = !fits;
        self.written[dir].clear();
        self.written[dir].extend_from_slice(copies);
    }

    pub(crate) fn release(mut self, be: &B) {
        if let Some(b) = self.buf.take() {
            be.host_free(b).ok();
        }
    }
}

/// Run the kernel once, outside any graph, over `entries` (destinations
/// must not overlap), and wait for it: for tests of the kernel itself.
pub fn run_copy_kernel<B: Backend>(
    be: &B,
    entries: &[(DevicePtr, DevicePtr, u64)],
    stream: &B::Stream,
) -> Result<()> {
    let k = CopyKernel::load(be)?;
    let cap = entries.iter().map(|c| rows(c.2)).sum();
    let t = match CopyTables::new(be, cap) {
        Ok(t) => t,
        Err(e) => {
            k.unload(be);
            return Err(e);
        }
    };
    let mut t = t;
    t.write(be, IN, entries);
    let r = k
        .launch(be, t.dev[IN], stream)
        .and_then(|()| be.stream_synchronize(stream).map_err(Into::into));
    t.release(be);
    k.unload(be);
    r
}
