// Writing a step's new keys and values into their slots of the paged KV cache, for CPUs.
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <utility>

// Quantize new keys or values [N, kv_heads, head_dim] per token per kv head into their cache
// slots, bit for bit as kv_cache.quantize does: one call instead of about ten PyTorch ops.
// Any strides: decode-sized projections come out transposed (see linear.py).
void write_int8(at::Tensor x, at::Tensor cache, at::Tensor scales, at::Tensor slots) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && cache.scalar_type() == at::kChar);
  TORCH_CHECK(cache.is_contiguous() && scales.is_contiguous());
  const int64_t n = x.size(0), kvh = x.size(1), hd = x.size(2), step = x.stride(2);
  const auto slot = slots.contiguous();
  const int64_t* sp = slot.data_ptr<int64_t>();
  const float* xp = x.data_ptr<float>();
  int8_t* cp = cache.data_ptr<int8_t>();
  float* scp = scales.data_ptr<float>();
#pragma omp parallel for if (n > 64)
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < kvh; ++h) {
      const float* src = xp + t * x.stride(0) + h * x.stride(1);
      float top = 0.0f;
      for (int64_t i = 0; i < hd; ++i) top = std::max(top, std::abs(src[i * step]));
      const float s = std::max(top / 127.0f, 1e-8f);
      int8_t* dst = cp + (sp[t] * kvh + h) * hd;
      for (int64_t i = 0; i < hd; ++i)
        dst[i] = static_cast<int8_t>(std::nearbyint(src[i * step] / s));
      scp[sp[t] * kvh + h] = s;
    }
  }
}

// New float32 keys and values [N, kv_heads, head_dim] (any strides) into their cache slots,
// both in one call: two index_copy_ calls and their views cost several times the copy.
void write_kv(at::Tensor k, at::Tensor v, at::Tensor k_cache, at::Tensor v_cache,
              at::Tensor slots) {
  TORCH_CHECK(k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat);
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() &&
              v_cache.scalar_type() == at::kFloat && v_cache.is_contiguous());
  const int64_t n = k.size(0), kvh = k.size(1), hd = k.size(2);
  TORCH_CHECK(v.sizes() == k.sizes() && k_cache.size(2) == kvh && k_cache.size(3) == hd);
  const auto slot = slots.contiguous();
  const int64_t* sp = slot.data_ptr<int64_t>();
  const int64_t capacity = k_cache.size(0) * k_cache.size(1);
  for (int64_t t = 0; t < n; ++t) TORCH_CHECK(sp[t] >= 0 && sp[t] < capacity, "slot out of range");
  for (auto [x, cache] : {std::pair{k, k_cache}, std::pair{v, v_cache}}) {
    const float* xp = x.data_ptr<float>();
    float* cp = cache.data_ptr<float>();
    const int64_t step = x.stride(2);
#pragma omp parallel for if (n > 64)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < kvh; ++h) {
        const float* src = xp + t * x.stride(0) + h * x.stride(1);
        float* dst = cp + (sp[t] * kvh + h) * hd;
        for (int64_t i = 0; i < hd; ++i) dst[i] = src[i * step];
      }
  }
}
