// Runs the op test table (tests/op_table.h) on every CPU instruction-set path.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "compare.h"
#include "op_table.h"
#include "torch_golden.h"
#include "tvc/autograd.h"
#include "tvc/internal/kernel.h"

namespace tvc::test {
namespace {

std::vector<OpRow> all_rows() {
  std::vector<OpRow> rows;
  for (auto family : {elementwise_rows, reduction_rows, nn_rows, shape_rows, loss_rows, creation_rows}) {
    auto r = family();
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}

const std::vector<OpRow>& rows() {
  static const std::vector<OpRow> r = all_rows();
  return r;
}

std::string case_name(const OpRow& row, const OpSample& s) {
  return std::string(op_name(row.op)) + " [" + s.label + "]";
}

// A copy of t in dtype with the same strides (layout), so non-contiguous and channels-last
// samples stay so. Non-floating tensors are returned as they are.
Tensor recast(const Tensor& t, DType dtype) {
  if (!is_floating(t.dtype())) return t;
  bool expanded = false;
  for (int64_t d = 0; d < t.dim(); ++d) expanded |= t.strides()[d] == 0 && t.shape()[d] > 1;
  NoGradGuard no_grad;
  if (expanded) return t.to(dtype).contiguous();
  Tensor out = empty_strided(t.shape(), t.strides(), {.dtype = dtype});
  out.copy_(t);
  return out;
}

std::vector<Tensor> prepare(const OpRow& row, const OpSample& s, DType dtype) {
  std::vector<Tensor> in;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    Tensor t = recast(s.inputs[i], dtype);
    bool wants_grad =
        std::find(row.grad_inputs.begin(), row.grad_inputs.end(), static_cast<int>(i)) != row.grad_inputs.end();
    if (wants_grad) t.requires_grad_(true);
    in.push_back(t);
  }
  return in;
}

Tensor call(const OpRow& row, const std::vector<Tensor>& in) {
  if (row.random) manual_seed(20261130);  // random ops become deterministic functions
  return row.fn(in);
}

// The projection R used to turn outputs into a scalar loss sum(out * R).
Tensor projection(const Shape& shape, DType dtype) { return recast(sample_randn(shape, 4242), dtype); }

std::vector<Tensor> differentiable(const OpRow& row, const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  for (int i : row.grad_inputs) out.push_back(in[i]);
  return out;
}

// Gradients of sum(fn(in) * R) w.r.t. the row's grad inputs (zeros where unused).
std::vector<Tensor> projected_grads(const OpRow& row, const std::vector<Tensor>& in, const Tensor& out) {
  std::vector<Tensor> wrt = differentiable(row, in);
  if (wrt.empty() || !out.requires_grad()) {
    std::vector<Tensor> z;
    for (const Tensor& t : wrt) z.push_back(zeros(t.shape(), {.dtype = t.dtype()}));
    return z;
  }
  Tensor loss = sum(mul(out, projection(out.shape(), out.dtype())));
  std::vector<Tensor> g = grad({loss}, wrt, {}, false, true);
  for (size_t i = 0; i < g.size(); ++i)
    if (!g[i].defined()) g[i] = zeros(wrt[i].shape(), {.dtype = wrt[i].dtype()});
  return g;
}

std::string isa_suffix() { return std::string(" on ") + isa_name(active_isa()); }

// Runs body once per instruction-set path, restoring the best path after.
template <typename F>
void for_each_isa(F&& body) {
  std::vector<Isa> isas = available_isas();
  for (Isa isa : isas) {
    set_isa(isa);
    body();
  }
  set_isa(isas.back());
}

TEST(OpTable, EveryOpHasARow) {
  std::set<Op> covered;
  for (const OpRow& row : rows()) covered.insert(row.op);
  for (int i = 0; i < kNumOps; ++i) {
    Op op = static_cast<Op>(i);
    if (op_kind(op) == OpKind::BACKWARD) continue;
    EXPECT_TRUE(covered.count(op)) << "op '" << op_name(op) << "' has no row in the op test table";
  }
}

TEST(OpTable, GradcheckFloat64) {
  for_each_isa([] {
    for (const OpRow& row : rows()) {
      if (row.grad_inputs.empty()) continue;
      for (const OpSample& s : row.samples()) {
        std::vector<Tensor> in = prepare(row, s, DType::Float64);
        Tensor out;
        try {
          out = call(row, in);
        } catch (const std::exception& e) {
          ADD_FAILURE() << case_name(row, s) << isa_suffix() << " threw: " << e.what();
          continue;
        }
        if (!is_floating(out.dtype())) continue;
        std::vector<Tensor> analytic = projected_grads(row, in, out);
        Tensor r = projection(out.shape(), DType::Float64);
        auto loss_at = [&]() {
          NoGradGuard no_grad;
          return sum(mul(call(row, in), r)).item<double>();
        };
        const double eps = 1e-6;
        for (size_t k = 0; k < row.grad_inputs.size(); ++k) {
          Tensor x = in[row.grad_inputs[k]];
          int64_t n = x.numel();
          // Up to 48 elements, evenly spread, each by central differences.
          int64_t step = std::max<int64_t>(1, n / 48);
          std::vector<double> num, ana;
          std::vector<double> a_all = analytic[k].to_vector();
          Shape cs = contiguous_strides(x.shape());
          for (int64_t e = 0; e < n; e += step) {
            int64_t off = x.storage_offset(), rem = e;
            for (int64_t d = 0; d < x.dim(); ++d) {
              off += (rem / cs[d]) * x.strides()[d];
              rem %= cs[d];
            }
            double* p = static_cast<double*>(x.storage()->data()) + off;
            double orig = *p;
            *p = orig + eps;
            double lp = loss_at();
            *p = orig - eps;
            double lm = loss_at();
            *p = orig;
            num.push_back((lp - lm) / (2 * eps));
            ana.push_back(a_all[e]);
          }
          double err = relative_error(tensor<double>(ana), tensor<double>(num));
          EXPECT_LE(err, 1e-5) << case_name(row, s) << isa_suffix() << ": gradient of input " << row.grad_inputs[k]
                               << " differs from finite differences";
        }
      }
    }
  });
}

TEST(OpTable, Float32MatchesFloat64) {
  for_each_isa([] {
    for (const OpRow& row : rows()) {
      for (const OpSample& s : row.samples()) {
        try {
          std::vector<Tensor> in64 = prepare(row, s, DType::Float64);
          std::vector<Tensor> in32 = prepare(row, s, DType::Float32);
          Tensor out64 = call(row, in64), out32 = call(row, in32);
          EXPECT_EQ(out32.shape(), out64.shape()) << case_name(row, s);
          if (row.random && !is_floating(out32.dtype())) continue;
          EXPECT_LE(relative_error(out32, out64), row.tol) << case_name(row, s) << isa_suffix() << ": forward";
          {
            // Where autograd does not record, fused ops take their one kernel (conv2d_epilogue,
            // inverted_residual, ...): that forward too.
            NoGradGuard no_grad;
            EXPECT_LE(relative_error(call(row, in32), out64), row.tol)
                << case_name(row, s) << isa_suffix() << ": forward without autograd";
          }
          if (!is_floating(out32.dtype())) continue;
          auto g64 = projected_grads(row, in64, out64), g32 = projected_grads(row, in32, out32);
          for (size_t k = 0; k < g64.size(); ++k)
            EXPECT_LE(relative_error(g32[k], g64[k]), row.tol)
                << case_name(row, s) << isa_suffix() << ": gradient of input " << row.grad_inputs[k];
        } catch (const std::exception& e) {
          ADD_FAILURE() << case_name(row, s) << isa_suffix() << " threw: " << e.what();
        }
      }
    }
  });
}

// float16 and bfloat16 are storage types computed in float32: every row's forward on half
// inputs must match the float32 forward on the same (rounded) values to within a few units of
// the storage type's rounding (composed ops round their intermediates too; the largest seen are
// 9.4e-4 for float16 and 1.4e-2 for bfloat16, in losses that sum many rounded terms).
TEST(OpTable, HalfTypesMatchFloat32) {
  for (auto [dtype, tol] : {std::pair{DType::Float16, 4e-3}, std::pair{DType::BFloat16, 3e-2}}) {
    for (const OpRow& row : rows()) {
      if (row.random) continue;
      for (const OpSample& s : row.samples()) {
        try {
          std::vector<Tensor> half = prepare(row, s, dtype), rounded;
          for (const Tensor& t : half) rounded.push_back(recast(t, DType::Float32));
          Tensor out = call(row, half), ref = call(row, rounded);
          bool float_input = false;
          for (const Tensor& t : s.inputs) float_input |= is_floating(t.dtype());
          if (float_input && ref.dtype() == DType::Float32) {
            EXPECT_EQ(out.dtype(), dtype) << case_name(row, s) << ": the result leaves the storage type";
          }
          EXPECT_LE(relative_error(out, ref), tol) << case_name(row, s) << " in " << dtype_name(dtype);
        } catch (const std::exception& e) {
          ADD_FAILURE() << case_name(row, s) << " in " << dtype_name(dtype) << " threw: " << e.what();
        }
      }
    }
  }
}

// ---------------------------------------------------------------- PyTorch

nlohmann::json tensor_json(const Tensor& t) {
  nlohmann::json j;
  j["dtype"] = dtype_name(t.dtype());
  j["shape"] = t.shape();
  j["data"] = t.to_vector();
  j["channels_last"] = t.dim() == 4 && t.suggest_memory_format() == MemoryFormat::ChannelsLast;
  return j;
}

struct TorchCase {
  const OpRow* row;
  OpSample sample;
  std::vector<Tensor> in32;
  Tensor out32;
  std::vector<Tensor> grads32;
};

// Evaluates all cases with PyTorch in one Python run (cached by the hash of the manifest and
// the oracle script, so an edited script is rerun).
nlohmann::json run_oracle(const nlohmann::json& manifest) {
  std::string text = manifest.dump();
  std::ifstream script(TVC_SOURCE_ROOT "/tools/torch_oracle.py");
  std::string hashed = text + std::string(std::istreambuf_iterator<char>(script), {});
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : hashed) h = (h ^ c) * 1099511628211ull;
  const char* env = std::getenv("TVC_GOLDEN_CACHE");
  std::filesystem::path dir = env && *env ? env : TVC_DEFAULT_GOLDEN_CACHE;
  std::filesystem::create_directories(dir);
  char name[48];
  std::snprintf(name, sizeof name, "optable-%016llx", static_cast<unsigned long long>(h));
  std::filesystem::path in = dir / (std::string(name) + ".in.json"), out = dir / (std::string(name) + ".out.json");
  if (!std::filesystem::exists(out)) {
    std::ofstream(in) << text;
    std::string cmd = std::string("/usr/bin/python3 ") + TVC_SOURCE_ROOT + "/tools/torch_oracle.py " + in.string() +
                      " " + out.string();
    int rc = std::system(cmd.c_str());
    if (rc != 0) {
      ADD_FAILURE() << "tools/torch_oracle.py failed (needs python3-torch): " << cmd;
      return {};
    }
  }
  std::ifstream f(out);
  return nlohmann::json::parse(f);
}

TEST(OpTable, Float32MatchesPyTorch) {
  std::vector<TorchCase> cases;
  nlohmann::json manifest;
  manifest["cases"] = nlohmann::json::array();
  for (const OpRow& row : rows()) {
    if (row.torch.empty()) continue;
    for (const OpSample& s : row.samples()) {
      TorchCase c{&row, s, prepare(row, s, DType::Float32), Tensor(), {}};
      nlohmann::json jc;
      jc["expr"] = row.torch;
      jc["name"] = case_name(row, s);
      jc["random"] = row.random;
      for (size_t i = 0; i < c.in32.size(); ++i) {
        nlohmann::json ji = tensor_json(c.in32[i]);
        ji["grad"] = c.in32[i].requires_grad();
        jc["inputs"].push_back(ji);
      }
      if (jc["inputs"].is_null()) jc["inputs"] = nlohmann::json::array();
      try {
        c.out32 = call(row, c.in32);
      } catch (const std::exception& e) {
        ADD_FAILURE() << case_name(row, s) << " threw: " << e.what();
        continue;
      }
      bool grads = !row.random && is_floating(c.out32.dtype()) && !row.grad_inputs.empty();
      jc["proj"] = grads ? tensor_json(projection(c.out32.shape(), DType::Float32)) : nlohmann::json();
      manifest["cases"].push_back(jc);
      cases.push_back(std::move(c));
    }
  }
  nlohmann::json results = run_oracle(manifest);
  ASSERT_TRUE(results.contains("results")) << "no PyTorch results";
  ASSERT_EQ(results["results"].size(), cases.size());
  for_each_isa([&] {
    for (size_t i = 0; i < cases.size(); ++i) {
      TorchCase& c = cases[i];
      const nlohmann::json& r = results["results"][i];
      std::string name = case_name(*c.row, c.sample) + isa_suffix();
      if (r.contains("error")) {
        ADD_FAILURE() << name << ": PyTorch raised " << r["error"].get<std::string>();
        continue;
      }
      std::vector<Tensor> in = prepare(*c.row, c.sample, DType::Float32);
      Tensor out = call(*c.row, in);
      Tensor ref = tensor_from_json(r["out"]);
      EXPECT_EQ(out.shape(), ref.shape()) << name << ": output shape";
      if (c.row->random) continue;  // different generators: shapes only
      EXPECT_LE(relative_error(out, ref), c.row->tol) << name << ": forward vs PyTorch";
      if (r["grads"].is_null()) continue;
      std::vector<Tensor> g = projected_grads(*c.row, in, out);
      for (size_t k = 0; k < g.size(); ++k) {
        const nlohmann::json& jg = r["grads"][c.row->grad_inputs[k]];
        Tensor gref = jg.is_null() ? zeros(g[k].shape(), {.dtype = DType::Float64}) : tensor_from_json(jg);
        EXPECT_LE(relative_error(g[k], gref), c.row->tol)
            << name << ": gradient of input " << c.row->grad_inputs[k] << " vs PyTorch";
      }
    }
  });
}

}  // namespace
}  // namespace tvc::test
