// `tvc train`: a small CNN on Fashion-MNIST.
//
// Model (N,1,28,28) -> Conv(1->32,3x3,pad 1)-BN-ReLU-MaxPool(2) -> (N,32,14,14)
//   -> Conv(32->64,3x3,pad 1)-BN-ReLU-MaxPool(2) -> (N,64,7,7) -> Flatten -> Linear(3136->10).
// Adam with a cosine learning-rate decay from --lr to 0 over all steps; cross-entropy loss;
// optionally an EMA of the weights (--ema).
// Images are scaled to [0,1] and standardised with the training set's mean and std.
#include "train.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "fashion_mnist.h"
#include "progress.h"
#include "tvc/autograd.h"
#include "tvc/lr_scheduler.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"
#include "tvc/optim.h"
#include "tvc/swa/averaged_model.h"

namespace tvc::tools {

namespace {

constexpr int64_t kClasses = 10;
constexpr int64_t kWidth1 = 32, kWidth2 = 64;  // channels of the two conv blocks

// Images as float32 (N,1,28,28), standardised with mean and std; labels as int64 (N).
struct Dataset {
  Tensor images, labels;
};

Dataset to_tensors(const ImageSet& set, double mean, double std) {
  Dataset d;
  d.images = empty({set.count, 1, set.rows, set.cols});
  d.labels = empty({set.count}, {.dtype = DType::Int64});
  float* x = d.images.data_ptr<float>();
  const float scale = static_cast<float>(1.0 / (255.0 * std));
  const float shift = static_cast<float>(mean / std);
  for (size_t i = 0; i < set.pixels.size(); ++i) x[i] = set.pixels[i] * scale - shift;
  int64_t* y = d.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < set.count; ++i) y[i] = set.labels[i];
  return d;
}

// Mean and standard deviation of the pixels scaled to [0,1].
std::pair<double, double> pixel_stats(const ImageSet& set) {
  double sum = 0, sum_sq = 0;
  for (uint8_t p : set.pixels) {
    double v = p / 255.0;
    sum += v;
    sum_sq += v * v;
  }
  double n = static_cast<double>(set.pixels.size());
  double mean = sum / n;
  return {mean, std::sqrt(std::max(sum_sq / n - mean * mean, 1e-12))};
}

// The rows of d listed in order[begin, end) as a new batch.
Dataset gather(const Dataset& d, const int64_t* order, int64_t begin, int64_t end) {
  int64_t n = end - begin, plane = d.images.numel() / d.images.size(0);
  Dataset b;
  Shape shape = d.images.shape();
  shape[0] = n;
  b.images = empty(shape);
  b.labels = empty({n}, {.dtype = DType::Int64});
  const float* src = d.images.data_ptr<float>();
  float* dst = b.images.data_ptr<float>();
  const int64_t* ysrc = d.labels.data_ptr<int64_t>();
  int64_t* ydst = b.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t row = order ? order[begin + i] : begin + i;
    std::memcpy(dst + i * plane, src + row * plane, plane * sizeof(float));
    ydst[i] = ysrc[row];
  }
  return b;
}

std::shared_ptr<nn::Sequential> make_model() {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Conv2d>(1, kWidth1, 3, nn::ConvOptions{.padding = 1}));
  net->push_back(std::make_shared<nn::BatchNorm2d>(kWidth1));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::MaxPool2d>(2));
  net->push_back(std::make_shared<nn::Conv2d>(kWidth1, kWidth2, 3, nn::ConvOptions{.padding = 1}));
  net->push_back(std::make_shared<nn::BatchNorm2d>(kWidth2));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::MaxPool2d>(2));
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Linear>(kWidth2 * 7 * 7, kClasses));
  return net;
}

