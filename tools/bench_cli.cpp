// `tvc bench` (see bench_cli.h).
#include "bench_cli.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "tvc/autograd.h"
#include "tvc/error.h"
#include "tvc/models/models.h"
#include "tvc/nn/attention.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"
#include "tvc/optim.h"
#include "tvc/profiler.h"

namespace tvc::tools {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The FLOPs (2 per multiply-add) of the convolutions, linear layers and multi-head attention
// (its input projections and the two attention products; its output projection is a Linear) of
// one forward pass of model on x, counted by forward hooks in eval mode.
double forward_flops(nn::Module& model, const Tensor& x) {
  double flops = 0;
  nn::ScopedHooks hooks;
  for (const auto& [name, m] : model.named_modules()) {
    if (const auto* conv = dynamic_cast<const nn::ConvNd*>(m.get())) {
      int64_t per_output = conv->in_channels / conv->groups;
      for (int64_t k : conv->kernel_size) per_output *= k;
      hooks.add(
          m->register_forward_hook([&flops, per_output](nn::Module&, const nn::TensorList&, const nn::TensorList& out) {
            flops += 2.0 * static_cast<double>(out[0].numel() * per_output);
            return std::optional<nn::TensorList>();
          }));
    } else if (const auto* linear = dynamic_cast<const nn::Linear*>(m.get())) {
      const int64_t in = linear->in_features;
      hooks.add(m->register_forward_hook([&flops, in](nn::Module&, const nn::TensorList&, const nn::TensorList& out) {
        flops += 2.0 * static_cast<double>(out[0].numel() * in);
        return std::optional<nn::TensorList>();
      }));
    } else if (const auto* mha = dynamic_cast<const nn::MultiheadAttention*>(m.get())) {
      const int64_t e = mha->embed_dim;
      const bool batch_first = mha->batch_first;
      hooks.add(m->register_forward_hook(
          [&flops, e, batch_first](nn::Module&, const nn::TensorList& args, const nn::TensorList&) {
            const Tensor& q = args[0];
            const Tensor& k = args.size() > 1 ? args[1] : args[0];  // called with x alone: self-attention
            const int64_t n = q.dim() == 3 ? q.size(batch_first ? 0 : 1) : 1;
            const double l = static_cast<double>(q.numel() / (n * e)), s = static_cast<double>(k.numel() / (n * e));
            // q, k, v projections, then q k^T and the weighted sum of v.
            flops += 2.0 * static_cast<double>(n) * e * (l * e + 2 * s * e + 2 * l * s);
            return std::optional<nn::TensorList>();
          }));
    }
  }
  NoGradGuard no_grad;
  model.eval();
  model(x);
  return flops;
}

// The peak resident memory of this process so far, in MiB.
double peak_resident_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux: kilobytes
}

// Each kernel's time per step, by the module being called when it ran (the innermost), its op,
// the path the kernel took and its output shape, in the order they first ran; from a
// KernelProfiler over each timed step, not module hooks, so that fused paths (which hooks turn
// off) run as they do without --verbose.
class KernelTimes {
 public:
  explicit KernelTimes(const nn::Module& model) {
    for (const auto& [name, m] : model.named_modules()) names_[m.get()] = name.empty() ? "(model)" : name;
  }
  void begin_step() { profiler_.emplace(); }
  void end_step() {
    for (const KernelRecord& r : profiler_->records()) {
      const auto named = names_.find(r.module);
      const std::string key =
          cat_str(named == names_.end() ? "-" : named->second, "|", r.op, "|", r.path, "|", r.shape);
      auto [it, added] = index_.try_emplace(key, rows_.size());
      if (added) rows_.push_back({named == names_.end() ? "-" : named->second, r.op, r.path, cat_str(r.shape), 0, 0});
      rows_[it->second].seconds += r.seconds;
      rows_[it->second].calls += 1;
    }
    profiler_.reset();
  }
  void reset() { rows_.clear(), index_.clear(); }
  // The rows with their calls and ms per step over steps, then the total.
  void print(int64_t steps) const {
    const double n = static_cast<double>(std::max<int64_t>(steps, 1));
    std::printf("%-36s %-22s %-36s %-20s %6s %9s\n", "layer", "kernel", "path", "output", "calls", "ms/step");
    double total = 0;
    for (const Row& r : rows_) {
      std::printf("%-36s %-22s %-36s %-20s %6.0f %9.3f\n", r.layer.c_str(), r.op.c_str(), r.path.c_str(),
                  r.shape.c_str(), static_cast<double>(r.calls) / n, 1000 * r.seconds / n);
      total += r.seconds;
    }
    std::printf("%-36s %-22s %-36s %-20s %6s %9.3f\n", "(all kernels)", "", "", "", "", 1000 * total / n);
  }

