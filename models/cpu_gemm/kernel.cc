// Small-M matrix products for XLA:CPU, registered through jax.ffi.
//
// y[M, N] = x[M, K] @ w      with w stored [K, N] ("nn", every nnx.Linear kernel)
// y[M, N] = x[M, K] @ w^T    with w stored [N, K] ("nt", the tied embedding as LM head)
// y[M, N] = x[M, K] @ w^T    with w [N, K] in a stored format ("q": bf16, int8, Q8_0, Q4_0, Q4_1)
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


// ---- quantized weights, kept as stored: y = x @ dequant(w)^T, w rows [N, K] -----------------
// Formats (QFormat below, the same codes as models.weight_formats.CODES): bf16 (q: bf16 bits
// [N, K]); int8 (q: int8 [N, K], d: f32 [N], one scale per row); and GGUF's 32-weight blocks along
// K: q8_0 (q: int8 [N, K], d: f16 [N, K/32], w = d q), q4_0 (q: nibbles [N, K/2], w = d (q - 8)),
// q4_1 (+ m: f16 [N, K/32], w = d q + m). In a 4-bit block of 16 bytes, byte j holds weight j in
// its low nibble and weight j + 16 in its high nibble (GGUF's order). At most 16 rows of x
// (AVX-512): the direct path below, in registers. Otherwise four rows of w are dequantised at
// a time into an L1 buffer (the weights are read once, from memory, as stored) and the M rows of x
// are multiplied against that buffer with nt_block, so a verify block reads the weights once too.

enum QFormat : int32_t { Q_BF16 = 1, Q_INT8 = 2, Q_Q8_0 = 3, Q_Q4_0 = 4, Q_Q4_1 = 5 };
constexpr int QBLOCK = 32;

inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {                 // subnormal: normalise
      int e = -1;
      do { ++e; man <<= 1; } while (!(man & 0x400u));
      bits = sign | ((112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
#endif
}

// 16 weights to floats: int8 * d; bf16 bits; nibbles (low or high half of 16 bytes) * d + m.
// Explicit intrinsics: GCC scalarises __builtin_convertvector from 8-bit lanes.
inline void i8_16(const uint8_t* p, float d, float* out) {
#if defined(__AVX512F__)
  __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
  _mm512_storeu_ps(out, _mm512_mul_ps(v, _mm512_set1_ps(d)));
#elif defined(__AVX2__)
  for (int h = 0; h < 2; ++h) {
    __m128i b = _mm_loadl_epi64((const __m128i*)(p + 8 * h));
    __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    _mm256_storeu_ps(out + 8 * h, _mm256_mul_ps(v, _mm256_set1_ps(d)));
  }
#else
  for (int i = 0; i < 16; ++i) out[i] = static_cast<float>(static_cast<int8_t>(p[i])) * d;
#endif
}

inline void bf16_16(const uint16_t* p, float* out) {
#if defined(__AVX512F__)
  __m512i v = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16);
  _mm512_storeu_ps(out, _mm512_castsi512_ps(v));
#elif defined(__AVX2__)
  for (int h = 0; h < 2; ++h) {
    __m128i b = _mm_loadu_si128((const __m128i*)(p + 8 * h));
    __m256i v = _mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16);
    _mm256_storeu_ps(out + 8 * h, _mm256_castsi256_ps(v));
  }
#else
  for (int i = 0; i < 16; ++i) {
    uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
    __builtin_memcpy(out + i, &bits, 4);
  }
#endif
}

// A 32-weight 4-bit block (16 bytes): out[j] = (q_j + bias) * d + m, q_j the low nibble of byte j
// (j < 16) or the high nibble of byte j - 16. q4_0: bias -8, m 0; q4_1: bias 0.
inline void nib_32(const uint8_t* p, float bias, float d, float m, float* out) {
#if defined(__AVX512F__)
  __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
  __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m), bv = _mm512_set1_ps(bias);
  __m512 lo = _mm512_add_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15))), bv);
  __m512 hi = _mm512_add_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), bv);
  _mm512_storeu_ps(out, _mm512_fmadd_ps(lo, dv, mv));
  _mm512_storeu_ps(out + 16, _mm512_fmadd_ps(hi, dv, mv));
#elif defined(__AVX2__)
  __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m), bv = _mm256_set1_ps(bias);
  for (int h = 0; h < 2; ++h) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8 * h)));
    __m256 lo = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15))), bv);
    __m256 hi = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), bv);
    _mm256_storeu_ps(out + 8 * h, _mm256_fmadd_ps(lo, dv, mv));
    _mm256_storeu_ps(out + 16 + 8 * h, _mm256_fmadd_ps(hi, dv, mv));
  }
#else
  for (int i = 0; i < 16; ++i) {
    out[i] = (static_cast<float>(p[i] & 15) + bias) * d + m;
    out[i + 16] = (static_cast<float>(p[i] >> 4) + bias) * d + m;
  }
