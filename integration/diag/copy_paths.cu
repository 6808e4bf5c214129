// Where does the VA-stable copy path's time go? A diagnostic (not a test), built with nvcc on the GPU
// machine by integration/diag/copy_paths.sh:
//     nvcc -O2 -arch=sm_90 -o copy_paths copy_paths.cu -lcuda && ./copy_paths
// Its first run (integration/results/perf_baseline_a14eaf4.md) timed the runtime's copy kernel of then,
// which read its table from pinned host memory; `table_kernel` below is that kernel's algorithm in CUDA C
// (the PTX itself was replaced since by the parameter-table kernel, which `copy_param` mirrors), so this
// file no longer reads the runtime's source. Every variant is a graph of N_WORK tiny store kernels (a
// stand-in for a step's kernels), alone or with a copy stage before and after it, replayed:
//   * "sync": launch + wait for each replay (what a blocking step pays), median over REPS;
//   * "pipelined": REPS replays back to back between two events, per replay (what an async loop pays).
// Copy stages compared:
//   host-table   the zero-copy design: a kernel reading its descriptor table from pinned, mapped host memory
//   dev-table    the same kernel reading the table from device memory
//   param-table  a kernel whose table is its by-value parameter (4 KiB), updated per replay with
//                cuGraphExecKernelNodeSetParams (no memory read to find the rows): the runtime's design now
//   batch        cuMemcpyBatchAsync before and after the graph launch (the batched driver copies)
// Each with 0 rows and with ROWS small copies (256 B each), and the host-table kernel at grid 1.
// Prints one Markdown table; every number is microseconds.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)
#define CD(x)                                                                                   \
  do {                                                                                          \
    CUresult r_ = (x);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                   \
      const char* s_ = nullptr;                                                                 \
      cuGetErrorString(r_, &s_);                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?");            \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

static const int N_WORK = 20;
static const int REPS = 200;
static const int ROWS = 16;
static const int PARAM_ROWS = 168;  // (4096 - 16) / 24

struct ParamTable {
  unsigned long long count, pad;
  unsigned long long rows[PARAM_ROWS][3];
};

__global__ void store(unsigned* p, unsigned v) { p[threadIdx.x] = v; }

// The zero-copy table kernel: thread 0 reads the row count (volatile: the host rewrites the table), rows
// spread over the CTAs, each row copied by its CTA. Table: [count, 0] then rows (dst, src, bytes).
__global__ void table_kernel(const unsigned long long* table) {
  __shared__ unsigned long long row[4];
  if (threadIdx.x == 0) row[3] = *(const volatile unsigned long long*)table;
  __syncthreads();
  const unsigned long long count = row[3];
  for (unsigned long long r = blockIdx.x; r < count; r += gridDim.x) {
    if (threadIdx.x < 3) row[threadIdx.x] = ((const volatile unsigned long long*)table)[2 + 3 * r + threadIdx.x];
    __syncthreads();
    unsigned char* dst = (unsigned char*)row[0];
    const unsigned char* src = (const unsigned char*)row[1];
    unsigned long long n = row[2];
    __syncthreads();
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
  }
}

__global__ void copy_param(ParamTable t) {
  __shared__ unsigned long long row[3];
  for (unsigned long long r = blockIdx.x; r < t.count; r += gridDim.x) {
    if (threadIdx.x < 3) row[threadIdx.x] = t.rows[r][threadIdx.x];
    __syncthreads();
    unsigned char* dst = (unsigned char*)row[0];
    const unsigned char* src = (const unsigned char*)row[1];
    unsigned long long n = row[2];
    __syncthreads();
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
  }
}

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Ctx {
  cudaStream_t s;
  unsigned* work;
  unsigned char *src, *dst;
  unsigned long long *host_table, *host_table_dev, *dev_table;
  int sms;
};

// Fill a table (count then rows of dst, src, bytes) with `rows` copies of 256 B.
static void fill(unsigned long long* t, const Ctx& c, int rows) {
  t[0] = rows;
  t[1] = 0;
  for (int i = 0; i < rows; i++) {
    t[2 + 3 * i] = (unsigned long long)(c.dst + 256 * i);
    t[3 + 3 * i] = (unsigned long long)(c.src + 256 * i);
    t[4 + 3 * i] = 256;
  }
}

static void launch_table(const Ctx& c, unsigned long long* table, unsigned grid) {
  table_kernel<<<grid, 256, 0, c.s>>>(table);
}

enum Stage { NONE, HOST_TABLE, HOST_TABLE_GRID1, DEV_TABLE, PARAM_TABLE, BATCH };

struct Built {
  cudaGraphExec_t exec;
  cudaGraphNode_t param_nodes[2];
};

static Built build(Ctx& c, Stage st, ParamTable* pt) {
  Built b{};
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(c.s, cudaStreamCaptureModeThreadLocal));
  auto stage = [&](int k) {
    switch (st) {
      case HOST_TABLE: launch_table(c, c.host_table_dev, c.sms * 4); break;
      case HOST_TABLE_GRID1: launch_table(c, c.host_table_dev, 1); break;
      case DEV_TABLE: launch_table(c, c.dev_table, c.sms * 4); break;
      case PARAM_TABLE: copy_param<<<c.sms * 4, 256, 0, c.s>>>(*pt); break;
      default: break;
    }
  };
  stage(0);
  for (int i = 0; i < N_WORK; i++) store<<<1, 32, 0, c.s>>>(c.work, i);
  stage(1);
  CK(cudaStreamEndCapture(c.s, &g));
  if (st == PARAM_TABLE) {
    // The copy nodes, found by their kernel (both get the same table in this bench).
    size_t count = 0;
    CK(cudaGraphGetNodes(g, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    CK(cudaGraphGetNodes(g, nodes.data(), &count));
    int k = 0;
    for (cudaGraphNode_t nd : nodes) {
      cudaGraphNodeType t;
      CK(cudaGraphNodeGetType(nd, &t));
      if (t != cudaGraphNodeTypeKernel) continue;
      cudaKernelNodeParams kp{};
      CK(cudaGraphKernelNodeGetParams(nd, &kp));
      if (kp.func == (void*)copy_param && k < 2) b.param_nodes[k++] = nd;
    }
    if (k != 2) { std::fprintf(stderr, "found %d copy nodes\n", k); std::exit(1); }
  }
  CK(cudaGraphInstantiate(&b.exec, g, 0));
  CK(cudaGraphUpload(b.exec, c.s));
  CK(cudaStreamSynchronize(c.s));
  return b;
}

static void batch_copies(Ctx& c, int rows) {
  if (rows == 0) return;
  std::vector<CUdeviceptr> d(rows), s(rows);
  std::vector<size_t> n(rows, 256);
  for (int i = 0; i < rows; i++) {
    d[i] = (CUdeviceptr)(c.dst + 256 * i);
    s[i] = (CUdeviceptr)(c.src + 256 * i);
  }
  CUmemcpyAttributes attr;
  std::memset(&attr, 0, sizeof attr);
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  attr.srcLocHint.type = CU_MEM_LOCATION_TYPE_DEVICE;
  attr.srcLocHint.id = 0;
  attr.dstLocHint = attr.srcLocHint;
  size_t idx = 0;
  CD(cuMemcpyBatchAsync(d.data(), s.data(), n.data(), rows, &attr, &idx, 1, (CUstream)c.s));
}

struct Result {
  double sync_us, pipe_us, host_us;
};

static Result time_variant(Ctx& c, Stage st, int rows) {
  ParamTable pt;
  std::memset(&pt, 0, sizeof pt);
  fill(c.host_table, c, rows);
  CK(cudaMemcpy(c.dev_table, c.host_table, 16 + 24 * ROWS, cudaMemcpyHostToDevice));
  if (st == PARAM_TABLE) {
    pt.count = rows;
    for (int i = 0; i < rows; i++) {
      pt.rows[i][0] = (unsigned long long)(c.dst + 256 * i);
      pt.rows[i][1] = (unsigned long long)(c.src + 256 * i);
      pt.rows[i][2] = 256;
    }
  }
  Built b = build(c, st, &pt);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto step = [&](int i) {
    if (st == PARAM_TABLE) {
      // What a step whose copies changed pays: both tables rewritten.
      pt.rows[0][2] = 256 - (i & 1);
      void* args[] = {&pt};
      cudaKernelNodeParams p{};
      p.func = (void*)copy_param;
      p.gridDim = dim3(c.sms * 4);
      p.blockDim = dim3(256);
      p.kernelParams = args;
      CK(cudaGraphExecKernelNodeSetParams(b.exec, b.param_nodes[0], &p));
      CK(cudaGraphExecKernelNodeSetParams(b.exec, b.param_nodes[1], &p));
    }
    if (st == BATCH) batch_copies(c, rows);
    CK(cudaGraphLaunch(b.exec, c.s));
    if (st == BATCH) batch_copies(c, rows);
  };
  for (int i = 0; i < 20; i++) step(i);
  CK(cudaStreamSynchronize(c.s));
  std::vector<double> sync, host;
  for (int i = 0; i < REPS; i++) {
    double t = now_us();
    CK(cudaEventRecord(e0, c.s));
    step(i);
    CK(cudaEventRecord(e1, c.s));
    host.push_back(now_us() - t);
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    sync.push_back(ms * 1e3);
  }
  CK(cudaEventRecord(e0, c.s));
  for (int i = 0; i < REPS; i++) step(i);
  CK(cudaEventRecord(e1, c.s));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  // Check the copies landed (the last replay's values).
  if (rows > 0) {
    std::vector<unsigned char> a(256 * rows), bb(256 * rows);
    CK(cudaMemcpy(a.data(), c.dst, a.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(bb.data(), c.src, bb.size(), cudaMemcpyDeviceToHost));
    size_t n = a.size() - (st == PARAM_TABLE ? 1 : 0);
    if (std::memcmp(a.data(), bb.data(), n) != 0) std::printf("WARNING: copies did not land (stage %d)\n", st);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaGraphExecDestroy(b.exec));
  return {median(sync), ms * 1e3 / REPS, median(host)};
}

int main() {
  Ctx c{};
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  CK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
  CK(cudaMalloc(&c.work, 4096));
  CK(cudaMalloc(&c.src, 1 << 20));
  CK(cudaMalloc(&c.dst, 1 << 20));
  CK(cudaMemset(c.src, 7, 1 << 20));
  CK(cudaHostAlloc(&c.host_table, 4096, cudaHostAllocPortable | cudaHostAllocMapped));
  CK(cudaHostGetDevicePointer(&c.host_table_dev, c.host_table, 0));
  CK(cudaMalloc(&c.dev_table, 4096));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs; graph of %d store kernels; %d replays; copies of 256 B\n", prop.name, c.sms,
              N_WORK, REPS);
  std::printf("\n| copy stage | rows | sync µs (launch+wait, median) | pipelined µs/replay | host µs to enqueue |\n");
  std::printf("|---|---|---|---|---|\n");
  struct V { const char* name; Stage st; int rows; };
  V vs[] = {{"none", NONE, 0},
            {"host-table", HOST_TABLE, 0},         {"host-table", HOST_TABLE, ROWS},
            {"host-table grid 1", HOST_TABLE_GRID1, 0},
            {"dev-table", DEV_TABLE, 0},           {"dev-table", DEV_TABLE, ROWS},
            {"param-table (+2 SetParams)", PARAM_TABLE, 0}, {"param-table (+2 SetParams)", PARAM_TABLE, ROWS},
            {"batch", BATCH, 0},                   {"batch", BATCH, ROWS}};
  for (const V& v : vs) {
    Result r = time_variant(c, v.st, v.rows);
    std::printf("| %s | %d | %.1f | %.1f | %.1f |\n", v.name, v.rows, r.sync_us, r.pipe_us, r.host_us);
    std::fflush(stdout);
  }
  return 0;
}
