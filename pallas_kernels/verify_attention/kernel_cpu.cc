// Verification attention for XLA:CPU that reads only the keys each row holds, via jax.ffi.
//
// q [B, T, Hq, Dh] (T new tokens per row), a KV cache k/v [B, S, KVH, Dh] holding lengths[b]
// committed keys, and the block's own T keys, either already written at slots lengths[b] + u
// ("written") or passed separately as k_new/v_new [B, T, KVH, Dh] ("unwritten"). Token t sees the
// committed prefix and the block keys u with u <= t (causal) or mask[b, t, u] (tree). Output
// [B, T, Hq, Dh]. The same math as reference.py, GQA-grouped (a KV head's G query heads share
// each key read), online softmax in fp32, so the cost follows lengths[b] + T, never S.
//
// Work items are (row, KV head, tile of query positions, split of the keys); a row with few items
// (a decode step at B = 1) has its keys split so both cores stream them, the splits merged at the
// end by their softmax maxima. A query that sees no key gets zeros.
//
// The cache may be float32 or bfloat16 (half the bytes a step reads); a bf16 block of keys is
// widened into an L1 buffer of floats as it is read, so the arithmetic is the same fp32 code.
// The block's own keys (k_new/v_new) are always float32.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

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
typedef float vf __attribute__((vector_size(VL * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VL * 4), aligned(4)));
typedef uint16_t vh __attribute__((vector_size(VL * 2), aligned(2)));

constexpr int KB = 32;        // keys per block (its K and V rows stay in L1 across a tile)
constexpr int RMAX = 32;      // query rows (positions x grouped heads) per tile
constexpr int64_t SPLIT_MIN = 256;   // fewest keys worth a split of their own

inline vf load(const float* p) { return *reinterpret_cast<const vf*>(p); }
inline void store(float* p, vf v) { *reinterpret_cast<vf*>(p) = v; }
inline vf splat(float x) {   // one broadcast (`vf{} + x` costs an add: -0.f + 0.f is kept)
#if defined(__AVX512F__)
  return reinterpret_cast<vf>(_mm512_set1_ps(x));
#elif defined(__AVX__)
  return reinterpret_cast<vf>(_mm256_set1_ps(x));
#else
  return vf{x, x, x, x};
#endif
}

inline float hsum(vf v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(reinterpret_cast<__m512>(v));   // log-depth, not a 16-add chain
#else
  float s = 0.f;
  for (int i = 0; i < VL; ++i) s += v[i];
  return s;
#endif
}

inline float hmax(vf v) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps(reinterpret_cast<__m512>(v));
#else
  float m = v[0];
  for (int i = 1; i < VL; ++i) m = std::max(m, v[i]);
  return m;
#endif
}

// out[c] = scale * (sum of the lanes of a[c]) for four vectors at once.
inline void sum4(const vf* a, float scale, float* out) {
#if defined(__AVX__) && !defined(__AVX512F__)
  __m256 t0 = _mm256_hadd_ps(reinterpret_cast<__m256>(a[0]), reinterpret_cast<__m256>(a[1]));
  __m256 t1 = _mm256_hadd_ps(reinterpret_cast<__m256>(a[2]), reinterpret_cast<__m256>(a[3]));
  __m256 t2 = _mm256_hadd_ps(t0, t1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(t2), _mm256_extractf128_ps(t2, 1));
  _mm_storeu_ps(out, _mm_mul_ps(s, _mm_set1_ps(scale)));
#elif defined(__AVX512F__)
  // pairwise within 128-bit lanes, then across the four lanes: 4 sums in ~12 shuffles and adds
  // (the scalar loop of hsum is a 16-add dependency chain per sum)
  const __m512 a0 = reinterpret_cast<__m512>(a[0]), a1 = reinterpret_cast<__m512>(a[1]);
  const __m512 a2 = reinterpret_cast<__m512>(a[2]), a3 = reinterpret_cast<__m512>(a[3]);
  __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  __m512 u = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  _mm_storeu_ps(out, _mm_mul_ps(s, _mm_set1_ps(scale)));
#else
  for (int c = 0; c < 4; ++c) out[c] = hsum(a[c]) * scale;
#endif
}