#endif
}

struct QWeights {
  int32_t fmt;
  const uint8_t* q;      // row n starts at q + n * row_bytes
  const uint16_t* d;     // f16 per block (q8_0/q4_*); for int8 the f32 scales (see dq)
  const float* dq;       // int8: f32 [N]
  const uint16_t* m;     // q4_1 mins
  int64_t K, row_bytes;
};

// Row n of w as K floats into out (K a multiple of 32 for the block formats, of 16 otherwise).
void dequant_row(const QWeights& w, int64_t n, float* out) {
  const int64_t K = w.K, nb = K / QBLOCK;
  const uint8_t* q = w.q + n * w.row_bytes;
  switch (w.fmt) {
    case Q_BF16:
      for (int64_t k = 0; k < K; k += 16)
        bf16_16(reinterpret_cast<const uint16_t*>(q) + k, out + k);
      break;
    case Q_INT8:
      for (int64_t k = 0; k < K; k += 16) i8_16(q + k, w.dq[n], out + k);
      break;
    case Q_Q8_0: {
      const uint16_t* dr = w.d + n * nb;
      for (int64_t b = 0; b < nb; ++b) {
        float d = half_to_float(dr[b]);
        i8_16(q + b * QBLOCK, d, out + b * QBLOCK);
        i8_16(q + b * QBLOCK + 16, d, out + b * QBLOCK + 16);
      }
      break;
    }
    case Q_Q4_0: {
      const uint16_t* dr = w.d + n * nb;
      for (int64_t b = 0; b < nb; ++b)
        nib_32(q + b * 16, -8.f, half_to_float(dr[b]), 0.f, out + b * QBLOCK);
      break;
    }
    case Q_Q4_1: {
      const uint16_t* dr = w.d + n * nb;
      const uint16_t* mr = w.m + n * nb;
      for (int64_t b = 0; b < nb; ++b)
        nib_32(q + b * 16, 0.f, half_to_float(dr[b]), half_to_float(mr[b]), out + b * QBLOCK);
      break;
    }
    default:
      break;
  }
}

constexpr int QC = 4;   // rows of w dequantised together

void q_nrange(const float* x, const QWeights& w, float* y, int64_t M, int64_t N, int64_t n0,
              int64_t n1, float* buf) {
  const int64_t K = w.K;
  int64_t n = n0;
  for (; n + QC <= n1; n += QC) {
    for (int c = 0; c < QC; ++c) dequant_row(w, n + c, buf + c * K);
    for (int64_t m = 0; m < M; m += MB) {
      const float* xm = x + m * K;
      float* ym = y + m * N + n;
      switch (std::min<int64_t>(MB, M - m)) {
        case 4: nt_block<4, QC>(xm, K, buf, N, ym, 0); break;
        case 3: nt_block<3, QC>(xm, K, buf, N, ym, 0); break;
        case 2: nt_block<2, QC>(xm, K, buf, N, ym, 0); break;
        default: nt_block<1, QC>(xm, K, buf, N, ym, 0); break;
      }
    }
  }
  for (; n < n1; ++n) {
    dequant_row(w, n, buf);
    for (int64_t m = 0; m < M; ++m) nt_block<1, 1>(x + m * K, K, buf, N, y + m * N + n, 0);
  }
}


#if defined(__AVX512F__)
// Direct path for every format at up to DR rows of x per pass (a decode step, a verify
// block; taller products take the rows DR at a time): each 32-weight block is expanded to two
// registers of dequantised weights once and multiplied by every row from registers, so a row costs
// two FMAs per block. 4-bit blocks: the block's 16 possible values (d j + m, j = 0..15) are built
// in one register and each weight is looked up by its nibble (vpermps reads the low 4 bits of each
// lane), no int->float conversion; q8_0 and int8: convert, then scale by d once for all rows;
// bf16: widen the bits.
// Up to 4 rows, two accumulators per row (low and high half-block) keep the FMA chains short.
constexpr int DR = 16;

// f16 [n] -> f32 [n]
inline void halves(const uint16_t* h, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(h + i))));
  for (; i < n; ++i) out[i] = half_to_float(h[i]);
}

// Software prefetch: the row PF bytes ahead (and its scales), so each core keeps more cache-line
// misses in flight than its hardware prefetchers do. Measured on cold weights (2 threads, M = 1,
// a noisy machine): the [49152, 576] Q8_0 LM head 2.3-2.6 -> 1.8-2.3 ms, [1536, 576] Q4_1 products
// 52-72 -> 41-65 us.
constexpr int64_t PF = 4096;

