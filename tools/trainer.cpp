// `tvc train` with a backbone (see trainer.h), and `tvc eval`.
//
// A step: forward, cross-entropy (label smoothing), backward, optional clipping, the optimizer,
// the step scheduler, the EMA every `every` steps. An epoch ends with the validation of the raw
// and the averaged model, SWA's update and SWALR step, a metrics row, the curves, the best
// weights and a checkpoint. Bit-for-bit resume: the checkpoint holds everything that a step
// reads (weights, buffers, optimizer state, scheduler progress, the average, the default
// generator's counter, the loader's position, the epoch's running sums); the data order and
// augmentation are pure functions of (seed, epoch, position) (image_data.h).
#include "trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "curves.h"
#include "image_data.h"
#include "models_cli.h"
#include "progress.h"
#include "tvc/autograd.h"
#include "tvc/dist/communicator.h"
#include "tvc/dist/data_parallel.h"
#include "tvc/dist/sync_batch_norm.h"
#include "tvc/error.h"
#include "tvc/hybrid/hybrid.h"
#include "tvc/lr_scheduler.h"
#include "tvc/models/weights.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"
#include "tvc/optim.h"
#include "tvc/serialize.h"
#include "tvc/swa/averaged_model.h"
#include "tvc/swa/swalr.h"
#include "tvc/swa/update_bn.h"

namespace tvc::tools {

namespace fs = std::filesystem;
namespace sched = optim::lr_scheduler;

namespace {

// ---------------------------------------------------------------- signals

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// SIGINT and SIGTERM set g_stop_signal while a run is going; the previous handlers come back after.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    previous_int_ = std::signal(SIGINT, on_stop_signal);
    previous_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignals() {
    std::signal(SIGINT, previous_int_);
    std::signal(SIGTERM, previous_term_);
  }

 private:
  void (*previous_int_)(int);
  void (*previous_term_)(int);
};

// ---------------------------------------------------------------- data

struct Data {
  std::shared_ptr<ImageSource> train, val, test;
  std::vector<int64_t> train_indices, val_indices, test_indices;
  std::vector<std::string> classes;
  std::string test_name;  // "the Fashion-MNIST test set", "the validation split of DIR", ... (printable)
};

std::vector<int64_t> all_indices(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

Data load_data(const Recipe& r, bool need_train) {
  Data d;
  if (r.data.empty()) {
    d.train = fashion_mnist_source(r.fashion_mnist_dir, "train");
    d.test = fashion_mnist_source(r.fashion_mnist_dir, "t10k");
    d.test_name = "the Fashion-MNIST test set";
  } else {
    d.train = image_folder_source(r.data);
    if (!r.val_data.empty()) d.test = image_folder_source(r.val_data, {.classes = d.train->classes()});
    d.test_name = r.val_data.empty() ? "the validation split of " + printable(r.data) : printable(r.val_data);
  }
  d.classes = d.train->classes();
  d.test_indices = all_indices(d.test ? d.test->size() : 0);
  if (!need_train && d.test) return d;
  // Validation: the separate folder, or a seeded split of the training images.
  if (!r.data.empty() && !r.val_data.empty()) {
    d.val = d.test;
    d.val_indices = d.test_indices;
    d.train_indices = all_indices(d.train->size());
  } else {
    auto [train, val] = split_indices(d.train->size(), r.val_split, r.seed);
    d.train_indices = std::move(train);
    d.val = d.train;
    d.val_indices = std::move(val);
    if (!d.test) {  // an image folder without a validation folder: test on the held-out split
      d.test = d.train;
      d.test_indices = d.val_indices;
    }
  }
  if (r.train_subset > 0 && r.train_subset < static_cast<int64_t>(d.train_indices.size())) {
    auto [rest, subset] = split_indices(static_cast<int64_t>(d.train_indices.size()),
                                        static_cast<double>(r.train_subset) / d.train_indices.size(), r.seed + 1);
    std::vector<int64_t> kept;
    for (int64_t i : subset) kept.push_back(d.train_indices[i]);
    d.train_indices = std::move(kept);
  }
  TVC_CHECK(!d.train_indices.empty(), "train: no training images left in ", printable(d.train->description()));
  return d;
}

// The normalisation of the weights' tag, else of the backbone's DEFAULT weights (the statistics
// torchvision's models were trained with).
std::array<std::array<double, 3>, 2> mean_std(const Recipe& r) {
  if (r.backbone == "small_cnn") {  // Fashion-MNIST's training images' mean and standard deviation
    constexpr double kMean = 0.2860, kStd = 0.3530;
    return {{{kMean, kMean, kMean}, {kStd, kStd, kStd}}};
  }
  const std::string tag = models::is_weights_tag(r.weights) ? r.weights : "DEFAULT";
  const models::Preprocessing& p = models::weights_tag(r.backbone, tag).preprocessing;
  return {p.mean, p.std};
}

Transform train_transform(const Recipe& r) {
  auto [mean, std] = mean_std(r);
  return {.size = r.image_size,
          .resize_size = r.image_size,
          .augment = r.augment,
          .scale = r.crop_scale,
          .hflip = r.hflip,
          .mean = mean,
          .std = std};
}

Transform eval_transform(const Recipe& r) {
  Transform t = train_transform(r);
  t.augment = false;
  return t;
}

// ---------------------------------------------------------------- model

// backbone small_cnn, images (N, 3, S, S) -> logits (N, num_classes):
//   stem      Conv(3->32, 3x3, pad 1, no bias: BN cancels one)-BN-ReLU-MaxPool(2) -> (N, 32, S/2, S/2)
//   stages.0  Conv(32->64, 3x3, pad 1)-BN-ReLU-MaxPool(2)   -> (N, 64, S/4, S/4)
//   head      Flatten-Linear(64 * (S/4)^2 -> num_classes)
hybrid::HybridModelPtr small_cnn(int64_t num_classes, int64_t image_size) {
  auto block = [](int64_t in, int64_t out) {
    return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::Conv2d>(in, out, 3, nn::ConvOptions{.padding = 1, .bias = false}),
        std::make_shared<nn::BatchNorm2d>(out), std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2)});
  };
  const int64_t side = image_size / 4;
  auto stages = std::make_shared<nn::ModuleList>(std::initializer_list<nn::ModulePtr>{block(32, 64)});
  auto head = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(64 * side * side, num_classes)});
  return std::make_shared<hybrid::HybridModel>(block(3, 32), stages, head, "small_cnn", std::vector<std::string>{},
                                               hybrid::HybridLayout{.family = "small_cnn",
                                                                    .stage_nodes = {"stages.0"},
                                                                    .stage_prefixes = {{"stages.0."}},
                                                                    .stem_prefixes = {"stem."}});
}

