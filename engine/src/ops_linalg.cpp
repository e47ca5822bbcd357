// Linear algebra: bmm, matmul (torch.matmul rules), attention, linear; their backward.
// Shape legend: B batch, M rows, K inner, N columns.
#include <algorithm>
#include <numeric>

#include "internal.h"

namespace tvc {

using autograd::GradList;
using autograd::SavedTensor;

Tensor bmm(const Tensor& a, const Tensor& b) {
  TVC_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expects 3-d tensors, got shapes ", a.shape(), " and ", b.shape());
  TVC_CHECK(a.shape()[0] == b.shape()[0] && a.shape()[2] == b.shape()[1], "bmm: shapes ", a.shape(), " and ", b.shape(),
            " cannot be multiplied (B,M,K) @ (B,K,N)");
  TVC_CHECK(a.dtype() == b.dtype(), "bmm: dtypes differ (", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()), ")");
  TVC_CHECK(is_floating(a.dtype()), "bmm: needs floating tensors, got ", dtype_name(a.dtype()));
  Tensor out = empty({a.shape()[0], a.shape()[1], b.shape()[2]}, {.dtype = a.dtype()});
  if (out.numel() > 0) {
    if (a.shape()[2] == 0)
      out.detach().zero_();
    else
      detail::run(Op::bmm, {a, b}, {out});
  }
  if (!autograd::any_requires_grad({a, b})) return out;
  bool ga = a.requires_grad(), gb = b.requires_grad();
  SavedTensor sa(gb ? a : Tensor()), sb(ga ? b : Tensor());
  autograd::record("BmmBackward0", {a, b}, {out}, [=](const GradList& g) -> GradList {
    return {ga ? bmm(g[0], sb.unpack("BmmBackward0").transpose(1, 2)) : Tensor(),
            gb ? bmm(sa.unpack("BmmBackward0").transpose(1, 2), g[0]) : Tensor()};
  });
  return out;
}

