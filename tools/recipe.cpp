// Recipes: a table of keys, each parsed from a YAML node (a file's value or a flag's text).
#include "recipe.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "tvc/error.h"
#include "tvc/hybrid/hybrid.h"

namespace tvc::tools {

namespace {

// The built-in recipe (the others are files, e.g. recipes/fashion_resnet18_se_ema.yaml).
const char* const kSmallCnn =
    R"(# The first tvc train: a small CNN on Fashion-MNIST at 28x28 with Adam and a cosine decay.
backbone: small_cnn
image_size: 28
augment: false
batch_size: 64
epochs: 1
optimizer: adam
lr: 0.002
weight_decay: 0
)";

std::string describe(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a map";
  return "nothing";
}

template <typename T>
T scalar(const YAML::Node& node, const std::string& key, const char* what) {
  T value{};
  TVC_CHECK(node.IsScalar() && YAML::convert<T>::decode(node, value), "'", key, "' must be ", what, ", got ",
            describe(node));
  return value;
}

double number(const YAML::Node& n, const std::string& key) {
  double v = scalar<double>(n, key, "a number");
  TVC_CHECK(std::isfinite(v), "'", key, "' must be a finite number, got ", describe(n));
  return v;
}
double number_in(const YAML::Node& n, const std::string& key, double lo, double hi, const char* range) {
  double v = number(n, key);
  TVC_CHECK(v >= lo && v <= hi, "'", key, "' must be in ", range, ", got ", describe(n));
  return v;
}
int64_t integer(const YAML::Node& n, const std::string& key, int64_t lo, int64_t hi = INT64_MAX) {
  int64_t v = scalar<int64_t>(n, key, "an integer");
  TVC_CHECK(v >= lo && v <= hi, "'", key, "' must be ",
            hi == INT64_MAX ? cat_str("at least ", lo) : cat_str("in [", lo, ", ", hi, "]"), ", got ", v);
  return v;
}
bool boolean(const YAML::Node& n, const std::string& key) { return scalar<bool>(n, key, "true or false"); }
std::string text(const YAML::Node& n, const std::string& key) { return scalar<std::string>(n, key, "a string"); }
std::string choice(const YAML::Node& n, const std::string& key, const std::vector<std::string>& allowed) {
  std::string v = text(n, key);
  if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
    std::string list;
    for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
    throw Error(cat_str("'", key, "' must be one of ", list, "; got '", v, "'"));
  }
  return v;
}

// A YAML value as JSON, keeping map order (patches apply in the text's order).
nlohmann::ordered_json to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    for (const auto& item : n) j[item.first.as<std::string>()] = to_json(item.second);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const auto& item : n) j.push_back(to_json(item));
    return j;
  }
  if (!n.IsScalar()) return nullptr;
  const std::string& s = n.Scalar();
  if (n.Tag() != "!") {  // unquoted: a bool or a number when it reads as one
    bool b;
    int64_t i;
    double d;
    if (YAML::convert<bool>::decode(n, b)) return b;
    if (YAML::convert<int64_t>::decode(n, i)) return i;
    if (YAML::convert<double>::decode(n, d)) return d;
  }
  return s;
}

// A key of a map value (ema, swa): the field setters by name.
using Setter = std::function<void(Recipe&, const YAML::Node&, const std::string& key)>;
struct Key {
  const char* name;
  Setter set;
};

const std::vector<std::pair<const char*, std::function<void(EmaRecipe&, const YAML::Node&, const std::string&)>>>&
ema_fields() {
  static const std::vector<
      std::pair<const char*, std::function<void(EmaRecipe&, const YAML::Node&, const std::string&)>>>
      f = {
          {"decay",
           [](EmaRecipe& e, const YAML::Node& n, const std::string& k) { e.decay = number_in(n, k, 0, 1, "[0, 1]"); }},
          {"warmup",
           [](EmaRecipe& e, const YAML::Node& n, const std::string& k) {
             bool b;
             if (n.IsScalar() && YAML::convert<bool>::decode(n, b))
               e.warmup = b ? "timm" : "none";
             else
               e.warmup = choice(n, k, {"none", "timm", "tensorflow"});
           }},
          {"every", [](EmaRecipe& e, const YAML::Node& n, const std::string& k) { e.every = integer(n, k, 1); }},
      };
  return f;
}

