// tvc_bench: the machine's FMA peak, tvc's SGEMM against it (per instruction-set path, and
// oneDNN's dnnl_sgemm beside it when built with oneDNN), ResNet-50's convolutions through
// tvc::conv2d, whole models (images/s) and EMA updates of a model's weights (GB/s). Every other rate is a GFLOP/s
// counter ("G/s" below means 1e9 FLOP/s); SGEMM also gets "peak%", its rate as a share of the measured FMA peak on the
// same number of threads. Benchmarks are named kind/variant/size/threads:T; pick them with --benchmark_filter. See
// bench/README.md.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../kernels/cpu/gemm.h"
#include "tvc/autograd.h"
#include "tvc/internal/kernel.h"
#include "tvc/models/models.h"
#include "tvc/ops.h"
#include "tvc/swa/averaged_model.h"

#ifdef TVC_HAVE_DNNL
#include <dnnl.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

// Thread counts benchmarked: 1 and all (OMP_NUM_THREADS or the cores).
std::vector<int> thread_counts() {
  int all = tvc::get_num_threads();
  return all > 1 ? std::vector<int>{1, all} : std::vector<int>{1};
}

// The fp32 (or bfloat16) peak of the active instruction set on `threads` threads in GFLOP/s
// (tvc::measure_fp32_peak_gflops, measure_bf16_peak_gflops), measured once per instruction set
// and thread count.
double peak_gflops(int threads, bool bf16 = false) {
  static std::map<std::tuple<tvc::Isa, int, bool>, double> cache;
  const auto key = std::make_tuple(tvc::active_isa(), threads, bf16);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  return cache[key] = bf16 ? tvc::measure_bf16_peak_gflops(threads, 0.5) : tvc::measure_fp32_peak_gflops(threads, 0.5);
}

// Runs body once per benchmark iteration, timing each call (wall clock, all threads); returns
// the calls per second.
template <typename Body>
double timed_calls(benchmark::State& state, Body&& body) {
  double total = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    body();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(s);
    total += s;
  }
  return static_cast<double>(state.iterations()) / total;
}

// timed_calls, setting the "GFLOP/s" counter and, with threads > 0, "peak%" (share of the FMA
// peak of the same instruction set on the same number of threads).
template <typename Body>
void timed_loop(benchmark::State& state, double flop_per_call, int threads, Body&& body, bool bf16 = false) {
  double gflops = flop_per_call * timed_calls(state, body) / 1e9;
  state.counters["GFLOP/s"] = gflops;
  if (threads > 0) state.counters["peak%"] = 100 * gflops / peak_gflops(threads, bf16);
}

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

// The fp32 peak per core that shared/spec/NOTES.md (section 5) gives for this machine.
constexpr double kNotesPeakPerCore = 214.0;

// (a) The fp32 FMA peak of one instruction set on every thread (tvc::measure_fp32_peak_gflops,
// best of the benchmark's iterations). "NOTES%" is it as a share of the NOTES figure for the
// same number of cores.
void fma_peak(benchmark::State& state, tvc::Isa isa, int threads) {
  tvc::set_isa(isa);
  double best = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    best = std::max(best, tvc::measure_fp32_peak_gflops(threads, 0.1));
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.counters["GFLOP/s"] = best;
  state.counters["NOTES%"] = 100 * best / (kNotesPeakPerCore * threads);
  tvc::set_isa(tvc::available_isas().back());
}

// (b) Square SGEMM C = A @ B (row-major, beta 0) with tvc's CPU GEMM on one instruction set.
void sgemm_tvc(benchmark::State& state, tvc::Isa isa, int64_t n, int threads) {
  tvc::set_isa(isa);
  tvc::set_num_threads(threads);
  tvc::apply_num_threads();  // the kernel is called directly, not through an op that applies it
  std::vector<float> a = random_floats(n * n, 1), b = random_floats(n * n, 2), c(n * n);
  timed_loop(state, 2.0 * n * n * n, threads, [&] {
    tvc::cpu::gemm<float>(n, n, n, a.data(), n, 1, b.data(), n, 1, c.data(), n, 1, 0.f);
    benchmark::DoNotOptimize(c.data());
  });
  tvc::set_isa(tvc::available_isas().back());
}

