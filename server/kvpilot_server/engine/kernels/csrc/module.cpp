// The one compiled CPU module: every kernel of this directory, bound for Python.
#include <torch/csrc/utils/pybind.h>  // pybind11 with torch's tensor conversions

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("float32_linear", &float32_linear, "float32 linear for a few rows, all cores (AVX2)");
  m.def("float32_gemm", &float32_gemm,
        "float32 linear for decode batches: register tiles over the weight as stored");
  m.def("int8_linear", &int8_linear, "weight-only int8 linear (AVX2)");
  m.def("int4_linear", &int4_linear, "weight-only group-wise int4 linear (AVX2)");
  m.def("int8_dequantize", &int8_dequantize, "int8 weight -> float32, into a given buffer");
  m.def("int4_dequantize", &int4_dequantize, "int4 weight -> float32, into a given buffer");

  m.attr("INT8_ACTIVATION_SPAN") = int8_activation_span();
  m.attr("INT8_ACTIVATION_BLOCK") = int8_activation_block();
  m.def("int4_int8_linear", &int4_int8_linear,
        "group-wise int4 weights x int8 activations per block of 32 (VNNI where present)");
  m.def("int8_int8_linear", &int8_int8_linear,
        "int8 weights per row x int8 activations per block of 32 (VNNI where present)");
  m.def("quantize_activations", &quantize_activations,
        "int8 activations per block of 32 as int4_int8_linear makes them: (xq, scale)");

  m.def("silu_mul", &silu_mul, "silu(gate) * up of a fused gate_up output");
  m.def("rms_norm", &rms_norm, "RMSNorm of each row");
  m.def("add_rms_norm", &add_rms_norm, "residual += x, then the RMSNorm of residual");
  m.def("rotate", &rotate, "rotary embedding (neox layout), into a new tensor");

  m.def("write_kv", &write_kv, "Store new float32 keys and values into a paged KV cache (CPU)");
  m.def("paged_decode", &paged_decode, "Decode attention over a paged KV cache (CPU, float32)");
  m.def("paged_decode_int8", &paged_decode_int8,
        "Decode attention over an int8 paged KV cache with per-token-per-head scales (CPU)");
  m.def("paged_prefill", &paged_prefill,
        "Prompt chunks' attention over a paged KV cache, causal and windowed (CPU, float32)");
  m.def("write_int8", &write_int8, "Quantize keys or values into an int8 paged KV cache (CPU)");

  bind_decode_stack(m);
}
