// A whole decoder's decode step in one call: for each layer, norm -> qkv -> rotate -> write
// K/V -> attend -> o_proj -> residual add and norm -> gate_up -> silu * up -> down_proj.
//
// The same kernels as the model's modules call one by one (kernels.h), in the same order, so
// the result is the same bit for bit; what goes is the Python between them: at batch 1 the
// interpreter's share of a decode step (module calls, views, splits, argument checks) was as
// long as the int4 products themselves. Serves decoders whose linears a compiled product runs
// (int4, int8, float32), or oneDNN's bfloat16 one (dtype bfloat16 on CPU), on a float32 KV
// cache, one decode per sequence, no tensor parallelism, no q/k norms; the modules serve the
// rest (engine/kernels/decode_stack.py decides).
#include "kernels.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/pybind.h>  // binds its classes for Python

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace {

enum class Kind { kInt4Int8, kInt4, kInt8, kFloat32, kBfloat16 };

// dtype bfloat16 on CPU (layers/half_matrices.py): the input rounded to bfloat16, oneDNN's
// product against the weight in its packed layout, the output back in float32, then the bias;
// the same op calls as HalfLinear.forward, so the same result bit for bit. oneDNN's linear is
// reached through the dispatcher, as Python's torch.ops.mkldnn reaches it.
at::Tensor bfloat16_linear(const at::Tensor& x, const at::Tensor& packed,
                           const c10::optional<at::Tensor>& bias) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  std::vector<c10::IValue> stack{x.to(at::kBFloat16), packed, c10::IValue(),
                                 c10::IValue(std::string("none")),
                                 c10::IValue(c10::List<std::optional<at::Scalar>>()),
                                 c10::IValue(std::string(""))};
  op.callBoxed(&stack);
  auto out = stack[0].toTensor().to(at::kFloat);
  return bias.has_value() ? out.add_(*bias) : out;
}

// One linear layer as its decode kernel reads it.
struct Linear {
  Kind kind;
  at::Tensor q, scale, minimum;  // q: the weight; scale: int8, int4; minimum: int4 only
  int64_t group;                    // int4 only
  c10::optional<at::Tensor> bias;
  int64_t max_rows;  // rows this product serves (engine/kernels/operands.py)

  // float32_rows: rows up to which float32_linear serves a float32 weight, float32_gemm beyond.
  at::Tensor operator()(const at::Tensor& x, int64_t float32_rows) const {
    switch (kind) {
      case Kind::kInt4Int8: return int4_int8_linear(x, q, scale, minimum, group, bias);
      case Kind::kInt4: return int4_linear(x, q, scale, minimum, group, bias);
      case Kind::kInt8: return int8_linear(x, q, scale, bias);
      case Kind::kFloat32:
        return x.size(0) <= float32_rows ? float32_linear(x, q, bias) : float32_gemm(x, q, bias);
      case Kind::kBfloat16: return bfloat16_linear(x, q, bias);
    }
    TORCH_CHECK(false, "unknown linear kind");
  }
};

Linear make_linear(const std::string& kind, at::Tensor q, c10::optional<at::Tensor> scale,
                   c10::optional<at::Tensor> minimum, int64_t group, c10::optional<at::Tensor> bias,
                   int64_t max_rows) {
  const Kind k = kind == "int4_int8" ? Kind::kInt4Int8 : kind == "int4" ? Kind::kInt4
                 : kind == "int8" ? Kind::kInt8 : kind == "float32" ? Kind::kFloat32
                 : kind == "bfloat16" ? Kind::kBfloat16
                 : throw std::invalid_argument("kind: " + kind);
  const bool quantized = k != Kind::kFloat32 && k != Kind::kBfloat16;
  TORCH_CHECK(!quantized || scale.has_value(), "quantized weights need their scales");
  TORCH_CHECK(!quantized || k == Kind::kInt8 || minimum.has_value(),
              "int4 needs its minimums");
  TORCH_CHECK(max_rows > 0, "max_rows: at least one row");
  return {k, q, scale.value_or(at::Tensor()), minimum.value_or(at::Tensor()), group, bias,
          max_rows};
}