namespace {

// An uninitialised tensor of shape (like's shape but its last dim `last`) whose memory holds its
// dims in the order of like's strides, largest first (ties in dim order), the last dim innermost.
Tensor empty_ordered_like(const Tensor& like, int64_t last) {
  const int64_t rank = like.dim();
  std::vector<int64_t> order(rank - 1);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return like.strides()[a] > like.strides()[b]; });
  order.push_back(rank - 1);
  Shape shape = like.shape(), stored(rank), back(rank);
  shape[rank - 1] = last;
  for (int64_t i = 0; i < rank; ++i) stored[i] = shape[order[i]], back[order[i]] = i;
  return empty(stored, {.dtype = like.dtype(), .device = like.device()}).permute(back);
}

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const Tensor& mask) {
  const int64_t rank = q.dim();
  TVC_CHECK(rank >= 2 && k.dim() == rank && v.dim() == rank, "attention: q, k and v need the same rank >= 2, got ",
            q.shape(), ", ", k.shape(), " and ", v.shape());
  const Shape batch(q.shape().begin(), q.shape().end() - 2);
  const int64_t L = q.shape()[rank - 2], D = q.shape()[rank - 1], S = k.shape()[rank - 2];
  TVC_CHECK(Shape(k.shape().begin(), k.shape().end() - 2) == batch &&
                Shape(v.shape().begin(), v.shape().end() - 2) == batch && k.shape()[rank - 1] == D &&
                v.shape()[rank - 2] == S,
            "attention: q ", q.shape(), ", k ", k.shape(), " and v ", v.shape(),
            " do not fit (*, L, D), (*, S, D), (*, S, Dv)");
  TVC_CHECK(is_floating(q.dtype()), "attention: needs floating tensors, got ", dtype_name(q.dtype()));
  Shape scores = batch;
  scores.push_back(L);
  scores.push_back(S);
  for (const auto& [t, name] : {std::pair{&k, "k"}, {&v, "v"}, {&bias, "bias"}, {&mask, "mask"}}) {
    if (!t->defined()) continue;
    TVC_CHECK(t->dtype() == q.dtype() && t->device() == q.device(), "attention: ", name, " is ", dtype_name(t->dtype()),
              " on ", device_name(t->device()), ", q ", dtype_name(q.dtype()), " on ", device_name(q.device()));
    if (t == &bias || t == &mask) {
      const Shape& shape = t->shape();
      const size_t lead = scores.size() - std::min(scores.size(), shape.size());
      bool fits = shape.size() <= scores.size();
      for (size_t i = 0; fits && i < shape.size(); ++i) fits = shape[i] == 1 || shape[i] == scores[lead + i];
      TVC_CHECK(fits, "attention: ", name, " of shape ", shape, " does not broadcast to the scores' shape ", scores);
    }
  }
  const bool kernel = (q.dtype() == DType::Float32 || q.dtype() == DType::Float64) && q.numel() > 0 && k.numel() > 0 &&
                      v.numel() > 0 && kernel_registry().supports(Op::attention, q.device());
  if (!kernel) {
    Tensor s = matmul(q, k.transpose(-2, -1));
    if (bias.defined()) s = add(s, bias);
    if (mask.defined()) s = add(s, mask);
    return matmul(softmax(s, -1), v);
  }
  Tensor out = empty_ordered_like(q, v.shape()[rank - 1]);
  {
    NoGradGuard no_grad;
    std::vector<Tensor> in{q.detach(), k.detach(), v.detach()};
    for (const Tensor* t : {&bias, &mask})
      if (t->defined()) in.push_back(t->detach().expand(scores));
    const AttentionParams p{bias.defined(), mask.defined()};
    detail::run(Op::attention, in, {out}, &p);
  }
  if (!autograd::any_requires_grad({q, k, v, bias, mask})) return out;
  // With the weights P = softmax(q k^T + bias + mask) made again and dS = P * (dP - sum(dP * P)),
  // dP = dO v^T: dq = dS k, dk = dS^T q, dv = P^T dO, dbias = dmask = dS (summed to their shapes).
  const bool gq = q.requires_grad(), gk = k.requires_grad(), gv = v.requires_grad(),
             gb = bias.defined() && bias.requires_grad(), gm = mask.defined() && mask.requires_grad();
  const bool has_bias = bias.defined(), has_mask = mask.defined();
  const Shape bias_shape = has_bias ? bias.shape() : Shape{}, mask_shape = has_mask ? mask.shape() : Shape{};
  SavedTensor sq(q), sk(k), sv(v), sb(bias), sm(mask);
  autograd::record("AttentionBackward0", {q, k, v, bias, mask}, {out}, [=](const GradList& g) -> GradList {
    const char* name = "AttentionBackward0";
    const Tensor qs = sq.unpack(name), ks = sk.unpack(name), vs = sv.unpack(name);
    if (kernel_registry().supports(Op::attention_backward, qs.device())) {
      // One kernel (each batch element's operands made dense in its thread's scratch, the weights
      // made again block by block), rather than the ops below with their copies of q, k and v into
      // batches of matrices in memory and (L, S) tensors between them.
      std::vector<Tensor> in{g[0], qs, ks, vs};
      if (has_bias) in.push_back(sb.unpack(name).expand(scores));
      if (has_mask) in.push_back(sm.unpack(name).expand(scores));
      const TensorOptions like{.dtype = qs.dtype(), .device = qs.device()};
      std::vector<Tensor> grads{empty(qs.shape(), like), empty(ks.shape(), like), empty(vs.shape(), like)};
      if (gb || gm) grads.push_back(empty(scores, like));
      const AttentionParams p{has_bias, has_mask};
      detail::run(Op::attention_backward, in, grads, &p);
      return {gq ? grads[0] : Tensor(), gk ? grads[1] : Tensor(), gv ? grads[2] : Tensor(),
              gb ? sum_to(grads[3], bias_shape) : Tensor(), gm ? sum_to(grads[3], mask_shape) : Tensor()};
    }
    const DenormalsAsZero no_denormals;  // the masked pairs' weights, as in the forward kernel
    Tensor s = matmul(qs, ks.transpose(-2, -1));
    if (has_bias) s = add(s, sb.unpack(name));
    if (has_mask) s = add(s, sm.unpack(name));
    const Tensor p = softmax(s, -1), dp = matmul(g[0], vs.transpose(-2, -1));
    const Tensor ds = mul(p, sub(dp, sum(mul(dp, p), {rank - 1}, true)));
    return {gq ? matmul(ds, ks) : Tensor(), gk ? matmul(ds.transpose(-2, -1), qs) : Tensor(),
            gv ? matmul(p.transpose(-2, -1), g[0]) : Tensor(), gb ? sum_to(ds, bias_shape) : Tensor(),
            gm ? sum_to(ds, mask_shape) : Tensor()};
  });
  return out;
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  TVC_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1, "matmul: both arguments need at least 1 dim, got ", "shapes ",
            a_in.shape(), " and ", b_in.shape());
  DType dt = promote_types(a_in.dtype(), b_in.dtype());
  Tensor a = a_in.to(dt), b = b_in.to(dt);
  bool a_vec = a.dim() == 1, b_vec = b.dim() == 1;
  if (a_vec) a = a.unsqueeze(0);
  if (b_vec) b = b.unsqueeze(1);
  TVC_CHECK(a.shape().back() == b.shape()[b.dim() - 2], "matmul: shapes ", a_in.shape(), " and ", b_in.shape(),
            " cannot be multiplied (inner dims ", a.shape().back(), " and ", b.shape()[b.dim() - 2], ")");
  int64_t M = a.shape()[a.dim() - 2], K = a.shape().back(), N = b.shape().back();
  Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  Tensor out;
  if (batch_b.empty()) {
    // (..., M, K) @ (K, N): fold the batch into M.
    Tensor a2 = a.reshape({1, -1, K});
    out = bmm(a2, b.unsqueeze(0)).reshape([&] {
      Shape s = batch_a;
      s.push_back(M);
      s.push_back(N);
      return s;
    }());
  } else {
    Shape batch = broadcast_shapes(batch_a, batch_b, "matmul");
    Shape sa = batch, sb = batch;
    sa.insert(sa.end(), {M, K});
    sb.insert(sb.end(), {K, N});
    Tensor a3 = a.expand(sa).reshape({-1, M, K});
    Tensor b3 = b.expand(sb).reshape({-1, K, N});
    Shape so = batch;
    so.insert(so.end(), {M, N});
    out = bmm(a3, b3).reshape(so);
  }
  if (a_vec) out = out.squeeze(-2);
  if (b_vec) out = out.squeeze(-1);
  return out;
}