const std::vector<std::pair<const char*, std::function<void(SwaRecipe&, const YAML::Node&, const std::string&)>>>&
swa_fields() {
  static const std::vector<
      std::pair<const char*, std::function<void(SwaRecipe&, const YAML::Node&, const std::string&)>>>
      f = {
          {"start_epoch",
           [](SwaRecipe& s, const YAML::Node& n, const std::string& k) { s.start_epoch = integer(n, k, 1); }},
          {"swa_lr", [](SwaRecipe& s, const YAML::Node& n,
                        const std::string& k) { s.swa_lr = number_in(n, k, 0, 1e6, "(0, 1e6]"); }},
          {"anneal_epochs",
           [](SwaRecipe& s, const YAML::Node& n, const std::string& k) { s.anneal_epochs = integer(n, k, 0); }},
          {"anneal_strategy",
           [](SwaRecipe& s, const YAML::Node& n, const std::string& k) {
             s.anneal_strategy = choice(n, k, {"cos", "linear"});
           }},
      };
  return f;
}

template <typename Sub>
void set_map(
    const YAML::Node& n, const std::string& key, Sub& sub,
    const std::vector<std::pair<const char*, std::function<void(Sub&, const YAML::Node&, const std::string&)>>>&
        fields) {
  TVC_CHECK(n.IsMap(), "'", key, "' must be a map, got ", describe(n));
  std::vector<std::string> names;
  for (const auto& f : fields) names.push_back(f.first);
  for (const auto& item : n) {
    const std::string field = item.first.as<std::string>();
    auto found = std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return field == f.first; });
    if (found == fields.end()) {
      std::string list;
      for (const std::string& a : names) list += (list.empty() ? "" : ", ") + a;
      throw Error(cat_str("unknown key '", key, ".", field, "'; the keys of '", key, "' are ", list));
    }
    found->second(sub, item.second, key + "." + field);
  }
}