// (b') The same product of bfloat16 matrices with float32 sums (tvc's GEMM in its bfloat16 form);
// peak% is of the bfloat16 peak (vdpbf16ps where the CPU has it, else the FMA loop).
void bf16gemm_tvc(benchmark::State& state, tvc::Isa isa, int64_t n, int threads) {
  tvc::set_isa(isa);
  tvc::set_num_threads(threads);
  tvc::apply_num_threads();
  const std::vector<float> af = random_floats(n * n, 1), bf = random_floats(n * n, 2);
  const std::vector<tvc::BFloat16> a(af.begin(), af.end()), b(bf.begin(), bf.end());
  std::vector<float> c(n * n);
  timed_loop(
      state, 2.0 * n * n * n, threads,
      [&] {
        tvc::cpu::gemm(n, n, n, a.data(), n, 1, b.data(), n, 1, c.data(), n, 1, 0.f);
        benchmark::DoNotOptimize(c.data());
      },
      true);
  tvc::set_isa(tvc::available_isas().back());
}

#ifdef TVC_HAVE_DNNL
// (d) The same product with oneDNN's dnnl_sgemm (row-major), the reference.
void sgemm_onednn(benchmark::State& state, int64_t n, int threads) {
  tvc::set_num_threads(threads);
  tvc::apply_num_threads();  // the kernel is called directly, not through an op that applies it
  std::vector<float> a = random_floats(n * n, 1), b = random_floats(n * n, 2), c(n * n);
  bool ok = true;
  timed_loop(state, 2.0 * n * n * n, threads, [&] {
    ok &= dnnl_sgemm('N', 'N', n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n) == dnnl_success;
    benchmark::DoNotOptimize(c.data());
  });
  if (!ok) state.SkipWithError("dnnl_sgemm failed");
}
#endif

// (c) ResNet-50's convolutions (and a few of VGG-16's and DenseNet-121's): conv2d(N, C, H, H) with O filters of k x k,
// bias, as in the network (3x3 with padding 1; 1x1 without).
struct ConvShape {
  const char* name;
  int64_t C, O, H, k, stride, pad;
};
constexpr ConvShape kResNet50Convs[] = {
    {"3x3_64x56", 64, 64, 56, 3, 1, 1},
    {"3x3_128x28", 128, 128, 28, 3, 1, 1},
    {"3x3_256x14", 256, 256, 14, 3, 1, 1},
    {"3x3_512x7", 512, 512, 7, 3, 1, 1},
    {"1x1_64-256x56", 64, 256, 56, 1, 1, 0},
    {"1x1_256-64x56", 256, 64, 56, 1, 1, 0},
    {"1x1_1024-256x14", 1024, 256, 14, 1, 1, 0},
    {"1x1_256-1024x14", 256, 1024, 14, 1, 1, 0},
    {"1x1_2048-512x7", 2048, 512, 7, 1, 1, 0},
    {"1x1_512-2048x7", 512, 2048, 7, 1, 1, 0},
    // VGG-16's wider 3x3 maps, and DenseNet-121's growth convolution
    {"3x3_256x56", 256, 256, 56, 3, 1, 1},
    {"3x3_512x28", 512, 512, 28, 3, 1, 1},
    {"3x3_128-32x28", 128, 32, 28, 3, 1, 1},
};

void conv2d_tvc(benchmark::State& state, ConvShape s, int64_t batch, int threads) {
  tvc::set_num_threads(threads);
  tvc::NoGradGuard no_grad;
  tvc::Tensor x = tvc::randn({batch, s.C, s.H, s.H});
  tvc::Tensor w = tvc::randn({s.O, s.C, s.k, s.k});
  tvc::Tensor bias = tvc::randn({s.O});
  int64_t ho = (s.H + 2 * s.pad - s.k) / s.stride + 1;
  timed_loop(state, 2.0 * batch * s.O * ho * ho * s.C * s.k * s.k, threads, [&] {
    tvc::Tensor y = tvc::conv2d(x, w, bias, {s.stride, s.stride}, {s.pad, s.pad});
    benchmark::DoNotOptimize(y.raw_data());
  });
}

// (e) Whole backbones of the model zoo (random weights, (N, 3, 224, 224) inputs): "eval" is a
// forward pass in eval mode without autograd; "train" one training step's forward (batch
// statistics) and backward of sum(output), gradients reset before each. Reports "img/s".
void model_tvc(benchmark::State& state, std::string name, bool train, int64_t batch, int threads) {
  tvc::set_num_threads(threads);
  tvc::models::BackbonePtr model = tvc::models::create(name);
  model->train(train);
  tvc::Tensor x = tvc::randn({batch, 3, 224, 224});
  double calls = timed_calls(state, [&] {
    if (train) {
      model->zero_grad();
      model->forward(x).sum().backward();
    } else {
      tvc::NoGradGuard no_grad;
      tvc::Tensor y = model->forward(x);
      benchmark::DoNotOptimize(y.raw_data());
    }
  });
  state.counters["img/s"] = calls * static_cast<double>(batch);
}

