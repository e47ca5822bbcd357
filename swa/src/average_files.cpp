// Averaging weight files (see tvc/swa/average_files.h).
#include "tvc/swa/average_files.h"

#include <tuple>
#include <unordered_set>

#include "tvc/serialize.h"
#include "tvc/swa/averaged_model.h"

namespace tvc::swa {

namespace {

// A module that is only a holder of named tensors and children.
class StateDictModule : public nn::Cloneable<StateDictModule> {
 public:
  std::string type_name() const override { return "Module"; }
};

bool is_buffer_entry(const std::string& key, const Tensor& t) {
  std::string leaf = key.substr(key.rfind('.') + 1);
  return leaf == "running_mean" || leaf == "running_var" || leaf == "num_batches_tracked" || !is_floating(t.dtype());
}

nn::StateDict load_file(const std::string& path, const io::ReadOptions& read) {
  return io::load_state_dict(path, {.read = read, .unwrap = true});
}

// The key, shape and dtype of every tensor of the first file, in its order.
struct Layout {
  std::string path;
  std::vector<std::tuple<std::string, Shape, DType>> entries;
  std::unordered_set<std::string> keys;
};

Layout layout_of(const nn::StateDict& first, const std::string& path) {
  Layout layout{path, {}, {}};
  for (const auto& [key, t] : first) {
    layout.entries.emplace_back(key, t.shape(), t.dtype());
    layout.keys.insert(key);
  }
  return layout;
}

// file's tensors in the first file's key order and dtypes; throws naming path and the first key
// that is missing, unexpected or of another shape.
nn::StateDict match_first(nn::StateDict file, const std::string& path, const Layout& first) {
  nn::StateDict ordered;
  for (const auto& [key, shape, dtype] : first.entries) {
    Tensor* t = file.find(key);
    TVC_CHECK(t != nullptr, "'", printable(path), "': lacks '", printable(key), "', which '", printable(first.path),
              "' has (the files must hold the same keys)");
    TVC_CHECK(t->shape() == shape, "'", printable(path), "': '", printable(key), "' has shape ", t->shape(), " but ",
              shape, " in '", printable(first.path), "'");
    Tensor moved = std::move(*t);
    ordered.insert(key, moved.to(dtype));
  }
  for (const auto& [key, t] : file)
    TVC_CHECK(first.keys.contains(key), "'", printable(path), "': has '", printable(key), "', which '",
              printable(first.path), "' lacks (the files must hold the same keys)");
  return ordered;
}

}  // namespace

std::shared_ptr<nn::Module> module_from_state_dict(const nn::StateDict& state_dict) {
  auto root = std::make_shared<StateDictModule>();
  for (const auto& [key, tensor] : state_dict) {
    try {
      nn::Module* m = root.get();
      size_t begin = 0;
      for (size_t dot = key.find('.'); dot != std::string::npos; begin = dot + 1, dot = key.find('.', begin)) {
        std::string part = key.substr(begin, dot - begin);
        if (!m->has_child(part)) m->register_module(part, std::make_shared<StateDictModule>());
        m = &m->child(part);
      }
      std::string leaf = key.substr(begin);
      if (is_buffer_entry(key, tensor))
        m->register_buffer(leaf, tensor);
      else
        m->register_parameter(leaf, tensor, /*requires_grad=*/false);
    } catch (const Error& e) {
      throw Error(cat_str("state_dict entry '", printable(key), "' does not fit a module tree: ", e.what()));
    }
  }
  return root;
}

AverageFilesReport average_weight_files(const std::vector<std::string>& paths, const std::string& out,
                                        const AverageFilesOptions& options) {
  TVC_CHECK(!paths.empty(), "average: no weight files given");
  io::format_for_extension(out);  // a bad output name fails before any work

  AveragedModelOptions averaging{.use_buffers = options.use_buffers};
  if (options.method == AverageFilesOptions::Method::ema)
    averaging.multi_avg_fn = get_ema_multi_avg_fn(options.ema_decay);

  Layout first_layout;
  std::shared_ptr<AveragedModel> average;
  AverageFilesReport report;
  for (const std::string& path : paths) {
    std::shared_ptr<nn::Module> model;
    if (!average) {
      nn::StateDict first = load_file(path, options.read);
      TVC_CHECK(!first.empty(), "'", printable(path), "': holds no tensors");
      first_layout = layout_of(first, path);
      model = module_from_state_dict(first);
      average = std::make_shared<AveragedModel>(*model, averaging);
      report.averaged += static_cast<int64_t>(model->named_parameters().size());
      for (const auto& [name, t] : model->named_buffers())
        (options.use_buffers && is_floating(t.dtype()) ? report.averaged : report.copied) += 1;
    } else {
      model = module_from_state_dict(match_first(load_file(path, options.read), path, first_layout));
    }
    try {
      average->update_parameters(*model);
    } catch (const Error& e) {
      throw Error(cat_str("'", printable(path), "': ", e.what()));
    }
    ++report.files;
  }
  io::save_state_dict(out, options.plain ? average->module().state_dict() : average->state_dict());
  return report;
}

}  // namespace tvc::swa
