// Sample builders for the op test table.
#include "op_table.h"

#include "tvc/autograd.h"

namespace tvc::test {

OpRow make_row(Op op, std::function<std::vector<OpSample>()> samples,
               std::function<Tensor(const std::vector<Tensor>&)> fn, std::string torch, std::vector<int> grad_inputs) {
  return OpRow{op, std::move(samples), std::move(fn), std::move(torch), std::move(grad_inputs)};
}

Tensor sample_randn(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, {.dtype = DType::Float64}, &gen);
}

Tensor sample_uniform(const Shape& shape, double lo, double hi, uint64_t seed) {
  Generator gen(seed);
  return add(mul(rand(shape, {.dtype = DType::Float64}, &gen), scalar_like(hi - lo, DType::Float64)),
             scalar_like(lo, DType::Float64));
}

Tensor non_contiguous(const Tensor& t) {
  if (t.dim() < 2) {
    // Every other element of a twice-as-long tensor.
    Shape doubled = t.shape();
    if (doubled.empty()) return t;
    doubled[0] *= 2;
    Tensor big = zeros(doubled, {.dtype = t.dtype()});
    Tensor view = big.slice(0, 0, doubled[0], 2);
    view.copy_(t);
    return view;
  }
  // Transposed storage of the last two dims, viewed back.
  Tensor tt = t.transpose(-1, -2).contiguous();
  return tt.transpose(-1, -2);
}

uint64_t seed_of(const std::string& label, size_t i) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : label) h = (h ^ c) * 1099511628211ull;
  return h + i;
}

Tensor channels_last(const Tensor& t) { return t.contiguous(MemoryFormat::ChannelsLast); }

std::vector<OpSample> unary_samples(std::function<Tensor(const Shape&, uint64_t)> make) {
  if (!make) make = sample_randn;
  std::vector<OpSample> out;
  for (int64_t n = 1; n <= 17; ++n) out.push_back({"1-d size " + std::to_string(n), {make({n}, seed_of("1d", n))}});
  out.push_back({"2-d", {make({3, 5}, seed_of("2d", 0))}});
  out.push_back({"3-d", {make({2, 3, 4}, seed_of("3d", 0))}});
  out.push_back({"0-d", {make({}, seed_of("0d", 0))}});
  out.push_back({"non-contiguous", {non_contiguous(make({5, 3}, seed_of("nc", 0)))}});
  out.push_back({"size-1", {make({1, 1, 3}, seed_of("s1", 0))}});
  out.push_back({"empty", {make({0, 3}, seed_of("empty", 0))}});
  out.push_back({"channels-last", {channels_last(make({2, 3, 2, 3}, seed_of("cl", 0)))}});
  return out;
}

std::vector<OpSample> binary_samples(std::function<Tensor(const Shape&, uint64_t)> make_a,
                                     std::function<Tensor(const Shape&, uint64_t)> make_b) {
  if (!make_a) make_a = sample_randn;
  if (!make_b) make_b = make_a;
  std::vector<OpSample> out;
  auto pair = [&](const std::string& label, const Shape& sa, const Shape& sb) {
    out.push_back({label, {make_a(sa, seed_of(label, 1)), make_b(sb, seed_of(label, 2))}});
  };
  for (int64_t n = 1; n <= 17; ++n) pair("1-d size " + std::to_string(n), {n}, {n});
  pair("same shape", {3, 5}, {3, 5});
  pair("broadcast both", {3, 1}, {1, 4});
  pair("broadcast trailing", {2, 3, 4}, {4});
  pair("broadcast leading", {4}, {2, 3, 4});
  pair("scalar", {3, 4}, {});
  pair("size-1", {1, 1}, {1, 1});
  pair("empty", {0, 3}, {3});
  out.push_back({"non-contiguous",
                 {non_contiguous(make_a({4, 3}, seed_of("nc", 1))), non_contiguous(make_b({4, 3}, seed_of("nc", 2)))}});
  out.push_back(
      {"channels-last",
       {channels_last(make_a({2, 3, 2, 3}, seed_of("cl", 1))), channels_last(make_b({2, 3, 2, 3}, seed_of("cl", 2)))}});
  out.push_back({"channels-last and contiguous",
                 {channels_last(make_a({2, 3, 2, 3}, seed_of("clc", 1))), make_b({2, 3, 2, 3}, seed_of("clc", 2))}});
  return out;
}

}  // namespace tvc::test
