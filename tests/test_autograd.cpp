// Autograd: accumulation, hooks, retain_graph, saved-tensor versions, in-place rules, no-grad.
#include <gtest/gtest.h>

#include <thread>

#include "compare.h"
#include "tvc/autograd.h"
#include "tvc/internal/autograd.h"
#include "tvc/ops.h"
#include "tvc/profiler.h"

using namespace tvc;
using tvc::test::relative_error;

TEST(Autograd, AccumulatesIntoLeaves) {
  Tensor x = randn({3}).requires_grad_();
  sum(mul(x, x)).backward();
  Tensor first = x.grad().clone();
  sum(mul(x, x)).backward();
  EXPECT_LE(relative_error(x.grad(), mul(first, scalar_like(2, DType::Float32))), 1e-7);
  EXPECT_LE(relative_error(first, mul(x, scalar_like(2, DType::Float32))), 1e-7);
}

// A leaf's first gradient is the incoming tensor itself when nothing else holds it (no copy), and
// a copy otherwise: never the memory of another leaf's gradient, of the caller's tensor or of
// what a hook kept.
TEST(Autograd, FirstGradientIsTakenOnlyWhenNothingElseHoldsIt) {
  Tensor x = randn({4, 5}).requires_grad_();
  const void* incoming = nullptr;
  const int handle = x.register_hook([&](const Tensor& g) {
    incoming = g.data_ptr<float>();
    return Tensor();
  });
  sum(mul(x, x)).backward();
  EXPECT_EQ(x.grad().data_ptr<float>(), incoming);  // taken
  EXPECT_LE(relative_error(x.grad(), mul(x.detach(), scalar_like(2, DType::Float32))), 1e-7);
  x.remove_hook(handle);
  // add's backward hands the same gradient to both inputs: two separate tensors.
  Tensor a = randn({3}).requires_grad_(), b = randn({3}).requires_grad_();
  Tensor g = randn({3});
  add(a, b).backward(g);
  EXPECT_NE(a.grad().data_ptr<float>(), b.grad().data_ptr<float>());
  EXPECT_NE(a.grad().data_ptr<float>(), g.data_ptr<float>());
  EXPECT_NE(b.grad().data_ptr<float>(), g.data_ptr<float>());
  a.grad().add_(1.0);
  EXPECT_EQ(b.grad().to_vector(), g.to_vector());
  // Both of add's gradients reach one leaf: summed (in place only into a tensor of its own), the
  // caller's gradient untouched.
  Tensor e = randn({3}).requires_grad_();
  const std::vector<double> g_before = g.to_vector();
  add(e, e).backward(g);
  EXPECT_EQ(g.to_vector(), g_before);
  EXPECT_LE(relative_error(e.grad(), mul(g, scalar_like(2, DType::Float32))), 1e-7);
  // A hook that keeps the gradient: the leaf's is a copy.
  Tensor kept;
  Tensor c = randn({3}).requires_grad_();
  c.register_hook([&](const Tensor& grad) {
    kept = grad;
    return Tensor();
  });
  sum(mul(c, c)).backward();
  EXPECT_NE(c.grad().data_ptr<float>(), kept.data_ptr<float>());
  // select's backward writes the gradient into a zero tensor of the input's size: the whole of it
  // is the leaf's.
  Tensor d = randn({2, 3}).requires_grad_();
  sum(d.select(0, 1)).backward();
  EXPECT_EQ(d.grad().to_vector(), std::vector<double>({0, 0, 0, 1, 1, 1}));
  // linear's weight and bias gradients are views (reshapes) of its product's and its sum's
  // results, which nothing else holds: taken too, no copy kernel in the backward.
  Tensor rows = randn({5, 4}).requires_grad_(), w = randn({3, 4}).requires_grad_(), bias = randn({3}).requires_grad_();
  const void* incoming_w = nullptr;
  w.register_hook([&](const Tensor& grad) {
    incoming_w = grad.data_ptr<float>();
    return Tensor();
  });
  Tensor dy = randn({5, 3});
  Tensor y = linear(rows, w, bias);
  {
    KernelProfiler profiler;
    y.backward(dy);
    for (const KernelRecord& r : profiler.records()) EXPECT_NE(r.op, "copy") << "shape " << r.shape;
  }
  EXPECT_EQ(w.grad().data_ptr<float>(), incoming_w);
  EXPECT_LE(relative_error(w.grad(), matmul(dy.t(), rows.detach())), 1e-6);
  EXPECT_LE(relative_error(bias.grad(), sum(dy, {0})), 1e-6);
  // A view of the caller's tensor (reshape's backward reshapes the incoming gradient): copied.
  Tensor f = randn({2, 3}).requires_grad_();
  Tensor g6 = randn({6});
  const std::vector<double> g6_before = g6.to_vector();
  f.reshape({6}).backward(g6);
  EXPECT_NE(f.grad().data_ptr<float>(), g6.data_ptr<float>());
  f.grad().add_(1.0);
  EXPECT_EQ(g6.to_vector(), g6_before);
}