hybrid::HybridModelPtr build_model(const Recipe& r, int64_t num_classes, const std::string& weights, bool verbose) {
  if (r.backbone == "small_cnn") return small_cnn(num_classes, r.image_size);
  return hybrid::HybridBuilder().from_torchvision(
      r.backbone, {.weights = weights,
                   .patches = hybrid::parse_patches(r.patches),
                   .num_classes = num_classes,
                   .dropout = r.dropout,
                   .freeze_backbone = r.freeze_backbone,
                   .unfreeze_stages = r.unfreeze_stages,
                   .verbose = verbose,
                   .image_size = r.backbone.rfind("vit", 0) == 0 ? std::optional<int64_t>(r.image_size) : std::nullopt,
                   .read = {.opaque_objects = r.opaque_weights}});
}

// The weights to export: torchvision's names for a hybrid without patches (they load into
// torchvision's model with strict=True), else (and for small_cnn) the HybridModel's.
nn::StateDict export_state(const hybrid::HybridModel& model, const nn::Module& weights) {
  nn::StateDict own = weights.state_dict();
  if (!model.modifications().empty() || model.layout().torchvision_names.empty()) return own;
  return model.to_torchvision_names(own);
}

void export_weights(const fs::path& out, const std::string& stem, const nn::StateDict& state) {
  io::save_state_dict((out / (stem + ".safetensors")).string(), state);
  io::save_state_dict((out / (stem + ".pth")).string(), state);
}

// ---------------------------------------------------------------- checkpoint values

io::Value options_value(const optim::Options& options) {
  io::Value::Items items;
  for (const auto& [name, v] : options.items()) {
    io::Value value;
    if (const double* d = std::get_if<double>(&v))
      value = io::Value(*d);
    else if (const bool* b = std::get_if<bool>(&v))
      value = io::Value(*b);
    else {
      std::vector<io::Value> list;
      for (double x : std::get<std::vector<double>>(v)) list.emplace_back(x);
      value = io::Value::list(std::move(list));
    }
    items.emplace_back(io::Value(name), std::move(value));
  }
  return io::Value::dict(std::move(items));
}

optim::Options options_from(const io::Value& v) {
  optim::Options options;
  for (const auto& [k, x] : v.items()) {
    if (x.kind() == io::Value::Kind::Bool)
      options.set(k.to_string(), x.to_bool());
    else if (x.kind() == io::Value::Kind::List) {
      std::vector<double> list;
      for (const io::Value& e : x.elements()) list.push_back(e.to_float());
      options.set(k.to_string(), list);
    } else
      options.set(k.to_string(), x.to_float());
  }
  return options;
}

io::Value optimizer_value(const optim::OptimizerStateDict& sd) {
  io::Value::Items state;
  for (const auto& [index, ps] : sd.state) {
    io::Value::Items entries;
    for (const auto& [name, t] : ps) entries.emplace_back(io::Value(name), t.defined() ? io::Value(t) : io::Value());
    state.emplace_back(io::Value(index), io::Value::dict(std::move(entries)));
  }
  std::vector<io::Value> groups;
  for (const auto& g : sd.param_groups) {
    std::vector<io::Value> params;
    for (int64_t p : g.params) params.emplace_back(p);
    groups.push_back(io::Value::dict(
        {{io::Value("options"), options_value(g.options)}, {io::Value("params"), io::Value::list(std::move(params))}}));
  }
  return io::Value::dict({{io::Value("state"), io::Value::dict(std::move(state))},
                          {io::Value("param_groups"), io::Value::list(std::move(groups))}});
}

optim::OptimizerStateDict optimizer_from(const io::Value& v) {
  optim::OptimizerStateDict sd;
  for (const auto& [index, entries] : v.find("state")->items()) {
    optim::ParamState ps;
    for (const auto& [name, t] : entries.items()) ps[name.to_string()] = t.is_none() ? Tensor() : t.to_tensor();
    sd.state[index.to_int()] = std::move(ps);
  }
  for (const io::Value& g : v.find("param_groups")->elements()) {
    optim::OptimizerStateDict::Group group{options_from(*g.find("options")), {}};
    for (const io::Value& p : g.find("params")->elements()) group.params.push_back(p.to_int());
    sd.param_groups.push_back(std::move(group));
  }
  return sd;
}

