#include "image_data.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <utility>

#include "fashion_mnist.h"
#include "tvc/error.h"

namespace tvc::tools {

namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------- random numbers

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// splitmix64's output function: a bijection of uint64 that scatters neighbouring inputs.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A uniform integer in [0, bound): the modulo's bias (bound / 2^64) is far below anything a
// shuffle or a crop position could show.
uint64_t below(SampleRng& rng, uint64_t bound) { return rng.next_u64() % bound; }

// Fisher-Yates, driven by rng (std::shuffle's algorithm differs between standard libraries).
void shuffle(std::vector<int64_t>& values, SampleRng& rng) {
  for (size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[below(rng, i)]);
}

// The streams of the whole-dataset shuffles: sample streams have epoch >= 0 and sample >= 0.
constexpr int64_t kShuffleStream = -1;

// ---------------------------------------------------------------- sources

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> classes = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                   "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return classes;
}

class FashionMnistSource : public ImageSource {
 public:
  FashionMnistSource(ImageSet set, std::string description)
      : set_(std::move(set)), description_(std::move(description)) {}

  int64_t size() const override { return set_.count; }
  int64_t label(int64_t i) const override {
    check_index(i);
    return set_.labels[static_cast<size_t>(i)];
  }
  vision::Image load(int64_t i) const override {
    check_index(i);
    const int64_t pixels = set_.rows * set_.cols;
    vision::Image image{.height = set_.rows, .width = set_.cols, .rgb = std::vector<uint8_t>(pixels * 3)};
    const uint8_t* grey = set_.pixels.data() + i * pixels;
    for (int64_t p = 0; p < pixels; ++p) image.rgb[p * 3] = image.rgb[p * 3 + 1] = image.rgb[p * 3 + 2] = grey[p];
    return image;
  }
  const std::vector<std::string>& classes() const override { return fashion_mnist_classes(); }
  std::string description() const override { return description_; }

 private:
  void check_index(int64_t i) const {
    TVC_CHECK(i >= 0 && i < set_.count, description_, ": sample ", i, " is out of range [0, ", set_.count, ")");
  }

  ImageSet set_;  // 28x28 grey bytes: 47 MB for the training split, a third of the RGB size
  std::string description_;
};

// The files and labels of an image folder; the pixels are decoded again at each load, so a
// folder far larger than memory works.
class ImageFolderSource : public ImageSource {
 public:
  ImageFolderSource(std::string root, std::vector<std::string> classes, std::vector<std::string> paths,
                    std::vector<int64_t> labels)
      : root_(std::move(root)), classes_(std::move(classes)), paths_(std::move(paths)), labels_(std::move(labels)) {}

  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }
  int64_t label(int64_t i) const override {
    check_index(i);
    return labels_[static_cast<size_t>(i)];
  }
  // decode_image's error names the file (one that was readable when the source was made).
  vision::Image load(int64_t i) const override {
    check_index(i);
    return vision::decode_image(paths_[static_cast<size_t>(i)]);
  }
  const std::vector<std::string>& classes() const override { return classes_; }
  std::string description() const override { return root_; }

 private:
  void check_index(int64_t i) const {
    TVC_CHECK(i >= 0 && i < size(), printable(root_), ": sample ", i, " is out of range [0, ", size(), ")");
  }

  std::string root_;
  std::vector<std::string> classes_;
  std::vector<std::string> paths_;
  std::vector<int64_t> labels_;
};

bool is_hidden(const fs::path& path) { return path.filename().string().starts_with('.'); }

