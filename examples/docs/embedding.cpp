// The example of docs/embedding.md, compiled by the build (tools/check_doc_examples.py).
#include <utility>

#include "tvc/models/models.h"
#include "tvc/models/weights.h"
#include "tvc/tvc.h"
#include "tvc/vision/preprocess.h"

std::pair<tvc::Tensor, tvc::Tensor> top5();

std::pair<tvc::Tensor, tvc::Tensor> top5() {
  // [doc]
  tvc::models::LoadReport report;
  auto model = tvc::models::create("resnet50", {.weights = "DEFAULT"}, &report);  // 1000 classes
  model->eval();
  const auto& prep = tvc::models::weights_tag("resnet50", "DEFAULT").preprocessing;
  tvc::Tensor image = tvc::vision::preprocess(tvc::vision::decode_image("cat.jpg"), prep).unsqueeze(0);
  tvc::NoGradGuard no_grad;
  auto [values, indices] = tvc::topk((*model)(image).softmax(1)[0], 5);
  // [end doc]
  return {values, indices};
}