io::Value doubles_value(const std::vector<double>& xs) {
  std::vector<io::Value> list;
  for (double x : xs) list.emplace_back(x);
  return io::Value::list(std::move(list));
}
std::vector<double> doubles_from(const io::Value& v) {
  std::vector<double> xs;
  for (const io::Value& e : v.elements()) xs.push_back(e.to_float());
  return xs;
}

io::Value scheduler_value(const sched::SchedulerStateDict& sd) {
  std::vector<io::Value> subs;
  for (const auto& s : sd.schedulers) subs.push_back(scheduler_value(s));
  return io::Value::dict({{io::Value("last_epoch"), io::Value(sd.last_epoch)},
                          {io::Value("step_count"), io::Value(sd.step_count)},
                          {io::Value("base_lrs"), doubles_value(sd.base_lrs)},
                          {io::Value("last_lr"), doubles_value(sd.last_lr)},
                          {io::Value("schedulers"), io::Value::list(std::move(subs))}});
}

sched::SchedulerStateDict scheduler_from(const io::Value& v) {
  sched::SchedulerStateDict sd;
  sd.last_epoch = v.find("last_epoch")->to_int();
  sd.step_count = v.find("step_count")->to_int();
  sd.base_lrs = doubles_from(*v.find("base_lrs"));
  sd.last_lr = doubles_from(*v.find("last_lr"));
  for (const io::Value& s : v.find("schedulers")->elements()) sd.schedulers.push_back(scheduler_from(s));
  return sd;
}

nn::StateDict state_from(const io::Value& v) {
  nn::StateDict sd;
  for (const auto& [k, t] : v.items()) sd.insert(k.to_string(), t.to_tensor());
  return sd;
}

// ---------------------------------------------------------------- metrics

// The running sums of an epoch (part of the checkpoint, so a resumed epoch reports the same).
struct EpochSums {
  double loss = 0;
  int64_t correct = 0, seen = 0, batches = 0;
  double seconds = 0;
};

std::string csv_header() {
  return "epoch,step,lr,train_loss,train_accuracy,val_accuracy,val_accuracy_average,epoch_seconds,"
         "model_images_per_s,loader_images_per_s";
}

void write_metrics(const fs::path& out, const std::vector<EpochMetrics>& history) {
  std::ostringstream csv;
  csv << csv_header() << "\n";
  for (const EpochMetrics& m : history) {
    char average[32] = "";  // empty without an average (yet)
    if (!std::isnan(m.val_accuracy_average)) std::snprintf(average, sizeof average, "%.6f", m.val_accuracy_average);
    char line[512];
    std::snprintf(line, sizeof line, "%lld,%lld,%.8g,%.6f,%.6f,%.6f,%s,%.3f,%.1f,%.1f\n",
                  static_cast<long long>(m.epoch), static_cast<long long>(m.step), m.lr, m.train_loss, m.train_accuracy,
                  m.val_accuracy, average, m.epoch_seconds, m.model_images_per_s, m.loader_images_per_s);
    csv << line;
  }
  io::write_file_atomic((out / "metrics.csv").string(), csv.str());
}

io::Value history_value(const std::vector<EpochMetrics>& history) {
  std::vector<io::Value> rows;
  for (const EpochMetrics& m : history)
    rows.push_back(doubles_value({static_cast<double>(m.epoch), static_cast<double>(m.step), m.lr, m.train_loss,
                                  m.train_accuracy, m.val_accuracy, m.val_accuracy_average, m.epoch_seconds,
                                  m.model_images_per_s, m.loader_images_per_s}));
  return io::Value::list(std::move(rows));
}

std::vector<EpochMetrics> history_from(const io::Value& v) {
  std::vector<EpochMetrics> history;
  for (const io::Value& row : v.elements()) {
    std::vector<double> x = doubles_from(row);
    TVC_CHECK(x.size() == 10, "checkpoint: a metrics row has ", x.size(), " values, expected 10");
    history.push_back(
        {static_cast<int64_t>(x[0]), static_cast<int64_t>(x[1]), x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9]});
  }
  return history;
}

// ---------------------------------------------------------------- evaluation

// Predictions of model (eval mode, no autograd) on the loader's epoch 0, and the labels.
std::pair<std::vector<int64_t>, std::vector<int64_t>> predict_all(nn::Module& model, BatchLoader& loader) {
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  std::vector<int64_t> predicted, labels;
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    if (batch->labels.numel() == 0) continue;  // a rank's empty share of a last, small batch
    Tensor p = argmax(model(batch->images), 1).contiguous();
    const int64_t* pp = p.data_ptr<int64_t>();
    const int64_t* lp = batch->labels.data_ptr<int64_t>();
    predicted.insert(predicted.end(), pp, pp + p.numel());
    labels.insert(labels.end(), lp, lp + batch->labels.numel());
  }
  model.train(was_training);
  return {predicted, labels};
}

// The share of the loader's images that model classifies correctly. With several ranks, each
// loader gives its rank's share of every batch and the counts are summed over the ranks.
double accuracy(nn::Module& model, BatchLoader& loader, dist::Communicator& comm) {
  auto [predicted, labels] = predict_all(model, loader);
  int64_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) correct += predicted[i] == labels[i];
  Tensor counts = tensor(std::vector<int64_t>{correct, static_cast<int64_t>(labels.size())});
  comm.all_reduce_sum(counts);
  const int64_t total = counts[1].item<int64_t>();
  return total == 0 ? 0.0 : static_cast<double>(counts[0].item<int64_t>()) / static_cast<double>(total);
}