// FNV-1a over the bytes of the tensors, in order.
uint64_t fnv1a(const std::vector<Tensor>& tensors) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const Tensor& t : tensors) {
    Tensor c = t.detach().contiguous();
    const auto* p = static_cast<const unsigned char*>(c.raw_data());
    for (size_t i = 0, n = c.numel() * c.element_size(); i < n; ++i) {
      h ^= p[i];
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

// Fraction of the images of d that the model classifies correctly (eval mode, no autograd).
double accuracy(nn::Module& net, const Dataset& d) {
  NoGradGuard no_grad;
  net.eval();
  constexpr int64_t kChunk = 250;  // activations stay under glibc's mmap threshold
  int64_t n = d.images.size(0), correct = 0;
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    Dataset b = gather(d, nullptr, begin, std::min(n, begin + kChunk));
    Tensor predicted = argmax(net(b.images), 1);
    correct += sum(eq(predicted, b.labels)).item<int64_t>();
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

}  // namespace

void train_fashion_mnist(const TrainOptions& o) {
  TVC_CHECK(o.epochs >= 1 && o.batch_size >= 1 && o.lr > 0 && o.threads >= 0 && o.max_batches >= 0,
            "train: epochs, batch size and lr must be positive, threads and max batches >= 0");
  if (o.threads > 0) set_num_threads(o.threads);

  ImageSet train_set = load_fashion_mnist(o.data_dir, "train");
  ImageSet test_set = load_fashion_mnist(o.data_dir, "t10k");
  auto [mean, std] = pixel_stats(train_set);
  Dataset train = to_tensors(train_set, mean, std);
  Dataset test = to_tensors(test_set, mean, std);
  train_set = {};
  test_set = {};

  manual_seed(o.seed);  // initial weights and the shuffling both draw from the default generator
  std::shared_ptr<nn::Sequential> net = make_model();
  optim::Adam opt(net->parameters(), {.lr = o.lr});
  // The EMA averages the BatchNorm statistics too (use_buffers), as timm's ModelEma does.
  std::shared_ptr<swa::AveragedModel> ema;
  if (o.ema_decay)
    ema = std::make_shared<swa::AveragedModel>(
        *net, swa::AveragedModelOptions{
                  .multi_avg_fn = swa::get_ema_multi_avg_fn(*o.ema_decay, {.kind = swa::EmaWarmup::Kind::timm}),
                  .use_buffers = true});

  const int64_t n = train.images.size(0);
  int64_t batches = (n + o.batch_size - 1) / o.batch_size;
  if (o.max_batches > 0) batches = std::min(batches, o.max_batches);
  optim::lr_scheduler::CosineAnnealingLR schedule(opt, /*T_max=*/batches * o.epochs);
  for (int64_t epoch = 1; epoch <= o.epochs; ++epoch) {
    net->train();
    Tensor order = randperm(n);
    const int64_t* order_data = order.data_ptr<int64_t>();
    Progress progress(cat_str("epoch ", epoch, "/", o.epochs), batches);
    double loss_sum = 0;
    for (int64_t b = 0; b < batches; ++b) {
      Dataset batch = gather(train, order_data, b * o.batch_size, std::min(n, (b + 1) * o.batch_size));
      Tensor loss = cross_entropy((*net)(batch.images), batch.labels);
      opt.zero_grad();
      loss.backward();
      opt.step();
      schedule.step();
      if (ema) ema->update_parameters(*net);
      loss_sum += loss.item<double>();
      progress.update(b + 1, batch.images.size(0), loss_sum / static_cast<double>(b + 1));
    }
    progress.finish();
    std::printf("epoch %lld/%lld: mean training loss %.6f\n", static_cast<long long>(epoch),
                static_cast<long long>(o.epochs), loss_sum / static_cast<double>(batches));
  }
  std::vector<Tensor> state = net->parameters();
  for (const Tensor& b : net->buffers()) state.push_back(b);
  std::printf("weights fnv1a: %016llx\n", static_cast<unsigned long long>(fnv1a(state)));
  if (ema) std::printf("EMA test accuracy: %.2f%%\n", 100.0 * accuracy(*ema, test));
  std::printf("test accuracy: %.2f%%\n", 100.0 * accuracy(*net, test));
}

}  // namespace tvc::tools
