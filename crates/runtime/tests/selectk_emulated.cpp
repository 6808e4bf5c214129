// The select_k kernel (src/selectk.cu) run on CPU threads, one thread per GPU thread and a std::barrier for
// the block's barriers, against a stable sort of each row (tests/selectk_kernel.rs builds and runs this).
// Exercises the kernel's own code: radix select, the ordered pass and its scan, the rank sort, for f32, bf16
// (both orders) and u64 keys with ties, signed zeros, infinities and NaNs, and block sizes that are not powers of two.
// Prints "ok <cases>" and exits 0, or names the first case that differs and exits 1.
#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

static thread_local unsigned t_tid;
static unsigned g_row, g_block;
static std::barrier<>* g_barrier;

#define XV_EMULATE
static inline unsigned xv_tid() { return t_tid; }
static inline unsigned xv_row() { return g_row; }
static inline unsigned xv_block() { return g_block; }
static inline void xv_sync() { g_barrier->arrive_and_wait(); }
static inline void xv_count(unsigned* bin) { __atomic_fetch_add(bin, 1u, __ATOMIC_RELAXED); }
#include "../src/selectk.cu"

template <class K>
static uint64_t key_of(typename K::bits b) { return K::key(b); }

// One launch: grid (batch), block (block).
template <class K, class F>
static void launch(F kernel, const std::vector<typename K::bits>& in, std::vector<typename K::bits>& vals,
                   std::vector<unsigned>& idx, unsigned batch, unsigned n, unsigned k, unsigned block) {
  for (unsigned row = 0; row < batch; ++row) {
    g_row = row;
    g_block = block;
    std::barrier<> bar(block);
    g_barrier = &bar;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; ++t)
      threads.emplace_back([&, t] {
        t_tid = t;
        kernel(in.data(), vals.data(), idx.data(), n, k);
      });
    for (auto& th : threads) th.join();
  }
}

template <class K, class F>
static bool check(const char* type, F kernel, std::mt19937_64& rng, unsigned batch, unsigned n, unsigned k,
                  unsigned block, const std::vector<typename K::bits>& pool) {
  typedef typename K::bits bits;
  std::vector<bits> in(size_t(batch) * n);
  for (auto& x : in) x = pool[rng() % pool.size()];
  std::vector<bits> vals(size_t(batch) * k, 0);
  std::vector<unsigned> idx(size_t(batch) * k, ~0u);
  launch<K>(kernel, in, vals, idx, batch, n, k, block);
  for (unsigned r = 0; r < batch; ++r) {
    std::vector<unsigned> order(n);
    for (unsigned i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](unsigned a, unsigned b) {
      return key_of<K>(in[size_t(r) * n + a]) > key_of<K>(in[size_t(r) * n + b]);
    });
    for (unsigned j = 0; j < k; ++j) {
      const unsigned want = order[j];
      const size_t at = size_t(r) * k + j;
      if (idx[at] != want || vals[at] != in[size_t(r) * n + want]) {
        std::printf("%s batch %u n %u k %u block %u: row %u slot %u has index %u, the stable order %u\n", type,
                    batch, n, k, block, r, j, idx[at], want);
        return false;
      }
    }
  }
  return true;
}

static uint32_t f32_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

int main() {
  std::mt19937_64 rng(12);
  // Pools: few values (many ties), or many (few ties).
  std::vector<uint32_t> f32_few = {f32_bits(0.0f), f32_bits(-0.0f), f32_bits(1.0f), f32_bits(-1.0f),
                                   f32_bits(3.5f), 0x7f800000u /* +inf */, 0xff800000u /* -inf */,
                                   0x7fc00000u /* +NaN */, 0xffc00000u /* -NaN */, f32_bits(1e-40f)};
  std::vector<uint32_t> f32_many;
  for (int i = 0; i < 5000; ++i) f32_many.push_back(uint32_t(rng()));
  std::vector<uint16_t> bf16_few = {0x0000, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fc0, 0x4040};
  std::vector<uint16_t> bf16_many;
  for (int i = 0; i < 3000; ++i) bf16_many.push_back(uint16_t(rng()));
  std::vector<unsigned long long> u64_few = {0, 1, ~0ull, 1ull << 63, 42, (1ull << 63) | 7};
  std::vector<unsigned long long> u64_many;
  for (int i = 0; i < 5000; ++i) u64_many.push_back(rng());

  struct Shape {
    unsigned batch, n, k, block;
  };
  // Block sizes below XV_BLOCK keep the thread count down; k stays within 8 per thread of the block.
  const Shape shapes[] = {{3, 20, 3, 32},     {2, 20, 20, 64},    {1, 1, 1, 32},      {2, 2000, 8, 96},
                          {1, 1024, 13, 256}, {2, 5000, 64, 128}, {1, 3000, 500, 64}, {1, 20000, 9, 1024},
                          {4, 700, 1, 33},    {1, 9000, 256, 1024}};
  int cases = 0;
  for (const Shape& s : shapes) {
    for (int many = 0; many < 2; ++many) {
      bool ok = check<xv_f32>("f32", xla_vmm_select_k_f32, rng, s.batch, s.n, s.k, s.block,
                              many ? f32_many : f32_few) &&
                check<xv_bf16>("bf16", xla_vmm_select_k_bf16, rng, s.batch, s.n, s.k, s.block,
                               many ? bf16_many : bf16_few) &&
                check<xv_u64key>("u64", xla_vmm_select_k_u64, rng, s.batch, s.n, s.k, s.block,
                                 many ? u64_many : u64_few) &&
                check<xv_f32_float_order>("f32 (TopK kernel order)", xla_vmm_top_k_f32, rng, s.batch, s.n, s.k,
                                          s.block, many ? f32_many : f32_few);
      if (!ok) return 1;
      cases += 4;
    }
  }
  std::printf("ok %d\n", cases);
  return 0;
}