LoaderOptions eval_loader_options(const Recipe& r, int64_t batch_size, const dist::Communicator& comm) {
  return {.batch_size = batch_size,
          .transform = eval_transform(r),
          .shuffle = false,
          .seed = r.seed,
          .workers = static_cast<int>(r.workers),
          .rank = comm.rank(),
          .ranks = comm.size()};
}

// ---------------------------------------------------------------- the run

class Run {
 public:
  Run(const Recipe& recipe, const std::string& resume_dir);
  int train();

 private:
  void make_optimizer();
  void make_schedulers(int64_t steps_per_epoch);
  int64_t steps_per_epoch() const;
  LoaderOptions train_loader_options(const dist::Communicator& comm) const;
  bool stop_requested() const;
  void train_epoch(int64_t epoch, int64_t first_batch);
  void end_epoch(int64_t epoch);
  void save_checkpoint(int64_t epoch, int64_t next_batch);
  void load_checkpoint(const fs::path& path);
  void finish();
  bool swa_active(int64_t epoch) const { return r_.swa && epoch + 1 >= r_.swa->start_epoch; }
  const char* average_name() const { return r_.ema ? "ema" : "swa"; }

  Recipe r_;
  fs::path out_;
  // The ranks of a data-parallel run (one process: a world of one). Every rank computes alike on
  // its share of each batch; rank 0 (the leader) alone prints and writes the files.
  dist::CommunicatorPtr world_;
  bool leader() const { return world_->rank() == 0; }
  std::unique_ptr<dist::DataParallel> data_parallel_;  // with several ranks
  Data data_;
  int64_t num_classes_ = 0;
  hybrid::HybridModelPtr model_;
  std::shared_ptr<swa::AveragedModel> average_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<sched::LRScheduler> scheduler_;  // per step, before SWA
  std::unique_ptr<swa::SWALR> swa_scheduler_;      // per epoch, from swa.start_epoch
  std::unique_ptr<BatchLoader> train_loader_, val_loader_;
  int64_t step_ = 0, start_epoch_ = 0, start_batch_ = 0;
  EpochSums sums_;
  std::vector<EpochMetrics> history_;
  double best_accuracy_ = -1;
  int stop_status_ = 0;
  double allreduce_ms_per_step_ = 0;  // the last epoch's wait for the gradients' sums
};

Run::Run(const Recipe& recipe, const std::string& resume_dir)
    : r_(recipe), out_(resume_dir.empty() ? recipe.out : resume_dir), world_(dist::world()) {
  if (r_.threads > 0) set_num_threads(static_cast<int>(r_.threads));
  world_->set_timeout_seconds(r_.rank_timeout);
  const int ranks = world_->size();
  TVC_CHECK(r_.batch_size >= ranks, "train: batch_size ", r_.batch_size, " is smaller than the ", ranks,
            " ranks: each rank trains on a share of every batch");
  TVC_CHECK(ranks == 1 || r_.dump_batches.empty(), "train: dump_batches needs a single process (", ranks, " ranks)");
  data_ = load_data(r_, /*need_train=*/true);
  num_classes_ = r_.num_classes > 0 ? r_.num_classes : static_cast<int64_t>(data_.classes.size());
  TVC_CHECK(static_cast<int64_t>(data_.classes.size()) <= num_classes_, "train: the data has ", data_.classes.size(),
            " classes but num_classes is ", num_classes_);
  std::printf("data: %lld training, %lld validation images of %s (%zu classes); test: %s\n",
              static_cast<long long>(data_.train_indices.size()), static_cast<long long>(data_.val_indices.size()),
              printable(data_.train->description()).c_str(), data_.classes.size(), data_.test_name.c_str());
  manual_seed(r_.seed);  // the random initialisation, dropout and stochastic depth
  model_ = build_model(r_, num_classes_, resume_dir.empty() ? r_.weights : "", /*verbose=*/resume_dir.empty());
  if (r_.ema) {
    swa::EmaWarmup warmup{.kind = r_.ema->warmup == "timm"         ? swa::EmaWarmup::Kind::timm
                                  : r_.ema->warmup == "tensorflow" ? swa::EmaWarmup::Kind::tensorflow
                                                                   : swa::EmaWarmup::Kind::none};
    // The EMA averages the BatchNorm statistics too (use_buffers), as timm's ModelEma does.
    average_ = std::make_shared<swa::AveragedModel>(
        *model_, swa::AveragedModelOptions{.multi_avg_fn = swa::get_ema_multi_avg_fn(r_.ema->decay, warmup),
                                           .use_buffers = true});
  } else if (r_.swa) {
    average_ = std::make_shared<swa::AveragedModel>(*model_);
  }
  if (ranks > 1) {
    // The average keeps plain BatchNorms: SWA's update_bn runs on every rank over all the data.
    if (r_.sync_bn) dist::convert_sync_batchnorm(*model_, world_);
    data_parallel_ = std::make_unique<dist::DataParallel>(*model_, world_);
  }
  train_loader_ = std::make_unique<BatchLoader>(data_.train, data_.train_indices, train_loader_options(*world_));
  val_loader_ =
      std::make_unique<BatchLoader>(data_.val, data_.val_indices, eval_loader_options(r_, r_.batch_size, *world_));
  make_optimizer();
  make_schedulers(steps_per_epoch());
  if (leader()) fs::create_directories(out_ / "checkpoints");
  if (!resume_dir.empty()) {
    load_checkpoint(out_ / "checkpoints" / "last.pth");
  } else if (leader()) {
    if (!r_.dump_batches.empty())  // the starting point of tools/train_torch.py's replay
      io::save_safetensors((fs::path(r_.dump_batches) / "initial.safetensors").string(), model_->state_dict());
    io::write_file_atomic((out_ / "recipe.yaml").string(), recipe_to_yaml(r_));
    std::string classes;
    for (const std::string& c : data_.classes) classes += c + "\n";
    io::write_file_atomic((out_ / "classes.txt").string(), classes);
    write_metrics(out_, history_);
  }
}

