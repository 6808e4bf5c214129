// The VA-stable copy kernels on HIP (copykernel.rs: hip_source): the same table and semantics as the CUDA PTX
// there. The table is the kernel's by-value parameter (XLA_VMM_ROWS rows, defined by hip_source), rewritten in
// the instantiated graph when the step's copies change. Written with clang's AMDGPU builtins only (no HIP
// header), so hiprtc compiles it whatever headers it ships; an #else branch (CUDA's built-in variables) lets
// NVRTC compile it too, for the HIP test shim on NVIDIA (integration/hipshim). Unverified on AMD hardware; CI
// compiles it for several gfx targets (tests/hip_kernel_source.rs).
typedef unsigned long long xla_vmm_u64;
struct __attribute__((aligned(16))) xla_vmm_v16 { xla_vmm_u64 lo, hi; };

#ifndef XLA_VMM_ROWS
#error "XLA_VMM_ROWS (rows per table) must be defined"
#endif

struct xla_vmm_table {
  xla_vmm_u64 count, pad;
  xla_vmm_u64 rows[XLA_VMM_ROWS][3];  // (dst, src, bytes)
};

static __attribute__((device)) inline void xla_vmm_copy_rows(const xla_vmm_table& t) {
#if defined(__AMDGCN__)
  // Work-group and grid sizes from the dispatch packet (hsa_kernel_dispatch_packet_t: workgroup_size_x is
  // the u16 at byte 4, grid_size_x, in work-items, the u32 at byte 12).
  const unsigned char* packet = (const unsigned char*)__builtin_amdgcn_dispatch_ptr();
  const unsigned block = *(const unsigned short*)(packet + 4);
  const unsigned groups = *(const unsigned*)(packet + 12) / block;
  const unsigned tid = __builtin_amdgcn_workitem_id_x();
  const unsigned group = __builtin_amdgcn_workgroup_id_x();
#else
  // NVIDIA compilers (NVRTC: the HIP test shim integration/hipshim compiles this with it): CUDA's built-in
  // variables, no header needed.
  const unsigned block = blockDim.x;
  const unsigned groups = gridDim.x;
  const unsigned tid = threadIdx.x;
  const unsigned group = blockIdx.x;
#endif
  for (xla_vmm_u64 r = group; r < t.count; r += groups) {
    unsigned char* dst = (unsigned char*)t.rows[r][0];
    const unsigned char* src = (const unsigned char*)t.rows[r][1];
    const xla_vmm_u64 n = t.rows[r][2];
    const xla_vmm_u64 vec = ((((xla_vmm_u64)dst | (xla_vmm_u64)src) & 15) == 0) ? (n >> 4) : 0;
    for (xla_vmm_u64 i = tid; i < vec; i += block) ((xla_vmm_v16*)dst)[i] = ((const xla_vmm_v16*)src)[i];
    for (xla_vmm_u64 i = vec * 16 + tid; i < n; i += block) dst[i] = src[i];
  }
}

// One entry per direction, so each graph node is found by the kernel it launches.
extern "C" __attribute__((global)) void xla_vmm_copy_in(const xla_vmm_table t) { xla_vmm_copy_rows(t); }
extern "C" __attribute__((global)) void xla_vmm_copy_out(const xla_vmm_table t) { xla_vmm_copy_rows(t); }
