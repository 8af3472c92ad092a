// Decode-sized linear layers on x86 with AVX2/FMA: y = x W^T (+ bias), where W is stored as
// int8 (one scale per output row), int4 (a scale and a minimum per group of inputs) or plain
// float32. For float32 the point is the threading: MKL runs a one-row product on one core and a
// few rows as separate products, reading the weights at well under the machine's bandwidth,
// while this loop splits output rows across every core and streams each weight row once.
//
// Decode is memory-bound: int8 weights are a quarter of the bytes of float32 ones, int4 an
// eighth. Here activations stay float32, so there is no activation quantization error (LLM
// activations have outliers that per-tensor int8 activations cannot represent). Each 16-weight
// chunk is widened to float once and used for up to eight input rows held in registers; output
// rows are split across OpenMP threads. Widening int4 costs more than reading it, so int4
// layers whose inputs come in whole spans take int8_activations.cpp's integer product instead.
// Large batches (prefill) are compute-bound: for them `dequantize` writes the float weight
// into a caller's buffer for one ordinary matmul.
#include "kernels.h"
#include "product.h"

namespace {

using namespace kvpilot;  // product.h: the shared product loop and its helpers

// int8, symmetric per output row: w[o, i] = q[o, i] * scale[o]. The scale is applied once per
// output, after the dot product.
struct Int8Weights {
  const int8_t* q;
  const float* scale;
  int64_t in;

  void load(int64_t o, int64_t i, __m256& lo, __m256& hi) const {
    __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + o * in + i));
    lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(packed));
    hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(packed, 8)));
  }
  float at(int64_t o, int64_t i) const { return static_cast<float>(q[o * in + i]); }
  float row_scale(int64_t o) const { return scale[o]; }
  void fetch(int64_t o) const { prefetch(q + o * in, in); }
};

// int4, asymmetric per group: w[o, i] = q * scale[o, g] + minimum[o, g], q in [0, 15]. In each
// 16-weight chunk byte k holds weight k in its low nibble and weight k + 8 in its high one, so
// one mask and one shift unpack a chunk. Groups are multiples of 16, so a chunk has one scale.
struct Int4Weights {
  const uint8_t* q;
  const uint16_t* scale;  // float16
  const uint16_t* minimum;
  int64_t in, group;

  void load(int64_t o, int64_t i, __m256& lo, __m256& hi) const {
    __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + (o * in + i) / 2));
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m128i low = _mm_and_si128(packed, mask);
    __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    const int64_t g = o * (in / group) + i / group;
    const __m256 s = _mm256_set1_ps(half(scale, g)), m = _mm256_set1_ps(half(minimum, g));
    lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(low)), s, m);
    hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(high)), s, m);
  }
  float at(int64_t, int64_t) const { return 0.0f; }  // never called: in % 16 == 0
  float row_scale(int64_t) const { return 1.0f; }
  void fetch(int64_t o) const {
    prefetch(q + o * in / 2, in / 2);
    prefetch(scale + o * (in / group), in / group * 2);
    prefetch(minimum + o * (in / group), in / group * 2);
  }
};

// float32, as stored by the model: nothing to widen.
struct Float32Weights {
  const float* w;
  int64_t in;

  void load(int64_t o, int64_t i, __m256& lo, __m256& hi) const {
    lo = _mm256_loadu_ps(w + o * in + i);
    hi = _mm256_loadu_ps(w + o * in + i + 8);
  }
  float at(int64_t o, int64_t i) const { return w[o * in + i]; }
  float row_scale(int64_t) const { return 1.0f; }
  void fetch(int64_t o) const { prefetch(w + o * in, in * 4); }
};

// R input rows against one output row; R is a template argument so the accumulators stay in
// registers.
template <int R, typename W>
void dot_rows(const W& w, int64_t o, const float* x, int64_t in, float* sums) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    __m256 lo, hi;
    w.load(o, i, lo, hi);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + r * in + i), acc[r]);
      acc[r] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + r * in + i + 8), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    sums[r] = hsum(acc[r]);
    for (int64_t j = i; j < in; ++j) sums[r] += x[r * in + j] * w.at(o, j);
  }
}

// Any format with load(): the weight widened chunk by chunk, its row scale applied at the end.
template <typename W>
struct WidenedDot {
  const W& w;
  const float* x;
  int64_t in, out;

  template <int R>
  void rows(int64_t o, int64_t r0, float* sums) const {
    if (r0 == 0 && o + kAhead < out) w.fetch(o + kAhead);
    dot_rows<R>(w, o, x + r0 * in, in, sums);
    for (int r = 0; r < R; ++r) sums[r] *= w.row_scale(o);
  }
};

template <typename W>
at::Tensor matmul(const W& w, const at::Tensor& x_in, int64_t out,
                  const c10::optional<at::Tensor>& bias) {
  auto x = rows_of(x_in);
  const WidenedDot<W> dot{w, x.data_ptr<float>(), x.size(1), out};
  return product(dot, x.size(0), out, x, bias);
}

