// XLA's select_k thunk and its TopK custom kernel on our runtime (selectk.rs): for each row of a [batch, n]
// input, the k largest elements in descending order and their indices. Elements are ordered by an unsigned key
// and equal keys come lowest index first, so the result is one well-defined answer (what a stable top-k
// returns). Keys: select_k's total order on floats (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN; equal
// keys are identical bits) and u64 as unsigned; the TopK kernel's float comparison (xv_f32_float_order).
//
// One block per row, XV_BLOCK threads:
//   1. radix select of the k-th largest key T, 8 bits a pass from the top (a 256-bin histogram of the keys that
//      match the digits found so far); it leaves `need`, how many elements equal to T belong to the top k;
//   2. one ordered pass (a block-wide scan per chunk keeps index order): every key > T goes to the front
//      in index order, the first `need` keys == T (lowest indices) to the last `need` slots;
//   3. the keys > T (fewer than k) are sorted in place by rank, (key desc, position asc).
// No scratch memory: the outputs are the only memory written. Launch: grid (batch, 1, 1), block
// (XV_BLOCK, 1, 1), no dynamic shared memory; k <= n and k <= XV_BLOCK * XV_SORT_PER_THREAD (selectk.rs checks).
//
// One source for every compiler, built with compiler builtins only (no CUDA or HIP headers):
//   - CUDA: clang's CUDA front end makes selectk.ptx from it (the command is in selectk.rs; CI checks the
//     committed PTX is what this source gives);
//   - HIP: hiprtc compiles it on the device (AMDGPU builtins branch; unverified on AMD hardware; CI compiles it
//     for several gfx targets);
//   - NVRTC (the HIP test shim on NVIDIA): CUDA's built-in variables and atomics;
//   - CPU threads (XV_EMULATE: tests/selectk_emulated.cpp runs it against a stable sort in CI).
typedef unsigned int xv_u32;
typedef unsigned short xv_u16;
typedef unsigned long long xv_u64;

#define XV_BLOCK 1024
#define XV_PER_THREAD 8
#define XV_SORT_PER_THREAD 8

#if defined(XV_EMULATE)
// On CPU threads, one block at a time (tests/selectk_emulated.cpp defines the xv_ functions below first).
#define XV_DEV static inline
#define XV_SHARED static
#define XV_KERNEL extern "C" void
#elif defined(__CUDACC_RTC__)
#define XV_DEV static __attribute__((device)) inline
#define XV_SHARED __shared__
#define XV_KERNEL extern "C" __global__ __launch_bounds__(XV_BLOCK) void
#else
#define XV_DEV static __attribute__((device)) inline
#define XV_SHARED __attribute__((shared))
#define XV_KERNEL extern "C" __attribute__((global)) __attribute__((launch_bounds(XV_BLOCK))) void
#endif

#if defined(XV_EMULATE)
#elif defined(__AMDGCN__)
XV_DEV xv_u32 xv_tid() { return __builtin_amdgcn_workitem_id_x(); }
XV_DEV xv_u32 xv_row() { return __builtin_amdgcn_workgroup_id_x(); }
XV_DEV xv_u32 xv_block() {
  // workgroup_size_x: the u16 at byte 4 of the dispatch packet (hsa_kernel_dispatch_packet_t).
  return *(const xv_u16*)((const unsigned char*)__builtin_amdgcn_dispatch_ptr() + 4);
}
XV_DEV void xv_sync() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
XV_DEV void xv_count(xv_u32* bin) { __atomic_fetch_add(bin, 1u, __ATOMIC_RELAXED); }
#else
XV_DEV xv_u32 xv_tid() { return threadIdx.x; }
XV_DEV xv_u32 xv_row() { return blockIdx.x; }
XV_DEV xv_u32 xv_block() { return blockDim.x; }
XV_DEV void xv_sync() { __syncthreads(); }
#if defined(__CUDACC_RTC__)
XV_DEV void xv_count(xv_u32* bin) { atomicAdd(bin, 1u); }
#else
XV_DEV void xv_count(xv_u32* bin) { __nvvm_atom_add_gen_i((int*)bin, 1); }
#endif
#endif

// Keys: unsigned, larger = earlier in the output.
struct xv_f32 {
  typedef xv_u32 bits;
  enum { BITS = 32 };
  XV_DEV xv_u64 key(xv_u32 b) { return (b & 0x80000000u) ? (xv_u64)(xv_u32)~b : (xv_u64)(b | 0x80000000u); }
};
struct xv_bf16 {
  typedef xv_u16 bits;
  enum { BITS = 16 };
  XV_DEV xv_u64 key(xv_u16 b) { return (b & 0x8000u) ? (xv_u64)(xv_u16)~b : (xv_u64)(xv_u16)(b | 0x8000u); }
};
// XLA's TopK custom kernel order (topk_k<K>_float_*): float comparison, so -0 and +0 are equal keys (lowest
// index first) and NaN is below every number.
struct xv_f32_float_order {
  typedef xv_u32 bits;
  enum { BITS = 32 };
  XV_DEV xv_u64 key(xv_u32 b) {
    const xv_u32 a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return 0;
    return xv_f32::key(a == 0 ? 0u : b);
  }
};
struct xv_u64key {
  typedef xv_u64 bits;
  enum { BITS = 64 };
  XV_DEV xv_u64 key(xv_u64 b) { return b; }
};

