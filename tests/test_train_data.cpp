// The data pieces of `tvc train` (tools/image_data.h): the Fashion-MNIST source against the raw
// IDX bytes, image folders made by PIL (sorted classes and files, skipped files reported),
// split_indices, SampleRng, the eval transform against the preprocessing steps it is made of,
// the augmentations' RandomResizedCrop boxes (the fallback and the full image exactly), and the
// batch loader: every index once an epoch, the same bytes for any worker count and on resume,
// worker errors rethrown.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "fashion_mnist.h"
#include "image_data.h"
#include "test_helpers.h"
#include "tvc/vision/preprocess.h"

namespace tvc {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::TempDir;
using test::tensor_bytes;
using ::testing::HasSubstr;
using ::testing::Not;
using tools::Batch;
using tools::BatchLoader;
using tools::LoaderOptions;
using tools::SampleRng;
using tools::Transform;

// ---------------------------------------------------------------- Fashion-MNIST

TEST(FashionMnistSource, SizesLabelsClassesAndPixels) {
  auto train = tools::fashion_mnist_source(tools::kDefaultFashionMnistDir, "train");
  auto test = tools::fashion_mnist_source(tools::kDefaultFashionMnistDir, "t10k");
  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(train->description(), "fashion-mnist train");
  EXPECT_EQ(test->classes(), (std::vector<std::string>{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                                                       "Shirt", "Sneaker", "Bag", "Ankle boot"}));

  // The test split has 1000 images of each class.
  const tools::ImageSet raw = tools::load_fashion_mnist(tools::kDefaultFashionMnistDir, "t10k");
  std::vector<int> per_class(10, 0);
  for (int64_t i = 0; i < test->size(); ++i) {
    ASSERT_EQ(test->label(i), raw.labels[i]) << i;
    ++per_class[test->label(i)];
  }
  EXPECT_EQ(per_class, std::vector<int>(10, 1000));

  for (int64_t i : {int64_t{0}, int64_t{1234}, int64_t{9999}}) {
    const vision::Image image = test->load(i);
    ASSERT_EQ(image.height, 28);
    ASSERT_EQ(image.width, 28);
    ASSERT_EQ(image.rgb.size(), 28u * 28 * 3);
    for (int64_t p = 0; p < 28 * 28; ++p) {
      const uint8_t grey = raw.pixels[i * 28 * 28 + p];
      ASSERT_EQ(image.rgb[p * 3], grey) << "sample " << i << " pixel " << p;
      ASSERT_EQ(image.rgb[p * 3 + 1], grey) << "sample " << i << " pixel " << p;
      ASSERT_EQ(image.rgb[p * 3 + 2], grey) << "sample " << i << " pixel " << p;
    }
  }
  EXPECT_THAT(error_of([&] { test->load(10000); }), HasSubstr("fashion-mnist t10k: sample 10000"));
  EXPECT_THAT(error_of([&] { tools::fashion_mnist_source("/nonexistent-dir", "train"); }),
              HasSubstr("/nonexistent-dir/train-images-idx3-ubyte.gz"));
}

// ---------------------------------------------------------------- split_indices

TEST(SplitIndices, SizesDisjointCoveringAndSeeded) {
  const auto [train, val] = tools::split_indices(1000, 0.1, 7);
  EXPECT_EQ(train.size(), 900u);
  EXPECT_EQ(val.size(), 100u);
  EXPECT_TRUE(std::is_sorted(train.begin(), train.end()));
  EXPECT_TRUE(std::is_sorted(val.begin(), val.end()));
  std::vector<int64_t> all = train;
  all.insert(all.end(), val.begin(), val.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(1000);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(all, expected);  // disjoint and covering

  EXPECT_EQ(tools::split_indices(1000, 0.1, 7), std::pair(train, val));
  EXPECT_NE(tools::split_indices(1000, 0.1, 8).second, val);
  // A shuffle, not a prefix.
  EXPECT_NE(val.back() - val.front(), 99);

  // n - round(n * fraction) in the first: 7 * 0.5 = 3.5 rounds to 4.
  EXPECT_EQ(tools::split_indices(7, 0.5, 0).first.size(), 3u);
  EXPECT_EQ(tools::split_indices(5, 0.0, 0).first, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(tools::split_indices(5, 0.0, 0).second.empty());
  EXPECT_THAT(error_of([] { tools::split_indices(5, 1.0, 0); }), HasSubstr("[0, 1)"));
}

// ---------------------------------------------------------------- SampleRng

TEST(SampleRng, DeterministicUniformAndOneStreamPerSample) {
  SampleRng a(3, 1, 17), b(3, 1, 17);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.next_u64(), b.next_u64());

  SampleRng u(0, 0, 0);
  double sum = 0;
  for (int i = 0; i < 20000; ++i) {
    const double x = u.uniform();
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
    sum += x;
  }
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
  for (int i = 0; i < 1000; ++i) {
    const double x = u.uniform(-2.0, 3.0);
    ASSERT_GE(x, -2.0);
    ASSERT_LT(x, 3.0);
  }

  // Neighbouring (seed, epoch, sample) triples start different streams.
  std::set<uint64_t> firsts;
  int streams = 0;
  for (uint64_t seed : {0, 1})
    for (int64_t epoch : {-1, 0, 1, 2})
      for (int64_t sample : {-1, 0, 1, 2, 1000}) {
        SampleRng rng(seed, epoch, sample);
        firsts.insert(rng.next_u64());
        ++streams;
      }
  EXPECT_EQ(firsts.size(), static_cast<size_t>(streams));
}

// ---------------------------------------------------------------- transforms

// A height x width image with structure in every channel (resizes and crops change it).
vision::Image pattern_image(int64_t height, int64_t width, int salt = 0) {
  vision::Image image{.height = height, .width = width, .rgb = std::vector<uint8_t>(height * width * 3)};
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x) {
      uint8_t* p = &image.rgb[(y * width + x) * 3];
      p[0] = static_cast<uint8_t>(x * 9 + y * 2 + salt);
      p[1] = static_cast<uint8_t>((x * y + 3 * salt) % 251);
      p[2] = static_cast<uint8_t>(y * 11 + (x % 7) * 20);
    }
  return image;
}

vision::Image crop(const vision::Image& image, int64_t top, int64_t left, int64_t height, int64_t width) {
  vision::Image out{.height = height, .width = width, .rgb = {}};
  for (int64_t y = top; y < top + height; ++y)
    for (int64_t x = left; x < left + width; ++x)
      for (int c = 0; c < 3; ++c) out.rgb.push_back(image.rgb[(y * image.width + x) * 3 + c]);
  return out;
}

// A (3, S, S) tensor mirrored left to right.
std::vector<double> flipped(const Tensor& t) {
  const std::vector<double> v = t.to_vector();
  const int64_t s = t.size(2);
  std::vector<double> out(v.size());
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < s; ++y)
      for (int64_t x = 0; x < s; ++x) out[(c * s + y) * s + x] = v[(c * s + y) * s + (s - 1 - x)];
  return out;
}

