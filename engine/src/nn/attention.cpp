// nn::MultiheadAttention (see tvc/nn/attention.h), following torch 1.13's
// F.multi_head_attention_forward step by step. Internally batch-first: N, L, S, E, H, D as in
// the header; heads are folded into the batch as N*H (n major), the layout of a 3-D attn_mask.
#include "tvc/nn/attention.h"

#include <cmath>
#include <limits>

#include "tvc/nn/init.h"

namespace tvc::nn {

namespace {

// A bool mask sets the masked scores to -inf, a floating one is added (PyTorch's meaning).
// mask broadcasts to scores (N*H, L, S).
Tensor apply_mask(const Tensor& scores, const Tensor& mask) {
  if (mask.dtype() == DType::Bool) return masked_fill(scores, mask, -std::numeric_limits<double>::infinity());
  return scores + mask.to(scores.dtype());
}

void check_mask_dtype(const Tensor& mask, const char* name) {
  TVC_CHECK(mask.dtype() == DType::Bool || is_floating(mask.dtype()), "MultiheadAttention: only bool and floating ",
            name, " are supported, got ", dtype_name(mask.dtype()));
}

}  // namespace

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, const MultiheadAttentionOptions& o)
    : embed_dim(embed_dim),
      kdim(o.kdim.value_or(embed_dim)),
      vdim(o.vdim.value_or(embed_dim)),
      num_heads(num_heads),
      head_dim(num_heads > 0 ? embed_dim / num_heads : 0),
      dropout(o.dropout),
      batch_first(o.batch_first),
      add_zero_attn(o.add_zero_attn) {
  TVC_CHECK(embed_dim > 0 && num_heads > 0 && kdim > 0 && vdim > 0,
            "MultiheadAttention: embed_dim, num_heads, kdim and vdim must be positive, got ", embed_dim, ", ",
            num_heads, ", ", kdim, ", ", vdim);
  TVC_CHECK(head_dim * num_heads == embed_dim, "MultiheadAttention: embed_dim must be divisible by num_heads, got ",
            embed_dim, " and ", num_heads);
  TVC_CHECK(dropout >= 0 && dropout <= 1, "MultiheadAttention: dropout probability has to be between 0 and 1, but got ",
            dropout);
  const bool same_dims = kdim == embed_dim && vdim == embed_dim;
  if (same_dims) register_parameter("in_proj_weight", empty({3 * embed_dim, embed_dim}));
  register_parameter("q_proj_weight", same_dims ? Tensor() : empty({embed_dim, embed_dim}));
  register_parameter("k_proj_weight", same_dims ? Tensor() : empty({embed_dim, kdim}));
  register_parameter("v_proj_weight", same_dims ? Tensor() : empty({embed_dim, vdim}));
  if (!same_dims) register_parameter("in_proj_weight", Tensor());
  register_parameter("in_proj_bias", o.bias ? empty({3 * embed_dim}) : Tensor());
  register_module("out_proj", std::make_shared<NonDynamicallyQuantizableLinear>(embed_dim, embed_dim, o.bias));
  if (o.add_bias_kv) {
    register_parameter("bias_k", empty({1, 1, embed_dim}));
    register_parameter("bias_v", empty({1, 1, embed_dim}));
  }
  reset_parameters();
}

// PyTorch's _reset_parameters (out_proj.weight keeps Linear's initialisation).
void MultiheadAttention::reset_parameters() {
  for (const char* name : {"in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"})
    if (Tensor w = parameter(name); w.defined()) init::xavier_uniform_(w);
  if (Tensor b = parameter("in_proj_bias"); b.defined()) {
    init::zeros_(b);
    init::zeros_(child_as<Linear>("out_proj").bias());
  }
  if (has_parameter("bias_k")) {
    init::xavier_normal_(parameter("bias_k"));
    init::xavier_normal_(parameter("bias_v"));
  }
}

std::array<Tensor, 3> MultiheadAttention::in_projection(const Tensor& query, const Tensor& key,
                                                        const Tensor& value) const {
  Tensor packed = parameter("in_proj_weight"), bias = parameter("in_proj_bias");
  std::vector<Tensor> w = packed.defined() ? chunk(packed, 3)
                                           : std::vector<Tensor>{parameter("q_proj_weight"), parameter("k_proj_weight"),
                                                                 parameter("v_proj_weight")};
  std::vector<Tensor> b = bias.defined() ? chunk(bias, 3) : std::vector<Tensor>(3);
  return {linear(query, w[0], b[0]), linear(key, w[1], b[1]), linear(value, w[2], b[2])};
}

