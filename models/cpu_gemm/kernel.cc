// Small-M fp32 matrix products for XLA:CPU, registered through jax.ffi.
//
// y[M, N] = x[M, K] @ w      with w stored [K, N] ("nn", every nnx.Linear kernel)
// y[M, N] = x[M, K] @ w^T    with w stored [N, K] ("nt", the tied embedding as LM head)
//
// For M = 1..64 rows (a decode step or a verify block), XLA:CPU's M >= 2 path re-reads the weights;
// these kernels read every weight once, in address order, and do the M products from registers and
// L1, so a block of T tokens costs about one pass over the weights until the FMAs catch up.
// Work is split over XLA's intra-op thread pool; the calling thread claims chunks too, so a busy
// pool only makes it slower, never deadlocks. Summation order differs from XLA's: results agree to
// fp32 rounding.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#if defined(__AVX512F__)
constexpr int VL = 16;
#elif defined(__AVX__)
constexpr int VL = 8;
#else
constexpr int VL = 4;
#endif
constexpr int MB = 4;   // rows of x per register block
typedef float vf __attribute__((vector_size(VL * 4), aligned(4)));

inline vf load(const float* p) { return *reinterpret_cast<const vf*>(p); }
inline void store(float* p, vf v) { *reinterpret_cast<vf*>(p) = v; }
inline float hsum(vf v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(reinterpret_cast<__m512>(v));
#elif defined(__AVX__)
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(reinterpret_cast<__m256>(v)),
                         _mm256_extractf128_ps(reinterpret_cast<__m256>(v), 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  return _mm_cvtss_f32(_mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1)));
#else
  float s = 0.f;
  for (int i = 0; i < VL; ++i) s += v[i];
  return s;
#endif
}

// ---- nn: y_part = x[:, k0:k1] @ w[k0:k1, :] ------------------------------------------------
// A k-block of KB rows of w is walked in panels of PW columns; each panel's R x PW outputs stay in
// registers across the KB rows, so y is touched once per k-block and w is read once overall.
// Threads split K (each a contiguous slab of rows); their partial sums are added at the end.

constexpr int NV = VL == 16 ? 4 : 2;   // vectors per panel (register budget: R * NV + NV + 1)
constexpr int PW = NV * VL;
constexpr int KB = 16;
constexpr int LINE = VL * 4 >= 64 ? 1 : 64 / (VL * 4);   // vectors per 64-byte cache line