 private:
  struct Row {
    std::string layer, op, path, shape;
    double seconds;
    int64_t calls;
  };
  std::unordered_map<const nn::Module*, std::string> names_;
  std::optional<KernelProfiler> profiler_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<Row> rows_;
};

}  // namespace

void bench_model(const BenchOptions& o) {
  TVC_CHECK(o.batch >= 1 && o.size >= 1 && o.threads >= 0 && o.iterations >= 0, "bench: --batch (", o.batch,
            ") and --size (", o.size, ") must be >= 1, --threads (", o.threads, ") and --iterations (", o.iterations,
            ") >= 0");
  TVC_CHECK(o.dtype == "float32" || o.dtype == "bfloat16", "bench: --dtype must be float32 or bfloat16, got '", o.dtype,
            "'");
  const bool bf16 = o.dtype == "bfloat16";
  TVC_CHECK(!bf16 || !o.train, "bench: --dtype bfloat16 times inference; --train runs in float32");
  TVC_CHECK(!bf16 || cpu_has_native_bfloat16(),
            "bench: bfloat16 inference is not supported on this CPU: it needs AVX512_BF16 (the kernels here use ",
            cpu_isa(), ")");
  if (o.threads > 0) set_num_threads(o.threads);
  manual_seed(0);
  models::Options create_options;
  if (o.model.rfind("vit", 0) == 0) create_options.image_size = o.size;
  models::BackbonePtr model = models::create(o.model, create_options);
  const Shape input_shape{o.batch, 3, o.size, o.size};
  const double flops = forward_flops(*model, randn(input_shape)) * (o.train ? 3.0 : 1.0);

  std::unique_ptr<optim::SGD> optimizer;
  if (o.train) {
    models::train_without_dropout(*model);  // batch statistics; no randomness in the timing
    optimizer = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 1e-4, .momentum = 0.9});
  } else {
    model->eval();
    if (bf16) nn::convert_weights_to_bfloat16(*model);  // once: every step then reads bfloat16 weights
  }
  // One step on the input (fresh and random each time, made before the clock starts); the output
  // (or the loss) must be finite.
  auto step = [&](const Tensor& x, const Tensor& labels) {
    Tensor checked;
    if (o.train) {
      Tensor loss = cross_entropy((*model)(x), labels);
      optimizer->zero_grad();
      loss.backward();
      optimizer->step();
      checked = loss.detach();
    } else {
      NoGradGuard no_grad;
      checked = (*model)(x);
    }
    for (double v : checked.to_vector())
      TVC_CHECK(std::isfinite(v), "bench ", o.model, ": the ", o.train ? "loss" : "output", " is not finite");
  };
  std::unique_ptr<KernelTimes> kernels;
  if (o.verbose) kernels = std::make_unique<KernelTimes>(*model);
  auto input = [&] { return randn(input_shape); };
  auto labels = [&] { return o.train ? randint(0, 1000, {o.batch}) : Tensor(); };
  Tensor x = input(), y = labels();
  const auto first_start = Clock::now();
  step(x, y);
  const double first = seconds_since(first_start);

  std::vector<double> times;
  const auto timing_start = Clock::now();
  while (o.iterations > 0 ? static_cast<int64_t>(times.size()) < o.iterations
                          : times.size() < 5 || seconds_since(timing_start) < 3.0) {
    x = input(), y = labels();
    if (kernels) kernels->begin_step();
    const auto start = Clock::now();
    step(x, y);
    times.push_back(seconds_since(start));
    if (kernels) kernels->end_step();
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double median =
      sorted.size() % 2 ? sorted[sorted.size() / 2] : (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]) / 2;
  const int threads = get_num_threads();
  const double peak = bf16 ? measure_bf16_peak_gflops(threads) : measure_fp32_peak_gflops(threads);
  const double gflops = flops / median / 1e9;
  std::printf(
      "%s batch %lld size %lld %s%s, %d threads (%s): median %.2f ms (min %.2f, max %.2f), %.1f GFLOP/s, %.1f%% "
      "of peak\n",
      o.model.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.size), o.train ? "train" : "eval",
      bf16 ? " bfloat16" : "", threads, cpu_isa().c_str(), 1000 * median, 1000 * sorted.front(), 1000 * sorted.back(),
      gflops, 100 * gflops / peak);
  std::printf(
      "first call %.2f ms; peak resident memory %.0f MiB; %.3f GFLOP per step (convolutions, linear layers, "
      "attention); peak %.1f GFLOP/s (%s %s loop, %d threads); %zu timed steps\n",
      1000 * first, peak_resident_mib(), flops / 1e9, peak, cpu_isa().c_str(), bf16 ? "bfloat16 dot-product" : "FMA",
      threads, times.size());
  if (kernels) kernels->print(static_cast<int64_t>(times.size()));
}

}  // namespace tvc::tools