// `ema: off` (or false, or nothing) removes an average the recipe had.
bool turns_off(const YAML::Node& n) {
  return n.IsNull() || (n.IsScalar() && (n.Scalar() == "false" || n.Scalar() == "off"));
}

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      {"backbone",
       [](Recipe& r, const YAML::Node& n, const std::string& k) {
         std::vector<std::string> all = hybrid::HybridBuilder::list_backbones();
         all.insert(all.begin(), "small_cnn");
         std::string v = text(n, k);
         TVC_CHECK(std::find(all.begin(), all.end(), v) != all.end(), "'", k, "': unknown backbone '", v,
                   "'; did you mean '", nearest_names(v, all, 1)[0], "'? (small_cnn or one of `tvc backbones`)");
         r.backbone = v;
       }},
      {"weights", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.weights = n.IsNull() ? "" : text(n, k); }},
      {"patches",
       [](Recipe& r, const YAML::Node& n, const std::string& k) {
         // A map in a file; on the command line the JSON text parses as a YAML map too.
         TVC_CHECK(n.IsMap() || n.IsNull(), "'", k, "' must be a map of module paths to patches, got ", describe(n));
         r.patches = n.IsNull() ? "{}" : to_json(n).dump();
         try {
           hybrid::parse_patches(r.patches);
         } catch (const Error& e) {
           throw Error(cat_str("'", k, "': ", e.what()));
         }
       }},
      {"num_classes", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.num_classes = integer(n, k, 0, 1000000); }},
      {"dropout", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.dropout = number_in(n, k, 0, 0.999999, "[0, 1)"); }},
      {"freeze_backbone", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.freeze_backbone = boolean(n, k); }},
      {"opaque_weights", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.opaque_weights = boolean(n, k); }},
      {"unfreeze_stages",
       [](Recipe& r, const YAML::Node& n, const std::string& k) {
         r.unfreeze_stages.clear();
         if (n.IsScalar()) {
           r.unfreeze_stages.push_back(integer(n, k, 0, 64));
           return;
         }
         TVC_CHECK(n.IsSequence(), "'", k, "' must be a list of stage indices, got ", describe(n));
         for (const auto& item : n) r.unfreeze_stages.push_back(integer(item, k, 0, 64));
       }},
      {"data", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.data = n.IsNull() ? "" : text(n, k); }},
      {"val_data", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.val_data = n.IsNull() ? "" : text(n, k); }},
      {"val_split", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.val_split = number_in(n, k, 0, 0.9, "[0, 0.9]"); }},
      {"train_subset", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.train_subset = integer(n, k, 0); }},
      {"fashion_mnist_dir", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.fashion_mnist_dir = text(n, k); }},
      {"image_size", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.image_size = integer(n, k, 8, 4096); }},
      {"augment", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.augment = boolean(n, k); }},
      {"crop_scale",
       [](Recipe& r, const YAML::Node& n, const std::string& k) {
         TVC_CHECK(n.IsSequence() && n.size() == 2, "'", k, "' must be [min, max], got ", describe(n));
         double lo = number_in(n[0], k, 1e-3, 1, "(0, 1]"), hi = number_in(n[1], k, 1e-3, 1, "(0, 1]");
         TVC_CHECK(lo <= hi, "'", k, "' must be [min, max] with min <= max, got [", lo, ", ", hi, "]");
         r.crop_scale = {lo, hi};
       }},
      {"hflip", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.hflip = number_in(n, k, 0, 1, "[0, 1]"); }},
      {"workers", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.workers = integer(n, k, 0, 256); }},
      {"batch_size", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.batch_size = integer(n, k, 1, 1 << 20); }},
      {"epochs", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.epochs = integer(n, k, 1, 1000000); }},
      {"optimizer",
       [](Recipe& r, const YAML::Node& n, const std::string& k) { r.optimizer = choice(n, k, {"sgd", "adamw", "adam"}); }},
      {"lr", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.lr = number_in(n, k, 1e-12, 1e6, "(0, 1e6]"); }},
      {"momentum", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.momentum = number_in(n, k, 0, 0.999999, "[0, 1)"); }},
      {"nesterov", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.nesterov = boolean(n, k); }},
      {"weight_decay", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.weight_decay = number_in(n, k, 0, 1, "[0, 1]"); }},
      {"no_decay_norm_bias", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.no_decay_norm_bias = boolean(n, k); }},
      {"scheduler",
       [](Recipe& r, const YAML::Node& n, const std::string& k) {
         r.scheduler = choice(n, k, {"cosine", "step", "onecycle", "constant"});
       }},
      {"warmup_epochs", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.warmup_epochs = number_in(n, k, 0, 1e6, "[0, 1e6]"); }},
      {"step_size", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.step_size = integer(n, k, 1); }},
      {"gamma", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.gamma = number_in(n, k, 0, 1, "[0, 1]"); }},
      {"min_lr", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.min_lr = number_in(n, k, 0, 1e6, "[0, 1e6]"); }},
      {"label_smoothing",
       [](Recipe& r, const YAML::Node& n, const std::string& k) { r.label_smoothing = number_in(n, k, 0, 0.999999, "[0, 1)"); }},
      {"clip_grad_norm", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.clip_grad_norm = number_in(n, k, 0, 1e12, "[0, 1e12]"); }},
      {"ema",
       [](Recipe& r, const YAML::Node& n, const std::string& k) {
         if (turns_off(n)) return r.ema.reset();
         EmaRecipe e = r.ema.value_or(EmaRecipe{});
         if (n.IsScalar()) e.decay = number_in(n, k + ".decay", 0, 1, "[0, 1]");  // --ema 0.999
         else set_map(n, k, e, ema_fields());
         r.ema = e;
       }},
      {"swa",
       [](Recipe& r, const YAML::Node& n, const std::string& k) {
         if (turns_off(n)) return r.swa.reset();
         SwaRecipe s = r.swa.value_or(SwaRecipe{});
         set_map(n, k, s, swa_fields());
         r.swa = s;
       }},
      {"seed", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.seed = static_cast<uint64_t>(integer(n, k, 0)); }},
      {"threads", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.threads = integer(n, k, 0, 4096); }},
      {"max_batches", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.max_batches = integer(n, k, 0); }},
      {"checkpoint_every", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.checkpoint_every = integer(n, k, 0); }},
      {"sync_bn", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.sync_bn = boolean(n, k); }},
      {"rank_timeout", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.rank_timeout = number_in(n, k, 1, 1e6, "[1, 1e6]"); }},
      {"out", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.out = text(n, k); }},
      {"dump_batches", [](Recipe& r, const YAML::Node& n, const std::string& k) { r.dump_batches = n.IsNull() ? "" : text(n, k); }},
  };
  return table;
}

std::vector<std::string> key_names() {
  std::vector<std::string> names;
  for (const Key& k : keys()) names.push_back(k.name);
  return names;
}