TEST(Transform, EvalIsResizeShorterSideThenCenterCrop) {
  const Transform t{.size = 24, .resize_size = 28, .augment = false};
  for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{{37, 50}, {61, 30}, {28, 28}, {20, 16}}) {
    const vision::Image image = pattern_image(h, w);
    SampleRng rng(1, 2, 3), untouched(1, 2, 3);
    const Tensor got = tools::apply_transform(image, t, rng);
    const Tensor want = vision::to_normalized_tensor(
        vision::center_crop(vision::resize_shorter_side(image, 28, models::Interpolation::Bilinear), 24), t.mean,
        t.std);
    ASSERT_EQ(got.shape(), (Shape{3, 24, 24}));
    EXPECT_EQ(got.dtype(), DType::Float32);
    EXPECT_EQ(tensor_bytes(got), tensor_bytes(want)) << h << "x" << w;
    EXPECT_EQ(rng.next_u64(), untouched.next_u64()) << "the eval transform drew random numbers";
  }
}

TEST(Transform, AugmentShapeAndDeterminism) {
  const Transform t{.size = 16, .augment = true};
  const vision::Image image = pattern_image(45, 60);
  std::set<std::string> outputs;  // hex of the bytes
  for (int64_t sample = 0; sample < 20; ++sample) {
    SampleRng a(9, 0, sample), b(9, 0, sample);
    const Tensor x = tools::apply_transform(image, t, a);
    ASSERT_EQ(x.shape(), (Shape{3, 16, 16}));
    EXPECT_EQ(tensor_bytes(x), tensor_bytes(tools::apply_transform(image, t, b))) << sample;
    outputs.insert(test::hex(tensor_bytes(x)));
  }
  EXPECT_EQ(outputs.size(), 20u) << "different samples got the same crop";
  SampleRng rng(0, 0, 0);
  EXPECT_THAT(error_of([&] {
                tools::apply_transform(image, {.augment = true, .scale = {0.5, 0.1}}, rng);
              }),
              HasSubstr("crop scale (0.5, 0.1)"));
}

