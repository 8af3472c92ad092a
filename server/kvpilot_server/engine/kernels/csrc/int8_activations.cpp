// int4 and int8 weights against int8 activations, for decode-sized batches: llama.cpp's Q4_1 x
// Q8_1 and Q8_0 x Q8_0 dot products. Widening each weight to float costs more instructions than
// reading it (the float path is compute-bound well above its bandwidth bound); with the
// activations quantized too, 32 weights meet 32 activations in one integer multiply-add.
//
// Activations are quantized per block of 32 inputs (x ~= d * xq, xq in [-127, 127]): a block
// has its own scale, so one outlier costs precision only in its own 32 inputs, not the whole
// row (the reason per-tensor int8 activations fail on these models). The int4 group minimum's
// share uses the exact float sum of the activations:
// sum x_i (q_i s + m) = s sum x_i q_i + m sum x_i.
#include "kernels.h"
#include "product.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace {

using namespace kvpilot;  // product.h: the shared product loop and its helpers

constexpr int64_t kBlock = 32;  // inputs per activation scale, as llama.cpp's Q8 blocks
constexpr int64_t kSpan = 64;   // inputs per step: two blocks, 32 packed bytes of weights

// acc + the sums of four unsigned-by-signed byte products per int32 lane. Exact either way (the
// AVX2 path's int16 pairs hold 15 * 127 * 2 for int4 and 127 * 127 * 2 for int8), so every CPU
// gives the same integers.
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
                                                  _mm256_set1_epi16(1)));
#endif
}

// Where a span's inputs sit in its vectors. Its 32 packed bytes hold, per block of 32, inputs
// 0-7 and 16-23 in their low nibbles and 8-15 and 24-31 in their high ones (the layout
// quant.quantize_int4 writes), so the low-nibble vector holds inputs 0-7, 16-23 of the first
// block then of the second, and the high-nibble vector 8-15, 24-31 likewise. Either way int32
// lanes 0-3 belong to the first block and 4-7 to the second: the two products add as integers.
inline int64_t span_slot(int64_t i) {
  const int64_t block = i / kBlock, j = i % kBlock, eighth = j / 8;
  const int64_t nibble = eighth % 2;  // eighths 0 and 2 are low nibbles, 1 and 3 high
  return nibble * 32 + block * 16 + (eighth / 2) * 8 + j % 8;
}

// sum a_i b_i, a in float16.
inline float dot(const uint16_t* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 wide = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    acc = _mm256_fmadd_ps(wide, _mm256_loadu_ps(b + i), acc);
  }
  float sum = hsum(acc);
  for (; i < n; ++i) sum += half(a, i) * b[i];
  return sum;
}

struct Int4Int8Dot {
  const uint8_t* q;         // packed weights [out, in / 2]
  const uint16_t* scale;    // float16 [out, in / group]
  const uint16_t* minimum;  // float16 [out, in / group]
  const int8_t* xq;         // quantized activations [rows, in], each span in span_slot order
  const float* xscale;      // [rows, in / kSpan, 8]: each span's two block scales, 4 times each
  const float* xsum;        // [rows, in / group]
  int64_t in, group, out;

  // The weight scales of span p's two blocks, four lanes each.
  __m256 span_scales(const uint16_t* srow, int64_t p) const {
    if (group != kBlock) return _mm256_set1_ps(half(srow, p * kSpan / group));
    int32_t bits;  // the two float16 scales of the span's two groups
    std::memcpy(&bits, srow + 2 * p, sizeof(bits));
    const __m128 pair = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(pair),
                                    _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  }