LoaderOptions Run::train_loader_options(const dist::Communicator& comm) const {
  return {.batch_size = r_.batch_size,
          .transform = train_transform(r_),
          .shuffle = true,
          .drop_last = data_.train_indices.size() > static_cast<size_t>(r_.batch_size),
          .seed = r_.seed,
          .workers = static_cast<int>(r_.workers),
          .rank = comm.rank(),
          .ranks = comm.size()};
}

// Whether a rank has had SIGINT/SIGTERM: every rank stops at the same step.
bool Run::stop_requested() const {
  Tensor flag = tensor(std::vector<int64_t>{g_stop_signal.load() != 0 ? 1 : 0});
  world_->all_reduce_sum(flag);
  return flag.item<int64_t>() > 0;
}

int64_t Run::steps_per_epoch() const {
  int64_t n = train_loader_->num_batches();
  return r_.max_batches > 0 ? std::min(n, r_.max_batches) : n;
}

void Run::make_optimizer() {
  // Two groups: weights that decay, and (no_decay_norm_bias) norm weights and biases that do not.
  std::vector<Tensor> decay, no_decay;
  for (const Tensor& p : model_->parameters()) {
    if (!p.requires_grad()) continue;
    (r_.no_decay_norm_bias && p.dim() <= 1 ? no_decay : decay).push_back(p);
  }
  std::vector<optim::ParamGroup> groups{{decay, {}}};
  if (!no_decay.empty()) groups.push_back({no_decay, optim::Options{{"weight_decay", 0.0}}});
  if (r_.optimizer == "sgd")
    optimizer_ = std::make_unique<optim::SGD>(
        groups, optim::SGDOptions{
                    .lr = r_.lr, .momentum = r_.momentum, .weight_decay = r_.weight_decay, .nesterov = r_.nesterov});
  else if (r_.optimizer == "adamw")
    optimizer_ =
        std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{.lr = r_.lr, .weight_decay = r_.weight_decay});
  else
    optimizer_ =
        std::make_unique<optim::Adam>(groups, optim::AdamOptions{.lr = r_.lr, .weight_decay = r_.weight_decay});
}

void Run::make_schedulers(int64_t steps) {
  // The step schedule spans the epochs before SWA takes over.
  const int64_t epochs = r_.swa ? r_.swa->start_epoch - 1 : r_.epochs;
  const int64_t total = epochs * steps;
  if (total == 0) {
    // SWA from the first epoch: SWALR alone.
  } else if (r_.scheduler == "cosine") {
    const int64_t warmup = std::min<int64_t>(std::llround(r_.warmup_epochs * steps), total - 1);
    auto cosine = std::make_shared<sched::CosineAnnealingLR>(*optimizer_, total - warmup, r_.min_lr);
    if (warmup > 0)
      scheduler_ = std::make_shared<sched::SequentialLR>(
          *optimizer_,
          std::vector<std::shared_ptr<sched::LRScheduler>>{
              std::make_shared<sched::LinearLR>(*optimizer_, 0.01, 1.0, warmup), cosine},
          std::vector<int64_t>{warmup});
    else
      scheduler_ = cosine;
  } else if (r_.scheduler == "step") {
    scheduler_ = std::make_shared<sched::StepLR>(*optimizer_, r_.step_size * steps, r_.gamma);
  } else if (r_.scheduler == "onecycle") {
    scheduler_ = std::make_shared<sched::OneCycleLR>(
        *optimizer_,
        sched::OneCycleLROptions{
            .max_lr = {r_.lr}, .total_steps = total, .cycle_momentum = r_.optimizer != "sgd" || r_.momentum > 0});
  }
  if (r_.swa)
    swa_scheduler_ = std::make_unique<swa::SWALR>(
        *optimizer_, r_.swa->swa_lr, r_.swa->anneal_epochs,
        r_.swa->anneal_strategy == "cos" ? swa::AnnealStrategy::cos : swa::AnnealStrategy::linear);
}

