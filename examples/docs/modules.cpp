// The examples of docs/modules.md, compiled by the build (tools/check_doc_examples.py).
#include <memory>
#include <string>
#include <vector>

#include "tvc/nn/attention.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/layers.h"

void write_a_module(const tvc::Tensor& x);
void attend(const tvc::Tensor& q, const tvc::Tensor& k, const tvc::Tensor& v, const tvc::Tensor& pad,
            const tvc::Tensor& causal, const tvc::Tensor& x);

void write_a_module(const tvc::Tensor& x) {
  // [doc]
  using namespace tvc;

  class Block : public nn::Cloneable<Block> {
   public:
    explicit Block(int64_t c) {
      register_module("conv1", std::make_shared<nn::Conv2d>(c, c, 3, nn::ConvOptions{.padding = 1, .bias = false}));
      register_module("bn1", std::make_shared<nn::BatchNorm2d>(c));
      register_parameter("gamma", full({c, 1, 1}, 1e-5));
    }
    Tensor forward(const Tensor& x) override {
      Tensor y = child("bn1")(child("conv1")(x));
      return x + relu(y) * parameter("gamma");
    }
  };

  auto model = std::make_shared<nn::Sequential>(
      std::initializer_list<nn::ModulePtr>{std::make_shared<Block>(16), std::make_shared<nn::AdaptiveAvgPool2d>(1),
                                           std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(16, 10)});
  Tensor logits = (*model)(x);                                 // runs the hooks; forward(x) alone does not
  std::vector<std::string> keys = model->state_dict().keys();  // "0.conv1.weight", ..., "3.bias"
  // [end doc]
}

void attend(const tvc::Tensor& q, const tvc::Tensor& k, const tvc::Tensor& v, const tvc::Tensor& pad,
            const tvc::Tensor& causal, const tvc::Tensor& x) {
  using namespace tvc;
  // [doc]
  nn::MultiheadAttention mha(768, 12, {.batch_first = true});
  auto [out, weights] = mha(q, k, v, {.key_padding_mask = pad, .attn_mask = causal});  // (N, L, E), (N, L, S)
  auto [o, none] = mha(q, k, v, {.need_weights = false, .average_attn_weights = false});
  Tensor y = mha(x);  // self-attention, output only (Sequential use)
  // [end doc]
}
