#include <gtest/gtest.h>

#include "tvc/autograd.h"
#include "tvc/ops.h"

using namespace tvc;

TEST(Tensor, BasicArithmeticAndBackward) {
  Tensor a = randn({3, 4}, {.dtype = DType::Float64}).requires_grad_();
  Tensor b = randn({4}, {.dtype = DType::Float64}).requires_grad_();
  Tensor y = sum(mul(relu(a), b) + exp(a));
  y.backward();
  ASSERT_TRUE(a.grad().defined());
  ASSERT_EQ(b.grad().shape(), Shape({4}));
  std::cout << a.grad() << "\n" << b.grad() << "\n";
}