// exp for x <= 0 (scores minus their running maximum): Cody-Waite reduction to r in
// [-ln2/2, ln2/2], a degree-6 Taylor polynomial (relative error ~2e-7), scaled by 2^n through
// the exponent bits. Inputs below -87 (and -inf, masked keys) give exactly 0.
inline vf vexp(vf x) {
  const vf lo = splat(-87.f);
  vf xc = x < lo ? lo : x;
  vf n = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;   // round to nearest
  vf r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf p = splat(1.f / 720);
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &e, sizeof(scale));
  vf out = p * scale;
  vi below = x < lo;
  vf zero{};
  return below ? zero : out;
}

// n bf16 values (n a multiple of VL) widened to float: a bf16 is the top half of a float.
inline void widen_bf16(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += VL) {
    vh h;
    std::memcpy(&h, src + i, sizeof(h));
    vi w = __builtin_convertvector(h, vi) << 16;
    std::memcpy(dst + i, &w, sizeof(w));
  }
}

struct Problem {
  const float *q, *k, *v, *k_new, *v_new;
  const uint16_t *k16, *v16;   // a bf16 cache (k and v are then null)
  const int32_t* lengths;
  const bool* mask;   // [B, T, T] or null (causal)
  float* out;
  int64_t B, T, S, KVH, G, Dh;
  bool written;
  float scale;

  int64_t prefix(int64_t b) const { return std::clamp<int64_t>(lengths[b], 0, S); }
  // Block keys that exist: written ones past slot S were dropped.
  int64_t block(int64_t b) const {
    return written ? std::clamp<int64_t>(S - lengths[b], 0, T) : T;
  }
  bool in_cache(int64_t j, int64_t L) const { return written || j < L; }
  int64_t cache_offset(int64_t b, int64_t h, int64_t j) const { return ((b * S + j) * KVH + h) * Dh; }
  const float* key(const float* cache, const float* fresh, int64_t b, int64_t h, int64_t j,
                   int64_t L) const {
    if (in_cache(j, L)) return cache + cache_offset(b, h, j);
    return fresh + ((b * T + (j - L)) * KVH + h) * Dh;
  }
};

struct Item {
  int64_t b, h0, h1, t0, t1, ja, jb;   // row, KV heads [h0, h1), positions [t0, t1), keys [ja, jb)
  int64_t part;   // -1: writes the output; else index of its partial (m, l, acc) slot
};

// sc[r][jj] = scale * q_r . k_jj for RR rows (RR = 1, 2) and nk keys: RR x 4 dot products share
// their loads, four keys' sums reduced together.
template <int ND, int RR>
inline void scores(const float* const* qrow, const float* const* kp, int nk, float scale,
                   float (*sc)[KB]) {
  int jj = 0;
  for (; jj + 4 <= nk; jj += 4) {
    vf a[RR][4];
    for (int i = 0; i < RR; ++i)
      for (int c = 0; c < 4; ++c) a[i][c] = vf{};
    for (int d = 0; d < ND; ++d) {
      vf qv[RR];
      for (int i = 0; i < RR; ++i) qv[i] = load(qrow[i] + d * VL);
      for (int c = 0; c < 4; ++c) {
        vf kv = load(kp[jj + c] + d * VL);
        for (int i = 0; i < RR; ++i) a[i][c] += qv[i] * kv;
      }
    }
    for (int i = 0; i < RR; ++i) sum4(a[i], scale, &sc[i][jj]);
  }
  for (; jj < nk; ++jj)
    for (int i = 0; i < RR; ++i) {
      vf a{};
      for (int d = 0; d < ND; ++d) a += load(qrow[i] + d * VL) * load(kp[jj] + d * VL);
      sc[i][jj] = hsum(a) * scale;
    }
  for (int i = 0; i < RR; ++i)
    for (int x = nk; x < KB; ++x) sc[i][x] = -INFINITY;
}

