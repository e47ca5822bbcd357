// Losses: cross_entropy, nll_loss, mse_loss, binary_cross_entropy_with_logits.
// Shape legend: N batch, K classes, d1,... extra dims of dense predictions (N,K,d1,...).
//
// All are composed from other ops (log_softmax, gather, index_select, sums), so autograd comes
// from those. Definitions follow PyTorch 1.13 exactly: a weighted mean divides by the summed
// weights of the non-ignored targets, and label smoothing adds eps/K times the (weighted)
// negative sum of the log-probabilities, reduced with the same normalisation.
#include "internal.h"

namespace tvc {

namespace {

Tensor reduce(const Tensor& loss, Reduction r) {
  if (r == Reduction::None) return loss;
  if (r == Reduction::Sum) return sum(loss);
  return mean(loss);
}

// Class-index targets checked against logits or log-probabilities of shape (N,K,d1,...) (or (K)
// with a 0-d target), with the per-element weights they select.
struct ClassTargets {
  Tensor x;        // the input, (N,K,d1,...)
  Tensor ignored;  // bool (N,d1,...): target == ignore_index
  Tensor safe;     // int64 (N,d1,...): the target with ignored entries replaced by 0
  Tensor w;        // (N,d1,...): weight[target], 0 where ignored
  bool unbatched = false;
};

ClassTargets class_targets(const char* op, const Tensor& input, const Tensor& target, const Tensor& weight,
                           int64_t ignore_index) {
  TVC_CHECK(input.defined() && target.defined(), op, ": undefined input or target");
  TVC_CHECK(input.dim() >= 1, op, ": input must have a class dim, got shape ", input.shape());
  TVC_CHECK(is_floating(input.dtype()), op, ": input must be floating, got ", dtype_name(input.dtype()));
  TVC_CHECK(target.dtype() == DType::Int64, op, ": class-index target must be int64, got ", dtype_name(target.dtype()),
            " (input shape ", input.shape(), ", target shape ", target.shape(), ")");
  ClassTargets ct;
  ct.unbatched = input.dim() == 1;
  ct.x = ct.unbatched ? input.unsqueeze(0) : input;
  Tensor tg = ct.unbatched ? target.unsqueeze(0) : target;
  Shape expect = ct.x.shape();
  expect.erase(expect.begin() + 1);
  TVC_CHECK(tg.shape() == expect, op, ": target of shape ", target.shape(), " does not match input of shape ",
            input.shape(), " (expected target shape ", ct.unbatched ? Shape{} : expect, ")");
  int64_t k = ct.x.shape()[1];
  for (double v : tg.to_vector()) {
    auto c = static_cast<int64_t>(v);
    TVC_CHECK(c == ignore_index || (c >= 0 && c < k), op, ": target value ", c, " is out of range for ", k,
              " classes (input shape ", input.shape(), ", target shape ", target.shape(), ")");
  }
  if (weight.defined())
    TVC_CHECK(weight.dim() == 1 && weight.shape()[0] == k, op, ": weight of shape ", weight.shape(), " must be (K) = [",
              k, "] for input of shape ", input.shape());
  ct.ignored = eq(tg, scalar_like(ignore_index, DType::Int64));
  ct.safe = where(ct.ignored, zeros_like(tg), tg);
  Tensor w = weight.defined()
                 ? index_select(weight.to(input.dtype()), 0, ct.safe.reshape({-1})).reshape(ct.safe.shape())
                 : ones(ct.safe.shape(), {.dtype = input.dtype()});
  ct.w = masked_fill(w, ct.ignored, 0.0);
  return ct;
}

// -w[target] * x[target] per element of (N,d1,...).
Tensor picked_loss(const ClassTargets& ct) { return neg(mul(gather(ct.x, 1, ct.safe.unsqueeze(1)).squeeze(1), ct.w)); }

// Reduces a per-element class loss: the mean divides by the summed weights of the non-ignored
// targets.
Tensor reduce_class_loss(const Tensor& loss, const ClassTargets& ct, Reduction r) {
  if (r == Reduction::None) return ct.unbatched ? loss.squeeze(0) : loss;
  if (r == Reduction::Sum) return sum(loss);
  return div(sum(loss), sum(ct.w));
}

}  // namespace

Tensor nll_loss(const Tensor& input, const Tensor& target, const Tensor& weight, int64_t ignore_index, Reduction r) {
  ClassTargets ct = class_targets("nll_loss", input, target, weight, ignore_index);
  return reduce_class_loss(picked_loss(ct), ct, r);
}

Tensor cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight, int64_t ignore_index, Reduction r,
                     double label_smoothing) {
  TVC_CHECK(label_smoothing >= 0 && label_smoothing <= 1, "cross_entropy: label_smoothing must be in [0, 1], got ",
            label_smoothing);
  TVC_CHECK(input.defined() && target.defined(), "cross_entropy: undefined input or target");
  TVC_CHECK(input.dim() >= 1, "cross_entropy: input must have a class dim, got shape ", input.shape());
  int64_t class_dim = input.dim() == 1 ? 0 : 1;
  int64_t k = input.shape()[class_dim];
  Shape weight_view(input.dim(), 1);  // weight broadcast along the class dim
  weight_view[class_dim] = k;
  if (weight.defined())
    TVC_CHECK(weight.dim() == 1 && weight.shape()[0] == k, "cross_entropy: weight of shape ", weight.shape(),
              " must be (K) = [", k, "] for input of shape ", input.shape());
  Tensor logp = log_softmax(input, class_dim);
  if (is_floating(target.dtype())) {
    // Class probabilities: -sum_k w_k t_k log p_k; the mean divides by the number of elements.
    TVC_CHECK(target.shape() == input.shape(), "cross_entropy: probability target of shape ", target.shape(),
              " must have the input's shape ", input.shape());
    TVC_CHECK(ignore_index < 0, "cross_entropy: ignore_index (", ignore_index,
              ") is not supported for probability targets");
    Tensor t = target.to(input.dtype());
    if (label_smoothing > 0)
      t = add(mul(t, scalar_like(1 - label_smoothing, t.dtype())), scalar_like(label_smoothing / k, t.dtype()));
    Tensor prod = mul(logp, t);
    if (weight.defined()) prod = mul(prod, weight.to(input.dtype()).view(weight_view));
    Tensor loss = neg(sum(prod, {class_dim}));
    if (r != Reduction::Mean) return reduce(loss, r);
    return div(sum(loss), scalar_like(static_cast<double>(loss.numel()), loss.dtype()));
  }
  ClassTargets ct = class_targets("cross_entropy", logp, target, weight, ignore_index);
  Tensor loss = picked_loss(ct);
  if (label_smoothing > 0) {
    DType dt = loss.dtype();
    Shape wv(ct.x.dim(), 1);
    wv[1] = k;
    Tensor lw = weight.defined() ? mul(ct.x, weight.to(dt).view(wv)) : ct.x;
    Tensor smooth = masked_fill(neg(sum(lw, {1})), ct.ignored, 0.0);
    loss = add(mul(loss, scalar_like(1 - label_smoothing, dt)), mul(smooth, scalar_like(label_smoothing / k, dt)));
  }
  return reduce_class_loss(loss, ct, r);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction r) {
  TVC_CHECK(input.defined() && target.defined(), "mse_loss: undefined input or target");
  broadcast_shapes(input.shape(), target.shape(), "mse_loss");
  Tensor d = sub(input, target);
  return reduce(mul(d, d), r);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target, const Tensor& weight, Reduction r,
                                        const Tensor& pos_weight) {
  TVC_CHECK(input.defined() && target.defined(), "binary_cross_entropy_with_logits: undefined input or target");
  TVC_CHECK(target.shape() == input.shape(), "binary_cross_entropy_with_logits: target of shape ", target.shape(),
            " must have the input's shape ", input.shape());
  TVC_CHECK(is_floating(input.dtype()), "binary_cross_entropy_with_logits: input must be floating, got ",
            dtype_name(input.dtype()));
  DType dt = input.dtype();
  Tensor t = target.to(dt);
  Tensor one = scalar_like(1, dt);
  // log(1 + exp(-x)) = m + log(exp(-m) + exp(-x - m)) with m = max(-x, 0), which never overflows.
  // m's gradient cancels exactly, so it is taken as a constant.
  Tensor m = relu(neg(input.detach()));
  Tensor log1p_exp = add(m, log(add(exp(neg(m)), exp(sub(neg(input), m)))));
  if (pos_weight.defined()) {
    TVC_CHECK(broadcast_shapes(input.shape(), pos_weight.shape(), "binary_cross_entropy_with_logits") == input.shape(),
              "binary_cross_entropy_with_logits: pos_weight of shape ", pos_weight.shape(),
              " does not broadcast to the input's shape ", input.shape());
    // (1 - t) x + (1 + (pos_weight - 1) t) log(1 + exp(-x))
    log1p_exp = mul(add(one, mul(sub(pos_weight.to(dt), one), t)), log1p_exp);
  }
  Tensor loss = add(mul(sub(one, t), input), log1p_exp);
  if (weight.defined()) {
    TVC_CHECK(broadcast_shapes(input.shape(), weight.shape(), "binary_cross_entropy_with_logits") == input.shape(),
              "binary_cross_entropy_with_logits: weight of shape ", weight.shape(),
              " does not broadcast to the input's shape ", input.shape());
    loss = mul(loss, weight.to(dt));
  }
  return reduce(loss, r);
}

}  // namespace tvc