// (f) One EMA update of a backbone's weights (AveragedModel with decay 0.999, after the copying
// first update): "multi" is the fused multi-tensor form (one foreach_lerp_ pass over every
// parameter), "per_tensor" the per-tensor avg_fn (ops per parameter). Reports "GB/s" of the
// 12 bytes each float32 element moves (average and model read, average written).
void ema_update_tvc(benchmark::State& state, std::string name, bool multi, int threads) {
  tvc::set_num_threads(threads);
  tvc::models::BackbonePtr model = tvc::models::create(name);
  tvc::swa::AveragedModelOptions options;
  if (multi)
    options.multi_avg_fn = tvc::swa::get_ema_multi_avg_fn(0.999);
  else
    options.avg_fn = tvc::swa::get_ema_avg_fn(0.999);
  tvc::swa::AveragedModel ema(*model, options);
  ema.update_parameters(*model);
  int64_t elements = 0;
  for (const tvc::Tensor& p : model->parameters()) elements += p.numel();
  double calls = timed_calls(state, [&] { ema.update_parameters(*model); });
  state.counters["GB/s"] = calls * 12.0 * static_cast<double>(elements) / 1e9;
}

// "kind/variant/.../key:value" names.
std::string bench_name(std::initializer_list<std::string> parts) {
  std::string name;
  for (const std::string& p : parts) {
    if (!name.empty()) name += '/';
    name += p;
  }
  return name;
}
std::string keyed(const char* key, int64_t value) {
  std::string s = key;
  s += ':';
  s += std::to_string(value);
  return s;
}

void register_all() {
  std::vector<int> threads = thread_counts();
  for (tvc::Isa isa : tvc::available_isas())
    for (int t : threads)
      benchmark::RegisterBenchmark(bench_name({"fma_peak", tvc::isa_name(isa), keyed("threads", t)}).c_str(), fma_peak,
                                   isa, t)
          ->UseManualTime();
  for (int64_t n : {256, 512, 1024, 2048})
    for (int t : threads) {
      for (tvc::Isa isa : tvc::available_isas())
        benchmark::RegisterBenchmark(
            bench_name({"sgemm", tvc::isa_name(isa), std::to_string(n), keyed("threads", t)}).c_str(), sgemm_tvc, isa,
            n, t)
            ->UseManualTime();
      for (tvc::Isa isa : tvc::available_isas())
        benchmark::RegisterBenchmark(
            bench_name({"bf16gemm", tvc::isa_name(isa), std::to_string(n), keyed("threads", t)}).c_str(), bf16gemm_tvc,
            isa, n, t)
            ->UseManualTime();
#ifdef TVC_HAVE_DNNL
      benchmark::RegisterBenchmark(bench_name({"sgemm", "onednn", std::to_string(n), keyed("threads", t)}).c_str(),
                                   sgemm_onednn, n, t)
          ->UseManualTime();
#endif
    }
  for (const ConvShape& s : kResNet50Convs)
    for (int64_t batch : {1, 8})
      for (int t : threads)
        benchmark::RegisterBenchmark(bench_name({"conv2d", s.name, keyed("N", batch), keyed("threads", t)}).c_str(),
                                     conv2d_tvc, s, batch, t)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
  for (const char* model : {"resnet50", "mobilenet_v2", "densenet121"})
    for (bool train : {false, true})
      for (int64_t batch : {1, 8})
        for (int t : threads)
          benchmark::RegisterBenchmark(
              bench_name({"model", model, train ? "train" : "eval", keyed("N", batch), keyed("threads", t)}).c_str(),
              model_tvc, model, train, batch, t)
              ->UseManualTime()
              ->Unit(benchmark::kMillisecond);
  for (const char* model : {"resnet50", "mobilenet_v2"})
    for (bool multi : {true, false})
      for (int t : threads)
        benchmark::RegisterBenchmark(
            bench_name({"ema_update", model, multi ? "multi" : "per_tensor", keyed("threads", t)}).c_str(),
            ema_update_tvc, model, multi, t)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
