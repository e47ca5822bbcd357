// The op test table: one row per op of tvc/internal/op_list.h (KERNEL and COMPOSED kinds).
//
// For every row, every sample and every CPU instruction-set path, tests/test_op_table.cpp:
//  - runs a float64 finite-difference gradcheck of the differentiable inputs;
//  - runs the op in float32 and compares forward and backward with our own float64 result, and
//    the forward once more where autograd does not record (fused ops' one kernel);
//  - runs the op on float16 and bfloat16 inputs against float32 on the same rounded values;
//  - compares float32 forward and backward with PyTorch (the row's `torch` expression, evaluated
//    by tools/torch_oracle.py on the same inputs), err <= row.tol.
// err is tests/compare.h's relative_error: ||a - b||2 / ||b||2 per tensor.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tvc/internal/op_list.h"
#include "tvc/ops.h"

namespace tvc::test {

// One set of inputs for a row. Inputs are float64 (or integer for indices); the harness makes
// float32 copies with the same strides/layout. Non-floating inputs are passed unchanged.
struct OpSample {
  std::string label;  // "broadcast", "non-contiguous", "channels-last", "empty", ...
  std::vector<Tensor> inputs;
};

struct OpRow {
  Op op;
  std::function<std::vector<OpSample>()> samples;
  // The op under test; returns one tensor (pick one output of multi-output ops).
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  // PyTorch expression over inputs named a, b, c, ..., j (in order), e.g. "torch.add(a, b)".
  // Empty: the op has no PyTorch counterpart worth comparing (say why in `note`).
  std::string torch;
  // Indices of inputs to differentiate (floating inputs only). Empty: no gradient checks.
  std::vector<int> grad_inputs;
  double tol = 1e-5;  // float32 vs PyTorch and vs our float64, per tensor
  std::string note{};
  bool random = false;  // output depends on the generator: compare shapes/statistics only
};

// A row with the default tolerance, no note, not random.
OpRow make_row(Op op, std::function<std::vector<OpSample>()> samples,
               std::function<Tensor(const std::vector<Tensor>&)> fn, std::string torch, std::vector<int> grad_inputs);

// Rows, one function per op family (tests/op_rows_*.cpp).
std::vector<OpRow> elementwise_rows();
std::vector<OpRow> reduction_rows();
std::vector<OpRow> nn_rows();     // conv, pool, norm, softmax, dropout, linear algebra
std::vector<OpRow> shape_rows();  // views, cat/stack/split/chunk, indexing, pad, roll, interpolate
std::vector<OpRow> loss_rows();
std::vector<OpRow> creation_rows();

// ---- sample builders (deterministic: seeded from the label) ----
// Random normal float64 tensor of shape.
Tensor sample_randn(const Shape& shape, uint64_t seed);
// Random float64 tensor with values in [lo, hi).
Tensor sample_uniform(const Shape& shape, double lo, double hi, uint64_t seed);
// A seed derived from a sample's label and an index (FNV-1a of the label plus i).
uint64_t seed_of(const std::string& label, size_t i);
// t copied into channels-last (NHWC) strides.
Tensor channels_last(const Tensor& t);
// Non-contiguous view of shape (a transposed copy, transposed back).
Tensor non_contiguous(const Tensor& t);
// Standard shapes for one input: odd 1-d sizes 1..17, 2-d, 3-d, non-contiguous, size-1,
// empty, channels-last 4-d. make(shape, seed) creates a value (e.g. sample_randn or a positive
// one for log).
std::vector<OpSample> unary_samples(std::function<Tensor(const Shape&, uint64_t)> make = nullptr);
// Standard pairs for binary ops: same shape, broadcast both ways, scalar (0-d), non-contiguous,
// size-1, empty, channels-last, odd sizes.
std::vector<OpSample> binary_samples(std::function<Tensor(const Shape&, uint64_t)> make_a = nullptr,
                                     std::function<Tensor(const Shape&, uint64_t)> make_b = nullptr);

}  // namespace tvc::test