template <int R>
void nn_panel(const float* x, int64_t K, const float* w, int64_t N, float* y, int64_t kb,
              bool first) {
  vf acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = first ? vf{} : load(y + r * N + j * VL);
  for (int64_t k = 0; k < kb; ++k) {
    vf a[NV];
    for (int j = 0; j < NV; ++j) a[j] = load(w + k * N + j * VL);
    // Software prefetch of this panel one k-block ahead: the hardware prefetchers alone do not
    // run far enough ahead once the FMAs take longer than the loads (T >= 2; measured: T=4
    // 1.33x -> 1.08x a T=1 step). Past the end of w it is a no-op.
    for (int j = 0; j < NV; j += LINE) __builtin_prefetch(w + (k + KB) * N + j * VL);
    for (int r = 0; r < R; ++r) {
      vf xb = vf{} + x[r * K + k];
      for (int j = 0; j < NV; ++j) acc[r][j] += xb * a[j];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) store(y + r * N + j * VL, acc[r][j]);
}

template <int R>
void nn_tail(const float* x, int64_t K, const float* w, int64_t N, float* y, int64_t kb,
             bool first, int64_t n0) {
  for (int r = 0; r < R; ++r)
    for (int64_t n = n0; n < N; ++n) {
      float acc = first ? 0.f : y[r * N + n];
      for (int64_t k = 0; k < kb; ++k) acc += x[r * K + k] * w[k * N + n];
      y[r * N + n] = acc;
    }
}

template <int R>
void nn_rows(const float* x, int64_t K, const float* w, int64_t N, float* y, int64_t kb,
             bool first) {
  int64_t n = 0;
  for (; n + PW <= N; n += PW) nn_panel<R>(x, K, w + n, N, y + n, kb, first);
  if (n < N) nn_tail<R>(x, K, w, N, y, kb, first, n);
}

void nn_krange(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N,
               int64_t k0, int64_t k1) {
  for (int64_t k = k0; k < k1; k += KB) {
    int64_t kb = std::min<int64_t>(KB, k1 - k);
    bool first = k == k0;
    const float* xk = x + k;
    const float* wk = w + k * N;
    int64_t m = 0;
    for (; m + MB <= M; m += MB) nn_rows<MB>(xk + m * K, K, wk, N, y + m * N, kb, first);
    switch (M - m) {
      case 3: nn_rows<3>(xk + m * K, K, wk, N, y + m * N, kb, first); break;
      case 2: nn_rows<2>(xk + m * K, K, wk, N, y + m * N, kb, first); break;
      case 1: nn_rows<1>(xk + m * K, K, wk, N, y + m * N, kb, first); break;
      default: break;
    }
  }
  if (k1 <= k0) std::fill(y, y + M * N, 0.f);
}

// ---- nt: y[:, n0:n1] = x @ w[n0:n1, :]^T, four rows of w against R rows of x ------------------

template <int R, int C>
void nt_block(const float* x, int64_t K, const float* w, int64_t N, float* y, int64_t n) {
  vf acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = vf{};
  int64_t k = 0;
  for (; k + VL <= K; k += VL) {
    vf a[C];
    for (int c = 0; c < C; ++c) a[c] = load(w + (n + c) * K + k);
    for (int r = 0; r < R; ++r) {
      vf xv = load(x + r * K + k);
      for (int c = 0; c < C; ++c) acc[r][c] += xv * a[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t kk = k; kk < K; ++kk) s += x[r * K + kk] * w[(n + c) * K + kk];
      y[r * N + n + c] = s;
    }
}

template <int C>
void nt_rows(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y,
             int64_t n) {
  int64_t m = 0;
  for (; m + MB <= M; m += MB) nt_block<MB, C>(x + m * K, K, w, N, y + m * N, n);
  switch (M - m) {
    case 3: nt_block<3, C>(x + m * K, K, w, N, y + m * N, n); break;
    case 2: nt_block<2, C>(x + m * K, K, w, N, y + m * N, n); break;
    case 1: nt_block<1, C>(x + m * K, K, w, N, y + m * N, n); break;
    default: break;
  }
}

void nt_nrange(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N,
               int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) nt_rows<4>(x, M, K, w, N, y, n);
  for (; n < n1; ++n) nt_rows<1>(x, M, K, w, N, y, n);
}

// ---- work sharing ----------------------------------------------------------------------------

struct Job {
  bool transposed;
  const float* x;
  const float* w;
  float* y;
  int64_t M, K, N, nchunks, chunk;
  std::unique_ptr<float[]> part;   // nn: partial sums of chunks 1.. (chunk 0 writes y)
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void run(int64_t c) {
    int64_t lo = c * chunk;
    if (transposed) {
      nt_nrange(x, w, y, M, K, N, lo, std::min(N, lo + chunk));
    } else {
      float* out = c == 0 ? y : part.get() + (c - 1) * M * N;
      nn_krange(x, w, out, M, K, N, lo, std::min(K, lo + chunk));
    }
  }
  void work() {
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < nchunks;) {
      run(c);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error Matmul(bool transposed, ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                  ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  if (xd.size() < 1 || wd.size() != 2)
    return ffi::Error::InvalidArgument("cpu_gemm: x must be [..., K] and w two-dimensional");
  int64_t K = xd.back();
  int64_t N = transposed ? wd[0] : wd[1];
  if ((transposed ? wd[1] : wd[0]) != K)
    return ffi::Error::InvalidArgument("cpu_gemm: contracting dimensions differ");
  int64_t M = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) M *= xd[i];
  float* out = y->typed_data();
  if (M == 0 || N == 0) return ffi::Error::Success();
  if (K == 0) {
    std::fill(out, out + M * N, 0.f);
    return ffi::Error::Success();
  }
  auto job = std::make_shared<Job>();
  job->transposed = transposed;
  job->x = x.typed_data();
  job->w = w.typed_data();
  job->y = out;
  job->M = M;
  job->K = K;
  job->N = N;
  int64_t threads = std::max<int64_t>(1, pool.num_threads());
  if (transposed) {         // rows of w: several chunks per thread, multiples of 4 rows
    int64_t chunk = (N + 4 * threads - 1) / (4 * threads);
    job->chunk = std::max<int64_t>(4, (chunk + 3) / 4 * 4);
    job->nchunks = (N + job->chunk - 1) / job->chunk;
  } else {                  // rows of w (the K axis): one contiguous slab per thread
    int64_t chunk = (K + threads - 1) / threads;
    job->chunk = std::max<int64_t>(4, (chunk + 3) / 4 * 4);
    job->nchunks = (K + job->chunk - 1) / job->chunk;
    if (job->nchunks > 1) job->part.reset(new float[(job->nchunks - 1) * M * N]);
  }
  int64_t helpers = std::min<int64_t>(threads, job->nchunks) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([job] { job->work(); });
  job->work();
  while (job->done.load(std::memory_order_acquire) < job->nchunks) {
  }
  if (!transposed)
    for (int64_t c = 1; c < job->nchunks; ++c) {
      const float* p = job->part.get() + (c - 1) * M * N;
      for (int64_t i = 0; i < M * N; ++i) out[i] += p[i];
    }
  return ffi::Error::Success();
}

ffi::Error MatmulNN(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                    ffi::ResultBuffer<ffi::F32> y) {
  return Matmul(false, pool, x, w, y);
}

ffi::Error MatmulNT(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                    ffi::ResultBuffer<ffi::F32> y) {
  return Matmul(true, pool, x, w, y);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jspec_cpu_gemm_nn, MatmulNN,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(jspec_cpu_gemm_nt, MatmulNT,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
