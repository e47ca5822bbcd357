// Built out of tree against an installed tvc (tests/test_install.sh): creates tensors, runs ops
// with autograd and prints the gradient (d/dx sum(x*x + 3x) = 2x + 3), then takes one SGD step
// on an nn::Linear layer, which must lower its loss, and keeps its SWA average (the swa/ headers
// installed under tvc/swa): the mean of the weights before and after the step. Last, an SE block
// from the hybrid layer's registry (tvc/hybrid) keeps the shape of a feature map.
#include <tvc/autograd.h>
#include <tvc/hybrid/blocks.h>
#include <tvc/nn/layers.h>
#include <tvc/ops.h>
#include <tvc/optim.h>
#include <tvc/swa/averaged_model.h>

#include <memory>

#include <cstdio>

int main() {
  try {
    tvc::Tensor x = tvc::tensor<float>({1, 2, 3}).requires_grad_();
    tvc::Tensor y = tvc::sum(x * x + x * 3.0);
    y.backward();
    std::printf("y = %g, grad = %s\n", y.item<double>(), x.grad().repr().c_str());
    bool ok = y.item<double>() == 32 && tvc::allclose(x.grad(), tvc::tensor<float>({5, 7, 9}));

    auto layer = std::make_shared<tvc::nn::Linear>(4, 2);
    tvc::optim::SGD sgd(layer->parameters(), {.lr = 0.1});
    tvc::swa::AveragedModel average(*layer);
    average.update_parameters(*layer);
    tvc::Tensor w0 = layer->weight().clone();
    tvc::Tensor input = tvc::randn({8, 4}), target = tvc::randn({8, 2});
    double before = tvc::mse_loss((*layer)(input), target).item<double>();
    tvc::Tensor loss = tvc::mse_loss((*layer)(input), target);
    sgd.zero_grad();
    loss.backward();
    sgd.step();
    double after = tvc::mse_loss((*layer)(input), target).item<double>();
    std::printf("linear layer loss %g -> %g after one SGD step\n", before, after);
    average.update_parameters(*layer);
    bool averaged = tvc::allclose(average.module().get_parameter("weight"), (w0 + layer->weight()) / 2.0);
    std::printf("SWA of the two weights: %s\n", averaged ? "ok" : "wrong");
    tvc::nn::ModulePtr se = tvc::hybrid::make_block("SEBlock", {}, {.out_channels = 32});
    tvc::Tensor map = tvc::randn({2, 32, 3, 3});
    bool block_ok = (*se)(map).shape() == map.shape() && se->has_child("excitation");
    std::printf("hybrid SEBlock on a (2, 32, 3, 3) map: %s\n", block_ok ? "ok" : "wrong");
    return ok && after < before && averaged && block_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