// scale (1, 1) on a square image: every try needs an aspect ratio that rounds both sides to the
// image's (the box is then the whole image), else the fallback's central crop is the whole image
// (ratio 1 is within [3/4, 4/3]). So the result is the eval resize, flipped when the flip draw
// says so: always at hflip 1, never at 0, about half the time at 0.5.
TEST(Transform, AugmentWithFullScaleOnASquareImageIsTheResizedImage) {
  const vision::Image image = pattern_image(40, 40, 5);
  SampleRng unused(0, 0, 0);
  const Tensor eval = tools::apply_transform(image, {.size = 24, .resize_size = 24}, unused);
  const std::vector<double> plain = eval.to_vector(), mirrored = flipped(eval);
  ASSERT_NE(plain, mirrored);
  int flips = 0;
  for (int64_t sample = 0; sample < 200; ++sample) {
    for (double hflip : {0.0, 1.0}) {
      SampleRng rng(4, 1, sample);
      const Tensor x =
          tools::apply_transform(image, {.size = 24, .augment = true, .scale = {1, 1}, .hflip = hflip}, rng);
      ASSERT_EQ(x.to_vector(), hflip == 1 ? mirrored : plain) << "sample " << sample << " hflip " << hflip;
    }
    SampleRng rng(4, 1, sample);
    const std::vector<double> x =
        tools::apply_transform(image, {.size = 24, .augment = true, .scale = {1, 1}, .hflip = 0.5}, rng).to_vector();
    ASSERT_TRUE(x == plain || x == mirrored) << "sample " << sample;
    flips += x == mirrored;
  }
  EXPECT_GT(flips, 70);
  EXPECT_LT(flips, 130);
}

// scale (1, 1) on a 2:1 image: no try fits (the box's short side exceeds the image's), so the
// fallback crops the center with the ratio clamped to 4/3: 27x20 at column (40 - 27) // 2 = 6;
// on a 1:2 image, ratio 3/4: 20x27 (round(26.67)) at row 6.
TEST(Transform, AugmentFallbackIsTheCentralCropWithClampedRatio) {
  struct Case {
    int64_t height, width, top, left, crop_height, crop_width;
  };
  for (const Case& c : {Case{20, 40, 0, 6, 20, 27}, Case{40, 20, 6, 0, 27, 20}}) {
    const vision::Image image = pattern_image(c.height, c.width, 3);
    const Tensor want =
        vision::to_normalized_tensor(vision::resize(crop(image, c.top, c.left, c.crop_height, c.crop_width), 16, 16,
                                                    models::Interpolation::Bilinear),
                                     {0.485, 0.456, 0.406}, {0.229, 0.224, 0.225});
    for (int64_t sample = 0; sample < 20; ++sample) {
      SampleRng rng(0, 0, sample);
      const Tensor x = tools::apply_transform(image, {.size = 16, .augment = true, .scale = {1, 1}, .hflip = 0}, rng);
      ASSERT_EQ(tensor_bytes(x), tensor_bytes(want)) << c.height << "x" << c.width << " sample " << sample;
    }
  }
}

// The boxes of RandomResizedCrop.get_params, written out from torchvision 0.14's source with the
// documented draw order (per try: scale, log ratio; on success: top row, left column; then the
// flip): the transform's output is the crop of that box, resized, flipped when drawn.
TEST(Transform, AugmentFollowsRandomResizedCropGetParams) {
  const vision::Image image = pattern_image(48, 64, 1);
  const std::array<double, 2> scale = {0.08, 1.0};
  for (int64_t sample = 0; sample < 100; ++sample) {
    SampleRng draws(11, 3, sample);
    int64_t top = -1, left = -1, h = 0, w = 0;
    for (int attempt = 0; attempt < 10 && top < 0; ++attempt) {
      const double target_area = 48.0 * 64.0 * draws.uniform(scale[0], scale[1]);
      const double aspect = std::exp(draws.uniform(std::log(3.0 / 4.0), std::log(4.0 / 3.0)));
      w = static_cast<int64_t>(std::nearbyint(std::sqrt(target_area * aspect)));
      h = static_cast<int64_t>(std::nearbyint(std::sqrt(target_area / aspect)));
      if (0 < w && w <= 64 && 0 < h && h <= 48) {
        top = static_cast<int64_t>(draws.next_u64() % static_cast<uint64_t>(48 - h + 1));
        left = static_cast<int64_t>(draws.next_u64() % static_cast<uint64_t>(64 - w + 1));
      }
    }
    ASSERT_GE(top, 0) << "the fallback is tested elsewhere; pick other samples";
    const bool flip = draws.uniform() < 0.5;
    const Tensor resized = vision::to_normalized_tensor(
        vision::resize(crop(image, top, left, h, w), 16, 16, models::Interpolation::Bilinear), {0, 0, 0}, {1, 1, 1});

    SampleRng rng(11, 3, sample);
    const Tensor x = tools::apply_transform(
        image, {.size = 16, .augment = true, .scale = scale, .mean = {0, 0, 0}, .std = {1, 1, 1}}, rng);
    ASSERT_EQ(x.to_vector(), flip ? flipped(resized) : resized.to_vector())
        << "sample " << sample << ": box " << w << "x" << h << " at (" << left << ", " << top << ")";
  }
}