namespace {

// Whether linear runs as the linear kernel: x, weight and bias (if any) of one float32 or float64
// dtype and device, something to compute, and the device has the kernel.
bool linear_kernel_fits(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return (x.dtype() == DType::Float32 || x.dtype() == DType::Float64) && weight.dtype() == x.dtype() &&
         (!bias.defined() || (bias.dtype() == x.dtype() && bias.device() == x.device())) &&
         weight.device() == x.device() && x.numel() > 0 && weight.shape()[1] > 0 &&
         kernel_registry().supports(Op::linear, x.device());
}

// The linear kernel on x (*, K), given as its rows (M, K): x @ weight^T (+ bias where defined),
// then the GELU where gelu is set, in x's shape but for the last dim; no autograd. The result is a tensor of its
// own (the kernel writes it through a (M, N) view), not a view: in-place ops on it (an inplace
// ReLU after a Linear) are then allowed under autograd.
Tensor run_linear(const Tensor& x, const Tensor& rows, const Tensor& weight, const Tensor& bias, bool gelu) {
  const LinearParams p{gelu, detail::may_keep_weight_forms(weight)};  // (before grad mode is off)
  NoGradGuard no_grad;
  const int64_t N = weight.shape()[0];
  Shape shape = x.shape();
  shape.back() = N;
  Tensor out = empty(shape, {.dtype = x.dtype(), .device = x.device()});
  std::vector<Tensor> in{rows.detach(), weight.detach()};
  if (bias.defined()) in.push_back(bias.detach());
  detail::run(Op::linear, in, {out.view({rows.shape()[0], N})}, &p);
  return out;
}

// linear with a bias as one linear kernel (the bias added to the product's blocks while in
// cache); its backward as matmuls and a sum over rows.
Tensor linear_fused(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const int64_t K = weight.shape()[1], N = weight.shape()[0];
  const Tensor rows = x.reshape({-1, K});  // a view, or the one copy of a non-contiguous x
  Tensor y = run_linear(x, rows, weight, bias, false);
  if (!autograd::any_requires_grad({x, weight, bias})) return y;
  const bool gx = x.requires_grad(), gw = weight.requires_grad(), gb = bias.requires_grad();
  const Shape x_shape = x.shape();
  SavedTensor srows(gw ? rows : Tensor()), sweight(gx ? weight : Tensor());
  autograd::record("AddmmBackward0", {x, weight, bias}, {y}, [=](const GradList& g) -> GradList {
    const char* node = "AddmmBackward0";
    const Tensor g2 = g[0].reshape({-1, N});
    return {gx ? matmul(g2, sweight.unpack(node)).reshape(x_shape) : Tensor(),
            gw ? matmul(g2.t(), srows.unpack(node)) : Tensor(), gb ? sum(g2, {0}) : Tensor()};
  });
  return y;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TVC_CHECK(weight.dim() == 2, "linear: weight must be 2-d (out_features, in_features), got shape ", weight.shape());
  TVC_CHECK(x.dim() >= 1 && x.shape().back() == weight.shape()[1], "linear: input of shape ", x.shape(),
            " does not end in in_features = ", weight.shape()[1], " (weight shape ", weight.shape(), ")");
  if (bias.defined()) {
    TVC_CHECK(bias.dim() == 1 && bias.shape()[0] == weight.shape()[0], "linear: bias of shape ", bias.shape(),
              " does not match out_features = ", weight.shape()[0]);
    if (linear_kernel_fits(x, weight, bias)) return linear_fused(x, weight, bias);
  } else if (linear_kernel_fits(x, weight, bias) && !autograd::any_requires_grad({x, weight})) {
    // Without a bias the kernel too (its kept weight), where autograd does not record: the bits
    // of the matmul below.
    return run_linear(x, x.reshape({-1, weight.shape()[1]}), weight, bias, false);
  }
  Tensor y;
  if (x.dtype() == DType::Float32 && weight.dtype() == DType::BFloat16) {
    // A bfloat16 weight (nn::convert_weights_to_bfloat16): without autograd on the CPU, x rounded to
    // bfloat16 and the products summed in float32 into a float32 y; else in float32 (exact).
    if (x.device() == Device::CPU && weight.shape()[1] > 0 && !autograd::any_requires_grad({x, weight, bias})) {
      NoGradGuard no_grad;
      const int64_t K = weight.shape()[1], N = weight.shape()[0];
      const Tensor a = x.to(DType::BFloat16).reshape({1, -1, K});
      Shape shape = x.shape();
      shape.back() = N;
      y = empty(shape);  // a tensor of its own, as run_linear's
      if (y.numel() > 0) detail::run(Op::bmm, {a, weight.t().unsqueeze(0)}, {y.view({1, a.shape()[1], N})});
    } else {
      y = matmul(x, weight.to(DType::Float32).t());
    }
  } else {
    y = matmul(x, weight.t());
  }
  return bias.defined() ? add(y, bias) : y;
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TVC_CHECK(bias.defined(), "linear_gelu: needs a bias");
  const bool fused = weight.dim() == 2 && x.dim() >= 1 && x.shape().back() == weight.shape()[1] && bias.dim() == 1 &&
                     bias.shape()[0] == weight.shape()[0] && linear_kernel_fits(x, weight, bias) &&
                     !autograd::any_requires_grad({x, weight, bias});
  return fused ? run_linear(x, x.reshape({-1, weight.shape()[1]}), weight, bias, true) : gelu(linear(x, weight, bias));
}

Tensor linear_gelu_linear(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2) {
  TVC_CHECK(w1.defined() && w1.dim() == 2 && w2.defined() && w2.dim() == 2,
            "linear_gelu_linear: w1 and w2 must be 2-d (out_features, in_features), got shapes ",
            w1.defined() ? cat_str(w1.shape()) : std::string("undefined"), " and ",
            w2.defined() ? cat_str(w2.shape()) : std::string("undefined"));
  TVC_CHECK(w2.shape()[1] == w1.shape()[0], "linear_gelu_linear: w2 of shape ", w2.shape(),
            " does not take w1's out_features = ", w1.shape()[0], " (w1 shape ", w1.shape(), ")");
  TVC_CHECK(x.defined() && x.dim() >= 1 && x.shape().back() == w1.shape()[1], "linear_gelu_linear: input of shape ",
            x.defined() ? cat_str(x.shape()) : std::string("undefined"),
            " does not end in w1's in_features = ", w1.shape()[1]);
  const bool fused = b1.defined() && b2.defined() && linear_kernel_fits(x, w1, b1) && linear_kernel_fits(x, w2, b2) &&
                     b1.dim() == 1 && b1.shape()[0] == w1.shape()[0] && b2.dim() == 1 &&
                     b2.shape()[0] == w2.shape()[0] && kernel_registry().supports(Op::linear_gelu_linear, x.device()) &&
                     !autograd::any_requires_grad({x, w1, b1, w2, b2});
  if (!fused) return linear(linear_gelu(x, w1, b1), w2, b2);  // (which check the biases)
  NoGradGuard no_grad;
  const int64_t C = w1.shape()[1], O = w2.shape()[0];
  const Tensor rows = x.reshape({-1, C});
  Shape shape = x.shape();
  shape.back() = O;
  Tensor out = empty(shape, {.dtype = x.dtype(), .device = x.device()});
  detail::run(Op::linear_gelu_linear, {rows.detach(), w1.detach(), b1.detach(), w2.detach(), b2.detach()},
              {out.view({rows.shape()[0], O})});
  return out;
}

Tensor Tensor::matmul(const Tensor& other) const { return tvc::matmul(*this, other); }

}  // namespace tvc