struct Layer {
  at::Tensor input_norm, post_norm;
  Linear qkv, o, gate_up, down;
  int64_t window;  // sliding window, or 0
};

class DecodeStack {
 public:
  DecodeStack(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double scale,
              int64_t float32_linear_max_rows)
      : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(eps), scale_(scale),
        float32_rows_(float32_linear_max_rows) {}

  void add_layer(at::Tensor input_norm, at::Tensor post_norm, Linear qkv, Linear o, Linear gate_up,
                 Linear down, int64_t window) {
    for (const Linear* l : {&qkv, &o, &gate_up, &down})
      max_rows_ = std::min(max_rows_, l->max_rows);
    layers_.push_back({input_norm, post_norm, qkv, o, gate_up, down, window});
  }

  // The most rows a step may have for every linear's product to serve it.
  int64_t max_rows() const { return layers_.empty() ? 0 : max_rows_; }

  // x: the embeddings [rows, hidden]; cos, sin [rows, 1, head_dim]; one K and V cache per
  // layer; slots [rows]; tables [rows, blocks] and lens [rows] as paged_decode takes them.
  // Returns (the last layer's MLP output, the residual stream before it is added), as the
  // modules' loop leaves them.
  std::vector<at::Tensor> forward(at::Tensor x, at::Tensor cos, at::Tensor sin,
                                  const std::vector<at::Tensor>& k_caches,
                                  const std::vector<at::Tensor>& v_caches, at::Tensor slots,
                                  at::Tensor tables, at::Tensor lens) const {
    const size_t n = layers_.size();
    TORCH_CHECK(k_caches.size() == n && v_caches.size() == n, "one K and V cache per layer");
    const int64_t rows = x.size(0), qk = heads_ + kv_heads_, f32 = float32_rows_;
    TORCH_CHECK(rows <= max_rows(), "more rows than the stack's products serve");
    at::Tensor residual = x;
    for (size_t i = 0; i < n; ++i) {
      const Layer& l = layers_[i];
      // The first layer's residual stream is the embeddings themselves.
      auto h = i == 0 ? rms_norm(x, l.input_norm, eps_)
                      : add_rms_norm(x, residual, l.input_norm, eps_);
      auto qkv = l.qkv(h, f32).view({rows, qk + kv_heads_, head_dim_});
      auto rotated = rotate(qkv.narrow(1, 0, qk), cos, sin);
      write_kv(rotated.narrow(1, heads_, kv_heads_), qkv.narrow(1, qk, kv_heads_), k_caches[i],
               v_caches[i], slots);
      auto attended = paged_decode(rotated.narrow(1, 0, heads_).contiguous(), k_caches[i],
                                   v_caches[i], tables, lens, scale_, l.window);
      h = add_rms_norm(l.o(attended.view({rows, heads_ * head_dim_}), f32), residual, l.post_norm,
                       eps_);
      x = l.down(silu_mul(l.gate_up(h, f32)), f32);
    }
    return {x, residual};
  }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  double eps_, scale_;
  int64_t float32_rows_;
  int64_t max_rows_ = std::numeric_limits<int64_t>::max();
  std::vector<Layer> layers_;
};

}  // namespace

void bind_decode_stack(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<Linear>(m, "StackLinear");
  m.def("stack_linear", &make_linear,
        "one layer for DecodeStack: kind int4_int8, int4, int8 or float32, its tensors, group, "
        "bias, the rows it serves");
  py::class_<DecodeStack>(m, "DecodeStack")
      .def(py::init<int64_t, int64_t, int64_t, double, double, int64_t>())
      .def("add_layer", &DecodeStack::add_layer)
      .def_property_readonly("max_rows", &DecodeStack::max_rows)
      .def("forward", &DecodeStack::forward, py::call_guard<py::gil_scoped_release>(),
           "every decoder layer's decode step: (hidden, residual)");
}