void Run::train_epoch(int64_t epoch, int64_t first_batch) {
  const int64_t steps = steps_per_epoch();
  model_->train();
  train_loader_->start_epoch(epoch, first_batch);
  Progress progress(cat_str("epoch ", epoch + 1, "/", r_.epochs), steps, leader() ? stderr : nullptr);
  const auto start = std::chrono::steady_clock::now();
  const double seconds_before = sums_.seconds;
  const double wait_before = data_parallel_ ? data_parallel_->wait_seconds() : 0;
  for (int64_t b = first_batch; b < steps; ++b) {
    std::optional<Batch> batch = train_loader_->next();
    TVC_CHECK(batch.has_value(), "train: the loader ended at batch ", b, " of ", steps);
    if (!r_.dump_batches.empty())
      io::save_safetensors(
          (fs::path(r_.dump_batches) / cat_str("epoch", epoch, "_batch", b, ".safetensors")).string(),
          std::vector<std::pair<std::string, Tensor>>{{"images", batch->images}, {"labels", batch->labels}});
    Tensor logits = (*model_)(batch->images);
    Tensor loss = cross_entropy(logits, batch->labels, Tensor(), -100, Reduction::Mean, r_.label_smoothing);
    // The batch's mean loss, correct predictions and size (over all ranks), and whether a rank
    // was asked to stop.
    std::vector<double> step_sums(4);
    {
      NoGradGuard no_grad;
      step_sums = {loss.item<double>() * static_cast<double>(batch->labels.numel()),
                   static_cast<double>(sum(eq(argmax(logits.detach(), 1), batch->labels)).item<int64_t>()),
                   static_cast<double>(batch->labels.numel()), g_stop_signal.load() != 0 ? 1.0 : 0.0};
    }
    if (data_parallel_) {
      Tensor t = tensor(step_sums);
      world_->all_reduce_sum(t);
      step_sums = t.to_vector();
    }
    optimizer_->zero_grad();
    if (data_parallel_) {
      // This share's mean loss weighted by its part of the batch: the mean over the ranks of the
      // gradients is then the whole batch's mean loss's gradient.
      (loss * (static_cast<double>(batch->labels.numel()) * world_->size() / step_sums[2])).backward();
      data_parallel_->average_gradients();
      if (!r_.sync_bn) data_parallel_->broadcast_buffers();  // rank 0's running statistics, as DDP
    } else {
      loss.backward();
    }
    if (r_.clip_grad_norm > 0) optim::clip_grad_norm_(model_->parameters(), r_.clip_grad_norm);
    optimizer_->step();
    if (scheduler_ && !swa_active(epoch)) scheduler_->step();
    ++step_;
    if (r_.ema && step_ % r_.ema->every == 0) average_->update_parameters(*model_);
    sums_.loss += step_sums[0] / step_sums[2];
    sums_.correct += static_cast<int64_t>(step_sums[1]);
    sums_.seen += static_cast<int64_t>(step_sums[2]);
    sums_.batches += 1;
    sums_.seconds = seconds_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress.update(b + 1, static_cast<int64_t>(step_sums[2]), sums_.loss / sums_.batches,
                    static_cast<double>(sums_.correct) / sums_.seen);
    const bool last = b + 1 == steps;
    if (step_sums[3] > 0 && !last) {
      progress.finish();
      save_checkpoint(epoch, b + 1);
      const int sig = g_stop_signal.load() != 0 ? g_stop_signal.load() : SIGTERM;  // another rank's
      std::printf("stopped by %s at epoch %lld, batch %lld: checkpoint %s; continue with tvc train --resume %s\n",
                  sig == SIGINT ? "SIGINT" : "SIGTERM", static_cast<long long>(epoch + 1),
                  static_cast<long long>(b + 1), printable((out_ / "checkpoints" / "last.pth").string()).c_str(),
                  printable(out_.string()).c_str());
      stop_status_ = 128 + sig;
      return;
    }
    if (r_.checkpoint_every > 0 && step_ % r_.checkpoint_every == 0 && !last) save_checkpoint(epoch, b + 1);
  }
  progress.finish();
  if (data_parallel_)
    allreduce_ms_per_step_ =
        1000 * (data_parallel_->wait_seconds() - wait_before) / std::max<int64_t>(steps - first_batch, 1);
}

void Run::end_epoch(int64_t epoch) {
  if (swa_active(epoch)) {
    average_->update_parameters(*model_);
    swa_scheduler_->step();
  }
  EpochMetrics m;
  m.epoch = epoch + 1;
  m.step = step_;
  m.lr = optimizer_->param_groups()[0].options.get_double("lr");
  m.train_loss = sums_.loss / std::max<int64_t>(sums_.batches, 1);
  m.train_accuracy = static_cast<double>(sums_.correct) / std::max<int64_t>(sums_.seen, 1);
  m.epoch_seconds = sums_.seconds;
  m.model_images_per_s = sums_.seconds > 0 ? sums_.seen / sums_.seconds : 0;
  const double loader_busy = train_loader_->busy_seconds();
  m.loader_images_per_s = loader_busy > 0 ? train_loader_->images_prepared() / loader_busy : 0;
  m.val_accuracy = accuracy(*model_, *val_loader_, *world_);
  m.val_accuracy_average = std::nan("");
  if (average_ && (r_.ema || swa_active(epoch))) {
    // SWA's BatchNorm statistics are only right after update_bn: the per-epoch figure uses the
    // raw model's running statistics, as PyTorch's SWA examples report it.
    m.val_accuracy_average = accuracy(*average_, *val_loader_, *world_);
  }
  history_.push_back(m);
  if (!leader()) {
    sums_ = {};
    return;
  }
  std::printf("epoch %lld/%lld: train loss %.4f, accuracy %.2f%%; validation accuracy %.2f%%",
              static_cast<long long>(m.epoch), static_cast<long long>(r_.epochs), m.train_loss, 100 * m.train_accuracy,
              100 * m.val_accuracy);
  if (!std::isnan(m.val_accuracy_average)) std::printf(", %s %.2f%%", average_name(), 100 * m.val_accuracy_average);
  std::printf("; lr %.3g; %.0f images/s (loader %.0f images/s", m.lr, m.model_images_per_s, m.loader_images_per_s);
  if (data_parallel_)
    std::printf(" per rank; %d ranks, all-reduce wait %.1f ms/step", world_->size(), allreduce_ms_per_step_);
  std::printf(")\n");
  std::fflush(stdout);
  write_metrics(out_, history_);
  write_curves((out_ / "curves.svg").string(), history_, average_ ? average_name() : "");
  if (m.val_accuracy > best_accuracy_) {
    best_accuracy_ = m.val_accuracy;
    export_weights(out_, "best", export_state(*model_, *model_));
  }
  sums_ = {};
  save_checkpoint(epoch + 1, 0);
}