// ---------------------------------------------------------------- the batch loader

// n images of sizes varying with the index; the red channel is the index everywhere (so a batch
// tells which samples it holds), green and blue vary (so crops and flips show). Sample `failing`
// cannot be loaded.
class PatternSource : public tools::ImageSource {
 public:
  explicit PatternSource(int64_t n, int64_t failing = -1) : n_(n), failing_(failing) {}
  int64_t size() const override { return n_; }
  int64_t label(int64_t i) const override { return i % 3; }
  vision::Image load(int64_t i) const override {
    TVC_CHECK(i != failing_, "cannot open image 'sample-", i, ".png': gone");
    vision::Image image = pattern_image(12 + i % 5, 10 + (i * 7) % 9, static_cast<int>(i));
    for (int64_t p = 0; p < image.height * image.width; ++p) image.rgb[p * 3] = static_cast<uint8_t>(i);
    return image;
  }
  const std::vector<std::string>& classes() const override { return classes_; }
  std::string description() const override { return "pattern"; }

 private:
  int64_t n_, failing_;
  std::vector<std::string> classes_ = {"zero", "one", "two"};
};

// Indices 0, 2, ..., 48 of a 50-image source: 25 samples, 7 batches of 4 (the last of 1).
std::vector<int64_t> even_indices() {
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < 50; i += 2) indices.push_back(i);
  return indices;
}

LoaderOptions loader_options(int workers) {
  return {.batch_size = 4,
          .transform = {.size = 8, .augment = true, .mean = {0, 0, 0}, .std = {1, 1, 1}},
          .seed = 5,
          .workers = workers};
}

std::vector<Batch> epoch_batches(BatchLoader& loader, int64_t epoch, int64_t first_batch = 0) {
  loader.start_epoch(epoch, first_batch);
  std::vector<Batch> batches;
  while (auto batch = loader.next()) batches.push_back(std::move(*batch));
  return batches;
}

// The samples of a batch, read from the red channel (the index / 255 with mean 0, std 1).
std::vector<int64_t> samples_of(const Batch& batch) {
  std::vector<int64_t> samples;
  for (int64_t k = 0; k < batch.images.size(0); ++k)
    samples.push_back(std::lround(batch.images[k][0][0][0].item<double>() * 255));
  return samples;
}

std::vector<int64_t> samples_of(const std::vector<Batch>& batches) {
  std::vector<int64_t> samples;
  for (const Batch& batch : batches)
    for (int64_t s : samples_of(batch)) samples.push_back(s);
  return samples;
}

TEST(BatchLoader, EveryIndexOnceAnEpochInANewOrder) {
  BatchLoader loader(std::make_shared<PatternSource>(50), even_indices(), loader_options(2));
  EXPECT_EQ(loader.num_samples(), 25);
  EXPECT_EQ(loader.num_batches(), 7);
  std::vector<std::vector<int64_t>> orders;
  for (int64_t epoch : {0, 1}) {
    const std::vector<Batch> batches = epoch_batches(loader, epoch);
    ASSERT_EQ(batches.size(), 7u);
    for (size_t b = 0; b < batches.size(); ++b) {
      const Batch& batch = batches[b];
      EXPECT_EQ(batch.index, static_cast<int64_t>(b));
      const int64_t count = b < 6 ? 4 : 1;
      ASSERT_EQ(batch.images.shape(), (Shape{count, 3, 8, 8}));
      EXPECT_EQ(batch.images.dtype(), DType::Float32);
      ASSERT_EQ(batch.labels.shape(), (Shape{count}));
      ASSERT_EQ(batch.labels.dtype(), DType::Int64);
      const std::vector<int64_t> samples = samples_of(batch);
      for (int64_t k = 0; k < count; ++k) EXPECT_EQ(batch.labels.data_ptr<int64_t>()[k], samples[k] % 3);
    }
    std::vector<int64_t> order = samples_of(batches);
    EXPECT_NE(order, even_indices()) << "epoch " << epoch << " is not shuffled";
    orders.push_back(order);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, even_indices()) << "epoch " << epoch;
    EXPECT_EQ(loader.images_prepared(), 25);
    EXPECT_GT(loader.busy_seconds(), 0.0);
    EXPECT_FALSE(loader.next().has_value());
  }
  EXPECT_NE(orders[0], orders[1]);
  // The same epoch again: the same order.
  EXPECT_EQ(samples_of(epoch_batches(loader, 1)), orders[1]);
}