void set_node(Recipe& r, const std::string& key, const YAML::Node& node) {
  // ema.decay, swa.start_epoch: a field of a map key.
  if (auto dot = key.find('.'); dot != std::string::npos) {
    const std::string head = key.substr(0, dot);
    TVC_CHECK(head == "ema" || head == "swa", "unknown key '", key, "': only ema and swa have fields");
    YAML::Node map(YAML::NodeType::Map);
    map[key.substr(dot + 1)] = node;
    set_node(r, head, map);
    return;
  }
  const auto& table = keys();
  auto found = std::find_if(table.begin(), table.end(), [&](const Key& k) { return key == k.name; });
  if (found == table.end()) {
    std::vector<std::string> names = key_names();
    throw Error(cat_str("unknown key '", key, "'; did you mean '", nearest_names(key, names, 1)[0],
                        "'? (docs/training.md lists every key)"));
  }
  found->set(r, node, key);
}

// where names the recipe in messages, escaped (printable()) by the caller.
Recipe parse(const YAML::Node& root, const std::string& where) {
  Recipe r;
  if (root.IsNull()) return r;
  TVC_CHECK(root.IsMap(), where, ": a recipe is a map of keys to values, got ", describe(root));
  for (const auto& item : root) {
    const std::string key = item.first.as<std::string>();
    try {
      TVC_CHECK(key.find('.') == std::string::npos, "unknown key '", key, "' (write ema and swa fields as maps)");
      set_node(r, key, item.second);
    } catch (const Error& e) {
      throw Error(cat_str(where, ": ", e.what()));
    }
  }
  return r;
}

YAML::Node load_yaml(const std::string& text, const std::string& where) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(cat_str(where, ": not valid YAML or JSON: ", e.what()));
  }
}

}  // namespace

std::vector<std::string> builtin_recipes() { return {"small_cnn"}; }

Recipe load_recipe(const std::string& name_or_path) {
  if (name_or_path == "small_cnn") return parse(load_yaml(kSmallCnn, name_or_path), name_or_path);
  std::error_code ec;
  TVC_CHECK(std::filesystem::is_regular_file(name_or_path, ec), "recipe ", printable(name_or_path),
            ": no such file (and not the built-in recipe small_cnn)");
  YAML::Node root;
  try {
    root = YAML::LoadFile(name_or_path);
  } catch (const YAML::Exception& e) {
    throw Error(cat_str("recipe ", printable(name_or_path), ": not valid YAML or JSON: ", e.what()));
  }
  Recipe r = parse(root, "recipe " + printable(name_or_path));
  try {
    check_recipe(r);
  } catch (const Error& e) {
    throw Error(cat_str("recipe ", printable(name_or_path), ": ", e.what()));
  }
  return r;
}

namespace {

std::string key_of_flag(const std::string& flag) {
  std::string key = flag;
  std::replace(key.begin(), key.end(), '-', '_');
  return key == "data_dir" ? "fashion_mnist_dir" : key;  // the first tvc train's spelling
}

}  // namespace

void set_recipe_key(Recipe& recipe, const std::string& flag, const std::string& value) {
  const std::string key = key_of_flag(flag);
  YAML::Node node = load_yaml(value, "--" + flag);
  try {
    set_node(recipe, key, node);
  } catch (const Error& e) {
    throw Error(cat_str("--", flag, ": ", e.what()));
  }
}

void check_recipe(const Recipe& r) {
  TVC_CHECK(!(r.ema && r.swa), "'ema' and 'swa' exclude each other: keep one average");
  TVC_CHECK(r.unfreeze_stages.empty() || r.freeze_backbone, "'unfreeze_stages' needs 'freeze_backbone: true'");
  TVC_CHECK(!r.swa || r.swa->start_epoch <= r.epochs, "'swa.start_epoch' (", r.swa ? r.swa->start_epoch : 0,
            ") is after the last epoch (", r.epochs, ")");
  TVC_CHECK(r.scheduler != "onecycle" || r.optimizer != "sgd" || r.momentum > 0,
            "'scheduler: onecycle' cycles the momentum: it needs 'momentum' > 0");
  if (r.backbone == "small_cnn") {
    // Two conv blocks and a linear head, initialised at random, normalised with Fashion-MNIST's statistics.
    TVC_CHECK(r.weights.empty() && r.patches == "{}" && r.data.empty() && !r.freeze_backbone,
              "backbone small_cnn trains on Fashion-MNIST without weights, patches, image folders or freezing; "
              "choose a backbone of `tvc backbones` for those");
  }
}