#if defined(__AVX2__) && !defined(__AVX512F__)
constexpr bool PACKED = true;   // 8-lane AVX2: tiles of many rows take the packed-key scores
#else
constexpr bool PACKED = false;
#endif
constexpr int64_t PACK_MIN = 16;   // rows of one head from which packing the keys pays (measured)

// kt[d][jj] = k_jj[d] for a block's keys (zero past nk): 8 x 8 transposes in registers.
template <int ND>
inline void pack_keys(const float* const* kp, int nk, float (*kt)[KB]) {
#if defined(__AVX2__) && !defined(__AVX512F__)
  alignas(32) static const float zero[ND * VL] = {};
  for (int j0 = 0; j0 < KB; j0 += 8) {
    const float* row[8];
    for (int i = 0; i < 8; ++i) row[i] = j0 + i < nk ? kp[j0 + i] : zero;
    for (int d0 = 0; d0 < ND * VL; d0 += 8) {
      __m256 r[8], t[8], u[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(row[i] + d0);
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
      }
      for (int i = 0; i < 4; ++i) {
        _mm256_store_ps(&kt[d0 + i][j0], _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_store_ps(&kt[d0 + i + 4][j0], _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
      }
    }
  }
#else
  for (int d = 0; d < ND * VL; ++d)
    for (int jj = 0; jj < KB; ++jj) kt[d][jj] = jj < nk ? kp[jj][d] : 0.f;
#endif
}

// The scores from packed keys: each row's q[d] broadcast against 2 x VL keys at once, RR rows
// sharing the key loads; no horizontal sums.
template <int ND, int RR>
inline void scores_packed(const float* const* qrow, const float (*kt)[KB], int nk, float scale,
                          float (*sc)[KB]) {
  for (int c0 = 0; c0 < KB; c0 += 2 * VL) {
    vf a[RR][2];
    for (int i = 0; i < RR; ++i) a[i][0] = a[i][1] = vf{};
    for (int d = 0; d < ND * VL; ++d) {
      vf k0 = load(&kt[d][c0]), k1 = load(&kt[d][c0 + VL]);
      for (int i = 0; i < RR; ++i) {
        vf qb = splat(qrow[i][d]);
        a[i][0] += qb * k0;
        a[i][1] += qb * k1;
      }
    }
    for (int i = 0; i < RR; ++i) {
      store(&sc[i][c0], a[i][0] * scale);
      store(&sc[i][c0 + VL], a[i][1] * scale);
    }
  }
  for (int i = 0; i < RR; ++i)
    for (int x = nk; x < KB; ++x) sc[i][x] = -INFINITY;
}

// acc_r = alpha_r * acc_r + sum_jj p[r][jj] v_jj for RR rows, Dh in chunks of DC vectors so that
// the RR x DC accumulators stay in registers while the block's values stream from L1.
template <int ND, int RR>
inline void values(const float (*p)[KB], const float* alpha, const float* const* vp, int nk,
                   float* acc, int64_t Dh) {
  constexpr int DC = ND % 4 == 0 ? 4 : ND % 3 == 0 ? 3 : ND % 2 == 0 ? 2 : 1;   // divides ND
  for (int d0 = 0; d0 < ND; d0 += DC) {
    vf o[RR][DC];
    for (int i = 0; i < RR; ++i)
      for (int d = 0; d < DC; ++d) o[i][d] = load(acc + i * Dh + (d0 + d) * VL) * alpha[i];
    for (int jj = 0; jj < nk; ++jj) {
      vf w[RR];
      for (int i = 0; i < RR; ++i) w[i] = splat(p[i][jj]);
      for (int d = 0; d < DC; ++d) {
        vf vv = load(vp[jj] + (d0 + d) * VL);
        for (int i = 0; i < RR; ++i) o[i][d] += w[i] * vv;
      }
    }
    for (int i = 0; i < RR; ++i)
      for (int d = 0; d < DC; ++d) store(acc + i * Dh + (d0 + d) * VL, o[i][d]);
  }
}

// values for four rows, Dh in chunks of two vectors: each value vector loaded once for the four
// (6 loads per 8 FMAs against 2 x 4's 6 per 8, but twice the rows per value read; measured ~15%
// faster on prefill and verify tiles).
template <int ND>
inline void values4(const float (*p)[KB], const float* alpha, const float* const* vp, int nk,
                    float* acc, int64_t Dh) {
  constexpr int DC = ND % 2 == 0 ? 2 : 1;
  for (int d0 = 0; d0 < ND; d0 += DC) {
    vf o[4][DC];
    for (int i = 0; i < 4; ++i)
      for (int d = 0; d < DC; ++d) o[i][d] = load(acc + i * Dh + (d0 + d) * VL) * alpha[i];
    for (int jj = 0; jj < nk; ++jj) {
      vf vv[DC];
      for (int d = 0; d < DC; ++d) vv[d] = load(vp[jj] + (d0 + d) * VL);
      for (int i = 0; i < 4; ++i) {
        vf w = splat(p[i][jj]);
        for (int d = 0; d < DC; ++d) o[i][d] += w * vv[d];
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int d = 0; d < DC; ++d) store(acc + i * Dh + (d0 + d) * VL, o[i][d]);
  }
}

// Rows [r0, r0 + R) of a tile, all of KV head h, over one block of nk keys at j0 (kp, vp): their
// scores, masks, online-softmax update and weighted values.
template <int ND>
inline void block_rows(const Problem& P, const Item& it, int64_t r0, int64_t R,
                       const float* const* qrow, const float* const* kp, const float* const* vp,
                       int64_t j0, int nk, float* m, float* l, float* acc) {
  const int64_t Dh = ND * VL, G = P.G, b = it.b, L = P.prefix(b);
  alignas(64) float sc[RMAX][KB];
  // scores: each key's row is read once from memory and reused by all R rows from L1
  int64_t r = 0;
  if (PACKED && R >= PACK_MIN) {
    alignas(32) float kt[ND * VL][KB];
    pack_keys<ND>(kp, nk, kt);
    for (; r + 4 <= R; r += 4) scores_packed<ND, 4>(qrow + r0 + r, kt, nk, P.scale, &sc[r]);
    for (; r < R; ++r) scores_packed<ND, 1>(qrow + r0 + r, kt, nk, P.scale, &sc[r]);
  } else {
    for (; r + 2 <= R; r += 2) scores<ND, 2>(qrow + r0 + r, kp, nk, P.scale, &sc[r]);
    if (r < R) scores<ND, 1>(qrow + r0 + r, kp, nk, P.scale, &sc[r]);
  }
  // masks: only blocks that reach into the new tokens need them
  if (j0 + nk > L) {
    for (int64_t x = 0; x < R; ++x) {
      int64_t t = it.t0 + x / G;
      for (int jj = 0; jj < nk; ++jj) {
        int64_t u = j0 + jj - L;
        if (u < 0) continue;
        bool sees = P.mask ? P.mask[(b * P.T + t) * P.T + u] : u <= t;
        if (!sees) sc[x][jj] = -INFINITY;
      }
    }
  }
  // online softmax, then the weighted sum of values two rows at a time
  float alpha[RMAX];
  bool any[RMAX];
  m += r0;
  l += r0;
  acc += r0 * Dh;
  for (int64_t x = 0; x < R; ++x) {
    vf vmx = load(&sc[x][0]);
    for (int jj = VL; jj < KB; jj += VL) {
      vf y = load(&sc[x][jj]);
      vmx = y > vmx ? y : vmx;
    }
    float mx = hmax(vmx);
    any[x] = mx != -INFINITY;
    if (!any[x]) continue;   // this row sees no key of this block
    float m_new = std::max(m[x], mx);
    alpha[x] = std::exp(m[x] - m_new);   // 0 on the first block that row sees
    vf msplat = splat(m_new);
    vf psum{};
    for (int jj = 0; jj < KB; jj += VL) {
      vf e = vexp(load(&sc[x][jj]) - msplat);
      store(&sc[x][jj], e);
      psum += e;
    }
    l[x] = l[x] * alpha[x] + hsum(psum);
    m[x] = m_new;
  }
  int64_t x = 0;
  for (; x + 4 <= R; x += 4) {
    if (any[x] && any[x + 1] && any[x + 2] && any[x + 3]) {
      values4<ND>(&sc[x], alpha + x, vp, nk, acc + x * Dh, Dh);
      continue;
    }
    for (int64_t y = x; y < x + 4; ++y)
      if (any[y]) values<ND, 1>(&sc[y], alpha + y, vp, nk, acc + y * Dh, Dh);
  }
  for (; x + 2 <= R; x += 2) {
    if (any[x] && any[x + 1])
      values<ND, 2>(&sc[x], alpha + x, vp, nk, acc + x * Dh, Dh);
    else
      for (int64_t y = x; y < x + 2; ++y)
        if (any[y]) values<ND, 1>(&sc[y], alpha + y, vp, nk, acc + y * Dh, Dh);
  }
  if (x < R && any[x]) values<ND, 1>(&sc[x], alpha + x, vp, nk, acc + x * Dh, Dh);
}

// Rows of a tile: per KV head h0..h1-1, the positions t0..t1-1 times the G grouped query heads.
inline int64_t rows_per_head(const Problem& P, const Item& it) { return (it.t1 - it.t0) * P.G; }

inline int64_t row_offset(const Problem& P, const Item& it, int64_t r) {   // in q and out
  const int64_t rh = rows_per_head(P, it), G = P.G;
  const int64_t h = it.h0 + r / rh, t = it.t0 + (r % rh) / G, g = r % G;
  return ((it.b * P.T + t) * P.KVH * G + h * G + g) * P.Dh;
}

// One tile over keys [ja, jb). A key block's rows of every head of the tile are read together
// (contiguous in the [B, S, KVH, Dh] cache), so a decode step reads the cache in address order.
template <int ND>
void attend_tile(const Problem& P, const Item& it, float* m, float* l, float* acc) {
  const int64_t Dh = ND * VL, b = it.b;
  const int64_t rh = rows_per_head(P, it), R = (it.h1 - it.h0) * rh;
  const int64_t L = P.prefix(b);
  const float* qrow[RMAX];
  for (int64_t r = 0; r < R; ++r) {
    qrow[r] = P.q + row_offset(P, it, r);
    m[r] = -INFINITY;
    l[r] = 0.f;
  }
  std::fill(acc, acc + R * Dh, 0.f);
  const float* kp[KB];
  const float* vp[KB];
  alignas(64) float kw[KB][ND * VL];   // a bf16 cache's keys and values, widened
  alignas(64) float vw[KB][ND * VL];
  for (int64_t j0 = it.ja; j0 < it.jb; j0 += KB) {
    const int nk = static_cast<int>(std::min<int64_t>(KB, it.jb - j0));
    for (int64_t h = it.h0; h < it.h1; ++h) {
      for (int jj = 0; jj < nk; ++jj) {
        const int64_t j = j0 + jj;
        if (P.k16 && P.in_cache(j, L)) {
          widen_bf16(P.k16 + P.cache_offset(b, h, j), kw[jj], Dh);
          widen_bf16(P.v16 + P.cache_offset(b, h, j), vw[jj], Dh);
          kp[jj] = kw[jj];
          vp[jj] = vw[jj];
          continue;
        }
        kp[jj] = P.key(P.k, P.k_new, b, h, j, L);
        vp[jj] = P.key(P.v, P.v_new, b, h, j, L);
      }
      block_rows<ND>(P, it, (h - it.h0) * rh, rh, qrow, kp, vp, j0, nk, m, l, acc);
    }
  }
}

void write_out(const Problem& P, const Item& it, const float* l, const float* acc) {
  const int64_t Dh = P.Dh, R = (it.h1 - it.h0) * rows_per_head(P, it);
  for (int64_t r = 0; r < R; ++r) {
    float* o = P.out + row_offset(P, it, r);
    float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    for (int64_t d = 0; d < Dh; ++d) o[d] = acc[r * Dh + d] * inv;
  }
}

typedef void (*TileFn)(const Problem&, const Item&, float*, float*, float*);

// Every head dim of kernel_cpu.HEAD_DIMS at every vector width (4, 8 or 16 lanes).
TileFn tile_fn(int64_t nd) {
  switch (nd) {
    case 1: return attend_tile<1>;
    case 2: return attend_tile<2>;
    case 4: return attend_tile<4>;
    case 6: return attend_tile<6>;
    case 8: return attend_tile<8>;
    case 12: return attend_tile<12>;
    case 16: return attend_tile<16>;
    case 24: return attend_tile<24>;
    case 32: return attend_tile<32>;
    case 64: return attend_tile<64>;
    default: return nullptr;
  }
}

struct Job {
  Problem P;
  TileFn fn;
  std::vector<Item> items;
  std::vector<float> parts;   // per partial: m[RMAX], l[RMAX], acc[RMAX * Dh]
  int64_t part_size;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void run(const Item& it) {
    if (it.part >= 0) {
      float* base = parts.data() + it.part * part_size;
      fn(P, it, base, base + RMAX, base + 2 * RMAX);
      return;
    }
    std::vector<float> scratch(2 * RMAX + RMAX * P.Dh);
    fn(P, it, scratch.data(), scratch.data() + RMAX, scratch.data() + 2 * RMAX);
    write_out(P, it, scratch.data() + RMAX, scratch.data() + 2 * RMAX);
  }
  void work() {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) <
                    static_cast<int64_t>(items.size());) {
      run(items[i]);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Merges the splits of one tile (items [first, first + n), consecutive partials).
void merge(const Job& job, const Item& head, int64_t n) {
  const Problem& P = job.P;
  const int64_t R = (head.h1 - head.h0) * rows_per_head(P, head), Dh = P.Dh;
  std::vector<float> l(R, 0.f), acc(R * Dh, 0.f);
  for (int64_t r = 0; r < R; ++r) {
    float mx = -INFINITY;
    for (int64_t s = 0; s < n; ++s)
      mx = std::max(mx, job.parts[(head.part + s) * job.part_size + r]);
    if (mx == -INFINITY) continue;
    for (int64_t s = 0; s < n; ++s) {
      const float* base = job.parts.data() + (head.part + s) * job.part_size;
      float w = std::exp(base[r] - mx);
      if (w == 0.f) continue;
      l[r] += w * base[RMAX + r];
      for (int64_t d = 0; d < Dh; ++d) acc[r * Dh + d] += w * base[2 * RMAX + r * Dh + d];
    }
  }
  write_out(P, head, l.data(), acc.data());
}

ffi::Error Attend(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k,
                  ffi::AnyBuffer v, ffi::Buffer<ffi::S32> lengths,
                  ffi::Buffer<ffi::PRED> mask, ffi::Buffer<ffi::F32> k_new,
                  ffi::Buffer<ffi::F32> v_new, ffi::ResultBuffer<ffi::F32> out, int64_t causal,
                  int64_t written) {
  auto qd = q.dimensions();
  auto kd = k.dimensions();
  if (qd.size() != 4 || kd.size() != 4)
    return ffi::Error::InvalidArgument("cpu attention: q and k/v must be 4-d");
  auto job = std::make_shared<Job>();
  Problem& P = job->P;
  P.B = qd[0];
  P.T = qd[1];
  P.S = kd[1];
  P.KVH = kd[2];
  P.Dh = qd[3];
  P.G = qd[2] / P.KVH;
  P.written = written != 0;
  P.scale = 1.f / std::sqrt(static_cast<float>(P.Dh));
  P.q = q.typed_data();
  // a bf16 cache comes as BF16 or as its bits (U16: models.kv_cache holds it so on CPU)
  const bool bf16 =
      k.element_type() == ffi::DataType::BF16 || k.element_type() == ffi::DataType::U16;
  if (k.element_type() != v.element_type() ||
      !(bf16 || k.element_type() == ffi::DataType::F32))
    return ffi::Error::InvalidArgument("cpu attention: the cache must be float32 or bfloat16");
  P.k = bf16 ? nullptr : static_cast<const float*>(k.untyped_data());
  P.v = bf16 ? nullptr : static_cast<const float*>(v.untyped_data());
  P.k16 = bf16 ? static_cast<const uint16_t*>(k.untyped_data()) : nullptr;
  P.v16 = bf16 ? static_cast<const uint16_t*>(v.untyped_data()) : nullptr;
  P.k_new = k_new.typed_data();
  P.v_new = v_new.typed_data();
  P.lengths = lengths.typed_data();
  P.mask = causal ? nullptr : mask.typed_data();
  P.out = out->typed_data();
  job->fn = tile_fn(P.Dh % VL == 0 ? P.Dh / VL : 0);
  if (!job->fn || P.G * P.KVH != qd[2] || P.G > RMAX)
    return ffi::Error::InvalidArgument("cpu attention: unsupported head_dim or grouping");
  if (P.B == 0 || P.T == 0) return ffi::Error::Success();

  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  // A tile holds every KV head when all T x Hq query rows fit (decode, short verifies): its key
  // blocks are then read in address order. Else one head and tq positions per tile.
  const bool all_heads = P.T * P.G * P.KVH <= RMAX;
  const int64_t heads = all_heads ? P.KVH : 1;
  const int64_t tq = all_heads ? P.T : std::max<int64_t>(1, RMAX / P.G);
  const int64_t tiles = (P.T + tq - 1) / tq;
  const int64_t base_items = P.B * (P.KVH / heads) * tiles;
  const int64_t want = 4 * threads;   // items enough to keep every thread busy
  int64_t parts = 0;
  for (int64_t b = 0; b < P.B; ++b) {
    const int64_t L = P.prefix(b), nb = P.block(b);
    for (int64_t h = 0; h < P.KVH; h += heads)
      for (int64_t tile = 0; tile < tiles; ++tile) {
        int64_t t0 = tile * tq, t1 = std::min(P.T, t0 + tq);
        int64_t jend = L + (P.mask ? nb : std::min(nb, t1));
        int64_t splits = 1;
        if (base_items < want)
          splits = std::clamp<int64_t>(jend / SPLIT_MIN, 1, (want + base_items - 1) / base_items);
        if (splits == 1) {
          job->items.push_back({b, h, h + heads, t0, t1, 0, jend, -1});
          continue;
        }
        int64_t step = (jend + splits - 1) / splits;
        step = (step + KB - 1) / KB * KB;
        for (int64_t ja = 0; ja < jend; ja += step)
          job->items.push_back({b, h, h + heads, t0, t1, ja, std::min(jend, ja + step), parts++});
      }
  }
  job->part_size = 2 * RMAX + RMAX * P.Dh;
  job->parts.resize(parts * job->part_size);
  const int64_t n = static_cast<int64_t>(job->items.size());
  int64_t helpers = std::min<int64_t>(threads, n) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([job] { job->work(); });
  job->work();
  while (job->done.load(std::memory_order_acquire) < n) {
  }
  for (int64_t i = 0; i < n;) {
    const Item& head = job->items[i];
    if (head.part < 0) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j < n && job->items[j].b == head.b && job->items[j].h0 == head.h0 &&
           job->items[j].t0 == head.t0 && job->items[j].part >= 0)
      ++j;
    merge(*job, head, j - i);
    i = j;
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jspec_cpu_attention, Attend,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // q
                                  .Arg<ffi::AnyBuffer>()           // k (cache, f32 or bf16)
                                  .Arg<ffi::AnyBuffer>()           // v (cache, f32 or bf16)
                                  .Arg<ffi::Buffer<ffi::S32>>()    // lengths
                                  .Arg<ffi::Buffer<ffi::PRED>>()   // tree mask (unused if causal)
                                  .Arg<ffi::Buffer<ffi::F32>>()    // k_new (unused if written)
                                  .Arg<ffi::Buffer<ffi::F32>>()    // v_new (unused if written)
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("causal")
                                  .Attr<int64_t>("written"));