TEST(BatchLoader, WithoutShuffleTheIndicesInOrder) {
  LoaderOptions options = loader_options(1);
  options.shuffle = false;
  BatchLoader loader(std::make_shared<PatternSource>(50), even_indices(), options);
  EXPECT_EQ(samples_of(epoch_batches(loader, 3)), even_indices());
}

TEST(BatchLoader, SameBytesWhateverTheWorkerCount) {
  auto source = std::make_shared<PatternSource>(50);
  BatchLoader reference(source, even_indices(), loader_options(0));
  for (int workers : {1, 3}) {
    LoaderOptions options = loader_options(workers);
    options.prefetch = workers == 1 ? 1 : 3;
    BatchLoader loader(source, even_indices(), options);
    for (int64_t epoch : {0, 2}) {
      const std::vector<Batch> want = epoch_batches(reference, epoch), got = epoch_batches(loader, epoch);
      ASSERT_EQ(got.size(), want.size());
      for (size_t b = 0; b < got.size(); ++b) {
        EXPECT_EQ(got[b].index, want[b].index);
        EXPECT_EQ(tensor_bytes(got[b].images), tensor_bytes(want[b].images))
            << workers << " workers, epoch " << epoch << ", batch " << b;
        EXPECT_EQ(tensor_bytes(got[b].labels), tensor_bytes(want[b].labels));
      }
      EXPECT_EQ(loader.images_prepared(), 25);
    }
  }
}

TEST(BatchLoader, RankSharesTogetherAreTheBatch) {
  // Data-parallel ranks: rank r takes positions r, r + R, ... of each global batch of 4; the
  // shares, interleaved back, are one loader's batch byte for byte (augmentation included), and
  // a last batch of 1 leaves the other ranks an empty share.
  auto source = std::make_shared<PatternSource>(50);
  BatchLoader whole(source, even_indices(), loader_options(2));
  for (int ranks : {2, 4, 3}) {
    std::vector<std::vector<Batch>> shares;
    for (int rank = 0; rank < ranks; ++rank) {
      LoaderOptions options = loader_options(rank % 2);
      options.rank = rank;
      options.ranks = ranks;
      BatchLoader loader(source, even_indices(), options);
      shares.push_back(epoch_batches(loader, 1));
    }
    const std::vector<Batch> want = epoch_batches(whole, 1);
    for (size_t b = 0; b < want.size(); ++b) {
      const int64_t count = want[b].labels.numel();
      for (int64_t position = 0; position < count; ++position) {
        const Batch& share = shares[static_cast<size_t>(position % ranks)][b];
        const int64_t row = position / ranks;
        ASSERT_LT(row, share.labels.numel()) << ranks << " ranks, batch " << b;
        EXPECT_EQ(tensor_bytes(share.images[row]), tensor_bytes(want[b].images[position]))
            << ranks << " ranks, batch " << b << ", position " << position;
        EXPECT_EQ(share.labels[row].item<int64_t>(), want[b].labels[position].item<int64_t>());
      }
      int64_t total = 0;
      for (const auto& rank_batches : shares) total += rank_batches[b].labels.numel();
      EXPECT_EQ(total, count) << ranks << " ranks, batch " << b;
    }
  }
  LoaderOptions bad = loader_options(0);
  bad.rank = 2;
  bad.ranks = 2;
  EXPECT_THAT(error_of([&] { BatchLoader(source, even_indices(), bad); }), HasSubstr("rank 2 of 2 ranks"));
}

// Sample j of the epoch (batch j / 4, row j % 4) is its image transformed with SampleRng(seed,
// epoch, j).
TEST(BatchLoader, SampleAtEpochPositionJUsesStreamJ) {
  auto source = std::make_shared<PatternSource>(50);
  const LoaderOptions options = loader_options(2);
  BatchLoader loader(source, even_indices(), options);
  const std::vector<Batch> batches = epoch_batches(loader, 4);
  const std::vector<int64_t> order = samples_of(batches);
  for (int64_t j = 0; j < 25; ++j) {
    SampleRng rng(options.seed, 4, j);
    const Tensor want = tools::apply_transform(source->load(order[j]), options.transform, rng);
    EXPECT_EQ(tensor_bytes(batches[j / 4].images[j % 4]), tensor_bytes(want)) << "sample " << j;
  }
}

