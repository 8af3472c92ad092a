// Every kernel the compiled module exports, declared once: module.cpp binds them for Python and
// decode_stack.cpp calls them directly, so a decode step runs the same code either way.
#pragma once
// ATen's tensor and the few factories the kernels call, not <torch/extension.h>: that header
// (pybind11 and the whole C++ frontend) took most of each file's compile time, and only the two
// files that bind for Python (module.cpp, decode_stack.cpp) need it. ATen names the dtypes
// kFloat (float32), kChar (int8) and kByte (uint8).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/tensor.h>

#include <vector>

namespace pybind11 {
class module_;
}

// weight_only.cpp: decode-sized products against float activations, and weight expansion.
at::Tensor float32_linear(at::Tensor x, at::Tensor w, c10::optional<at::Tensor> bias);
at::Tensor int8_linear(at::Tensor x, at::Tensor q, at::Tensor scale,
                       c10::optional<at::Tensor> bias);
at::Tensor int4_linear(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor minimum,
                       int64_t group, c10::optional<at::Tensor> bias);
void int8_dequantize(at::Tensor q, at::Tensor scale, at::Tensor dense);
void int4_dequantize(at::Tensor q, at::Tensor scale, at::Tensor minimum, int64_t group,
                     at::Tensor dense);

// float32_gemm.cpp: float32 products of decode batches (a few to a few hundred rows).
at::Tensor float32_gemm(at::Tensor x, at::Tensor w, c10::optional<at::Tensor> bias);

// int8_activations.cpp: products against activations quantized to int8 per block of 32.
std::vector<at::Tensor> quantize_activations(at::Tensor x);
int64_t int8_activation_span();
int64_t int8_activation_block();
at::Tensor int4_int8_linear(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor minimum,
                            int64_t group, c10::optional<at::Tensor> bias);
at::Tensor int8_int8_linear(at::Tensor x, at::Tensor q, at::Tensor scale,
                            c10::optional<at::Tensor> bias);

// layer_ops.cpp: a decode layer's small ops.
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps);
at::Tensor add_rms_norm(at::Tensor x, at::Tensor residual, at::Tensor weight, double eps);
at::Tensor rotate(at::Tensor x, at::Tensor cos, at::Tensor sin);
at::Tensor silu_mul(at::Tensor gate_up);

// paged_decode.cpp: decode attention over the paged KV cache.
at::Tensor paged_decode(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                        at::Tensor block_tables, at::Tensor context_lens, double scale,
                        int64_t window);
at::Tensor paged_decode_int8(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                             at::Tensor k_scale, at::Tensor v_scale, at::Tensor block_tables,
                             at::Tensor context_lens, double scale, int64_t window);

// paged_prefill.cpp: prompt chunks' attention over the paged KV cache, written into `out`.
void paged_prefill(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor block_tables,
                   at::Tensor rows, at::Tensor lens, at::Tensor context_lens, double scale,
                   int64_t window, at::Tensor out);

// kv_write.cpp: a step's new keys and values into their cache slots.
void write_int8(at::Tensor x, at::Tensor cache, at::Tensor scales, at::Tensor slots);
void write_kv(at::Tensor k, at::Tensor v, at::Tensor k_cache, at::Tensor v_cache, at::Tensor slots);

// decode_stack.cpp: a whole decoder's decode step in one call.
void bind_decode_stack(pybind11::module_& m);
