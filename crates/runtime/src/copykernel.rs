//! The copy kernel of VA-stable mode: a step's copies run inside the
//! step's graph, as two kernel nodes (copies in first, copies out last),
//! each finding its copies in its own kernel parameter: a table passed by
//! value. When a reservation's copies change, the host rewrites that node's
//! parameter in the instantiated graph ([`Backend::graph_exec_kernel_update`]):
//! the GPU never reads memory the host writes, the host never waits for the
//! GPU (launches already enqueued keep their parameters), and a step whose
//! copies did not change makes no call for them at all.
//!
//! Why not a table in pinned host memory, read by the kernel (the design
//! before): every CTA then read it over PCIe, and on the H200 VM those
//! reads are serialized: ~1.15 ms for the two launches of a step against
//! ~2 µs with the table in the parameter
//! (`integration/results/perf_baseline_a14eaf4.md`, `integration/diag/`).
//!
//! Table (little-endian u64 words): `[count, 0]`, then `cap` rows
//! `(dst, src, bytes)`; a copy longer than [`ROW_BYTES`] takes several rows.
//! Rows run concurrently, one CTA each (row `ctaid`, `ctaid + nctaid`, ...):
//! destinations must not overlap (the caller orders those copies itself).
//! The CTA copies a row with 16-byte vectors when both ends are 16-byte
//! aligned, then byte by byte. A direction whose copies need more rows than
//! the table has runs as a batched driver copy instead.
//!
//! Capacity: [`ROWS_SMALL`] rows (a 4 KiB parameter, every backend), or
//! [`ROWS_LARGE`] (32 KiB: CUDA's large kernel parameters, Volta and later,
//! CUDA 12.1 drivers; the host backend too) when an executable needs more.
//!
//! Kernels: CUDA runs [`ptx`] (JIT-compiled by the driver); HIP runs
//! [`hip_source`] (compiled for the device by hiprtc at first use;
//! **unverified on AMD hardware**); the host backend runs
//! [`host_copy_kernel`], registered under both names with
//! [`register_host_copy_kernel`], so tests go through the same table path.
//! Where the kernel or node updates are unavailable the copies stay batched
//! driver copies.

use std::sync::Arc;

use xla_vmm_device::host::HostKernelFn;
use xla_vmm_device::{Backend, DevicePtr, HostBackend, ImageKind, LaunchConfig};

use crate::error::{Result, RuntimeError, Teardown};

/// The kernels' names: one per direction, so that each node is found by
/// the function it launches.
pub const COPY_IN_NAME: &str = "xla_vmm_copy_in";
pub const COPY_OUT_NAME: &str = "xla_vmm_copy_out";
/// Bytes before the first row.
pub const TABLE_HEADER: usize = 16;
/// Bytes per row.
pub const ENTRY_BYTES: usize = 24;
/// Copies are split into rows of at most this many bytes (a multiple of
/// 16, so alignment is kept), one CTA per row.
pub const ROW_BYTES: u64 = 128 << 10;
/// Rows of a 4 KiB parameter (every backend).
pub const ROWS_SMALL: usize = (4096 - TABLE_HEADER) / ENTRY_BYTES;
/// Rows of a 32 KiB parameter (CUDA's limit is 32764 bytes).
pub const ROWS_LARGE: usize = (32764 - TABLE_HEADER) / ENTRY_BYTES;
/// Threads per CTA.
const BLOCK: u32 = 256;
/// At most this many CTAs per multiprocessor.
const CTAS_PER_SM: u32 = 4;

/// Copies in (before the step's work) and out (after it).
pub(crate) const IN: usize = 0;
pub(crate) const OUT: usize = 1;

/// One copy: (dst, src, bytes).
pub type CopyOp = (DevicePtr, DevicePtr, u64);

/// Bytes of a table of `cap` rows (the kernel parameter's size).
pub fn table_bytes(cap: usize) -> usize {
    TABLE_HEADER + ENTRY_BYTES * cap.max(1)
}

/// Rows a copy of `bytes` takes (at least one).
pub fn rows(bytes: u64) -> usize {
    bytes.div_ceil(ROW_BYTES).max(1) as usize
}

