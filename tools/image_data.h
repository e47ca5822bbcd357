// The images `tvc train` and `tvc eval` learn from: Fashion-MNIST (the embedded default) and
// image folders in torchvision's ImageFolder layout, their augmentations, and a batch loader
// with worker threads.
//
//   ImageSource train = fashion_mnist_source("/usr/share/datasets/fashion-mnist", "train");
//   BatchLoader loader(train, indices, {.batch_size = 128, .transform = {...}, .seed = 0});
//   loader.start_epoch(epoch, first_batch);
//   while (auto batch = loader.next()) { batch->images;  /* (B, 3, S, S) */ }
//
// Every random choice (the epoch's order, each sample's crop and flip) is a pure function of
// (seed, epoch, sample position), never of thread timing: a run gives the same batches whatever
// the worker count, and a resumed run the same batches as an uninterrupted one.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tvc/tensor.h"
#include "tvc/vision/preprocess.h"

namespace tvc::tools {

// ---------------------------------------------------------------- sources

// A labelled set of images, read one at a time (thread-safe: load may run on several threads).
class ImageSource {
 public:
  virtual ~ImageSource() = default;
  virtual int64_t size() const = 0;
  // The class index of sample i, in [0, classes().size()).
  virtual int64_t label(int64_t i) const = 0;
  // Sample i as an 8-bit RGB image (grey replicated to three channels).
  virtual vision::Image load(int64_t i) const = 0;
  // The class names, in label order.
  virtual const std::vector<std::string>& classes() const = 0;
  // Where the images come from, for messages ("fashion-mnist train", "/data/pets/train").
  virtual std::string description() const = 0;
};

// Fashion-MNIST's split "train" (60,000 images) or "t10k" (10,000) from the gzipped IDX files
// in dir (tools/fashion_mnist.h), 28x28 grey replicated to RGB; classes "T-shirt/top", ...,
// "Ankle boot". Throws tvc::Error naming the file at fault.
std::shared_ptr<ImageSource> fashion_mnist_source(const std::string& dir, const std::string& split);

// torchvision's ImageFolder: root/<class>/<file>, classes the sorted sub-folder names, files
// (any depth below the class folder) sorted by path, with extensions .jpg, .jpeg, .png (any
// case). Every file is decoded once when the source is made (on worker threads): a zero-byte,
// corrupt or non-image file is left out with one warning line on stderr naming it and the
// fault, then a line with the count skipped; the run goes on. A root that does not exist, has no
// class folder or no usable image at all is an error naming root. `classes`, when not empty,
// fixes the class list (a validation folder must have the training folder's classes; a class
// folder not in it is an error naming it).
struct ImageFolderOptions {
  std::vector<std::string> classes{};
  int threads = 0;  // decoding threads for the check (0: hardware concurrency)
};
std::shared_ptr<ImageSource> image_folder_source(const std::string& root, const ImageFolderOptions& options = {});

// The indices [0, n) split in two by a seeded shuffle: the first holds n - round(n * fraction)
// indices, the second the rest, each sorted ascending. fraction in [0, 1).
std::pair<std::vector<int64_t>, std::vector<int64_t>> split_indices(int64_t n, double fraction, uint64_t seed);

// ---------------------------------------------------------------- transforms

// How a sample becomes a float32 (3, size, size) tensor.
//  - train (augment): torchvision's RandomResizedCrop(size, scale, ratio=(3/4, 4/3)) with its
//    ten tries and center-crop fallback, bilinear (PIL's antialiased resize), then a horizontal
//    flip with probability hflip; the random numbers come from the sample's own generator.
//  - eval: resize the shorter side to resize_size (bilinear), center-crop size.
//  - both: to_normalized_tensor(mean, std).
struct Transform {
  int64_t size = 224;
  int64_t resize_size = 224;  // eval only
  bool augment = false;
  std::array<double, 2> scale = {0.08, 1.0};
  double hflip = 0.5;
  std::array<double, 3> mean = {0.485, 0.456, 0.406};
  std::array<double, 3> std = {0.229, 0.224, 0.225};
};

// A small counter-based generator (splitmix64): the stream of one sample in one epoch.
class SampleRng {
 public:
  SampleRng(uint64_t seed, int64_t epoch, int64_t sample);
  uint64_t next_u64();
  double uniform();  // [0, 1)
  double uniform(double lo, double hi);

 private:
  uint64_t state_;
};

// Applies t to image; rng is used only when t.augment.
Tensor apply_transform(const vision::Image& image, const Transform& t, SampleRng& rng);

// ---------------------------------------------------------------- loader

struct Batch {
  Tensor images;      // float32 (B, 3, size, size)
  Tensor labels;      // int64 (B)
  int64_t index = 0;  // the batch's position in the epoch
};

struct LoaderOptions {
  int64_t batch_size = 64;
  Transform transform;
  bool shuffle = true;     // a new seeded order each epoch (else indices in order)
  bool drop_last = false;  // leave out a last, smaller batch
  uint64_t seed = 0;
  int workers = 2;   // threads preparing batches (0: on the calling thread)
  int prefetch = 2;  // batches prepared ahead per worker
  // Data-parallel training: this rank's share of every batch, the positions rank, rank + ranks,
  // ... of the global batch of batch_size (dist::shard within the batch), so that the ranks'
  // k-th batches together are the k-th batch of one process, each sample transformed alike.
  int rank = 0;
  int ranks = 1;
};

// Batches of source's samples at `indices`. Each epoch's order is a seeded shuffle of indices
// (a pure function of seed and epoch); sample j of the epoch is transformed with
// SampleRng(seed, epoch, j). Workers prepare batches ahead (at most workers * prefetch); next()
// returns them in order. Destroying the loader or starting another epoch stops the workers.
class BatchLoader {
 public:
  BatchLoader(std::shared_ptr<ImageSource> source, std::vector<int64_t> indices, LoaderOptions options);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Batches per epoch.
  int64_t num_batches() const;
  int64_t num_samples() const { return static_cast<int64_t>(indices_.size()); }
  // Starts epoch (0-based) at batch first_batch (a resumed run starts mid-epoch).
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The next batch of the epoch, or nullopt at its end. An error on a worker (a file that
  // became unreadable) is rethrown here.
  std::optional<Batch> next();
  // Seconds the workers spent preparing batches since start_epoch, and images prepared (for
  // the loader's images/s).
  double busy_seconds() const;
  int64_t images_prepared() const;

  const ImageSource& source() const { return *source_; }

 private:
  Batch make_batch(int64_t batch) const;
  void stop();

  std::shared_ptr<ImageSource> source_;
  std::vector<int64_t> indices_;
  LoaderOptions options_;
  std::vector<int64_t> order_;  // this epoch's order of indices_
  int64_t epoch_ = 0, next_batch_ = 0, end_batch_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int64_t, Batch> ready_;
  int64_t next_to_prepare_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  double busy_seconds_ = 0;
  int64_t images_prepared_ = 0;
  std::vector<std::thread> workers_;
};

}  // namespace tvc::tools
