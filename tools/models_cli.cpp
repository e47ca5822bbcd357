#include "models_cli.h"

#include <algorithm>
#include <cstdio>

#include "tvc/autograd.h"
#include "tvc/error.h"
#include "tvc/models/models.h"
#include "tvc/models/weights.h"
#include "tvc/ops.h"
#include "tvc/serialize.h"
#include "tvc/vision/preprocess.h"

namespace tvc::tools {

void list_models() {
  for (const auto& name : models::list()) std::printf("%s\n", name.c_str());
}

namespace {

models::BackbonePtr load_model(const std::string& name, const std::string& weights, std::optional<int64_t> num_classes,
                               bool opaque) {
  models::LoadReport report;
  models::BackbonePtr model = models::create(
      name, {.num_classes = num_classes, .weights = weights, .read = {.opaque_objects = opaque}}, &report);
  std::fprintf(stderr, "%s: weights from %s", name.c_str(), printable(report.file).c_str());
  if (!report.skipped.empty()) {
    std::fprintf(stderr, " (kept initial values of the classifier, whose size differs:");
    for (const auto& key : report.skipped) std::fprintf(stderr, " %s", printable(key).c_str());
    std::fprintf(stderr, ")");
  }
  std::fprintf(stderr, "\n");
  return model;
}

}  // namespace

void run_model(const RunOptions& options) {
  io::SafetensorsFile file = io::SafetensorsFile::open(options.input);
  Tensor input = file.tensor("input");
  TVC_CHECK(input.dtype() == DType::Float32 && input.dim() == 4 && input.shape()[1] == 3, "'", printable(options.input),
            "': tensor 'input' must be float32 (N, 3, H, W), got ", dtype_name(input.dtype()), " ",
            shape_str(input.shape()));
  models::BackbonePtr model = load_model(options.model, options.weights, options.num_classes, options.opaque);
  if (options.train_mode)
    models::train_without_dropout(*model);  // batch statistics, but no dropout or stochastic depth
  else
    model->eval();
  NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> tensors = {{"output", model->forward(input)}};
  if (options.features)
    for (auto& stage : model->forward_stages(input)) tensors.push_back(std::move(stage));
  io::save_safetensors(options.output, tensors, {{"model", options.model}});
  std::printf("wrote %s: output %s%s\n", printable(options.output).c_str(),
              shape_str(tensors[0].second.shape()).c_str(),
              options.features ? cat_str(" and ", tensors.size() - 1, " stage tensors").c_str() : "");
}

void predict(const PredictOptions& options) {
  TVC_CHECK(!options.images.empty(), "predict: no image given");
  // The preprocessing: --preprocess-tag's, else that of the weights when they are a tag of the
  // model, else (a file) the DEFAULT tag's.
  std::string prep_tag = options.preprocess_tag;
  if (prep_tag.empty()) {
    std::vector<std::string> tags = models::weights_tags(options.model);
    bool is_tag = options.weights == "DEFAULT" || std::find(tags.begin(), tags.end(), options.weights) != tags.end();
    prep_tag = is_tag ? options.weights : "DEFAULT";
  }
  const models::Preprocessing& prep = models::weights_tag(options.model, prep_tag).preprocessing;
  std::vector<Tensor> inputs;
  for (const auto& path : options.images) inputs.push_back(vision::preprocess(vision::decode_image(path), prep));

  models::BackbonePtr model = load_model(options.model, options.weights, 1000, options.opaque);
  model->eval();
  NoGradGuard no_grad;
  print_top_classes(options.images, softmax(model->forward(stack(inputs)), 1), models::imagenet_categories(), 5);
}

void print_top_classes(const std::vector<std::string>& images, const Tensor& probs,
                       const std::vector<std::string>& names, int64_t k) {
  k = std::min<int64_t>(k, probs.size(1));
  auto [top_probs, top_classes] = topk(probs, k, 1);
  top_probs = top_probs.contiguous();
  top_classes = top_classes.contiguous();
  const float* p = top_probs.data_ptr<float>();
  const int64_t* c = top_classes.data_ptr<int64_t>();
  for (size_t i = 0; i < images.size(); ++i) {
    std::printf("%s\n", printable(images[i]).c_str());
    for (int64_t j = 0; j < k; ++j) {
      const int64_t cls = c[i * k + j];
      std::printf("  %6.2f%%  %lld  %s\n", 100.0 * p[i * k + j], static_cast<long long>(cls),
                  static_cast<size_t>(cls) < names.size() ? printable(names[static_cast<size_t>(cls)]).c_str() : "?");
    }
  }
}

}  // namespace tvc::tools