/// The copy kernels in PTX with a table of `cap` rows: entries
/// [`COPY_IN_NAME`] and [`COPY_OUT_NAME`], one parameter each (the table,
/// by value). PTX ISA 7.0 / sm_52 when the table fits in 4 KiB; larger
/// tables need ISA 8.1 / sm_70 (large kernel parameters).
pub fn ptx(cap: usize) -> String {
    let bytes = table_bytes(cap);
    let (version, target) = if bytes <= 4096 {
        ("7.0", "sm_52")
    } else {
        ("8.1", "sm_70")
    };
    let mut s = format!(".version {version}\n.target {target}\n.address_size 64\n");
    for name in [COPY_IN_NAME, COPY_OUT_NAME] {
        s.push_str(
            &PTX_ENTRY
                .replace("NAME", name)
                .replace("BYTES", &bytes.to_string()),
        );
    }
    s
}

/// One entry: the table's address in parameter space is taken once, rows
/// are read from it with `ld.param` (constant bank: no memory traffic).
const PTX_ENTRY: &str = r#"
.visible .entry NAME(
	.param .align 8 .b8 p_table[BYTES]
)
.maxntid 256, 1, 1
{
	.reg .pred 	%p<6>;
	.reg .b16 	%rs<2>;
	.reg .b32 	%r<9>;
	.reg .b64 	%rd<17>;

	mov.b64 	%rd1, p_table;
	ld.param.u64 	%rd2, [p_table];
	mov.u32 	%r1, %ctaid.x;
	cvt.u64.u32 	%rd3, %r1;
	setp.ge.u64 	%p1, %rd3, %rd2;
	@%p1 bra 	$L_done;
	mov.u32 	%r2, %tid.x;
	cvt.u64.u32 	%rd4, %r2;
	mov.u32 	%r3, %ntid.x;
	cvt.u64.u32 	%rd5, %r3;
	mov.u32 	%r4, %nctaid.x;
	cvt.u64.u32 	%rd6, %r4;
$L_row:
	mul.lo.u64 	%rd7, %rd3, 24;
	add.u64 	%rd7, %rd7, %rd1;
	ld.param.u64 	%rd8, [%rd7+16];
	ld.param.u64 	%rd9, [%rd7+24];
	ld.param.u64 	%rd10, [%rd7+32];
	cvta.to.global.u64 	%rd8, %rd8;
	cvta.to.global.u64 	%rd9, %rd9;
	or.b64 	%rd11, %rd8, %rd9;
	and.b64 	%rd11, %rd11, 15;
	setp.eq.u64 	%p2, %rd11, 0;
	shr.u64 	%rd12, %rd10, 4;
	selp.b64 	%rd12, %rd12, 0, %p2;
	mov.u64 	%rd13, %rd4;
$L_vec:
	setp.ge.u64 	%p3, %rd13, %rd12;
	@%p3 bra 	$L_vec_done;
	shl.b64 	%rd14, %rd13, 4;
	add.u64 	%rd15, %rd9, %rd14;
	add.u64 	%rd16, %rd8, %rd14;
	ld.global.v4.u32 	{%r5, %r6, %r7, %r8}, [%rd15];
	st.global.v4.u32 	[%rd16], {%r5, %r6, %r7, %r8};
	add.u64 	%rd13, %rd13, %rd5;
	bra 	$L_vec;
$L_vec_done:
	shl.b64 	%rd13, %rd12, 4;
	add.u64 	%rd13, %rd13, %rd4;
$L_byte:
	setp.ge.u64 	%p4, %rd13, %rd10;
	@%p4 bra 	$L_byte_done;
	add.u64 	%rd15, %rd9, %rd13;
	add.u64 	%rd16, %rd8, %rd13;
	ld.global.u8 	%rs1, [%rd15];
	st.global.u8 	[%rd16], %rs1;
	add.u64 	%rd13, %rd13, %rd5;
	bra 	$L_byte;
$L_byte_done:
	add.u64 	%rd3, %rd3, %rd6;
	setp.lt.u64 	%p5, %rd3, %rd2;
	@%p5 bra 	$L_row;
$L_done:
	ret;
}
"#;

/// The copy kernels as HIP C++ (`copykernel.hip`, the same table and
/// semantics as [`ptx`]) with a table of `cap` rows.
pub fn hip_source(cap: usize) -> String {
    format!("#define XLA_VMM_ROWS {cap}\n{COPY_KERNEL_HIP}")
}