bool has_image_extension(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// The files below a class folder (links followed, hidden entries left out) in torchvision's
// order: sorted(os.walk(folder)) visits the folders by path, and each folder's files by name.
std::vector<std::string> files_below(const fs::path& folder) {
  std::vector<std::pair<std::string, std::string>> files;  // (folder, name)
  for (auto it = fs::recursive_directory_iterator(folder, fs::directory_options::follow_directory_symlink);
       it != fs::recursive_directory_iterator(); ++it) {
    if (is_hidden(it->path())) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_directory()) files.emplace_back(it->path().parent_path().string(), it->path().filename().string());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> paths;
  paths.reserve(files.size());
  for (const auto& [dir, name] : files) paths.push_back((fs::path(dir) / name).string());
  return paths;
}

// decode_image's message without the path (the warning names the file first).
std::string fault_of(const Error& e, const std::string& path) {
  std::string message = e.what();
  const std::string quoted = " '" + printable(path) + "'";  // as decode_image prints it
  if (size_t at = message.find(quoted); at != std::string::npos) message.erase(at, quoted.size());
  return message;
}

// Why each file cannot be used ("" when it can): the extension, then a full decode, spread over
// `threads` threads. An error other than a tvc::Error (out of memory) is not the file's fault
// and is rethrown.
std::vector<std::string> check_files(const std::vector<std::string>& paths, int threads) {
  std::vector<std::string> faults(paths.size());
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::exception_ptr failure;
  auto check = [&] {
    for (size_t i = next++; i < paths.size(); i = next++) {
      try {
        if (!has_image_extension(paths[i]))
          faults[i] = "not an image file (extension)";
        else if (std::error_code ec; !fs::is_regular_file(paths[i], ec))
          faults[i] = "not a regular file";  // a dangling link, a device, a FIFO
        else
          vision::decode_image(paths[i]);
      } catch (const Error& e) {
        faults[i] = fault_of(e, paths[i]);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  unsigned count = threads > 0 ? static_cast<unsigned>(threads) : std::max(1u, std::thread::hardware_concurrency());
  count = static_cast<unsigned>(std::min<size_t>(count, std::max<size_t>(paths.size(), 1)));
  {
    std::vector<std::jthread> pool;
    for (unsigned t = 1; t < count; ++t) pool.emplace_back(check);
    check();
  }
  if (failure) std::rethrow_exception(failure);
  return faults;
}

// ---------------------------------------------------------------- transforms

// Python's round() of a float: halves go to the even neighbour (the default rounding mode).
int64_t round_half_even(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// The rows [top, top + height) and columns [left, left + width) of image (PIL's crop inside it).
vision::Image crop(const vision::Image& image, int64_t top, int64_t left, int64_t height, int64_t width) {
  vision::Image out{.height = height, .width = width, .rgb = std::vector<uint8_t>(height * width * 3)};
  for (int64_t y = 0; y < height; ++y)
    std::memcpy(&out.rgb[y * width * 3], &image.rgb[((top + y) * image.width + left) * 3], width * 3);
  return out;
}

void flip_horizontally(vision::Image& image) {
  for (int64_t y = 0; y < image.height; ++y) {
    uint8_t* row = &image.rgb[y * image.width * 3];
    for (int64_t l = 0, r = image.width - 1; l < r; ++l, --r)
      std::swap_ranges(row + l * 3, row + l * 3 + 3, row + r * 3);
  }
}

// torchvision 0.14's RandomResizedCrop.get_params(img, scale, ratio=(3/4, 4/3)): the crop of a
// height x width image as (top, left, crop height, crop width). Draws per try: the area's scale,
// the log aspect ratio, then (on success) the top row and the left column.
std::array<int64_t, 4> random_resized_crop_box(int64_t height, int64_t width, const std::array<double, 2>& scale,
                                               SampleRng& rng) {
  constexpr double kMinRatio = 3.0 / 4.0, kMaxRatio = 4.0 / 3.0;
  const double area = static_cast<double>(height * width);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(scale[0], scale[1]);
    const double aspect = std::exp(rng.uniform(std::log(kMinRatio), std::log(kMaxRatio)));
    const int64_t w = round_half_even(std::sqrt(target_area * aspect));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const auto top = static_cast<int64_t>(below(rng, static_cast<uint64_t>(height - h + 1)));
      const auto left = static_cast<int64_t>(below(rng, static_cast<uint64_t>(width - w + 1)));
      return {top, left, h, w};
    }
  }
  // The fallback: the central crop, its aspect ratio clamped to [3/4, 4/3].
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < kMinRatio)
    h = round_half_even(static_cast<double>(w) / kMinRatio);
  else if (in_ratio > kMaxRatio)
    w = round_half_even(static_cast<double>(h) * kMaxRatio);
  return {(height - h) / 2, (width - w) / 2, h, w};
}

}  // namespace

// ---------------------------------------------------------------- sources

std::shared_ptr<ImageSource> fashion_mnist_source(const std::string& dir, const std::string& split) {
  return std::make_shared<FashionMnistSource>(load_fashion_mnist(dir, split), "fashion-mnist " + split);
}

std::shared_ptr<ImageSource> image_folder_source(const std::string& root, const ImageFolderOptions& options) {
  std::vector<std::string> found_classes;
  std::vector<std::string> paths;
  std::vector<size_t> class_of_path;  // index into found_classes
  try {
    TVC_CHECK(fs::exists(root), "image folder '", printable(root), "' does not exist");
    TVC_CHECK(fs::is_directory(root), "image folder '", printable(root), "' is not a folder");
    for (const fs::directory_entry& entry : fs::directory_iterator(root))
      if (entry.is_directory() && !is_hidden(entry.path())) found_classes.push_back(entry.path().filename().string());
    std::sort(found_classes.begin(), found_classes.end());
    TVC_CHECK(!found_classes.empty(), "image folder '", printable(root),
              "' has no class folder (expected root/<class>/<image files>)");
    for (size_t c = 0; c < found_classes.size(); ++c)
      for (std::string& file : files_below(fs::path(root) / found_classes[c])) {
        paths.push_back(std::move(file));
        class_of_path.push_back(c);
      }
  } catch (const fs::filesystem_error& e) {
    throw Error(cat_str("image folder '", printable(root), "': ", printable(e.what())));  // what() names paths
  }

  // Labels index the given class list when there is one (a validation folder may lack a class).
  const std::vector<std::string>& classes = options.classes.empty() ? found_classes : options.classes;
  std::vector<int64_t> label_of_class(found_classes.size());
  for (size_t c = 0; c < found_classes.size(); ++c) {
    auto it = std::find(classes.begin(), classes.end(), found_classes[c]);
    TVC_CHECK(it != classes.end(), "image folder '", printable(root), "': class folder '", printable(found_classes[c]),
              "' is not one of the ", classes.size(), " classes of the training data");
    label_of_class[c] = it - classes.begin();
  }

  const std::vector<std::string> faults = check_files(paths, options.threads);
  std::vector<std::string> usable_paths;
  std::vector<int64_t> labels;
  size_t skipped = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (faults[i].empty()) {
      usable_paths.push_back(paths[i]);
      labels.push_back(label_of_class[class_of_path[i]]);
    } else {
      std::cerr << "warning: skipping " << printable(paths[i]) << ": " << faults[i] << "\n";
      ++skipped;
    }
  }
  if (skipped > 0)
    std::cerr << "warning: skipped " << skipped << " of " << paths.size() << " files in " << printable(root) << "\n";
  TVC_CHECK(!usable_paths.empty(), "image folder '", printable(root), "' has no usable image (", paths.size(),
            " files in its class folders; images are .jpg, .jpeg or .png)");
  return std::make_shared<ImageFolderSource>(root, classes, std::move(usable_paths), std::move(labels));
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> split_indices(int64_t n, double fraction, uint64_t seed) {
  TVC_CHECK(n >= 0, "split_indices: n must be >= 0, got ", n);
  TVC_CHECK(fraction >= 0 && fraction < 1, "split_indices: the fraction must be in [0, 1), got ", fraction);
  // A Fisher-Yates shuffle driven by SampleRng(seed, -1, -1), a stream no epoch or sample uses.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  SampleRng rng(seed, kShuffleStream, kShuffleStream);
  shuffle(order, rng);
  const auto first_size = static_cast<size_t>(n - std::llround(static_cast<double>(n) * fraction));
  std::vector<int64_t> first(order.begin(), order.begin() + first_size),
      second(order.begin() + first_size, order.end());
  std::sort(first.begin(), first.end());
  std::sort(second.begin(), second.end());
  return {std::move(first), std::move(second)};
}

// ---------------------------------------------------------------- transforms

// The state is a chained hash of (seed, epoch, sample): every step is a bijection, so two samples
// of one epoch never start from the same state; two other triples do, or overlap within a few
// thousand draws, with a chance of about 2^-52.
SampleRng::SampleRng(uint64_t seed, int64_t epoch, int64_t sample) {
  uint64_t h = mix64(seed + kGolden);
  h = mix64((h ^ static_cast<uint64_t>(epoch)) + kGolden);
  state_ = mix64((h ^ static_cast<uint64_t>(sample)) + kGolden);
}

uint64_t SampleRng::next_u64() { return mix64(state_ += kGolden); }

double SampleRng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double SampleRng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

Tensor apply_transform(const vision::Image& image, const Transform& t, SampleRng& rng) {
  TVC_CHECK(t.size > 0, "transform: the size must be positive, got ", t.size);
  TVC_CHECK(
      image.height > 0 && image.width > 0 && image.rgb.size() == static_cast<size_t>(image.height * image.width * 3),
      "transform: the image is ", image.width, "x", image.height, " with ", image.rgb.size(),
      " bytes (expected a non-empty RGB image)");
  if (!t.augment)
    return vision::to_normalized_tensor(vision::center_crop(vision::resize_shorter_side(image, t.resize_size), t.size),
                                        t.mean, t.std);
  TVC_CHECK(0 <= t.scale[0] && t.scale[0] <= t.scale[1], "transform: the crop scale (", t.scale[0], ", ", t.scale[1],
            ") must be 0 <= min <= max");
  const auto [top, left, h, w] = random_resized_crop_box(image.height, image.width, t.scale, rng);
  vision::Image out = vision::resize(crop(image, top, left, h, w), t.size, t.size, models::Interpolation::Bilinear);
  // RandomHorizontalFlip: torch.rand(1) < p. Drawn whatever p is, so the stream stays aligned.
  if (rng.uniform() < t.hflip) flip_horizontally(out);
  return vision::to_normalized_tensor(out, t.mean, t.std);
}

// ---------------------------------------------------------------- loader

BatchLoader::BatchLoader(std::shared_ptr<ImageSource> source, std::vector<int64_t> indices, LoaderOptions options)
    : source_(std::move(source)), indices_(std::move(indices)), options_(std::move(options)) {
  TVC_CHECK(source_ != nullptr, "BatchLoader: no image source");
  TVC_CHECK(options_.batch_size > 0, "BatchLoader: the batch size must be positive, got ", options_.batch_size);
  TVC_CHECK(options_.workers >= 0, "BatchLoader: the worker count must be >= 0, got ", options_.workers);
  TVC_CHECK(options_.prefetch > 0, "BatchLoader: prefetch must be positive, got ", options_.prefetch);
  TVC_CHECK(options_.transform.size > 0, "BatchLoader: the image size must be positive, got ", options_.transform.size);
  TVC_CHECK(options_.ranks >= 1 && options_.rank >= 0 && options_.rank < options_.ranks, "BatchLoader: rank ",
            options_.rank, " of ", options_.ranks, " ranks");
  const int64_t n = source_->size();
  for (int64_t index : indices_)
    TVC_CHECK(index >= 0 && index < n, "BatchLoader: index ", index, " is not a sample of ", source_->description(),
              " (", n, " images)");
  // No batches until start_epoch: end_batch_ stays 0.
}

BatchLoader::~BatchLoader() { stop(); }

int64_t BatchLoader::num_batches() const {
  const int64_t n = num_samples(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

void BatchLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  TVC_CHECK(epoch >= 0, "BatchLoader: the epoch must be >= 0, got ", epoch);
  TVC_CHECK(first_batch >= 0 && first_batch <= num_batches(), "BatchLoader: batch ", first_batch,
            " is not in the epoch's ", num_batches(), " batches");
  stop();
  epoch_ = epoch;
  order_ = indices_;
  if (options_.shuffle) {
    SampleRng rng(options_.seed, epoch, kShuffleStream);
    shuffle(order_, rng);
  }
  // No worker runs now: the state is set without the lock, and the threads started below see it.
  next_batch_ = next_to_prepare_ = first_batch;
  end_batch_ = num_batches();
  ready_.clear();
  stopping_ = false;
  error_ = nullptr;
  busy_seconds_ = 0;
  images_prepared_ = 0;
  const int64_t ahead = int64_t{options_.workers} * options_.prefetch;
  for (int w = 0; w < options_.workers; ++w)
    workers_.emplace_back([this, ahead] {
      std::unique_lock lock(mutex_);
      for (;;) {
        cv_.wait(lock, [&] {
          return stopping_ || (next_to_prepare_ < end_batch_ && next_to_prepare_ - next_batch_ < ahead);
        });
        if (stopping_) return;
        const int64_t b = next_to_prepare_++;
        lock.unlock();
        const auto start = std::chrono::steady_clock::now();
        std::optional<Batch> batch;
        std::exception_ptr error;
        try {
          batch = make_batch(b);
        } catch (...) {
          error = std::current_exception();
        }
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        lock.lock();
        busy_seconds_ += seconds;
        if (batch) {
          images_prepared_ += batch->labels.numel();
          ready_.emplace(b, std::move(*batch));
        } else if (!error_) {
          error_ = error;
        }
        cv_.notify_all();
      }
    });
}

std::optional<Batch> BatchLoader::next() {
  // next_batch_ and end_batch_ change only on this thread (the workers only read them).
  if (next_batch_ >= end_batch_) return std::nullopt;
  if (workers_.empty()) {
    const auto start = std::chrono::steady_clock::now();
    Batch batch = make_batch(next_batch_);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard lock(mutex_);
    busy_seconds_ += seconds;
    images_prepared_ += batch.labels.numel();
    ++next_batch_;
    return batch;
  }
  std::unique_lock lock(mutex_);
  // An error is rethrown as soon as a worker meets it, even while earlier batches are still
  // coming: the epoch cannot finish anyway.
  cv_.wait(lock, [&] { return error_ || ready_.contains(next_batch_); });
  if (error_) std::rethrow_exception(error_);
  auto node = ready_.extract(next_batch_);
  ++next_batch_;
  cv_.notify_all();  // a worker waiting for room ahead may go on
  return std::move(node.mapped());
}

double BatchLoader::busy_seconds() const {
  std::lock_guard lock(mutex_);
  return busy_seconds_;
}

int64_t BatchLoader::images_prepared() const {
  std::lock_guard lock(mutex_);
  return images_prepared_;
}

Batch BatchLoader::make_batch(int64_t batch) const {
  const int64_t size = options_.transform.size;
  const int64_t begin = batch * options_.batch_size;
  const int64_t global_count = std::min(options_.batch_size, static_cast<int64_t>(order_.size()) - begin);
  // This rank's positions of the global batch: rank, rank + ranks, ...
  const int64_t count = global_count > options_.rank ? (global_count - options_.rank - 1) / options_.ranks + 1 : 0;
  const int64_t sample_floats = 3 * size * size;
  Batch out{.images = empty({count, 3, size, size}), .labels = empty({count}, {.dtype = DType::Int64}), .index = batch};
  float* images = out.images.data_ptr<float>();
  int64_t* labels = out.labels.data_ptr<int64_t>();
  for (int64_t k = 0; k < count; ++k) {
    const int64_t position = begin + options_.rank + k * options_.ranks;
    const int64_t index = order_[static_cast<size_t>(position)];
    SampleRng rng(options_.seed, epoch_, position);
    // to_normalized_tensor makes a fresh contiguous (3, size, size) tensor.
    const Tensor sample = apply_transform(source_->load(index), options_.transform, rng);
    std::memcpy(images + k * sample_floats, sample.data_ptr<float>(), sizeof(float) * sample_floats);
    labels[k] = source_->label(index);
  }
  return out;
}

void BatchLoader::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
}

}  // namespace tvc::tools