// int4 against R input rows, one output row, with the affine part folded out of the inner
// loop: over a group, sum_i x_i (q_i s + m) = s sum_i x_i q_i + m sum_i x_i. The inner loop
// only widens q and multiplies; the scale is applied once per group on the accumulator, and the
// minimum against each row's group sum of x (computed once per call, shared by every output).
template <int R>
void dot_rows_int4(const Int4Weights& w, int64_t o, const float* x, const float* xsum,
                   float* sums) {
  const int64_t in = w.in, groups = in / w.group;
  const uint8_t* qrow = w.q + o * in / 2;
  const uint16_t* srow = w.scale + o * groups;
  const uint16_t* mrow = w.minimum + o * groups;
  const __m128i mask = _mm_set1_epi8(0x0F);
  __m256 acc[R];
  float offset[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), offset[r] = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    __m256 part[R];
    for (int r = 0; r < R; ++r) part[r] = _mm256_setzero_ps();
    for (int64_t i = g * w.group; i < (g + 1) * w.group; i += 16) {
      __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qrow + i / 2));
      __m128i low = _mm_and_si128(packed, mask);
      __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
      const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(low));
      const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(high));
      for (int r = 0; r < R; ++r) {
        part[r] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + r * in + i), part[r]);
        part[r] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + r * in + i + 8), part[r]);
      }
    }
    const __m256 scale = _mm256_set1_ps(half(srow, g));
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(part[r], scale, acc[r]);
      offset[r] += half(mrow, g) * xsum[r * groups + g];
    }
  }
  for (int r = 0; r < R; ++r) sums[r] = hsum(acc[r]) + offset[r];
}

struct Int4Dot {
  const Int4Weights& w;
  const float* x;
  const float* xsum;
  int64_t out;

  template <int R>
  void rows(int64_t o, int64_t r0, float* sums) const {
    if (r0 == 0 && o + kAhead < out) w.fetch(o + kAhead);
    dot_rows_int4<R>(w, o, x + r0 * w.in, xsum + r0 * (w.in / w.group), sums);
  }
};

at::Tensor matmul_int4(const Int4Weights& w, const at::Tensor& x_in, int64_t out,
                       const c10::optional<at::Tensor>& bias) {
  auto x = rows_of(x_in);
  const int64_t rows = x.size(0);
  // Each row's sum over each group of inputs: the minimum's share of every output.
  auto xsum = x.view({rows, w.in / w.group, w.group}).sum(2).contiguous();
  const Int4Dot dot{w, x.data_ptr<float>(), xsum.data_ptr<float>(), out};
  return product(dot, rows, out, x, bias);
}

template <typename W>
void expand(const W& w, int64_t out, int64_t in, at::Tensor& dense) {
  TORCH_CHECK(
      dense.scalar_type() == at::kFloat && dense.is_contiguous() && dense.numel() == out * in,
      "dense: contiguous float32 [out, in]");
  float* dp = dense.data_ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    const __m256 s = _mm256_set1_ps(w.row_scale(o));
    float* row = dp + o * in;
    int64_t i = 0;
    for (; i + 16 <= in; i += 16) {
      __m256 lo, hi;
      w.load(o, i, lo, hi);
      _mm256_storeu_ps(row + i, _mm256_mul_ps(lo, s));
      _mm256_storeu_ps(row + i + 8, _mm256_mul_ps(hi, s));
    }
    for (; i < in; ++i) row[i] = w.at(o, i) * w.row_scale(o);
  }
}

Int8Weights int8_weights(const at::Tensor& q, const at::Tensor& scale) {
  TORCH_CHECK(q.scalar_type() == at::kChar && q.is_contiguous(), "q: contiguous int8");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == q.size(0), "scale");
  return {q.data_ptr<int8_t>(), scale.data_ptr<float>(), q.size(1)};
}

Int4Weights int4_weights(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& minimum,
                         int64_t group) {
  TORCH_CHECK(q.scalar_type() == at::kByte && q.is_contiguous(), "q: contiguous uint8");
  const int64_t in = q.size(1) * 2;
  TORCH_CHECK(group % 16 == 0 && in % group == 0, "group: a multiple of 16 dividing in");
  const int64_t groups = q.size(0) * (in / group);
  TORCH_CHECK(scale.numel() == groups, "scale: one per group");
  TORCH_CHECK(minimum.numel() == groups, "minimum: one per group");
  return {q.data_ptr<uint8_t>(), half_bits(scale), half_bits(minimum), in, group};
}

#if defined(__AVX512F__)
// float32 weights against up to kWideRows rows where the CPU has AVX-512: one 16-lane load per
// 64-byte line of a weight row serves every input row, half the loads and multiply-adds of the
// 8-lane loop above. A decode step at batch 1 is this loop over every weight, memory-bound only
// while its instructions keep up with the memory; the 8-lane loop with product()'s burst of
// prefetches per row read SmolLM2's matrices measurably slower.
//
// No software prefetch: each thread reads one run of consecutive rows, a plain stream, which the
// hardware prefetcher follows across a whole 2 MiB page (the weights sit on huge pages,
// engine/huge_pages.py). A prefetch per line, rows ahead, takes a load slot per line and kept
// the stream well under a plain read's rate (benchmarks/engine_throughput.py's batch-1 figure
// against its read bound); on 4 KiB pages it gained nothing either.
constexpr int64_t kWideRows = 4;