inline void prefetch_ahead(const QWeights& w, int64_t n, int64_t n1, int64_t nb) {
  const char* end = (const char*)(w.q + n1 * w.row_bytes);
  const char* ahead = (const char*)(w.q + n * w.row_bytes) + PF;
  for (int64_t o = 0; o < w.row_bytes; o += 64)
    if (ahead + o < end) _mm_prefetch(ahead + o, _MM_HINT_T0);
  const int64_t r = n + std::max<int64_t>(1, PF / w.row_bytes);
  if (r < n1 && w.fmt != Q_BF16 && w.fmt != Q_INT8) {
    _mm_prefetch((const char*)(w.d + r * nb), _MM_HINT_T0);
    if (w.fmt == Q_Q4_1) _mm_prefetch((const char*)(w.m + r * nb), _MM_HINT_T0);
  }
}

template <int R>
void q_rows_direct(const QWeights& w, const float* x, float* y, int64_t N, int64_t n0, int64_t n1,
                   float* scratch) {
  const int64_t K = w.K, nb = K / QBLOCK;
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  float* dfl = scratch;          // the row's scales, then its minima, as floats
  float* mfl = scratch + nb;
  const bool q8 = w.fmt == Q_Q8_0 || w.fmt == Q_INT8, q41 = w.fmt == Q_Q4_1;
  const bool b16 = w.fmt == Q_BF16, i8 = w.fmt == Q_INT8;
  for (int64_t n = n0; n < n1; ++n) {
    prefetch_ahead(w, n, n1, nb);
    const uint8_t* q = w.q + n * w.row_bytes;
    if (i8) {
      for (int64_t b = 0; b < nb; ++b) dfl[b] = w.dq[n];        // int8: one scale per row
    } else if (!b16) {
      halves(w.d + n * nb, nb, dfl);
    }
    if (q41) {
      halves(w.m + n * nb, nb, mfl);
    } else if (w.fmt == Q_Q4_0) {
      for (int64_t b = 0; b < nb; ++b) mfl[b] = -8.f * dfl[b];     // q4_0: d (j - 8)
    }
    __m512 a0[R], a1[R <= 4 ? R : 1];     // short rows: a second chain per row; tall: registers
    for (int r = 0; r < R; ++r) a0[r] = _mm512_setzero_ps();
    for (int r = 0; r < (R <= 4 ? R : 1); ++r) a1[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m512 lo, hi;
      if (b16) {                  // bf16: the high half of an f32's bits
        const __m256i* p = (const __m256i*)(q + 64 * b);
        lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p)), 16));
        hi = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p + 1)), 16));
      } else if (q8) {
        const __m512 d = _mm512_set1_ps(dfl[b]);
        const __m128i* p = (const __m128i*)(q + 32 * b);
        lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p))), d);
        hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p + 1))), d);
      } else {
        const __m512 table = _mm512_fmadd_ps(iota, _mm512_set1_ps(dfl[b]), _mm512_set1_ps(mfl[b]));
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(q + 16 * b)));
        lo = _mm512_permutexvar_ps(v, table);
        hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
      }
      for (int r = 0; r < R; ++r) {
        a0[r] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x + r * K + 32 * b), a0[r]);
        if constexpr (R <= 4) {
          a1[r] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + r * K + 32 * b + 16), a1[r]);
        } else {
          a0[r] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + r * K + 32 * b + 16), a0[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      if constexpr (R <= 4) {
        y[r * N + n] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r]));
      } else {
        y[r * N + n] = _mm512_reduce_add_ps(a0[r]);
      }
    }
  }
}
#endif

// Measured at [1536, 576] and [576, 1536] Q4_1 and [49152, 576] Q8_0 (2 threads): the direct path
// is 1.1-1.7x faster than dequantising into L1 up to 16 rows; at 32 the L1 path is 5-25 % faster.
bool direct_ok(const QWeights& w, int64_t M) {
#if defined(__AVX512F__)
  return M <= DR && w.K % QBLOCK == 0;    // every format; bf16 and int8 need K in 32s here
#else
  (void)w;
  (void)M;
  return false;
#endif
}