// Views of parts of one tensor (select, slice): the first part's backward writes its gradient
// into zeros of the tensor's shape, each later part's is added into that gathered gradient in
// place (one fill, no add of whole-sized tensors), with add's values; where the gathered gradient
// is the caller's tensor, a new sum instead, the caller's tensor untouched.
TEST(Autograd, PartsOfATensorAddTheirGradientsIntoItsOwn) {
  Tensor x = randn({3, 4, 5}).requires_grad_();
  const Tensor a = randn({3, 5}), b = randn({3, 5}), c = randn({3, 4, 3});
  Tensor loss = add(add(sum(mul(x.select(1, 0), a)), sum(mul(x.select(1, 2), b))), sum(mul(x.slice(2, 1, 4), c)));
  {
    KernelProfiler profiler;
    loss.backward();
    int fills = 0;
    for (const KernelRecord& r : profiler.records()) {
      fills += r.op == "fill" && r.shape == Shape{3, 4, 5};
      EXPECT_FALSE(r.op == "add" && (r.shape == Shape{3, 4, 5})) << "a whole-sized add";
    }
    EXPECT_EQ(fills, 1);
  }
  Tensor want = zeros({3, 4, 5});
  want.select(1, 0).add_(a);
  want.select(1, 2).add_(b);
  want.slice(2, 1, 4).add_(c);
  EXPECT_LE(relative_error(x.grad(), want), 1e-7);
  // The caller's gradient for x itself gathered first: not added into.
  Tensor y = randn({3, 4, 5}).requires_grad_();
  const Tensor given = randn({3, 4, 5}), part = randn({3, 5});
  const std::vector<double> given_before = given.to_vector();
  backward({y, y.select(1, 1)}, {given, part});
  EXPECT_EQ(given.to_vector(), given_before);
  Tensor want_y = given.clone();
  want_y.select(1, 1).add_(part);
  EXPECT_LE(relative_error(y.grad(), want_y), 1e-7);
}

TEST(Autograd, SharedSubexpressionSumsGradients) {
  Tensor x = randn({4}, {.dtype = DType::Float64}).requires_grad_();
  Tensor y = exp(x);
  Tensor z = add(mul(y, y), y);  // d/dx = 2 e^2x + e^x
  sum(z).backward();
  Tensor expect =
      add(mul(exp(mul(x.detach(), scalar_like(2, DType::Float64))), scalar_like(2, DType::Float64)), exp(x.detach()));
  EXPECT_LE(relative_error(x.grad(), expect), 1e-14);
}

TEST(Autograd, SecondBackwardNeedsRetainGraph) {
  Tensor x = randn({3}).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward({}, true);
  y.backward();  // retained once: allowed
  try {
    y.backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
}

TEST(Autograd, InPlaceOnSavedTensorRaises) {
  Tensor x = randn({3}).requires_grad_();
  Tensor e = exp(x);  // saves its output
  Tensor y = sum(e);
  {
    NoGradGuard ng;
    e.mul_(2.0);  // even without grad mode the write bumps the version
  }
  EXPECT_THROW(y.backward(), Error);
  Tensor a = randn({3}).requires_grad_();
  Tensor b = mul(a, a);
  Tensor s = sigmoid(b);  // saves its output s
  Tensor loss = sum(s);
  s.add_(1.0);  // s now requires grad (non-leaf): in-place allowed, but s was saved
  try {
    loss.backward();
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("modified by an in-place operation"), std::string::npos) << err.what();
  }
}