TEST(BatchLoader, ResumedEpochGivesTheRestOfTheSameBatches) {
  BatchLoader loader(std::make_shared<PatternSource>(50), even_indices(), loader_options(2));
  const std::vector<Batch> full = epoch_batches(loader, 1);
  const std::vector<Batch> resumed = epoch_batches(loader, 1, 3);
  ASSERT_EQ(resumed.size(), full.size() - 3);
  for (size_t b = 0; b < resumed.size(); ++b) {
    EXPECT_EQ(resumed[b].index, full[b + 3].index);
    EXPECT_EQ(tensor_bytes(resumed[b].images), tensor_bytes(full[b + 3].images)) << "batch " << b + 3;
    EXPECT_EQ(tensor_bytes(resumed[b].labels), tensor_bytes(full[b + 3].labels));
  }
  EXPECT_EQ(loader.images_prepared(), 25 - 3 * 4);
  EXPECT_TRUE(epoch_batches(loader, 1, 7).empty());
  EXPECT_THAT(error_of([&] { loader.start_epoch(1, 8); }), HasSubstr("batch 8"));
}

TEST(BatchLoader, DropLastLeavesOutThePartialBatch) {
  LoaderOptions options = loader_options(2);
  options.drop_last = true;
  BatchLoader loader(std::make_shared<PatternSource>(50), even_indices(), options);
  EXPECT_EQ(loader.num_batches(), 6);
  const std::vector<Batch> batches = epoch_batches(loader, 0);
  ASSERT_EQ(batches.size(), 6u);
  for (const Batch& batch : batches) EXPECT_EQ(batch.images.size(0), 4);
  std::vector<int64_t> samples = samples_of(batches);
  std::sort(samples.begin(), samples.end());
  EXPECT_EQ(std::adjacent_find(samples.begin(), samples.end()), samples.end());
  EXPECT_EQ(samples.size(), 24u);
}

TEST(BatchLoader, SourceErrorIsRethrownByNext) {
  for (int workers : {0, 1, 3}) {
    BatchLoader loader(std::make_shared<PatternSource>(50, 20), even_indices(), loader_options(workers));
    loader.start_epoch(0);
    const std::string message = error_of([&] {
      while (loader.next()) {
      }
    });
    EXPECT_THAT(message, HasSubstr("sample-20.png")) << workers << " workers";
  }
  // Sample 20 left out: the epoch goes through.
  std::vector<int64_t> indices = even_indices();
  indices.erase(std::find(indices.begin(), indices.end(), 20));
  BatchLoader loader(std::make_shared<PatternSource>(50, 20), indices, loader_options(3));
  EXPECT_EQ(epoch_batches(loader, 0).size(), 6u);
}

TEST(BatchLoader, StopsMidEpochAndChecksItsArguments) {
  auto source = std::make_shared<PatternSource>(50);
  {
    BatchLoader loader(source, even_indices(), loader_options(3));
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
    loader.start_epoch(1);  // stops the workers of epoch 0 mid-way
    ASSERT_TRUE(loader.next().has_value());
  }  // and the destructor those of epoch 1
  const std::vector<int64_t> out_of_range = {0, 50};
  EXPECT_THAT(error_of([&] { BatchLoader loader(source, out_of_range, loader_options(1)); }), HasSubstr("index 50"));
  LoaderOptions zero_batch = loader_options(1);
  zero_batch.batch_size = 0;
  EXPECT_THAT(error_of([&] { BatchLoader loader(source, {0}, zero_batch); }), HasSubstr("batch size"));
}

// ---------------------------------------------------------------- image folders

// root/cat: a.png, z.png, sub/b.jpg, notes.txt (not an image), .hidden.png (ignored);
// root/dog: c.JPG, empty.jpg (zero bytes), broken.jpg (a JPEG cut in half);
// root/.cache/x.png (a hidden folder, ignored); root/readme.md (not in a class folder).
const char* kMakeFolder = R"(
import os, sys
from PIL import Image
root = sys.argv[1]

def pattern(w, h, salt):
    data = bytes((x * 7 + y * 13 + c * 50 + salt * (x ^ y)) % 256
                 for y in range(h) for x in range(w) for c in range(3))
    return Image.frombytes("RGB", (w, h), data)

