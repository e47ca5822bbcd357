// Built out of tree against an installed tvc with only `pkg-config --cflags --static --libs tvc`
// (tests/test_install.sh): the core library alone. Creates tensors, runs ops with autograd and
// checks the gradient (d/dx sum(x*x + 3x) = 2x + 3), then takes one SGD step on an nn::Linear
// layer, which must lower its loss.
#include <tvc/tvc.h>

#include <cstdio>
#include <memory>

int main() {
  try {
    tvc::Tensor x = tvc::tensor<float>({1, 2, 3}).requires_grad_();
    tvc::Tensor y = tvc::sum(x * x + x * 3.0);
    y.backward();
    std::printf("tvc %s: y = %g, grad = %s\n", TVC_VERSION_STRING, y.item<double>(), x.grad().repr().c_str());
    bool ok = y.item<double>() == 32 && tvc::allclose(x.grad(), tvc::tensor<float>({5, 7, 9}));

    auto layer = std::make_shared<tvc::nn::Linear>(4, 2);
    tvc::optim::SGD sgd(layer->parameters(), {.lr = 0.1});
    tvc::Tensor input = tvc::randn({8, 4}), target = tvc::randn({8, 2});
    double before = tvc::mse_loss((*layer)(input), target).item<double>();
    tvc::Tensor loss = tvc::mse_loss((*layer)(input), target);
    sgd.zero_grad();
    loss.backward();
    sgd.step();
    double after = tvc::mse_loss((*layer)(input), target).item<double>();
    std::printf("linear layer loss %g -> %g after one SGD step\n", before, after);
    return ok && after < before ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