TEST(Autograd, InPlaceRules) {
  Tensor leaf = randn({3}).requires_grad_();
  EXPECT_THROW(leaf.add_(1.0), Error);
  {
    NoGradGuard ng;
    leaf.add_(1.0);  // optimizers do this
  }
  Tensor base = mul(leaf, scalar_like(2, DType::Float32));
  Tensor view = base.narrow(0, 0, 2);
  EXPECT_THROW(view.mul_(3.0), Error);  // in-place on a view of a tensor that requires grad
  // In-place on a non-view intermediate rebases its history correctly.
  Tensor x = randn({5}, {.dtype = DType::Float64}).requires_grad_();
  Tensor h = mul(x, scalar_like(3, DType::Float64));
  h.mul_(2.0);
  {
    // ReLU in place under autograd writes into h and saves its result: no copy of h.
    KernelProfiler profiler;
    h.relu_();
    ASSERT_EQ(profiler.records().size(), 1u);
    EXPECT_EQ(profiler.records()[0].op, "relu");
  }
  sum(h).backward();
  Tensor xs = x.detach();
  Tensor expect = mul(gt(xs, scalar_like(0, DType::Float64)).to(DType::Float64), scalar_like(6, DType::Float64));
  // Multiplying in place by a tensor sharing h's storage saves a value the write changes: as in
  // PyTorch, backward then raises instead of returning a wrong gradient.
  Tensor h2 = mul(x, scalar_like(3, DType::Float64));
  h2.mul_(h2.detach());
  EXPECT_THROW(sum(h2).backward(), Error);
  // Its result changed in place after an in-place ReLU: PyTorch's error too (the gradient needs
  // that result).
  Tensor h3 = mul(x.detach(), scalar_like(3, DType::Float64)).requires_grad_();
  Tensor h4 = mul(h3, scalar_like(1, DType::Float64));
  h4.relu_();
  h4.mul_(2.0);
  EXPECT_THROW(sum(h4).backward(), Error);
  EXPECT_LE(relative_error(x.grad(), expect), 1e-14);
}

TEST(Autograd, TensorHooksAndRetainGrad) {
  Tensor x = randn({3}).requires_grad_();
  Tensor y = mul(x, scalar_like(2, DType::Float32));
  y.retain_grad();
  int calls = 0;
  y.register_hook([&](const Tensor& g) {
    ++calls;
    return mul(g, scalar_like(10, DType::Float32));  // replaces the gradient
  });
  int leaf_handle = x.register_hook([&](const Tensor&) {
    ++calls;
    return Tensor();  // observe only
  });
  sum(y).backward();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(x.grad().to_vector(), std::vector<double>(3, 20));
  EXPECT_EQ(y.grad().to_vector(), std::vector<double>(3, 10));
  x.remove_hook(leaf_handle);
  x.set_grad(Tensor());
  sum(mul(x, x)).backward();
  EXPECT_EQ(calls, 2);
}

TEST(Autograd, NoGradIsThreadLocal) {
  Tensor x = randn({2}).requires_grad_();
  NoGradGuard ng;
  EXPECT_FALSE(exp(x).requires_grad());
  bool other_thread_records = false;
  std::thread t([&] { other_thread_records = exp(x).requires_grad(); });
  t.join();
  EXPECT_TRUE(other_thread_records);
}

TEST(Autograd, GradFunctionAndUnusedInputs) {
  Tensor a = randn({3}, {.dtype = DType::Float64}).requires_grad_();
  Tensor b = randn({3}, {.dtype = DType::Float64}).requires_grad_();
  Tensor y = sum(mul(a, a));
  auto g = grad({y}, {a, b}, {}, true, true);
  EXPECT_LE(relative_error(g[0], mul(a.detach(), scalar_like(2, DType::Float64))), 1e-15);
  EXPECT_FALSE(g[1].defined());
  EXPECT_FALSE(a.grad().defined());        // grad() does not accumulate
  EXPECT_THROW(grad({y}, {a, b}), Error);  // b unused without allow_unused
}

TEST(Autograd, DetachAndGradFnNames) {
  Tensor x = randn({2, 2}).requires_grad_();
  Tensor y = relu(mul(x, x));
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name(), "ReluBackward0");
  Tensor d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.storage(), y.storage());
  EXPECT_NE(y.repr().find("grad_fn=<ReluBackward0>"), std::string::npos);
}

TEST(Autograd, SavedTensorsFreedAfterBackward) {
  Tensor x = randn({1000}).requires_grad_();
  std::weak_ptr<Storage> saved;
  {
    Tensor e = exp(x);
    saved = e.storage();
    Tensor loss = sum(e);
    loss.backward();
    e = Tensor();
    // loss still holds the graph, but the saved output was released by backward.
    EXPECT_TRUE(saved.expired());
  }
}

TEST(Autograd, BroadcastGradientsSumBack) {
  Tensor a = randn({3, 1}, {.dtype = DType::Float64}).requires_grad_();
  Tensor b = randn({4}, {.dtype = DType::Float64}).requires_grad_();
  sum(mul(a, b)).backward();
  EXPECT_EQ(a.grad().shape(), Shape({3, 1}));
  EXPECT_LE(relative_error(a.grad(), full({3, 1}, sum(b.detach()).item<double>(), {.dtype = DType::Float64})), 1e-15);
}