void q_nrange_direct(const float* x, const QWeights& w, float* y, int64_t M, int64_t N,
                     int64_t n0, int64_t n1, float* scratch) {
#if defined(__AVX512F__)
  // Rows per pass: all of them up to DR where K is short; at K = 1536 at most 8 (more stream x
  // from L2: measured 1.6x slower at 16 rows in one pass), in near-equal groups.
  const int64_t fit = std::max<int64_t>(1, std::min<int64_t>(DR, 12288 / w.K));
  const int64_t groups = (M + fit - 1) / fit, rows = (M + groups - 1) / groups;
  for (int64_t m = 0; m < M; m += rows) {
    const float* xm = x + m * w.K;
    float* ym = y + m * N;
    switch (std::min<int64_t>(rows, M - m)) {
      case 1: q_rows_direct<1>(w, xm, ym, N, n0, n1, scratch); break;
      case 2: q_rows_direct<2>(w, xm, ym, N, n0, n1, scratch); break;
      case 3: q_rows_direct<3>(w, xm, ym, N, n0, n1, scratch); break;
      case 4: q_rows_direct<4>(w, xm, ym, N, n0, n1, scratch); break;
      case 5: q_rows_direct<5>(w, xm, ym, N, n0, n1, scratch); break;
      case 6: q_rows_direct<6>(w, xm, ym, N, n0, n1, scratch); break;
      case 7: q_rows_direct<7>(w, xm, ym, N, n0, n1, scratch); break;
      case 8: q_rows_direct<8>(w, xm, ym, N, n0, n1, scratch); break;
      case 9: q_rows_direct<9>(w, xm, ym, N, n0, n1, scratch); break;
      case 10: q_rows_direct<10>(w, xm, ym, N, n0, n1, scratch); break;
      case 11: q_rows_direct<11>(w, xm, ym, N, n0, n1, scratch); break;
      case 12: q_rows_direct<12>(w, xm, ym, N, n0, n1, scratch); break;
      case 13: q_rows_direct<13>(w, xm, ym, N, n0, n1, scratch); break;
      case 14: q_rows_direct<14>(w, xm, ym, N, n0, n1, scratch); break;
      case 15: q_rows_direct<15>(w, xm, ym, N, n0, n1, scratch); break;
      default: q_rows_direct<16>(w, xm, ym, N, n0, n1, scratch); break;
    }
  }
#else
  (void)x; (void)w; (void)y; (void)M; (void)N; (void)n0; (void)n1; (void)scratch;
#endif
}

struct QJob {
  QWeights w;
  const float* x;
  float* y;
  int64_t M, N, nchunks, chunk;
  bool direct = false;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void work() {
    std::unique_ptr<float[]> buf;
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < nchunks;) {
      int64_t lo = c * chunk, hi = std::min(N, lo + chunk);
      if (!buf) buf.reset(new float[QC * w.K]);      // >= 2 K / 32 floats for the direct path
      if (direct) {
        q_nrange_direct(x, w, y, M, N, lo, hi, buf.get());
      } else {
        q_nrange(x, w, y, M, N, lo, hi, buf.get());
      }
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error QMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer q,
                   ffi::AnyBuffer d, ffi::AnyBuffer m, ffi::ResultBuffer<ffi::F32> y,
                   int32_t fmt, int64_t n_out) {
  auto xd = x.dimensions();
  auto qd = q.dimensions();
  if (xd.size() < 1 || qd.size() != 2 || qd[0] != n_out)
    return ffi::Error::InvalidArgument("cpu_gemm q: x must be [..., K] and q [N, bytes]");
  int64_t K = xd.back(), N = n_out, M = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) M *= xd[i];
  QWeights w{fmt, static_cast<const uint8_t*>(q.untyped_data()),
             static_cast<const uint16_t*>(d.untyped_data()),
             static_cast<const float*>(d.untyped_data()),
             static_cast<const uint16_t*>(m.untyped_data()), K,
             static_cast<int64_t>(q.size_bytes()) / std::max<int64_t>(1, N)};
  bool blocks = fmt == Q_Q8_0 || fmt == Q_Q4_0 || fmt == Q_Q4_1;
  int64_t want = fmt == Q_BF16 ? 2 * K : (fmt == Q_Q4_0 || fmt == Q_Q4_1) ? K / 2 : K;
  if (fmt < Q_BF16 || fmt > Q_Q4_1)
    return ffi::Error::InvalidArgument("cpu_gemm q: unknown format");
  if (K % (blocks ? QBLOCK : 16) != 0 || w.row_bytes != want)
    return ffi::Error::InvalidArgument("cpu_gemm q: K does not fit the format's blocks");
  float* out = y->typed_data();
  if (M == 0 || N == 0) return ffi::Error::Success();
  auto job = std::make_shared<QJob>();
  job->w = w;
  job->x = x.typed_data();
  job->y = out;
  job->M = M;
  job->N = N;
  job->direct = direct_ok(w, M);
  int64_t threads = std::max<int64_t>(1, pool.num_threads());
  int64_t chunk = (N + 4 * threads - 1) / (4 * threads);   // measured: 2 threads 1.8x 1 thread
  job->chunk = std::max<int64_t>(QC, (chunk + QC - 1) / QC * QC);
  job->nchunks = (N + job->chunk - 1) / job->chunk;
  int64_t helpers = std::min<int64_t>(threads, job->nchunks) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([job] { job->work(); });
  job->work();
  while (job->done.load(std::memory_order_acquire) < job->nchunks) {
  }
  return ffi::Error::Success();
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(jspec_cpu_gemm_q, QMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("fmt")
                                  .Attr<int64_t>("n_out"));