void Run::save_checkpoint(int64_t epoch, int64_t next_batch) {
  if (!leader()) return;
  const Generator::State rng = default_generator().state();
  io::Value::Items items{
      {io::Value("format"), io::Value("tvc-train-checkpoint")},
      {io::Value("version"), io::Value(int64_t{1})},
      {io::Value("recipe"), io::Value(recipe_to_yaml(r_))},
      {io::Value("epoch"), io::Value(epoch)},
      {io::Value("batch"), io::Value(next_batch)},
      {io::Value("step"), io::Value(step_)},
      {io::Value("model"), io::Value(model_->state_dict())},
      {io::Value("optimizer"), optimizer_value(optimizer_->state_dict())},
      {io::Value("scheduler"), scheduler_ ? scheduler_value(scheduler_->state_dict()) : io::Value()},
      {io::Value("swa_scheduler"), swa_scheduler_ ? scheduler_value(swa_scheduler_->state_dict()) : io::Value()},
      {io::Value("average"), average_ ? io::Value(average_->state_dict()) : io::Value()},
      // Philox counters: the seed and offset as strings (a uint64 may not fit Python's int64 pickles).
      {io::Value("rng"), io::Value::list({io::Value(std::to_string(rng.seed)), io::Value(std::to_string(rng.offset))})},
      {io::Value("epoch_sums"),
       doubles_value({sums_.loss, static_cast<double>(sums_.correct), static_cast<double>(sums_.seen),
                      static_cast<double>(sums_.batches), sums_.seconds})},
      {io::Value("history"), history_value(history_)},
      {io::Value("best_accuracy"), io::Value(best_accuracy_)},
  };
  io::save_pth((out_ / "checkpoints" / "last.pth").string(), io::Value::dict(std::move(items)));
}

void Run::load_checkpoint(const fs::path& path) {
  io::Value c = io::load_pth(path.string());
  const io::Value* format = c.find("format");
  TVC_CHECK(format && format->to_string() == "tvc-train-checkpoint", printable(path.string()),
            ": not a tvc train checkpoint");
  model_->load_state_dict(state_from(*c.find("model")));
  optimizer_->load_state_dict(optimizer_from(*c.find("optimizer")));
  if (scheduler_) scheduler_->load_state_dict(scheduler_from(*c.find("scheduler")));
  if (swa_scheduler_) swa_scheduler_->load_state_dict(scheduler_from(*c.find("swa_scheduler")));
  if (average_) average_->load_state_dict(state_from(*c.find("average")));
  const auto& rng = c.find("rng")->elements();
  default_generator().set_state({std::stoull(rng[0].to_string()), std::stoull(rng[1].to_string())});
  start_epoch_ = c.find("epoch")->to_int();
  start_batch_ = c.find("batch")->to_int();
  step_ = c.find("step")->to_int();
  std::vector<double> s = doubles_from(*c.find("epoch_sums"));
  sums_ = {s[0], static_cast<int64_t>(s[1]), static_cast<int64_t>(s[2]), static_cast<int64_t>(s[3]), s[4]};
  history_ = history_from(*c.find("history"));
  best_accuracy_ = c.find("best_accuracy")->to_float();
  if (leader()) write_metrics(out_, history_);  // rows written after this checkpoint are written again
  std::printf("resumed %s at epoch %lld, batch %lld (step %lld)\n", printable(out_.string()).c_str(),
              static_cast<long long>(start_epoch_ + 1), static_cast<long long>(start_batch_),
              static_cast<long long>(step_));
}

int Run::train() {
  StopSignals signals;
  for (int64_t epoch = start_epoch_; epoch < r_.epochs; ++epoch) {
    train_epoch(epoch, epoch == start_epoch_ ? start_batch_ : 0);
    if (stop_status_ != 0) return stop_status_;
    end_epoch(epoch);
    if (epoch + 1 < r_.epochs && stop_requested()) {
      std::printf("stopped after epoch %lld: continue with tvc train --resume %s\n", static_cast<long long>(epoch + 1),
                  printable(out_.string()).c_str());
      return 128 + (g_stop_signal.load() != 0 ? g_stop_signal.load() : SIGTERM);
    }
  }
  finish();
  return 0;
}

