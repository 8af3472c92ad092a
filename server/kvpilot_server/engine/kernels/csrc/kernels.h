// Every kernel the compiled module exports, declared once: module.cpp binds them for Python and
// decode_stack.cpp calls them directly, so a decode step runs the same code either way.
#pragma once
#include <torch/extension.h>

#include <vector>

// weight_only.cpp: decode-sized products against float activations, and weight expansion.
torch::Tensor float32_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias);
torch::Tensor int8_linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale,
                          c10::optional<torch::Tensor> bias);
torch::Tensor int4_linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale,
                          torch::Tensor minimum, int64_t group, c10::optional<torch::Tensor> bias);
void int8_dequantize(torch::Tensor q, torch::Tensor scale, torch::Tensor dense);
void int4_dequantize(torch::Tensor q, torch::Tensor scale, torch::Tensor minimum, int64_t group,
                     torch::Tensor dense);

// float32_gemm.cpp: float32 products of decode batches (a few to a few hundred rows).
torch::Tensor float32_gemm(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias);

// int8_activations.cpp: products against activations quantized to int8 per block of 32.
std::vector<torch::Tensor> quantize_activations(torch::Tensor x);
int64_t int8_activation_span();
int64_t int8_activation_block();
torch::Tensor int4_int8_linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale,
                               torch::Tensor minimum, int64_t group,
                               c10::optional<torch::Tensor> bias);
torch::Tensor int8_int8_linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale,
                               c10::optional<torch::Tensor> bias);

// layer_ops.cpp: a decode layer's small ops.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
torch::Tensor add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight,
                           double eps);
torch::Tensor rotate(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);
torch::Tensor silu_mul(torch::Tensor gate_up);

// paged_decode.cpp: decode attention over the paged KV cache.
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_tables, torch::Tensor context_lens, double scale,
                           int64_t window);
torch::Tensor paged_decode_int8(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                torch::Tensor k_scale, torch::Tensor v_scale,
                                torch::Tensor block_tables, torch::Tensor context_lens,
                                double scale, int64_t window);

// paged_prefill.cpp: prompt chunks' attention over the paged KV cache, written into `out`.
void paged_prefill(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                   torch::Tensor block_tables, torch::Tensor rows, torch::Tensor lens,
                   torch::Tensor context_lens, double scale, int64_t window, torch::Tensor out);

// kv_write.cpp: a step's new keys and values into their cache slots.
void write_int8(torch::Tensor x, torch::Tensor cache, torch::Tensor scales, torch::Tensor slots);
void write_kv(torch::Tensor k, torch::Tensor v, torch::Tensor k_cache, torch::Tensor v_cache,
              torch::Tensor slots);

// decode_stack.cpp: a whole decoder's decode step in one call.
void bind_decode_stack(pybind11::module& m);
