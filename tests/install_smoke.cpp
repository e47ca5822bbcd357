// Built out of tree against an installed tvc (tests/test_install.sh): creates tensors, runs ops
// with autograd and prints the gradient. d/dx sum(x*x + 3x) = 2x + 3.
#include <tvc/autograd.h>
#include <tvc/ops.h>

#include <cstdio>

int main() {
  try {
    tvc::Tensor x = tvc::tensor<float>({1, 2, 3}).requires_grad_();
    tvc::Tensor y = tvc::sum(x * x + x * 3.0);
    y.backward();
    std::printf("y = %g, grad = %s\n", y.item<double>(), x.grad().repr().c_str());
    bool ok = y.item<double>() == 32 && tvc::allclose(x.grad(), tvc::tensor<float>({5, 7, 9}));
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