template <int R>
at::Tensor float32_wide(const at::Tensor& x, const at::Tensor& w, const float* bias) {
  const int64_t out = w.size(0), in = w.size(1);
  auto y = at::empty({R, out}, x.options());
  const float* wp = w.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t tail = in % 16;
  const __mmask16 lanes = static_cast<__mmask16>((1u << tail) - 1);
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    const float* row = wp + o * in;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= in; i += 16) {
      const __m512 wv = _mm512_loadu_ps(row + i);
      for (int r = 0; r < R; ++r)
        acc[r] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xp + r * in + i), acc[r]);
    }
    if (tail) {  // the missing lanes load as zeros
      const __m512 wv = _mm512_maskz_loadu_ps(lanes, row + i);
      for (int r = 0; r < R; ++r)
        acc[r] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(lanes, xp + r * in + i), acc[r]);
    }
    for (int r = 0; r < R; ++r)
      yp[r * out + o] = _mm512_reduce_add_ps(acc[r]) + (bias ? bias[o] : 0.0f);
  }
  return y;
}
#else
// The same loop with AVX2: a 64-byte line is two 8-lane loads, each half with its own sums, so
// a row's multiply-adds form two chains rather than one twice as long. product()'s 8-lane loop,
// with its burst of prefetches per row, read SmolLM2's matrices at under half a plain read's
// rate (AVX2 kernels, MKL and oneDNN held to AVX2 on an AVX-512 host).
constexpr int64_t kWideRows = 4;

template <int R>
at::Tensor float32_wide(const at::Tensor& x, const at::Tensor& w, const float* bias) {
  const int64_t out = w.size(0), in = w.size(1), body = in / 16 * 16;
  auto y = at::empty({R, out}, x.options());
  const float* wp = w.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    const float* row = wp + o * in;
    __m256 lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < body; i += 16) {
      const __m256 a = _mm256_loadu_ps(row + i), b = _mm256_loadu_ps(row + i + 8);
      for (int r = 0; r < R; ++r) {
        lo[r] = _mm256_fmadd_ps(a, _mm256_loadu_ps(xp + r * in + i), lo[r]);
        hi[r] = _mm256_fmadd_ps(b, _mm256_loadu_ps(xp + r * in + i + 8), hi[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      float sum = hsum(_mm256_add_ps(lo[r], hi[r]));
      for (int64_t i = body; i < in; ++i) sum += row[i] * xp[r * in + i];
      yp[r * out + o] = sum + (bias ? bias[o] : 0.0f);
    }
  }
  return y;
}
#endif

}  // namespace

at::Tensor float32_linear(at::Tensor x, at::Tensor w, c10::optional<at::Tensor> bias) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous(), "w: contiguous float32");
  TORCH_CHECK(x.size(1) == w.size(1), "x and w: in features differ");
  if (x.size(0) <= kWideRows) {
    auto xc = rows_of(x);
    const auto b = checked_bias(bias, w.size(0));
    const float* bp = b ? b->data_ptr<float>() : nullptr;
    switch (xc.size(0)) {
      case 0:
        return at::empty({0, w.size(0)}, x.options());
      case 1: return float32_wide<1>(xc, w, bp);
      case 2: return float32_wide<2>(xc, w, bp);
      case 3: return float32_wide<3>(xc, w, bp);
      default: return float32_wide<4>(xc, w, bp);
    }
  }
  return matmul(Float32Weights{w.data_ptr<float>(), w.size(1)}, x, w.size(0), bias);
}

at::Tensor int8_linear(at::Tensor x, at::Tensor q, at::Tensor scale,
                       c10::optional<at::Tensor> bias) {
  TORCH_CHECK(x.size(1) == q.size(1), "x and q: in features differ");
  return matmul(int8_weights(q, scale), x, q.size(0), bias);
}

at::Tensor int4_linear(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor minimum,
                       int64_t group, c10::optional<at::Tensor> bias) {
  TORCH_CHECK(x.size(1) == q.size(1) * 2, "x and q: in features differ");
  return matmul_int4(int4_weights(q, scale, minimum, group), x, q.size(0), bias);
}

void int8_dequantize(at::Tensor q, at::Tensor scale, at::Tensor dense) {
  expand(int8_weights(q, scale), q.size(0), q.size(1), dense);
}

void int4_dequantize(at::Tensor q, at::Tensor scale, at::Tensor minimum, int64_t group,
                     at::Tensor dense) {
  expand(int4_weights(q, scale, minimum, group), q.size(0), q.size(1) * 2, dense);
}
