// Built out of tree against an installed tvc with `pkg-config --cflags --static --libs tvc-swa
// tvc-hybrid` (tests/test_install.sh): the SWA average of a layer before and after one step is the
// mean of the two weights, and an SE block from the hybrid layer's registry keeps the shape of a
// feature map.
#include <tvc/autograd.h>
#include <tvc/hybrid/blocks.h>
#include <tvc/nn/layers.h>
#include <tvc/ops.h>
#include <tvc/swa/averaged_model.h>

#include <cstdio>
#include <memory>

int main() {
  try {
    auto layer = std::make_shared<tvc::nn::Linear>(4, 2);
    tvc::swa::AveragedModel average(*layer);
    average.update_parameters(*layer);
    tvc::Tensor w0 = layer->weight().clone();
    {
      tvc::NoGradGuard no_grad;
      layer->weight().add_(tvc::randn({2, 4}));
    }
    average.update_parameters(*layer);
    bool averaged = tvc::allclose(average.module().get_parameter("weight"), (w0 + layer->weight()) / 2.0);
    std::printf("SWA of the two weights: %s\n", averaged ? "ok" : "wrong");
    tvc::nn::ModulePtr se = tvc::hybrid::make_block("SEBlock", {}, {.out_channels = 32});
    tvc::Tensor map = tvc::randn({2, 32, 3, 3});
    bool block_ok = (*se)(map).shape() == map.shape() && se->has_child("excitation");
    std::printf("hybrid SEBlock on a (2, 32, 3, 3) map: %s\n", block_ok ? "ok" : "wrong");
    return averaged && block_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