/// `copykernel.hip` (needs `XLA_VMM_ROWS` defined: [`hip_source`]).
pub const COPY_KERNEL_HIP: &str = include_str!("copykernel.hip");

/// The host backend's copy kernel: the same table semantics (rows in order).
pub fn host_copy_kernel() -> HostKernelFn {
    Arc::new(|ctx, args, _cfg| {
        let invalid = |m: &str| xla_vmm_device::DeviceError::InvalidArgument(m.into());
        let table = args
            .first()
            .ok_or_else(|| invalid("copy kernel: no table"))?;
        let word = |at: usize| -> xla_vmm_device::Result<u64> {
            let b = table
                .get(at..at + 8)
                .ok_or_else(|| invalid("copy kernel: table too short"))?;
            Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        let count = word(0)? as usize;
        for i in 0..count {
            let at = TABLE_HEADER + ENTRY_BYTES * i;
            let (dst, src, n) = (
                DevicePtr(word(at)?),
                DevicePtr(word(at + 8)?),
                word(at + 16)?,
            );
            if n > 0 {
                let len = usize::try_from(n).map_err(|_| invalid("copy too large"))?;
                let data = ctx.read_vec(src, len)?;
                ctx.write(dst, &data)?;
            }
        }
        Ok(())
    })
}

/// Make the copy kernels available on a host backend (the kernel path is
/// then used by VA-stable executables created afterwards).
pub fn register_host_copy_kernel(b: &HostBackend) {
    b.register_kernel(COPY_IN_NAME, host_copy_kernel());
    b.register_kernel(COPY_OUT_NAME, host_copy_kernel());
}

/// The loaded kernels (one per direction) and their table capacity.
pub(crate) struct CopyKernel<B: Backend> {
    module: Option<B::Module>,
    functions: [B::Function; 2],
    cap: usize,
    max_grid: u32,
}

impl<B: Backend> CopyKernel<B> {
    /// Load the kernels with room for `rows` rows per direction where the
    /// backend allows it (CUDA and host: up to [`ROWS_LARGE`]; HIP:
    /// [`ROWS_SMALL`]); a large table that fails to load falls back to the
    /// small one.
    pub(crate) fn load(be: &B, rows: usize) -> Result<Self> {
        let backend = be.info().backend;
        let large = rows > ROWS_SMALL && matches!(backend, "cuda" | "host");
        if large {
            match Self::load_cap(be, ROWS_LARGE) {
                Ok(k) => return Ok(k),
                Err(e) => {
                    tracing::info!(error = %e, "copy kernel with a 32 KiB table unavailable; 4 KiB");
                }
            }
        }
        Self::load_cap(be, ROWS_SMALL)
    }

    fn load_cap(be: &B, cap: usize) -> Result<Self> {
        let module = match be.info().backend {
            "cuda" => be.module_load(ptx(cap).as_bytes(), ImageKind::Ptx)?,
            "hip" => be.module_load(hip_source(cap).as_bytes(), ImageKind::HipSource)?,
            "host" => be.module_load(
                format!("{COPY_IN_NAME}\n{COPY_OUT_NAME}").as_bytes(),
                ImageKind::Host,
            )?,
            other => {
                return Err(RuntimeError::invalid(format!(
                    "no copy kernel for the {other} backend"
                )))
            }
        };
        let functions = be
            .module_function(&module, COPY_IN_NAME)
            .and_then(|i| Ok([i, be.module_function(&module, COPY_OUT_NAME)?]));
        let functions = match functions {
            Ok(f) => f,
            Err(e) => {
                Teardown::new("a copy kernel without its functions")
                    .check("module_unload", be.module_unload(module));
                return Err(e.into());
            }
        };
        let sms = be.info().multiprocessor_count.max(1);
        Ok(CopyKernel {
            module: Some(module),
            functions,
            cap,
            max_grid: sms.saturating_mul(CTAS_PER_SM).clamp(1, 65535),
        })
    }

    /// Rows per direction.
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    pub(crate) fn function(&self, dir: usize) -> &B::Function {
        &self.functions[dir]
    }

    /// One CTA per row, at most [`CTAS_PER_SM`] per multiprocessor.
    pub(crate) fn config(&self, table: &Table) -> LaunchConfig {
        LaunchConfig {
            grid: [(table.rows as u32).clamp(1, self.max_grid), 1, 1],
            block: [BLOCK, 1, 1],
            ..Default::default()
        }
    }

    /// Enqueue (or capture) one run of direction `dir` over `table`.
    pub(crate) fn launch(
        &self,
        be: &B,
        dir: usize,
        table: &Table,
        stream: &B::Stream,
    ) -> Result<()> {
        be.launch(
            &self.functions[dir],
            &self.config(table),
            &[&table.bytes],
            stream,
        )?;
        Ok(())
    }

    /// Rewrite direction `dir`'s node `node` of `exec` with `table`.
    pub(crate) fn update(
        &self,
        be: &B,
        exec: &B::GraphExec,
        node: &B::GraphNode,
        dir: usize,
        table: &Table,
    ) -> Result<()> {
        be.graph_exec_kernel_update(
            exec,
            node,
            &self.functions[dir],
            &self.config(table),
            &[&table.bytes],
        )?;
        Ok(())
    }

    pub(crate) fn unload(mut self, be: &B) {
        if let Some(m) = self.module.take() {
            Teardown::new("the copy kernel").check("module_unload", be.module_unload(m));
        }
    }
}

/// A direction's table: the kernel parameter's bytes.
#[derive(Clone, Debug)]
pub(crate) struct Table {
    bytes: Vec<u8>,
    rows: usize,
}

impl Table {
    /// An empty table of `cap` rows.
    pub(crate) fn empty(cap: usize) -> Self {
        Table {
            bytes: vec![0; table_bytes(cap)],
            rows: 0,
        }
    }

    /// Fill with `copies` split into rows; `false` (and empty) when they
    /// need more rows than the table has.
    pub(crate) fn fill(&mut self, copies: &[CopyOp]) -> bool {
        let cap = (self.bytes.len() - TABLE_HEADER) / ENTRY_BYTES;
        let need: usize = copies.iter().map(|c| rows(c.2)).sum();
        self.rows = 0;
        if need <= cap {
            for &(d, s, n) in copies {
                let mut done = 0u64;
                loop {
                    let len = (n - done).min(ROW_BYTES);
                    let at = TABLE_HEADER + ENTRY_BYTES * self.rows;
                    let row = &mut self.bytes[at..at + ENTRY_BYTES];
                    row[..8].copy_from_slice(&d.offset(done).0.to_le_bytes());
                    row[8..16].copy_from_slice(&s.offset(done).0.to_le_bytes());
                    row[16..].copy_from_slice(&len.to_le_bytes());
                    self.rows += 1;
                    done += len;
                    if done >= n {
                        break;
                    }
                }
            }
        }
        self.bytes[..8].copy_from_slice(&(self.rows as u64).to_le_bytes());
        need <= cap
    }
}

/// Run the kernel outside any graph over `entries` (destinations must not
/// overlap), as many launches as the table needs, and wait for it: for
/// tests of the kernel itself.
pub fn run_copy_kernel<B: Backend>(be: &B, entries: &[CopyOp], stream: &B::Stream) -> Result<()> {
    let need = entries.iter().map(|c| rows(c.2)).sum();
    let k = CopyKernel::load(be, need)?;
    // No piece bigger than a whole table.
    let most = ROW_BYTES * k.capacity() as u64;
    let mut pieces = Vec::new();
    for &(d, s, n) in entries {
        if n == 0 {
            pieces.push((d, s, 0));
        }
        let mut done = 0;
        while done < n {
            let len = (n - done).min(most);
            pieces.push((d.offset(done), s.offset(done), len));
            done += len;
        }
    }
    let mut table = Table::empty(k.capacity());
    let r = (|| {
        let mut rest = &pieces[..];
        while !rest.is_empty() {
            let (mut n, mut used) = (0, 0);
            while n < rest.len() && used + rows(rest[n].2) <= k.capacity() {
                used += rows(rest[n].2);
                n += 1;
            }
            table.fill(&rest[..n]);
            k.launch(be, IN, &table, stream)?;
            rest = &rest[n..];
        }
        be.stream_synchronize(stream)?;
        Ok(())
    })();
    k.unload(be);
    r
}
