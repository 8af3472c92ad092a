// float32 products of a decode batch (a few to a few hundred rows) against a weight as the model
// stores it, [out, in] row-major: y = x W^T (+ bias).
//
// MKL's GEMM is blocked for large shapes; at decode-sized row counts, and most of all at counts
// that are not a multiple of its own tiles, it runs well under the FMA units' peak (figures:
// benchmarks/engine_throughput.py, layers/linear.py measures both). Here a register tile of
// kNO weight rows by kNR input rows is the whole kernel: along `in`, each loaded weight vector
// serves kNR input rows and each input vector kNO weight rows, so a tile's multiply-adds need
// only (kNO + kNR) loads, and the weight is read in its own layout (nothing packed, no second
// copy). Each (output, row) pair is a dot product in vector lanes, summed once at its end.
// Output tiles are split across OpenMP threads; rows run in blocks small enough for a block's
// inputs to stay in the core's L2 while every weight tile passes over them.
#include "kernels.h"
#include "product.h"

#include <immintrin.h>

#include <algorithm>

namespace {

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// 32 vector registers: 24 accumulators, 4 weight vectors, 1 input vector.
using Vec = __m512;
constexpr int kLanes = 16, kNO = 4, kNR = 6;
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec load_first(const float* p, int64_t n) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
}
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float total(Vec v) { return _mm512_reduce_add_ps(v); }
#else
// 16 vector registers: 12 accumulators, 3 weight vectors, 1 input vector.
using Vec = __m256;
constexpr int kLanes = 8, kNO = 3, kNR = 4;
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec load_first(const float* p, int64_t n) {
  const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_maskload_ps(p, lanes);
}
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float total(Vec v) { return kvpilot::hsum(v); }
#endif

// Inputs per row block: a block of rows x in floats within this many bytes stays in L2.
constexpr int64_t kBlockBytes = 256 << 10;

struct Operands {
  const float* w;  // [out, in]
  const float* x;  // [rows, in]
  const float* bias;  // [out] or null
  float* y;  // [rows, out]
  int64_t rows, in, out;
};

// y[r0 + r, o0 + o] for NO weight rows from o0 and NR input rows from r0; meanwhile the
// `nahead` weight rows from `ahead` are asked for into L2, a line each per loaded vector.
template <int NO, int NR>
void tile(const Operands& p, int64_t o0, int64_t r0, const float* ahead, int64_t nahead) {
  const float* w = p.w + o0 * p.in;
  const float* x = p.x + r0 * p.in;
  Vec acc[NO][NR];
  for (int o = 0; o < NO; ++o)
    for (int r = 0; r < NR; ++r) acc[o][r] = zero();
  int64_t i = 0;
  for (; i + kLanes <= p.in; i += kLanes) {
    Vec wv[NO];
    for (int o = 0; o < NO; ++o) wv[o] = load(w + o * p.in + i);
    for (int64_t a = 0; a < nahead; ++a)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + a * p.in + i), _MM_HINT_T1);
    for (int r = 0; r < NR; ++r) {
      Vec xv = load(x + r * p.in + i);
      kvpilot::in_register(xv);
      for (int o = 0; o < NO; ++o) acc[o][r] = fma(wv[o], xv, acc[o][r]);
    }
  }
  if (i < p.in) {  // the last, partial vector: the missing lanes load as zeros
    const int64_t n = p.in - i;
    Vec wv[NO];
    for (int o = 0; o < NO; ++o) wv[o] = load_first(w + o * p.in + i, n);
    for (int r = 0; r < NR; ++r) {
      const Vec xv = load_first(x + r * p.in + i, n);
      for (int o = 0; o < NO; ++o) acc[o][r] = fma(wv[o], xv, acc[o][r]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    float* y = p.y + (r0 + r) * p.out + o0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    if constexpr (NO == 4) {
      __m128 sums = kvpilot::totals4(acc[0][r], acc[1][r], acc[2][r], acc[3][r]);
      if (p.bias) sums = _mm_add_ps(sums, _mm_loadu_ps(p.bias + o0));
      _mm_storeu_ps(y, sums);
      continue;
    }
#endif
    for (int o = 0; o < NO; ++o) y[o] = total(acc[o][r]) + (p.bias ? p.bias[o0 + o] : 0.0f);
  }
}

// Every row of [r0, r1) against NO weight rows from o0: full tiles of kNR rows, then the rest.
template <int NO>
void rows(const Operands& p, int64_t o0, int64_t r0, int64_t r1) {
  const int64_t passes = (r1 - r0 + kNR - 1) / kNR;
  const float* ahead = o0 + 2 * kNO <= p.out ? p.w + (o0 + kNO) * p.in : nullptr;
  int64_t r = r0, pass = 0;
  // The next tile's weight rows are asked for into L2 a row or so per pass over this tile's
  // input rows: asked for all in one pass, most requests find the core's miss buffers full,
  // and a decode step's weights, which come from memory, run well under their in-cache rate.
  auto share = [&](int64_t k, const float*& at) {
    const int64_t first = k * kNO / passes, last = (k + 1) * kNO / passes;
    at = ahead ? ahead + first * p.in : nullptr;
    return ahead ? last - first : 0;
  };
  const float* at = nullptr;
  for (; r + kNR <= r1; r += kNR, ++pass) {
    const int64_t n = share(pass, at);
    tile<NO, kNR>(p, o0, r, at, n);
  }
  const int64_t n = r < r1 ? share(pass, at) : 0;
  switch (r1 - r) {
    case 0: break;
    case 1: tile<NO, 1>(p, o0, r, at, n); break;
    case 2: tile<NO, 2>(p, o0, r, at, n); break;
    case 3: tile<NO, 3>(p, o0, r, at, n); break;
    case 4: tile<NO, 4>(p, o0, r, at, n); break;  // a tail only where kNR is 6
    default: tile<NO, 5>(p, o0, r, at, n); break;
  }
}

void outputs(const Operands& p, int64_t o0, int64_t r0, int64_t r1) {
  switch (std::min<int64_t>(kNO, p.out - o0)) {
    case 1: rows<1>(p, o0, r0, r1); break;
    case 2: rows<2>(p, o0, r0, r1); break;
    case 3: rows<3>(p, o0, r0, r1); break;
    default: rows<kNO>(p, o0, r0, r1); break;
  }
}

}  // namespace

at::Tensor float32_gemm(at::Tensor x, at::Tensor w, c10::optional<at::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x: 2-D float32");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.is_contiguous(),
              "w: contiguous float32 [out, in]");
  TORCH_CHECK(x.size(1) == w.size(1), "x and w: in features differ");
  auto xc = x.contiguous();
  auto y = at::empty({x.size(0), w.size(0)}, x.options());
  const auto b = kvpilot::checked_bias(bias, w.size(0));
  const Operands p{w.data_ptr<float>(), xc.data_ptr<float>(), b ? b->data_ptr<float>() : nullptr,
                   y.data_ptr<float>(), x.size(0), x.size(1), w.size(0)};
  const int64_t block = std::max<int64_t>(kNR, kBlockBytes / (4 * p.in) / kNR * kNR);
  const int64_t tiles = (p.out + kNO - 1) / kNO;
#pragma omp parallel
  for (int64_t r0 = 0; r0 < p.rows; r0 += block) {
    const int64_t r1 = std::min(p.rows, r0 + block);
#pragma omp for schedule(static) nowait
    for (int64_t t = 0; t < tiles; ++t) outputs(p, t * kNO, r0, r1);
  }
  return y;
}
