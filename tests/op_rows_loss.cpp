// Op table rows: cross_entropy, nll_loss, mse_loss, binary_cross_entropy_with_logits.
// Inputs: a = logits (or log-probabilities), b = int64 class targets (or float targets),
// c = class weight (K) or weight, d = pos_weight.
#include "op_table.h"

namespace tvc::test {
namespace {

using In = const std::vector<Tensor>&;

// Class targets in [0, k) of shape, every third one from the second on replaced by ignore (when
// given), so some are always kept.
Tensor class_targets(int64_t k, const Shape& shape, uint64_t seed, std::optional<int64_t> ignore = std::nullopt) {
  Generator gen(seed);
  Tensor t = randint(0, k, shape, {.dtype = DType::Int64}, &gen);
  if (ignore) {
    std::vector<double> v = t.to_vector();
    std::vector<int64_t> out(v.begin(), v.end());
    for (size_t i = 1; i < out.size(); i += 3) out[i] = *ignore;
    t = tensor<int64_t>(out, shape);
  }
  return t;
}

Tensor class_weight(int64_t k, uint64_t seed) { return sample_uniform({k}, 0.25, 2.0, seed); }

// A mean over no elements is NaN (0/0) in PyTorch and here; empty samples go to the other
// reductions only.
bool allows_empty(const std::string& reduction) { return reduction != "mean"; }

std::vector<OpSample> without_empty(std::vector<OpSample> samples) {
  std::erase_if(samples, [](const OpSample& s) {
    for (const Tensor& t : s.inputs)
      if (t.numel() == 0) return true;
    return false;
  });
  return samples;
}

// (logits (N,K,...), targets (N,...), weight (K)) samples; the target ignore value when given.
std::vector<OpSample> class_samples(std::optional<int64_t> ignore, bool with_empty) {
  struct C {
    std::string label;
    Shape shape;
    bool non_contiguous = false;
  };
  std::vector<C> cases = {{"(N,K)", {5, 4}},
                          {"one class", {3, 1}},
                          {"size-1", {1, 1}},
                          {"(N,K) odd", {7, 3}},
                          {"non-contiguous", {6, 5}, true},
                          {"(N,K,d)", {2, 4, 5}},
                          {"(N,K,d1,d2)", {2, 3, 2, 3}},
                          {"empty batch", {0, 4}}};
  std::vector<OpSample> out;
  for (size_t i = 0; i < cases.size(); ++i) {
    const C& c = cases[i];
    if (!with_empty && shape_numel(c.shape) == 0) continue;
    Tensor x = sample_randn(c.shape, 700 + i);
    if (c.non_contiguous) x = non_contiguous(x);
    Shape ts = c.shape;
    ts.erase(ts.begin() + 1);
    int64_t k = c.shape[1];
    out.push_back({c.label, {x, class_targets(k, ts, 720 + i, ignore), class_weight(k, 740 + i)}});
  }
  return out;
}

// One cross_entropy row: weighted or not, with an ignore_index or not.
OpRow ce_row(bool weighted, std::optional<int64_t> ignore, const std::string& reduction, double smoothing) {
  int64_t ii = ignore.value_or(-100);
  std::string torch = "F.cross_entropy(a, b" + std::string(weighted ? ", weight=c" : "") +
                      ", ignore_index=" + std::to_string(ii) + ", reduction='" + reduction +
                      "', label_smoothing=" + std::to_string(smoothing) + ")";
  bool empty = allows_empty(reduction);
  return make_row(
      Op::cross_entropy, [ignore, empty] { return class_samples(ignore, empty); },
      [=](In x) {
        return cross_entropy(x[0], x[1], weighted ? x[2] : Tensor(), ii, parse_mode<Reduction>(reduction), smoothing);
      },
      torch, {0});
}

std::vector<OpSample> probability_samples() {
  std::vector<OpSample> out;
  std::vector<Shape> shapes = {{5, 4}, {1, 1}, {2, 3, 4}, {0, 3}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = softmax(sample_randn(shapes[i], 760 + i), 1);
    out.push_back(
        {"shape " + shape_str(shapes[i]), {sample_randn(shapes[i], 770 + i), p, class_weight(shapes[i][1], 780 + i)}});
  }
  return out;
}

std::vector<OpSample> unbatched_samples() {
  return {{"(K)", {sample_randn({5}, 790), tensor<int64_t>(std::vector<int64_t>{3}, Shape{}), class_weight(5, 791)}}};
}

std::vector<OpSample> bce_samples() {
  std::vector<OpSample> out;
  std::vector<Shape> shapes = {{4, 5}, {1, 1}, {7}, {2, 3, 5}, {0, 5}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t k = shapes[i].back();
    out.push_back({"shape " + shape_str(shapes[i]),
                   {sample_randn(shapes[i], 800 + i), sample_uniform(shapes[i], 0, 1, 810 + i),
                    sample_uniform({k}, 0.5, 2, 820 + i), sample_uniform({k}, 0.25, 3, 830 + i)}});
  }
  // Large logits: the stable form must not overflow.
  out.push_back({"large logits",
                 {mul(sample_randn({3, 4}, 840), scalar_like(40, DType::Float64)), sample_uniform({3, 4}, 0, 1, 841),
                  sample_uniform({4}, 0.5, 2, 842), sample_uniform({4}, 0.25, 3, 843)}});
  out.push_back({"non-contiguous",
                 {non_contiguous(sample_randn({5, 3}, 850)), non_contiguous(sample_uniform({5, 3}, 0, 1, 851)),
                  sample_uniform({3}, 0.5, 2, 852), sample_uniform({3}, 0.25, 3, 853)}});
  return out;
}

}  // namespace

std::vector<OpRow> loss_rows() {
  std::vector<OpRow> rows;
  // ---- cross_entropy
  for (std::string red : {"mean", "sum", "none"}) {
    rows.push_back(ce_row(false, std::nullopt, red, 0.0));
    rows.push_back(ce_row(true, 2, red, 0.0));
    rows.push_back(ce_row(true, 1, red, 0.15));
  }
  rows.push_back(ce_row(false, 3, "mean", 0.3));
  rows.push_back(make_row(
      Op::cross_entropy, [] { return without_empty(probability_samples()); },
      [](In x) { return cross_entropy(x[0], x[1], x[2], -100, Reduction::Mean, 0.2); },
      "F.cross_entropy(a, b, weight=c, label_smoothing=0.2)", {0, 1}));
  rows.push_back(make_row(Op::cross_entropy, probability_samples,
                          [](In x) { return cross_entropy(x[0], x[1], Tensor(), -100, Reduction::None); },
                          "F.cross_entropy(a, b, reduction='none')", {0, 1}));
  rows.push_back(make_row(Op::cross_entropy, unbatched_samples,
                          [](In x) { return cross_entropy(x[0], x[1], x[2], -100, Reduction::Mean, 0.1); },
                          "F.cross_entropy(a, b, weight=c, label_smoothing=0.1)", {0}));
  // ---- nll_loss (inputs are any values: nll_loss does not need log-probabilities)
  for (std::string red : {"mean", "sum", "none"})
    rows.push_back(make_row(
        Op::nll_loss, [red] { return class_samples(1, allows_empty(red)); },
        [red](In x) { return nll_loss(x[0], x[1], x[2], 1, parse_mode<Reduction>(red)); },
        "F.nll_loss(a, b, weight=c, ignore_index=1, reduction='" + red + "')", {0}));
  rows.push_back(make_row(
      Op::nll_loss, [] { return class_samples(std::nullopt, false); }, [](In x) { return nll_loss(x[0], x[1]); },
      "F.nll_loss(a, b)", {0}));
  // ---- mse_loss (broadcasting as PyTorch, which warns about it)
  for (std::string red : {"mean", "sum", "none"})
    rows.push_back(make_row(
        Op::mse_loss, [red] { return allows_empty(red) ? binary_samples() : without_empty(binary_samples()); },
        [red](In x) { return mse_loss(x[0], x[1], parse_mode<Reduction>(red)); },
        "F.mse_loss(a, b, reduction='" + red + "')", {0, 1}));
  // ---- binary_cross_entropy_with_logits (differentiable in the target too, as PyTorch)
  for (std::string red : {"mean", "sum", "none"})
    rows.push_back(make_row(
        Op::binary_cross_entropy_with_logits,
        [red] { return allows_empty(red) ? bce_samples() : without_empty(bce_samples()); },
        [red](In x) { return binary_cross_entropy_with_logits(x[0], x[1], x[2], parse_mode<Reduction>(red), x[3]); },
        "F.binary_cross_entropy_with_logits(a, b, weight=c, reduction='" + red + "', pos_weight=d)", {0, 1}));
  OpRow plain = make_row(
      Op::binary_cross_entropy_with_logits, [] { return without_empty(bce_samples()); },
      [](In x) { return binary_cross_entropy_with_logits(x[0], x[1]); }, "F.binary_cross_entropy_with_logits(a, b)",
      {0, 1});
  plain.tol = 5e-5;
  plain.note =
      "the input gradient sigmoid(a) - b cancels where b is near sigmoid(a): on the [1, 1] sample it is "
      "-0.0021 from terms near 0.70, and PyTorch's own float32 gradient is 8e-6 off its float64 one";
  rows.push_back(plain);
  return rows;
}

}  // namespace tvc::test