  template <int R>
  void span(int64_t r0, int64_t p, const uint8_t* qrow, __m256 s, __m256* acc) const {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qrow + p * 32));
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256i low = _mm256_and_si256(bytes, mask);
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int8_t* x = xq + row * in + p * kSpan;
      __m256i sums = dot_u8s8(_mm256_setzero_si256(), low,
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
      sums = dot_u8s8(sums, high, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32)));
      const __m256 d = _mm256_mul_ps(s, _mm256_loadu_ps(xscale + (row * (in / kSpan) + p) * 8));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc[r]);
    }
  }

  template <int R>
  void rows(int64_t o, int64_t r0, float* sums) const {
    const int64_t spans = in / kSpan, groups = in / group;
    const uint8_t* qrow = q + o * in / 2;
    const uint16_t* srow = scale + o * groups;
    // Two sets of accumulators taken in turn: with one, each span waits on the last one's add.
    __m256 acc[2][R];
    for (auto& set : acc)
      for (int r = 0; r < R; ++r) set[r] = _mm256_setzero_ps();
    if (r0 == 0 && o + kAhead < out) {
      prefetch(qrow + kAhead * in / 2, in / 2);
      prefetch(srow + kAhead * groups, groups * 2);
      prefetch(minimum + (o + kAhead) * groups, groups * 2);
    }
    for (int64_t p = 0; p < spans; ++p) span<R>(r0, p, qrow, span_scales(srow, p), acc[p % 2]);
    for (int r = 0; r < R; ++r) {
      const float offset = dot(minimum + o * groups, xsum + (r0 + r) * groups, groups);
      sums[r] = hsum(_mm256_add_ps(acc[0][r], acc[1][r])) + offset;
    }
  }
};

// One block of 32: d = max |x| / 127 and q = round(x / d), ties to even as torch.round; returns
// d, and the block's float sum in *sum.
inline float quantize_block(const float* src, int8_t* q, float* sum) {
  float amax = 0.0f, total = 0.0f;
  for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(src[i])), total += src[i];
  const float d = amax / 127.0f, inverse = d > 0.0f ? 1.0f / d : 0.0f;
  for (int64_t i = 0; i < kBlock; ++i) q[i] = static_cast<int8_t>(std::nearbyint(src[i] * inverse));
  *sum = total;
  return d;
}

// Every block of x, stored in span_slot order, with d written four times per block as the int4
// kernel multiplies it, and each block's float sum (the minimum's share). A decode step's few
// rows are quantized on one thread: waking the others costs more than the work.
void quantize_spans(const float* x, int64_t spans, int8_t* xq, float* xscale, float* xsum) {
#pragma omp parallel for schedule(static) if (spans > 256)
  for (int64_t p = 0; p < spans; ++p) {
    for (int64_t block = 0; block < 2; ++block) {
      int8_t q[kBlock];
      const float d = quantize_block(x + p * kSpan + block * kBlock, q, &xsum[p * 2 + block]);
      for (int64_t i = 0; i < kBlock; ++i) xq[p * kSpan + span_slot(block * kBlock + i)] = q[i];
      for (int64_t k = 0; k < 4; ++k) xscale[p * 8 + block * 4 + k] = d;
    }
  }
}

// int8 weights, symmetric per output row, against int8 activations in input order. The byte
// product takes one unsigned operand: |w| against x carrying w's sign (llama.cpp's way), so
// every product stays within 127 * 127 and the AVX2 path's int16 pairs never saturate.
struct Int8Int8Dot {
  const int8_t* q;      // [out, in], in [-127, 127]
  const float* scale;   // [out]
  const int8_t* xq;     // [rows, in]
  const float* xscale;  // [rows, in / 32]
  int64_t in, out;

  template <int R>
  void rows(int64_t o, int64_t r0, float* sums) const {
    const int64_t blocks = in / kBlock;
    const int8_t* qrow = q + o * in;
    if (r0 == 0 && o + kAhead < out) prefetch(qrow + kAhead * in, in);
    __m256 acc[2][R];
    for (auto& set : acc)
      for (int r = 0; r < R; ++r) set[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qrow + b * kBlock));
      const __m256i magnitude = _mm256_sign_epi8(w, w);
      for (int r = 0; r < R; ++r) {
        const int64_t row = r0 + r;
        const __m256i x =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + row * in + b * kBlock));
        const __m256i products = dot_u8s8(_mm256_setzero_si256(), magnitude,
                                          _mm256_sign_epi8(x, w));
        acc[b % 2][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products),
                                        _mm256_set1_ps(xscale[row * blocks + b]), acc[b % 2][r]);
      }
    }
    for (int r = 0; r < R; ++r) sums[r] = scale[o] * hsum(_mm256_add_ps(acc[0][r], acc[1][r]));
  }
};

// The quantized activations of one call, kept per thread between calls: three tensors a call
// cost more than quantizing a decode step's row.
struct Scratch {
  std::vector<int8_t> xq;
  std::vector<float> xscale, xsum;

  static Scratch& sized(int64_t elements) {
    thread_local Scratch scratch;
    scratch.xq.resize(elements);
    scratch.xscale.resize(elements / kSpan * 8);  // the int4 layout's, the larger
    scratch.xsum.resize(elements / kBlock);
    return scratch;
  }
};

}  // namespace