for d in ["cat/sub", "dog", ".cache"]:
    os.makedirs(os.path.join(root, d))
pattern(20, 16, 1).save(os.path.join(root, "cat/a.png"))
pattern(12, 14, 2).save(os.path.join(root, "cat/z.png"))
pattern(24, 18, 3).save(os.path.join(root, "cat/sub/b.jpg"), quality=90)
pattern(8, 8, 4).save(os.path.join(root, "cat/.hidden.png"))
pattern(8, 8, 5).save(os.path.join(root, ".cache/x.png"))
pattern(16, 20, 6).save(os.path.join(root, "dog/c.JPG"), quality=90)
open(os.path.join(root, "cat/notes.txt"), "w").write("not an image\n")
open(os.path.join(root, "readme.md"), "w").write("a folder of test images\n")
open(os.path.join(root, "dog/empty.jpg"), "wb").close()
pattern(64, 64, 7).save(os.path.join(root, "whole.jpg"), quality=95)
data = open(os.path.join(root, "whole.jpg"), "rb").read()
os.remove(os.path.join(root, "whole.jpg"))
open(os.path.join(root, "dog/broken.jpg"), "wb").write(data[:len(data) // 2])
print("ok")
)";

class ImageFolder : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    test::write_file(*dir_ / "make_folder.py", kMakeFolder);
    const std::string command =
        "/usr/bin/python3 " + (*dir_ / "make_folder.py") + " " + root() + " >" + (*dir_ / "make_folder.out") + " 2>&1";
    ok_ = std::system(command.c_str()) == 0 && test::read_file(*dir_ / "make_folder.out") == "ok\n";
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(ok_) << "the Python script making the images failed: " << test::read_file(*dir_ / "make_folder.out");
  }

  static std::string root() { return *dir_ / "root"; }
  static std::string path(const std::string& name) { return root() + "/" + name; }

  static TempDir* dir_;
  static bool ok_;
};
TempDir* ImageFolder::dir_ = nullptr;
bool ImageFolder::ok_ = false;

TEST_F(ImageFolder, SortedClassesAndFilesSkippedOnesReported) {
  ASSERT_THROW(vision::decode_image(path("dog/broken.jpg")), Error) << "the corrupt test file decodes";
  testing::internal::CaptureStderr();
  auto source = tools::image_folder_source(root(), {.threads = 2});
  const std::string err = testing::internal::GetCapturedStderr();

  EXPECT_EQ(source->classes(), (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(source->description(), root());
  // torchvision's order: a folder's files by name, then its sub-folders.
  const std::vector<std::string> files = {"cat/a.png", "cat/z.png", "cat/sub/b.jpg", "dog/c.JPG"};
  const std::vector<int64_t> labels = {0, 0, 0, 1};
  ASSERT_EQ(source->size(), 4);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(source->label(i), labels[i]) << files[i];
    const vision::Image image = source->load(i), want = vision::decode_image(path(files[i]));
    EXPECT_EQ(image.height, want.height) << files[i];
    EXPECT_EQ(image.width, want.width) << files[i];
    EXPECT_EQ(image.rgb, want.rgb) << files[i];
  }
  EXPECT_EQ(source->load(0).width, 20);
  EXPECT_EQ(source->load(0).height, 16);

  EXPECT_THAT(err, HasSubstr("warning: skipping " + path("cat/notes.txt") + ": not an image file (extension)\n"));
  EXPECT_THAT(err,
              HasSubstr("warning: skipping " + path("dog/empty.jpg") + ": cannot decode image: the file is empty\n"));
  EXPECT_THAT(err, HasSubstr("warning: skipping " + path("dog/broken.jpg") + ": cannot decode JPEG: "));
  EXPECT_THAT(err, HasSubstr("warning: skipped 3 of 7 files in " + root() + "\n"));
  EXPECT_THAT(err, Not(HasSubstr("hidden")));
  EXPECT_THAT(err, Not(HasSubstr(".cache")));
  EXPECT_THAT(err, Not(HasSubstr("readme")));
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 4);

  // One decoding thread finds the same.
  testing::internal::CaptureStderr();
  auto single = tools::image_folder_source(root(), {.threads = 1});
  EXPECT_EQ(testing::internal::GetCapturedStderr(), err);
  ASSERT_EQ(single->size(), 4);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(single->load(i).rgb, source->load(i).rgb);
}

