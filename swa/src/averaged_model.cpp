// AveragedModel and the averaging functions (see tvc/swa/averaged_model.h).
#include "tvc/swa/averaged_model.h"

#include <algorithm>
#include <cmath>

#include "tvc/autograd.h"
#include "tvc/ops.h"

namespace tvc::swa {

// ---------------------------------------------------------------- averaging functions

double ema_decay(double decay, const EmaWarmup& warmup, int64_t t) {
  TVC_CHECK(decay >= 0 && decay <= 1, "EMA: decay must be in [0, 1], got ", decay);
  TVC_CHECK(t >= 0, "EMA: the number of averaged models must be >= 0, got ", t);
  const double td = static_cast<double>(t);
  switch (warmup.kind) {
    case EmaWarmup::Kind::none:
      return decay;
    case EmaWarmup::Kind::timm:
      TVC_CHECK(warmup.gamma > 0 && warmup.power > 0, "EMA warm-up: gamma and power must be positive, got ",
                warmup.gamma, " and ", warmup.power);
      return std::max(warmup.min_decay, std::min(decay, 1 - std::pow(1 + td / warmup.gamma, -warmup.power)));
    case EmaWarmup::Kind::tensorflow:
      return std::min(decay, (1 + td) / (10 + td));
  }
  return decay;
}

MultiAvgFn get_ema_multi_avg_fn(double decay, EmaWarmup warmup) {
  ema_decay(decay, warmup, 0);  // validates
  return [decay, warmup](const std::vector<Tensor>& averaged, const std::vector<Tensor>& current, int64_t n) {
    foreach_lerp_(averaged, current, 1 - ema_decay(decay, warmup, n));
  };
}

AvgFn get_ema_avg_fn(double decay, EmaWarmup warmup) {
  ema_decay(decay, warmup, 0);
  return [decay, warmup](const Tensor& averaged, const Tensor& current, int64_t n) {
    double d = ema_decay(decay, warmup, n);
    return add(mul(averaged, scalar_like(d, averaged.dtype())), mul(current, scalar_like(1 - d, current.dtype())));
  };
}

MultiAvgFn get_swa_multi_avg_fn() {
  return [](const std::vector<Tensor>& averaged, const std::vector<Tensor>& current, int64_t n) {
    foreach_lerp_(averaged, current, 1.0 / static_cast<double>(n + 1));
  };
}

AvgFn get_swa_avg_fn() {
  return [](const Tensor& averaged, const Tensor& current, int64_t n) {
    return add(averaged, div(sub(current, averaged), scalar_like(n + 1, DType::Int64)));
  };
}

// ---------------------------------------------------------------- AveragedModel

struct AveragedModel::Slot {
  std::string name;  // dotted, as in the model
  Tensor averaged;   // the copy's tensor, detached
  Tensor current;    // the model's, detached, in the average's dtype and on its device
  bool average;      // averaged (else copied from the model)
};

namespace {

// The dtype a tensor of the model is averaged in.
DType average_dtype(DType source, const std::optional<DType>& requested) {
  if (!is_floating(source)) return source;
  if (requested) return *requested;
  return source == DType::Float16 || source == DType::BFloat16 ? DType::Float32 : source;
}

}  // namespace

AveragedModel::AveragedModel(const nn::Module& model, AveragedModelOptions options) : options_(std::move(options)) {
  TVC_CHECK(options_.update_every >= 1, "AveragedModel: update_every must be >= 1, got ", options_.update_every);
  TVC_CHECK(!options_.dtype || is_floating(*options_.dtype), "AveragedModel: dtype must be floating, got ",
            dtype_name(*options_.dtype));
  for (const auto& [name, t] : model.named_parameters())
    if (t.defined()) source_parameters_.push_back({t.dtype(), t.device()});
  for (const auto& [name, t] : model.named_buffers())
    if (t.defined()) source_buffers_.push_back({t.dtype(), t.device()});

  nn::ModulePtr copy = model.clone();
  const std::optional<DType> requested = options_.dtype;
  copy->convert_tensors([&requested](const Tensor& t) { return t.to(average_dtype(t.dtype(), requested)); });
  if (options_.device) copy->to(*options_.device);
  Device device = options_.device               ? *options_.device
                  : !source_parameters_.empty() ? source_parameters_[0].device
                                                : Device::CPU;
  register_module("module", copy);
  register_buffer("n_averaged", zeros({}, {.dtype = DType::Int64, .device = device}));
}

int64_t AveragedModel::n_averaged() const { return buffer("n_averaged").item<int64_t>(); }

Tensor AveragedModel::forward(const Tensor& x) { return module()(x); }

std::string AveragedModel::extra_repr() const {
  return cat_str("n_averaged=", n_averaged(), ", use_buffers=", options_.use_buffers ? "True" : "False");
}

std::vector<AveragedModel::Slot> AveragedModel::pair_tensors(const nn::Module& model) const {
  std::vector<Slot> slots;
  auto pair = [&](const std::vector<std::pair<std::string, Tensor>>& own,
                  const std::vector<std::pair<std::string, Tensor>>& theirs, const std::vector<SourceTensor>& source,
                  const char* kind, bool average_floating) {
    std::vector<std::pair<std::string, Tensor>> a, m;
    for (const auto& e : own)
      if (e.second.defined()) a.push_back(e);
    for (const auto& e : theirs)
      if (e.second.defined()) m.push_back(e);
    for (size_t i = 0; i < std::max(a.size(), m.size()); ++i) {
      TVC_CHECK(i < a.size(), "AveragedModel.update_parameters: the model has ", kind, " '", printable(m[i].first),
                "', which the averaged copy lacks (it has ", a.size(), " ", kind, "s, the model ", m.size(), ")");
      TVC_CHECK(i < m.size(), "AveragedModel.update_parameters: the model lacks ", kind, " '", printable(a[i].first),
                "' of the averaged copy (the copy has ", a.size(), " ", kind, "s, the model ", m.size(), ")");
      const std::string& name = a[i].first;
      const Tensor& mt = m[i].second;
      TVC_CHECK(m[i].first == name, "AveragedModel.update_parameters: ", kind, " ", i, " is '", printable(m[i].first),
                "' in the model but '", printable(name), "' in the averaged copy");
      TVC_CHECK(mt.shape() == a[i].second.shape(), "AveragedModel.update_parameters: ", kind, " '", printable(name),
                "' has shape ", mt.shape(), " in the model but ", a[i].second.shape(), " in the averaged copy");
      TVC_CHECK(mt.dtype() == source[i].dtype, "AveragedModel.update_parameters: ", kind, " '", printable(name),
                "' is ", dtype_name(mt.dtype()), " in the model but the averaged copy was made from ",
                dtype_name(source[i].dtype));
      TVC_CHECK(mt.device() == source[i].device, "AveragedModel.update_parameters: ", kind, " '", printable(name),
                "' is on ", device_name(mt.device()), " in the model but the averaged copy was made from ",
                device_name(source[i].device));
      slots.push_back({name, a[i].second.detach(), mt.detach(), average_floating && is_floating(mt.dtype())});
    }
  };
  pair(module().named_parameters(), model.named_parameters(), source_parameters_, "parameter", true);
  pair(module().named_buffers(), model.named_buffers(), source_buffers_, "buffer", options_.use_buffers);
  // Converted only once everything is checked.
  for (Slot& s : slots) s.current = s.current.to(s.averaged.device()).to(s.averaged.dtype());
  return slots;
}

void AveragedModel::update_parameters(const nn::Module& model) {
  if ((update_calls_ + 1) % options_.update_every != 0) {
    ++update_calls_;
    return;
  }
  std::vector<Slot> slots = pair_tensors(model);
  const int64_t n = n_averaged();
  NoGradGuard no_grad;

  // The new averages, all computed (and checked) before any is written.
  std::vector<Tensor> results;
  if (n > 0 && options_.avg_fn && !options_.multi_avg_fn) {
    for (const Slot& s : slots) {
      if (!s.average) continue;
      Tensor r = options_.avg_fn(s.averaged, s.current, n);
      TVC_CHECK(r.defined() && r.shape() == s.averaged.shape(), "AveragedModel.update_parameters: avg_fn returned ",
                r.defined() ? cat_str("shape ", r.shape()) : std::string("an undefined tensor"), " for '",
                printable(s.name), "' of shape ", s.averaged.shape());
      results.push_back(r);
    }
  }
  ++update_calls_;

  if (n == 0) {
    for (Slot& s : slots)
      if (s.average) s.averaged.copy_(s.current);
  } else if (!results.empty()) {
    size_t k = 0;
    for (Slot& s : slots)
      if (s.average) s.averaged.copy_(results[k++]);
  } else {
    // One call of the multi-tensor function per (dtype, device) group, in order of appearance.
    const MultiAvgFn fn = options_.multi_avg_fn ? options_.multi_avg_fn : get_swa_multi_avg_fn();
    std::vector<std::pair<std::pair<DType, Device>, std::pair<std::vector<Tensor>, std::vector<Tensor>>>> groups;
    for (Slot& s : slots) {
      if (!s.average) continue;
      auto key = std::make_pair(s.averaged.dtype(), s.averaged.device());
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
      if (it == groups.end()) it = groups.insert(groups.end(), {key, {}});
      it->second.first.push_back(s.averaged);
      it->second.second.push_back(s.current);
    }
    for (auto& [key, lists] : groups) fn(lists.first, lists.second, n);
  }
  for (Slot& s : slots)
    if (!s.average) s.averaged.copy_(s.current);
  buffer("n_averaged").fill_(n + 1);
}

}  // namespace tvc::swa
