// The example of docs/models.md, compiled by the build (tools/check_doc_examples.py).
#include "tvc/models/models.h"

#include <iostream>

#include "tvc/models/weights.h"
#include "tvc/vision/preprocess.h"

void run_resnet50(const tvc::Tensor& images);

void run_resnet50(const tvc::Tensor& images) {
  // [doc]
  tvc::models::LoadReport report;  // what was loaded, what not
  auto model = tvc::models::create("resnet50", {.weights = "DEFAULT"}, &report);
  model->eval();
  tvc::Tensor logits = (*model)(images);                 // (N, 3, H, W) -> (N, 1000)
  for (auto& [node, t] : model->forward_stages(images))  // "relu", "layer1", ..., "layer4"
    std::cout << node << " " << t.shape() << "\n";
  // [end doc]
}