std::pair<Tensor, Tensor> MultiheadAttention::attend(Tensor query, Tensor key, Tensor value,
                                                     const AttentionArgs& args) const {
  TVC_CHECK(query.dim() == 2 || query.dim() == 3,
            "MultiheadAttention: query should be unbatched 2D or batched 3D tensor but received ", query.dim(),
            "-D query tensor");
  const bool batched = query.dim() == 3;
  TVC_CHECK(key.dim() == query.dim() && value.dim() == query.dim(), "MultiheadAttention: for ", query.dim(),
            "-D query, expected key and value to be ", query.dim(), "-D but found ", key.dim(), "-D and ", value.dim(),
            "-D tensors respectively");
  Tensor key_padding_mask = args.key_padding_mask, attn_mask = args.attn_mask;
  if (key_padding_mask.defined()) {
    check_mask_dtype(key_padding_mask, "key_padding_mask");
    TVC_CHECK(key_padding_mask.dim() == query.dim() - 1, "MultiheadAttention: for ", query.dim(),
              "-D query, expected key_padding_mask to be None or ", query.dim() - 1, "-D but found ",
              key_padding_mask.dim(), "-D tensor instead");
  }
  if (attn_mask.defined()) check_mask_dtype(attn_mask, "attn_mask");

  // To (N, L|S, features).
  if (!batched) {
    query = query.unsqueeze(0), key = key.unsqueeze(0), value = value.unsqueeze(0);
    if (key_padding_mask.defined()) key_padding_mask = key_padding_mask.unsqueeze(0);
  } else if (!batch_first) {
    query = query.transpose(0, 1), key = key.transpose(0, 1), value = value.transpose(0, 1);
  }
  const int64_t n = query.size(0), tgt_len = query.size(1), heads = num_heads, d = head_dim;
  int64_t src_len = key.size(1);
  TVC_CHECK(query.size(2) == embed_dim, "MultiheadAttention: was expecting embedding dimension of ", embed_dim,
            ", but got ", query.size(2));
  TVC_CHECK(key.size(2) == kdim && value.size(2) == vdim, "MultiheadAttention: expected key and value with ", kdim,
            " and ", vdim, " features, got ", key.shape(), " and ", value.shape());
  TVC_CHECK(key.size(0) == n && value.size(0) == n && value.size(1) == src_len, "MultiheadAttention: key ", key.shape(),
            " and value ", value.shape(), " do not match each other or the query's batch of ", n);
  if (attn_mask.defined()) {
    Shape want = attn_mask.dim() == 2 ? Shape{tgt_len, src_len} : Shape{n * heads, tgt_len, src_len};
    TVC_CHECK((attn_mask.dim() == 2 || attn_mask.dim() == 3) && attn_mask.shape() == want,
              "MultiheadAttention: the shape of the ", attn_mask.dim(), "D attn_mask is ", attn_mask.shape(),
              ", but should be ", want);
  }
  if (key_padding_mask.defined())
    TVC_CHECK(key_padding_mask.shape() == (Shape{n, src_len}),
              "MultiheadAttention: expecting key_padding_mask shape of ", Shape{n, src_len}, ", but got ",
              key_padding_mask.shape());
  // One more key for each sequence (add_bias_kv, add_zero_attn): the masks let it be attended.
  auto extend_masks = [&] {
    if (attn_mask.defined()) attn_mask = pad(attn_mask, {0, 1});
    if (key_padding_mask.defined()) key_padding_mask = pad(key_padding_mask, {0, 1});
  };

  auto [q, k, v] = in_projection(query, key, value);  // (N, L, E), (N, S, E), (N, S, E)
  if (has_parameter("bias_k")) {
    k = cat({k, parameter("bias_k").expand({n, 1, embed_dim})}, 1);
    v = cat({v, parameter("bias_v").expand({n, 1, embed_dim})}, 1);
    extend_masks();
  }
  // (N, T, H*D) -> the view (N, H, T, D)
  auto heads_of = [&](const Tensor& t) { return t.reshape({n, t.size(1), heads, d}).permute({0, 2, 1, 3}); };
  // Without the weights to return or drop out, nor a zero key to add: the attention op over the
  // heads as views, the masks as additions (a bool mask's masked scores -inf), the result's
  // memory (N, L, H, D) already.
  if (!args.need_weights && !(is_training() && dropout > 0) && !add_zero_attn) {
    const TensorOptions options{.dtype = q.dtype(), .device = q.device()};  // not q itself: clang 14 lambdas
    auto additive = [&](const Tensor& mask) {
      if (mask.dtype() != DType::Bool) return mask.to(options.dtype);
      return masked_fill(zeros(mask.shape(), options), mask, -std::numeric_limits<double>::infinity());
    };
    Tensor bias, mask;
    if (attn_mask.defined())
      bias = attn_mask.dim() == 2 ? additive(attn_mask) : additive(attn_mask).reshape({n, heads, tgt_len, src_len});
    if (key_padding_mask.defined()) mask = additive(key_padding_mask).reshape({n, 1, 1, src_len});
    Tensor out = attention(heads_of(q / std::sqrt(static_cast<double>(d))), heads_of(k), heads_of(v), bias, mask);
    out = child("out_proj")(out.permute({0, 2, 1, 3}).reshape({n, tgt_len, embed_dim}));
    if (!batched) return {out.squeeze(0), Tensor()};
    return {batch_first ? out : out.transpose(0, 1), Tensor()};
  }
  // (N, T, H*D) -> (N*H, T, D)
  auto split_heads = [&](const Tensor& t) { return heads_of(t).reshape({n * heads, t.size(1), d}); };
  q = split_heads(q), k = split_heads(k), v = split_heads(v);
  if (add_zero_attn) {
    Tensor zero = zeros({n * heads, 1, d}, {.dtype = k.dtype(), .device = k.device()});
    k = cat({k, zero}, 1), v = cat({v, zero}, 1);
    extend_masks();
  }
  src_len = k.size(1);

  // softmax(q k^T / sqrt(D) + masks) v, per head: (N*H, L, S) weights.
  Tensor scores = bmm(q / std::sqrt(static_cast<double>(d)), k.transpose(1, 2));
  if (attn_mask.defined()) scores = apply_mask(scores, attn_mask);
  if (key_padding_mask.defined())
    scores = apply_mask(
        scores,
        key_padding_mask.reshape({n, 1, 1, src_len}).expand({n, heads, 1, src_len}).reshape({n * heads, 1, src_len}));
  Tensor weights = softmax(scores, -1);
  if (is_training() && dropout > 0) weights = tvc::dropout(weights, dropout, true);
  Tensor out = bmm(weights, v);  // (N*H, L, D)
  out = out.reshape({n, heads, tgt_len, d}).permute({0, 2, 1, 3}).reshape({n, tgt_len, embed_dim});
  out = child("out_proj")(out);  // (N, L, E)
  if (!batched) {
    out = out.squeeze(0);
  } else if (!batch_first) {
    out = out.transpose(0, 1);
  }
  if (!args.need_weights) return {out, Tensor()};
  weights = weights.view({n, heads, tgt_len, src_len});
  if (args.average_attn_weights) weights = weights.sum(1) / static_cast<double>(heads);
  return {out, batched ? weights : weights.squeeze(0)};
}

std::pair<Tensor, Tensor> MultiheadAttention::operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                                                         const AttentionArgs& args) {
  TensorList out = call({query, key, value, args.key_padding_mask, args.attn_mask}, [&](const TensorList& in) {
    TVC_CHECK(in.size() == 5,
              "MultiheadAttention: forward takes (query, key, value, key_padding_mask, attn_mask), "
              "a pre-hook gave ",
              in.size(), " tensors");
    AttentionArgs given = args;
    given.key_padding_mask = in[3], given.attn_mask = in[4];
    auto [output, weights] = attend(in[0], in[1], in[2], given);
    return TensorList{output, weights};
  });
  TVC_CHECK(out.size() == 2, "MultiheadAttention: a forward hook returned ", out.size(),
            " outputs where 2 (output, weights) are expected");
  return {out[0], out[1]};
}

Tensor MultiheadAttention::forward(const Tensor& x) { return attend(x, x, x, {.need_weights = false}).first; }

}  // namespace tvc::nn
