// The VA-stable copy kernel on HIP (copykernel.rs: COPY_KERNEL_HIP): the same table and semantics as the CUDA
// PTX there. Written with clang's AMDGPU builtins only (no HIP header), so hiprtc compiles it whatever headers
// it ships. Unverified on AMD hardware; CI compiles it for several gfx targets (tests/hip_kernel_source.rs).
typedef unsigned long long xla_vmm_u64;
struct __attribute__((aligned(16))) xla_vmm_v16 { xla_vmm_u64 lo, hi; };

static __attribute__((device)) inline void xla_vmm_sync() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// The host rewrites the table between launches: read it at system scope (never a stale cached line).
static __attribute__((device)) inline xla_vmm_u64 xla_vmm_load(const xla_vmm_u64* p) {
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}

extern "C" __attribute__((global)) void xla_vmm_copy_table(const xla_vmm_u64* table) {
  __attribute__((shared)) xla_vmm_u64 row[4];
  // Work-group and grid sizes from the dispatch packet (hsa_kernel_dispatch_packet_t: workgroup_size_x is
  // the u16 at byte 4, grid_size_x, in work-items, the u32 at byte 12).
  const unsigned char* packet = (const unsigned char*)__builtin_amdgcn_dispatch_ptr();
  const unsigned block = *(const unsigned short*)(packet + 4);
  const unsigned groups = *(const unsigned*)(packet + 12) / block;
  const unsigned tid = __builtin_amdgcn_workitem_id_x();
  if (tid == 0) row[3] = xla_vmm_load(&table[0]);
  xla_vmm_sync();
  const xla_vmm_u64 count = row[3];
  for (xla_vmm_u64 r = __builtin_amdgcn_workgroup_id_x(); r < count; r += groups) {
    if (tid < 3) row[tid] = xla_vmm_load(&table[2 + 3 * r + tid]);
    xla_vmm_sync();
    unsigned char* dst = (unsigned char*)row[0];
    const unsigned char* src = (const unsigned char*)row[1];
    const xla_vmm_u64 n = row[2];
    xla_vmm_sync();  // every thread holds the row before threads 0..2 load the next one
    const xla_vmm_u64 vec = ((((xla_vmm_u64)dst | (xla_vmm_u64)src) & 15) == 0) ? (n >> 4) : 0;
    for (xla_vmm_u64 i = tid; i < vec; i += block) ((xla_vmm_v16*)dst)[i] = ((const xla_vmm_v16*)src)[i];
    for (xla_vmm_u64 i = vec * 16 + tid; i < n; i += block) dst[i] = src[i];
  }
}