std::string recipe_to_yaml(const Recipe& r) {
  YAML::Emitter y;
  y << YAML::BeginMap;
  y << YAML::Key << "backbone" << YAML::Value << r.backbone;
  y << YAML::Key << "weights" << YAML::Value << r.weights;
  y << YAML::Key << "opaque_weights" << YAML::Value << r.opaque_weights;
  y << YAML::Key << "patches" << YAML::Value << YAML::Load(r.patches);
  y << YAML::Key << "num_classes" << YAML::Value << r.num_classes;
  y << YAML::Key << "dropout" << YAML::Value << r.dropout;
  y << YAML::Key << "freeze_backbone" << YAML::Value << r.freeze_backbone;
  y << YAML::Key << "unfreeze_stages" << YAML::Value << YAML::Flow << r.unfreeze_stages;
  y << YAML::Key << "data" << YAML::Value << r.data;
  y << YAML::Key << "val_data" << YAML::Value << r.val_data;
  y << YAML::Key << "val_split" << YAML::Value << r.val_split;
  y << YAML::Key << "train_subset" << YAML::Value << r.train_subset;
  y << YAML::Key << "fashion_mnist_dir" << YAML::Value << r.fashion_mnist_dir;
  y << YAML::Key << "image_size" << YAML::Value << r.image_size;
  y << YAML::Key << "augment" << YAML::Value << r.augment;
  y << YAML::Key << "crop_scale" << YAML::Value << YAML::Flow << std::vector<double>{r.crop_scale[0], r.crop_scale[1]};
  y << YAML::Key << "hflip" << YAML::Value << r.hflip;
  y << YAML::Key << "workers" << YAML::Value << r.workers;
  y << YAML::Key << "batch_size" << YAML::Value << r.batch_size;
  y << YAML::Key << "epochs" << YAML::Value << r.epochs;
  y << YAML::Key << "optimizer" << YAML::Value << r.optimizer;
  y << YAML::Key << "lr" << YAML::Value << r.lr;
  y << YAML::Key << "momentum" << YAML::Value << r.momentum;
  y << YAML::Key << "nesterov" << YAML::Value << r.nesterov;
  y << YAML::Key << "weight_decay" << YAML::Value << r.weight_decay;
  y << YAML::Key << "no_decay_norm_bias" << YAML::Value << r.no_decay_norm_bias;
  y << YAML::Key << "scheduler" << YAML::Value << r.scheduler;
  y << YAML::Key << "warmup_epochs" << YAML::Value << r.warmup_epochs;
  y << YAML::Key << "step_size" << YAML::Value << r.step_size;
  y << YAML::Key << "gamma" << YAML::Value << r.gamma;
  y << YAML::Key << "min_lr" << YAML::Value << r.min_lr;
  y << YAML::Key << "label_smoothing" << YAML::Value << r.label_smoothing;
  y << YAML::Key << "clip_grad_norm" << YAML::Value << r.clip_grad_norm;
  if (r.ema) {
    y << YAML::Key << "ema" << YAML::Value << YAML::Flow << YAML::BeginMap;
    y << YAML::Key << "decay" << YAML::Value << r.ema->decay;
    y << YAML::Key << "warmup" << YAML::Value << r.ema->warmup;
    y << YAML::Key << "every" << YAML::Value << r.ema->every << YAML::EndMap;
  }
  if (r.swa) {
    y << YAML::Key << "swa" << YAML::Value << YAML::Flow << YAML::BeginMap;
    y << YAML::Key << "start_epoch" << YAML::Value << r.swa->start_epoch;
    y << YAML::Key << "swa_lr" << YAML::Value << r.swa->swa_lr;
    y << YAML::Key << "anneal_epochs" << YAML::Value << r.swa->anneal_epochs;
    y << YAML::Key << "anneal_strategy" << YAML::Value << r.swa->anneal_strategy << YAML::EndMap;
  }
  y << YAML::Key << "seed" << YAML::Value << r.seed;
  y << YAML::Key << "threads" << YAML::Value << r.threads;
  y << YAML::Key << "max_batches" << YAML::Value << r.max_batches;
  y << YAML::Key << "checkpoint_every" << YAML::Value << r.checkpoint_every;
  y << YAML::Key << "sync_bn" << YAML::Value << r.sync_bn;
  y << YAML::Key << "rank_timeout" << YAML::Value << r.rank_timeout;
  y << YAML::Key << "out" << YAML::Value << r.out;
  y << YAML::Key << "dump_batches" << YAML::Value << r.dump_batches;
  y << YAML::EndMap;
  return std::string(y.c_str()) + "\n";
}

}  // namespace tvc::tools