// int4_int8_linear takes in features in multiples of the span, int8_int8_linear of the block.
int64_t int8_activation_span() { return kSpan; }
int64_t int8_activation_block() { return kBlock; }

// The activations as int4_int8_linear quantizes them, in input order: xq [rows, in] and one
// scale per block of 32, [rows, in / 32] (for tests and references).
std::vector<at::Tensor> quantize_activations(at::Tensor x_in) {
  auto x = rows_of(x_in);
  TORCH_CHECK(x.size(1) % kSpan == 0, "x: in features a multiple of 64");
  auto slotted = at::empty(x.sizes(), x.options().dtype(at::kChar));
  auto scales = at::empty({x.numel() / kBlock, 4}, x.options());
  auto sums = at::empty({x.numel() / kBlock}, x.options());
  quantize_spans(x.data_ptr<float>(), x.numel() / kSpan, slotted.data_ptr<int8_t>(),
                 scales.data_ptr<float>(), sums.data_ptr<float>());
  std::vector<int64_t> order(kSpan);
  for (int64_t i = 0; i < kSpan; ++i) order[i] = span_slot(i);
  auto index = at::tensor(order);
  auto xq = slotted.view({-1, kSpan}).index_select(1, index).reshape(x.sizes());
  return {xq, scales.select(1, 0).reshape({x.size(0), -1})};
}

at::Tensor int4_int8_linear(at::Tensor x_in, at::Tensor q, at::Tensor scale, at::Tensor minimum,
                            int64_t group, c10::optional<at::Tensor> bias) {
  auto x = rows_of(x_in);
  const int64_t rows = x.size(0), in = x.size(1), out = q.size(0);
  TORCH_CHECK(q.scalar_type() == at::kByte && q.is_contiguous() && q.size(1) * 2 == in,
              "q: contiguous uint8 [out, in / 2]");
  TORCH_CHECK(in % kSpan == 0, "in features: a multiple of 64");
  TORCH_CHECK(group == kBlock || (group % kSpan == 0 && in % group == 0),
              "group: 32, or a multiple of 64 dividing in");
  TORCH_CHECK(scale.numel() == out * (in / group), "scale: one per group");
  TORCH_CHECK(minimum.numel() == out * (in / group), "minimum: one per group");
  Scratch& scratch = Scratch::sized(rows * in);
  float* sums = scratch.xsum.data();
  quantize_spans(x.data_ptr<float>(), rows * in / kSpan, scratch.xq.data(),
                 scratch.xscale.data(), sums);
  // Block sums to group sums, in place: group g's sum lands in slot g.
  const int64_t per_group = group / kBlock, groups = rows * in / group;
  for (int64_t g = 0; g < groups; ++g) {
    float total = 0.0f;
    for (int64_t k = 0; k < per_group; ++k) total += sums[g * per_group + k];
    sums[g] = total;
  }
  const Int4Int8Dot dot{q.data_ptr<uint8_t>(), half_bits(scale), half_bits(minimum),
                        scratch.xq.data(), scratch.xscale.data(), sums, in, group, out};
  return product(dot, rows, out, x, bias);
}

at::Tensor int8_int8_linear(at::Tensor x_in, at::Tensor q, at::Tensor scale,
                            c10::optional<at::Tensor> bias) {
  auto x = rows_of(x_in);
  const int64_t rows = x.size(0), in = x.size(1), out = q.size(0), blocks = in / kBlock;
  TORCH_CHECK(q.scalar_type() == at::kChar && q.is_contiguous() && q.size(1) == in,
              "q: contiguous int8 [out, in]");
  TORCH_CHECK(in % kBlock == 0, "in features: a multiple of 32");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == out, "scale: [out]");
  Scratch& scratch = Scratch::sized(rows * in);
  const float* xp = x.data_ptr<float>();
  int8_t* qp = scratch.xq.data();
  float* dp = scratch.xscale.data();
  float unused;
  for (int64_t b = 0; b < rows * blocks; ++b)
    dp[b] = quantize_block(xp + b * kBlock, qp + b * kBlock, &unused);
  const Int8Int8Dot dot{q.data_ptr<int8_t>(), scale.data_ptr<float>(), qp, dp, in, out};
  return product(dot, rows, out, x, bias);
}