void Run::finish() {
  if (r_.swa) {
    // The average's BatchNorm statistics, recomputed on the training images (PyTorch's update_bn),
    // on every rank over all of them: the same statistics everywhere.
    BatchLoader all(data_.train, data_.train_indices, train_loader_options(*dist::single_process()));
    all.start_epoch(r_.epochs);
    swa::update_bn(
        [&]() -> std::optional<Tensor> {
          std::optional<Batch> b = all.next();
          if (!b) return std::nullopt;
          return b->images;
        },
        *average_);
  }
  if (leader()) {
    export_weights(out_, "final", export_state(*model_, *model_));
    if (average_) export_weights(out_, cat_str("final_", average_name()), export_state(*model_, average_->module()));
  }
  BatchLoader test_loader(data_.test, data_.test_indices, eval_loader_options(r_, r_.batch_size, *world_));
  const double raw = accuracy(*model_, test_loader, *world_);
  const double averaged = average_ ? accuracy(*average_, test_loader, *world_) : 0;
  std::printf("test accuracy on %s (%zu images): %.2f%%", data_.test_name.c_str(), data_.test_indices.size(),
              100 * raw);
  if (average_) std::printf(", %s %.2f%%", average_name(), 100 * averaged);
  std::printf(
      "\nfiles in %s: recipe.yaml, classes.txt, metrics.csv, curves.svg, final.{safetensors,pth}, "
      "best.{safetensors,pth}%s, checkpoints/last.pth\n",
      printable(out_.string()).c_str(),
      average_ ? cat_str(", final_", average_name(), ".{safetensors,pth}").c_str() : "");
}

}  // namespace

int train_recipe(const Recipe& recipe, const std::string& resume_dir) {
  if (!resume_dir.empty())
    TVC_CHECK(fs::is_regular_file(fs::path(resume_dir) / "checkpoints" / "last.pth"), "train --resume ",
              printable(resume_dir), ": no checkpoints/last.pth there");
  if (!recipe.dump_batches.empty()) fs::create_directories(recipe.dump_batches);
  Run run(recipe, resume_dir);
  return run.train();
}

namespace {

// The recipe's model with weights of train's exports (torchvision's names or the HybridModel's).
hybrid::HybridModelPtr load_trained(const Recipe& r, int64_t num_classes, const std::string& weights, bool opaque) {
  manual_seed(r.seed);
  hybrid::HybridModelPtr model = build_model(r, num_classes, "", /*verbose=*/false);
  nn::StateDict file = io::load_state_dict(weights, {.read = {.opaque_objects = opaque}, .unwrap = true});
  const bool torchvision_names = model->modifications().empty() && !file.contains(model->state_dict().begin()->first);
  io::load_converted(*model, torchvision_names ? model->from_torchvision_names(file) : file);
  model->eval();
  return model;
}

Recipe run_recipe(const std::string& run_or_recipe) {
  const fs::path path =
      fs::is_directory(run_or_recipe) ? fs::path(run_or_recipe) / "recipe.yaml" : fs::path(run_or_recipe);
  Recipe r = load_recipe(path.string());
  if (r.threads > 0) set_num_threads(static_cast<int>(r.threads));
  return r;
}

}  // namespace

void predict_with_recipe(const std::string& run, const std::string& weights, const std::vector<std::string>& images,
                         bool opaque) {
  TVC_CHECK(!images.empty(), "predict: no image given");
  TVC_CHECK(fs::is_directory(run), "predict --recipe ", printable(run), ": not a tvc train output folder");
  Recipe r = run_recipe(run);
  std::vector<std::string> classes;
  {
    std::ifstream in(fs::path(run) / "classes.txt");
    TVC_CHECK(in.good(), "predict --recipe ", printable(run), ": no classes.txt there");
    for (std::string line; std::getline(in, line);) classes.push_back(line);
  }
  hybrid::HybridModelPtr model =
      load_trained(r, r.num_classes > 0 ? r.num_classes : static_cast<int64_t>(classes.size()), weights, opaque);
  const Transform t = eval_transform(r);
  SampleRng unused(0, 0, 0);  // the eval transform draws nothing
  std::vector<Tensor> inputs;
  for (const std::string& path : images) inputs.push_back(apply_transform(vision::decode_image(path), t, unused));
  NoGradGuard no_grad;
  print_top_classes(images, softmax((*model)(stack(inputs)), 1), classes, 5);
}

void evaluate(const EvalOptions& o) {
  Recipe r = run_recipe(o.recipe);
  if (!o.data.empty()) {
    r.data = o.data;
    r.val_data = "";
  }
  Data d = load_data(r, /*need_train=*/false);
  const int64_t num_classes = r.num_classes > 0 ? r.num_classes : static_cast<int64_t>(d.classes.size());
  hybrid::HybridModelPtr model = load_trained(r, num_classes, o.weights, o.opaque);
  BatchLoader loader(d.test, d.test_indices,
                     eval_loader_options(r, o.batch_size > 0 ? o.batch_size : r.batch_size, *dist::single_process()));
  auto [predicted, labels] = predict_all(*model, loader);
  const size_t k = d.classes.size();
  std::vector<std::vector<int64_t>> confusion(k, std::vector<int64_t>(k, 0));
  int64_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    TVC_CHECK(predicted[i] >= 0 && static_cast<size_t>(predicted[i]) < k, "eval: the model predicts class ",
              predicted[i], ", outside the data's ", k, " classes");
    confusion[labels[i]][predicted[i]] += 1;
    correct += predicted[i] == labels[i];
  }
  std::printf("accuracy on %s (%zu images): %.2f%%\n", d.test_name.c_str(), labels.size(),
              100.0 * correct / std::max<size_t>(labels.size(), 1));
  std::printf("%s", confusion_text(d.classes, confusion).c_str());
  if (!o.svg_out.empty()) {
    io::write_file_atomic(o.svg_out, confusion_svg(d.classes, confusion));
    std::printf("confusion matrix: %s\n", printable(o.svg_out).c_str());
  }
}

}  // namespace tvc::tools
