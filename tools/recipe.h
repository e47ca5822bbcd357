// A training recipe of `tvc train`: every key of a YAML or JSON recipe file and of the
// command line's `--KEY VALUE` flags (the same keys; a flag overrides the file).
//
//   backbone: resnet18            # a backbone of `tvc backbones`, or small_cnn
//   patches: {layer3: {wrap: se}}
//   image_size: 32
//   epochs: 3
//   optimizer: sgd
//   lr: 0.1
//   ema: {decay: 0.999, warmup: timm, every: 1}
//
// Unknown keys and bad values are errors naming the key, what was given and what is allowed.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tvc::tools {

// ema: an exponential moving average of the weights (and BatchNorm statistics), updated every
// `every` optimizer steps with decay `decay` and a warm-up of the decay (swa/averaged_model.h).
struct EmaRecipe {
  double decay = 0.9998;
  std::string warmup = "timm";  // none | timm | tensorflow
  int64_t every = 1;
};

// swa: from epoch start_epoch (1-based) on, the learning rate anneals to swa_lr over
// anneal_epochs (SWALR, cos or linear) and the weights are averaged at every epoch's end; the
// average's BatchNorm statistics are recomputed on the training data at the end (update_bn).
struct SwaRecipe {
  int64_t start_epoch = 1;
  double swa_lr = 0.05;
  int64_t anneal_epochs = 1;
  std::string anneal_strategy = "cos";  // cos | linear
};

struct Recipe {
  // The model.
  std::string backbone = "small_cnn";
  std::string weights;          // a torchvision tag or a weight file; "": random init
  bool opaque_weights = false;  // read the weights file with io::ReadOptions::opaque_objects
  std::string patches = "{}";   // the patches as JSON (hybrid::parse_patches)
  int64_t num_classes = 0;      // 0: the data's class count
  double dropout = 0;
  bool freeze_backbone = false;
  std::vector<int64_t> unfreeze_stages;
  // The data.
  std::string data;          // an image folder; "": Fashion-MNIST (fashion_mnist_dir)
  std::string val_data;      // a validation image folder; "": val_split of data
  double val_split = 0.1;    // share of the training images held out for validation
  int64_t train_subset = 0;  // > 0: train on this many images (a seeded subset)
  std::string fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";
  int64_t image_size = 224;
  bool augment = true;  // random resized crop and horizontal flip
  std::array<double, 2> crop_scale = {0.08, 1.0};
  double hflip = 0.5;
  int64_t workers = 2;  // loader threads
  // The optimisation.
  int64_t batch_size = 64;
  int64_t epochs = 1;
  std::string optimizer = "sgd";  // sgd | adamw | adam
  double lr = 0.1;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 5e-5;
  bool no_decay_norm_bias = true;    // no weight decay on norm weights and biases (1-d tensors)
  std::string scheduler = "cosine";  // cosine | step | onecycle | constant
  double warmup_epochs = 0;          // cosine: linear warm-up from lr/100
  int64_t step_size = 1;             // step: epochs between decays
  double gamma = 0.1;                // step: decay factor
  double min_lr = 0;                 // cosine: the final lr
  double label_smoothing = 0;
  double clip_grad_norm = 0;  // > 0: clip the gradients' joint 2-norm to this
  std::optional<EmaRecipe> ema;
  std::optional<SwaRecipe> swa;
  // The run.
  uint64_t seed = 0;
  int64_t threads = 0;           // 0: all cores
  int64_t max_batches = 0;       // > 0: stop each epoch after this many batches
  int64_t checkpoint_every = 0;  // > 0: also checkpoint every this many steps
  // Data-parallel runs (mpirun -np N tvc train, docs/distributed.md).
  bool sync_bn = false;       // BatchNorm statistics over all ranks' shares (SyncBatchNorm)
  double rank_timeout = 600;  // seconds a rank waits for the others before the job ends
  std::string out = "runs/train";
  std::string dump_batches;  // a folder: write every training batch (for the PyTorch replay)
};

// The recipe of the built-in name "small_cnn" or of a YAML/JSON file.
// Throws tvc::Error naming the file and the key at fault.
Recipe load_recipe(const std::string& name_or_path);
// Sets one key from text (a flag's value, parsed as YAML: `0.1`, `true`, `[1, 2]`, JSON maps).
// key may use dashes for underscores (`batch-size`) and dots into ema/swa (`ema.decay`); `ema`
// with a number sets ema.decay, `data-dir` is `fashion_mnist_dir`. Throws naming the key.
void set_recipe_key(Recipe& recipe, const std::string& key, const std::string& value);
// The recipe as YAML text (every key, loadable by load_recipe).
std::string recipe_to_yaml(const Recipe& recipe);
// Checks the values together (an option that needs another, exclusive options, ranges).
void check_recipe(const Recipe& recipe);

// The built-in recipe names.
std::vector<std::string> builtin_recipes();

}  // namespace tvc::tools