TEST_F(ImageFolder, GivenClassList) {
  testing::internal::CaptureStderr();
  auto source = tools::image_folder_source(root(), {.classes = {"ant", "cat", "dog"}});
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(source->classes(), (std::vector<std::string>{"ant", "cat", "dog"}));
  ASSERT_EQ(source->size(), 4);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(source->label(i), i < 3 ? 1 : 2);

  const tools::ImageFolderOptions cat_and_cow{.classes = {"cat", "cow"}};
  EXPECT_THAT(error_of([&] { tools::image_folder_source(root(), cat_and_cow); }),
              HasSubstr("class folder 'dog' is not one of the 2 classes"));
}

TEST_F(ImageFolder, MissingEmptyOrImagelessRootIsAnError) {
  TempDir dir;
  const std::string missing = dir / "missing";
  EXPECT_THAT(error_of([&] { tools::image_folder_source(missing); }), HasSubstr("'" + missing + "' does not exist"));
  fs::create_directories(dir / "empty/.hidden");
  EXPECT_THAT(error_of([&] { tools::image_folder_source(dir / "empty"); }),
              HasSubstr("'" + (dir / "empty") + "' has no class folder"));
  fs::create_directories(dir / "imageless/cls");
  test::write_file(dir / "imageless/cls/notes.txt", "text");
  testing::internal::CaptureStderr();
  const std::string message = error_of([&] { tools::image_folder_source(dir / "imageless"); });
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(message, HasSubstr("'" + (dir / "imageless") + "' has no usable image"));
  EXPECT_THAT(err, HasSubstr("skipping " + (dir / "imageless/cls/notes.txt")));
  EXPECT_THAT(error_of([&] { tools::image_folder_source(path("cat/a.png")); }), HasSubstr("is not a folder"));
}

// A crafted file or class folder name can neither retitle nor clear the terminal of whoever
// trains on the folder: warnings and errors print it escaped.
TEST_F(ImageFolder, HostileNamesPrintEscaped) {
  TempDir dir;
  const std::string hostile = "\x1b]0;pwned\x07\x1b[2J\xff", printed = "\\x1b]0;pwned\\x07\\x1b[2J\\xff";
  fs::create_directories(dir / ("data/cls" + hostile));
  fs::copy_file(path("cat/a.png"), dir / ("data/cls" + hostile + "/a.png"));
  test::write_file(dir / ("data/cls" + hostile + "/" + hostile + ".jpg"), "");
  testing::internal::CaptureStderr();
  auto source = tools::image_folder_source(dir / "data");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(source->size(), 1);
  EXPECT_TRUE(test::IsTerminalSafe(err));
  EXPECT_THAT(err, HasSubstr("warning: skipping " + (dir / ("data/cls" + printed + "/" + printed + ".jpg")) +
                             ": cannot decode image: the file is empty\n"));
  const std::string message = error_of([&] { tools::image_folder_source(dir / "data", {.classes = {"cat"}}); });
  EXPECT_TRUE(test::IsTerminalSafe(message));
  EXPECT_THAT(message, HasSubstr("class folder 'cls" + printed + "' is not one of the 1 classes"));
}

// Links are followed (a linked file, a linked class folder); a file removed after the check
// makes load throw naming it.
TEST_F(ImageFolder, LinksFollowedAndVanishedFilesNamed) {
  TempDir dir;
  fs::create_directories(dir / "data/cls");
  fs::copy_file(path("cat/a.png"), dir / "data/cls/one.png");
  fs::copy_file(path("cat/z.png"), dir / "data/cls/two.png");
  fs::create_symlink(path("cat/sub/b.jpg"), dir / "data/cls/link.jpg");
  fs::create_directory_symlink(path("cat"), dir / "data/linked");
  testing::internal::CaptureStderr();
  auto source = tools::image_folder_source(dir / "data", {.threads = 3});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(source->classes(), (std::vector<std::string>{"cls", "linked"}));
  // cls: link.jpg, one.png, two.png; linked (= cat): a.png, z.png, sub/b.jpg (notes.txt skipped).
  ASSERT_EQ(source->size(), 6);
  EXPECT_EQ(source->load(0).rgb, vision::decode_image(path("cat/sub/b.jpg")).rgb);
  EXPECT_EQ(source->load(5).rgb, vision::decode_image(path("cat/sub/b.jpg")).rgb);
  EXPECT_EQ(source->label(5), 1);
  EXPECT_THAT(err, HasSubstr("warning: skipped 1 of 7 files in " + (dir / "data")));

  fs::remove(dir / "data/cls/one.png");
  EXPECT_THAT(error_of([&] { source->load(1); }), HasSubstr(dir / "data/cls/one.png"));
  EXPECT_EQ(source->load(2).width, 12);
}

}  // namespace
}  // namespace tvc
