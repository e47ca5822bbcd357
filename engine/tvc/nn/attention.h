// torch.nn.MultiheadAttention: the same parameters (names, shapes, order, initialisation), the
// same call and the same numbers, composed from differentiable ops (linear, bmm, softmax,
// dropout), so autograd comes with it.
//
// Shape legend: N batch, L target (query) length, S source (key/value) length, E embed_dim,
// H num_heads, D = E / H head_dim, Ek kdim, Ev vdim.
//
//   nn::MultiheadAttention mha(768, 12, {.batch_first = true});
//   auto [out, weights] = mha(q, k, v);                          // (N, L, E), (N, L, S)
//   auto [o, none] = mha(x, x, x, {.need_weights = false});      // none is undefined
//   Tensor y = mha(x);                                           // self-attention, output only
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <utility>

#include "tvc/nn/layers.h"

namespace tvc::nn {

// PyTorch's constructor arguments after num_heads, in its order.
struct MultiheadAttentionOptions {
  double dropout = 0;             // dropout on the attention weights (training only)
  bool bias = true;               // in_proj_bias and out_proj.bias
  bool add_bias_kv = false;       // bias_k, bias_v (1, 1, E) appended to the key/value sequences
  bool add_zero_attn = false;     // a zero key/value appended to each head's sequence
  std::optional<int64_t> kdim{};  // key features (default E)
  std::optional<int64_t> vdim{};  // value features (default E)
  bool batch_first = false;       // (N, L, E) instead of (L, N, E)
};

// The keyword arguments of MultiheadAttention's call, with PyTorch's defaults.
struct AttentionArgs {
  // (N, S) or (S) for unbatched input: bool (true = ignore that key) or floating (added to the
  // scores). Undefined: none.
  Tensor key_padding_mask{};
  bool need_weights = true;
  // (L, S) or (N*H, L, S): bool (true = not allowed to attend) or floating (added to the scores).
  Tensor attn_mask{};
  bool average_attn_weights = true;  // weights averaged over heads (N, L, S), else (N, H, L, S)
};

// PyTorch's NonDynamicallyQuantizableLinear: a Linear under the name PyTorch prints for out_proj.
class NonDynamicallyQuantizableLinear : public Cloneable<NonDynamicallyQuantizableLinear, Linear> {
 public:
  using Cloneable::Cloneable;
};

// Tensors, in state_dict order: in_proj_weight (3E, E) when kdim = vdim = E, else
// q_proj_weight (E, E), k_proj_weight (E, Ek), v_proj_weight (E, Ev) (xavier_uniform_);
// in_proj_bias (3E) (zeros) when bias; bias_k, bias_v (1, 1, E) (xavier_normal_) when
// add_bias_kv; out_proj.weight (E, E) (Linear's init), out_proj.bias (E) (zeros) when bias.
//
// Inputs query (L, N, E), key (S, N, Ek), value (S, N, Ev), or (N, L, E), ... with
// batch_first, or unbatched (L, E), (S, Ek), (S, Ev). Each head computes
// softmax(q k^T / sqrt(D) + masks) v on its D features of the projections; masked scores are
// -inf (a row with every key masked gives NaN, as PyTorch).
class MultiheadAttention : public Cloneable<MultiheadAttention> {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, const MultiheadAttentionOptions& options = {});

  // (attention output shaped as query, attention weights (N, L, S) averaged over heads or
  // (N, H, L, S); unbatched without N; undefined unless need_weights). Runs the module's hooks
  // with the inputs (query, key, value, key_padding_mask, attn_mask) (undefined masks stand for
  // None) and the outputs (output, weights).
  std::pair<Tensor, Tensor> operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                                       const AttentionArgs& args = {});
  using Module::operator();
  // Self-attention of x without weights: the output of (x, x, x, {.need_weights = false}).
  Tensor forward(const Tensor& x) override;
  void reset_parameters();

  int64_t embed_dim, kdim, vdim, num_heads, head_dim;
  double dropout;
  bool batch_first, add_zero_attn;

 private:
  // The computation, without hooks.
  std::pair<Tensor, Tensor> attend(Tensor query, Tensor key, Tensor value, const AttentionArgs& args) const;
  // query, key and value projected with the packed or separate weights: (N, L|S, E) each.
  std::array<Tensor, 3> in_projection(const Tensor& query, const Tensor& key, const Tensor& value) const;
};

}  // namespace tvc::nn
