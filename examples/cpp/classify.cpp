// Inference with tvc from C++: a torchvision backbone with its weights, an image file, the top
// five classes (libraries tvc-vision and tvc-models).
//
//   c++ -std=c++20 classify.cpp $(pkg-config --cflags --static --libs tvc-vision) -o classify
//   ./classify resnet50 DEFAULT cat.jpg     # DEFAULT: torchvision's file, from $TVC_WEIGHTS
#include <tvc/autograd.h>
#include <tvc/models/models.h>
#include <tvc/models/weights.h>
#include <tvc/ops.h>
#include <tvc/vision/preprocess.h>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL WEIGHTS IMAGE\n", argv[0]);
    return 2;
  }
  try {
    tvc::models::LoadReport report;
    tvc::models::BackbonePtr model = tvc::models::create(argv[1], {.weights = argv[2]}, &report);
    model->eval();
    // The preprocessing of the weights' tag (or of the model's default tag for a file).
    const char* tag = tvc::models::is_weights_tag(argv[2]) ? argv[2] : "DEFAULT";
    const tvc::models::Preprocessing& prep = tvc::models::weights_tag(argv[1], tag).preprocessing;
    tvc::Tensor image = tvc::vision::preprocess(tvc::vision::decode_image(argv[3]), prep).unsqueeze(0);

    tvc::NoGradGuard no_grad;  // inference: no autograd graph
    tvc::Tensor probabilities = (*model)(image).softmax(1)[0];
    auto [values, indices] = tvc::topk(probabilities, 5);
    const auto& names = tvc::models::imagenet_categories();
    for (int64_t i = 0; i < 5; ++i) {
      int64_t c = indices[i].item<int64_t>();
      std::printf("%5.1f%%  %s\n", 100 * values[i].item<double>(),
                  c < static_cast<int64_t>(names.size()) ? names[c].c_str() : "?");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
