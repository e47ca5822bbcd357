// Every model honours its module tree, as torchvision's does: a forward hook on each submodule
// fires as often as on torchvision's (a shared ReLU once per call), and replacing a submodule
// (an activation by an identity, a stage's block by a wrapped one) changes the output exactly as
// the same replacement does in torchvision, on the same weights (saved by tvc, loaded by torch).
#include <gtest/gtest.h>

#include <map>

#include "compare.h"
#include "test_helpers.h"
#include "torch_golden.h"
#include "tvc/autograd.h"
#include "tvc/models/models.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"
#include "tvc/serialize.h"

namespace tvc {
namespace {

// The input side of a model's checks: ViT takes only its image size.
int64_t input_size(const std::string& model) { return model.rfind("vit", 0) == 0 ? 224 : 64; }

// Children whose parameters torchvision's forward reads instead of calling them, so that its
// hooks on them never fire (Swin's shifted_window_attention: F.linear(x, self.qkv.weight, ...);
// torch's MultiheadAttention reads out_proj.weight in F.multi_head_attention_forward). tvc calls
// every child as a module (its hooks fire, a replacement takes effect): they run once per call
// of their parent.
const char* const kReadByTorchvisionNotCalled[] = {".attn.qkv", ".attn.proj", ".self_attention.out_proj"};

// torchvision's hook counts with the children above counted as tvc calls them.
std::map<std::string, int> as_called_by_tvc(std::map<std::string, int> counts) {
  for (auto& [path, count] : counts)
    for (const char* suffix : kReadByTorchvisionNotCalled)
      if (path.ends_with(suffix)) count = counts.at(path.substr(0, path.rfind('.')));
  return counts;
}

// The first activation module in named_modules order.
std::string first_activation(nn::Module& model) {
  for (const auto& [path, m] : model.named_modules())
    if (dynamic_cast<nn::Activation*>(m.get()) || dynamic_cast<nn::GELU*>(m.get()) ||
        dynamic_cast<nn::Sigmoid*>(m.get()))
      return path;
  return "";
}

// Calls of every submodule (by path, the root "") in one eval forward of a (1, 3, S, S) input.
std::map<std::string, int> hook_counts(nn::Module& model, const Tensor& x) {
  std::map<std::string, int> counts;
  std::vector<std::pair<nn::ModulePtr, nn::RemovableHandle>> handles;
  for (const auto& [path, m] : model.named_modules()) {
    counts[path] = 0;
    handles.emplace_back(
        m, m->register_forward_hook([&counts, p = path](nn::Module&, const nn::TensorList&, const nn::TensorList&) {
          ++counts[p];
          return std::optional<nn::TensorList>();
        }));
  }
  NoGradGuard no_grad;
  model(x);
  for (auto& [m, h] : handles) h.remove();
  return counts;
}

void check_tree(const std::string& name) {
  SCOPED_TRACE(name);
  test::TempDir dir;
  manual_seed(3);
  models::BackbonePtr model = models::create(name, {.num_classes = 10});
  model->eval();
  // Random normalisation statistics and affine values: with torchvision's initial ones some
  // replacements cancel out (relu(norm(relu(x))) == relu(norm(x)) for an identity norm).
  {
    NoGradGuard no_grad;
    for (const auto& m : model->modules())
      if (auto* bn = dynamic_cast<nn::BatchNorm*>(m.get())) {
        bn->running_mean().normal_(0, 0.2);
        bn->running_var().uniform_(0.5, 2.0);
        bn->weight().uniform_(0.5, 1.5);
        bn->bias().normal_(0, 0.2);
      }
  }
  const int64_t s = input_size(name);
  Tensor x = randn({1, 3, s, s});
  io::save_pth(dir / "weights.pth", io::Value(model->state_dict()));
  io::save_safetensors(dir / "input.safetensors", {{"x", x}});

  std::map<std::string, int> counts = hook_counts(*model, x);
  const std::string activation = first_activation(*model);
  const std::string stage = model->stage_nodes().at(1);
  ASSERT_FALSE(activation.empty());
  auto identity = std::make_shared<nn::Identity>();
  auto wrapper_relu = std::make_shared<nn::ReLU>();
  model->set_submodule(activation, identity);
  model->set_submodule(stage, std::make_shared<nn::Sequential>(
                                  std::initializer_list<nn::ModulePtr>{model->get_submodule(stage), wrapper_relu}));
  int replaced_calls = 0;
  for (nn::Module* m : {static_cast<nn::Module*>(identity.get()), static_cast<nn::Module*>(wrapper_relu.get())})
    m->register_forward_hook([&](nn::Module&, const nn::TensorList&, const nn::TensorList&) {
      ++replaced_calls;
      return std::optional<nn::TensorList>();
    });
  Tensor changed;
  {
    NoGradGuard no_grad;
    changed = (*model)(x);
  }
  // The new modules ran in the forward pass (as often as the ones they replace and wrap).
  EXPECT_EQ(replaced_calls, counts.at(activation) + counts.at(stage)) << activation << ", " << stage;

  std::string out = test::torch_run_uncached(R"(
import json, torchvision
from safetensors.torch import load_file
torch.set_num_threads(2)
model = torchvision.models.__dict__[")" + name +
                                             R"("](num_classes=10)
model.load_state_dict(torch.load(")" + (dir / "weights.pth") +
                                             R"("))
model.eval()
x = load_file(")" + (dir / "input.safetensors") +
                                             R"(")["x"]
counts = {path: 0 for path, _ in model.named_modules()}
def counter(path):
    def hook(module, args, output):
        counts[path] += 1
    return hook
handles = [m.register_forward_hook(counter(path)) for path, m in model.named_modules()]
with torch.no_grad():
    model(x)
for h in handles:
    h.remove()
def replace(path, module):
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent), leaf, module)
replace(")" + activation + R"(", torch.nn.Identity())
replace(")" + stage + R"(", torch.nn.Sequential(model.get_submodule(")" +
                                             stage + R"("), torch.nn.ReLU()))
with torch.no_grad():
    y = model(x)
print(json.dumps({"counts": counts, "changed": y.flatten().tolist()}))
)");
  if (out.empty()) return;  // torch is missing: torch_run_uncached recorded the failure
  nlohmann::json torch = nlohmann::json::parse(out);
  EXPECT_EQ(counts, as_called_by_tvc(torch["counts"].get<std::map<std::string, int>>()));
  Tensor want = tensor(torch["changed"].get<std::vector<double>>()).to(DType::Float32);
  EXPECT_LE(test::relative_error(changed.flatten(), want), 1e-4)
      << activation << " -> Identity, " << stage << " wrapped";
}

// One model per family in CI ...
TEST(ModelTree, HooksAndReplacementsAsTorchvision) {
  for (const char* name :
       {"resnet18", "resnext50_32x4d", "vgg11_bn", "densenet121", "mobilenet_v2", "mobilenet_v3_small",
        "efficientnet_b0", "efficientnet_v2_s", "convnext_tiny", "swin_t", "vit_b_32"})
    check_tree(name);
}

// ... every model in the full suite (tools/conformance.sh).
TEST(ModelTreeFull, EveryModel) {
  for (const std::string& name : models::list()) check_tree(name);
}

}  // namespace
}  // namespace tvc