template <class K>
XV_DEV void xv_select_k(const typename K::bits* in, typename K::bits* vals, xv_u32* idx, xv_u32 n, xv_u32 k) {
  typedef typename K::bits bits;
  XV_SHARED xv_u32 hist[256];
  XV_SHARED xv_u32 scan[XV_BLOCK];
  XV_SHARED xv_u64 s_prefix;
  XV_SHARED xv_u32 s_need;
  const xv_u32 tid = xv_tid();
  const xv_u32 block = xv_block();
  const xv_u64 row = xv_row();
  in += row * n;
  vals += row * k;
  idx += row * k;

  // 1. Radix select. Invariant: at least `need` keys match `prefix` on the bits of `mask`.
  xv_u64 prefix = 0, mask = 0;
  xv_u32 need = k;
  for (int shift = K::BITS - 8; shift >= 0; shift -= 8) {
    for (xv_u32 d = tid; d < 256; d += block) hist[d] = 0;
    xv_sync();
    for (xv_u32 i = tid; i < n; i += block) {
      const xv_u64 key = K::key(in[i]);
      if ((key & mask) == prefix) xv_count(&hist[(key >> shift) & 255]);
    }
    xv_sync();
    if (tid == 0) {
      xv_u32 above = 0;
      int d = 255;
      for (; d > 0; --d) {
        if (above + hist[d] >= need) break;
        above += hist[d];
      }
      s_prefix = prefix | ((xv_u64)d << shift);
      s_need = need - above;
    }
    xv_sync();
    prefix = s_prefix;
    need = s_need;
    mask |= (xv_u64)255 << shift;
  }
  const xv_u64 t = prefix;
  const xv_u32 above_total = k - need;  // keys > t

  // 2. Ordered pass: thread `tid` takes XV_PER_THREAD consecutive elements of each chunk; one scan gives every
  // thread where its keys go (above t in the low 16 bits, equal to t in the high 16: a chunk has < 65536).
  xv_u32 above_base = 0, equal_base = 0;
  for (xv_u32 start = 0; start < n; start += block * XV_PER_THREAD) {
    const xv_u32 first = start + tid * XV_PER_THREAD;
    xv_u32 mine = 0;
    for (xv_u32 e = 0; e < XV_PER_THREAD; ++e) {
      const xv_u32 i = first + e;
      if (i < n) {
        const xv_u64 key = K::key(in[i]);
        mine += key > t ? 1u : (key == t ? 0x10000u : 0u);
      }
    }
    scan[tid] = mine;
    xv_sync();
    for (xv_u32 off = 1; off < block; off <<= 1) {
      const xv_u32 v = tid >= off ? scan[tid - off] : 0u;
      xv_sync();
      scan[tid] += v;
      xv_sync();
    }
    const xv_u32 before = scan[tid] - mine;
    const xv_u32 chunk = scan[block - 1];
    xv_u32 a = above_base + (before & 0xffffu);
    xv_u32 q = equal_base + (before >> 16);
    for (xv_u32 e = 0; e < XV_PER_THREAD; ++e) {
      const xv_u32 i = first + e;
      if (i < n) {
        const bits b = in[i];
        const xv_u64 key = K::key(b);
        if (key > t) {
          vals[a] = b;
          idx[a] = i;
          ++a;
        } else if (key == t) {
          if (q < need) {
            vals[above_total + q] = b;
            idx[above_total + q] = i;
          }
          ++q;
        }
      }
    }
    above_base += chunk & 0xffffu;
    equal_base += chunk >> 16;
    xv_sync();  // scan[] is reused; the writes above are seen by the sort below
    if (above_base >= above_total && equal_base >= need) break;  // the same for every thread
  }

  // 3. Sort the keys above t (in index order now) by rank: larger keys first, equal keys keep their order.
  bits v[XV_SORT_PER_THREAD];
  xv_u32 ix[XV_SORT_PER_THREAD];
  xv_u32 rank[XV_SORT_PER_THREAD];
  xv_u32 m = 0;
  for (xv_u32 c = tid; c < above_total && m < XV_SORT_PER_THREAD; c += block, ++m) {
    const bits bc = vals[c];
    const xv_u64 kc = K::key(bc);
    xv_u32 r = 0;
    for (xv_u32 j = 0; j < above_total; ++j) {
      const xv_u64 kj = K::key(vals[j]);
      r += (kj > kc || (kj == kc && j < c)) ? 1u : 0u;
    }
    v[m] = bc;
    ix[m] = idx[c];
    rank[m] = r;
  }
  xv_sync();
  for (xv_u32 q = 0; q < m; ++q) {
    vals[rank[q]] = v[q];
    idx[rank[q]] = ix[q];
  }
}

#define XV_ENTRY(NAME, K)                                                                          \
  XV_KERNEL NAME(const K::bits* in, K::bits* vals, xv_u32* idx, xv_u32 n, xv_u32 k) {              \
    xv_select_k<K>(in, vals, idx, n, k);                                                           \
  }
XV_ENTRY(xla_vmm_select_k_f32, xv_f32)
XV_ENTRY(xla_vmm_select_k_bf16, xv_bf16)
XV_ENTRY(xla_vmm_select_k_u64, xv_u64key)
XV_ENTRY(xla_vmm_top_k_f32, xv_f32_float_order)
