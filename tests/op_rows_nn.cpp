// Op table rows: convolution, pooling, normalisation, softmax, dropout and linear algebra.
// Op parameters are fixed per row (one row per parameter set), in both the lambda and the
// PyTorch expression. Shapes are odd where possible so windows and padding meet edges.
#include "op_table.h"

namespace tvc::test {
namespace {

using In = const std::vector<Tensor>&;

Tensor positive(const Shape& s, uint64_t seed) { return sample_uniform(s, 0.5, 2.5, seed); }

// Random normal inputs of the given shapes.
OpSample randn_sample(const std::string& label, const std::vector<Shape>& shapes) {
  OpSample s{label, {}};
  for (size_t i = 0; i < shapes.size(); ++i)
    s.inputs.push_back(shape_numel(shapes[i]) == 0 ? empty(shapes[i], {.dtype = DType::Float64})
                                                   : sample_randn(shapes[i], seed_of(label, i)));
  return s;
}

// The cases given, plus channels-last and non-contiguous variants of the first case's input 0
// (which must be 4-d for the channels-last one).
std::vector<OpSample> with_layouts(std::vector<OpSample> cases) {
  OpSample cl = cases.front(), nc = cases.front();
  cl.label = "channels-last " + cl.label;
  cl.inputs[0] = channels_last(cl.inputs[0]);
  nc.label = "non-contiguous " + nc.label;
  nc.inputs[0] = non_contiguous(nc.inputs[0]);
  cases.push_back(cl);
  cases.push_back(nc);
  return cases;
}

// ---------------------------------------------------------------- convolution

OpRow conv2d_row(std::array<int64_t, 2> stride, std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation,
                 int64_t groups, bool bias, std::string torch_args, std::vector<OpSample> samples) {
  return make_row(
      Op::conv2d, [samples] { return with_layouts(samples); },
      [=](In x) { return conv2d(x[0], x[1], bias ? x[2] : Tensor(), stride, padding, dilation, groups); },
      std::string("F.conv2d(a, b") + (bias ? ", c" : "") + torch_args + ")",
      bias ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 1});
}

std::vector<OpRow> conv_rows() {
  std::vector<OpRow> rows;
  rows.push_back(conv2d_row({1, 1}, {0, 0}, {1, 1}, 1, true, "",
                            {randn_sample("odd sizes", {{2, 3, 7, 5}, {4, 3, 3, 3}, {4}}),
                             randn_sample("batch 1", {{1, 2, 5, 6}, {3, 2, 2, 3}, {3}}),
                             randn_sample("pointwise", {{2, 5, 3, 4}, {3, 5, 1, 1}, {3}}),
                             randn_sample("size-1", {{1, 1, 1, 1}, {2, 1, 1, 1}, {2}}),
                             randn_sample("kernel = input", {{2, 2, 3, 3}, {3, 2, 3, 3}, {3}}),
                             randn_sample("unbatched", {{3, 6, 5}, {2, 3, 3, 2}, {2}}),
                             // several GEMMs of several samples each, and weight-gradient
                             // chunks of several GEMMs (kernels/cpu/conv.cpp)
                             randn_sample("many samples", {{20, 2, 6, 6}, {3, 2, 3, 3}, {3}})}));
  rows.push_back(conv2d_row({2, 2}, {1, 1}, {1, 1}, 1, true, ", stride=2, padding=1",
                            {randn_sample("odd sizes", {{2, 3, 7, 9}, {4, 3, 3, 3}, {4}}),
                             randn_sample("pointwise", {{2, 3, 5, 5}, {2, 3, 1, 1}, {2}}),
                             randn_sample("batch 1", {{1, 1, 8, 8}, {5, 1, 3, 3}, {5}}),
                             // output rows of 7 and K >= 128: the input read in place as 7-row
                             // tiles where the CPU has them (position rows)
                             randn_sample("position rows", {{2, 16, 14, 14}, {16, 16, 3, 3}, {16}})}));
  rows.push_back(conv2d_row(
      {1, 2}, {1, 2}, {2, 1}, 1, false, ", stride=(1, 2), padding=(1, 2), dilation=(2, 1)",
      {randn_sample("odd sizes", {{2, 3, 7, 6}, {2, 3, 3, 2}}), randn_sample("batch 1", {{1, 2, 5, 5}, {3, 2, 2, 3}}),
       // 7x7 outputs, K = 132: position rows through offsets, dilated
       randn_sample("position rows", {{1, 22, 9, 10}, {16, 22, 3, 2}})}));
  rows.push_back(conv2d_row({1, 1}, {1, 1}, {1, 1}, 2, true, ", padding=1, groups=2",
                            {randn_sample("odd sizes", {{2, 4, 5, 7}, {6, 2, 3, 3}, {6}}),
                             randn_sample("pointwise", {{1, 4, 3, 3}, {4, 2, 1, 1}, {4}})}));
  // Depthwise: groups == C, with channel multiplier 2 and 1.
  rows.push_back(conv2d_row({2, 2}, {1, 1}, {1, 1}, 3, true, ", stride=2, padding=1, groups=3",
                            {randn_sample("multiplier 2", {{2, 3, 7, 6}, {6, 1, 3, 3}, {6}}),
                             randn_sample("multiplier 1", {{1, 3, 5, 5}, {3, 1, 3, 3}, {3}}),
                             // 20 output columns at stride 2: long rows in the float32 kernel
                             randn_sample("wide", {{1, 3, 7, 40}, {6, 1, 3, 3}, {6}}),
                             randn_sample("unbatched", {{3, 4, 4}, {3, 1, 2, 2}, {3}})}));
  // 3 input channels to a multiple of 8: the few-channel rows (a network's stem), stride 2.
  rows.push_back(conv2d_row({2, 2}, {1, 1}, {1, 1}, 1, true, ", stride=2, padding=1",
                            {randn_sample("stem", {{2, 3, 9, 11}, {8, 3, 3, 3}, {8}}),
                             randn_sample("stem wide", {{1, 3, 7, 37}, {16, 3, 3, 3}, {16}})}));
  rows.push_back(conv2d_row({1, 1}, {2, 1}, {2, 2}, 3, false, ", padding=(2, 1), dilation=2, groups=3",
                            {randn_sample("depthwise dilated", {{2, 3, 6, 7}, {3, 1, 3, 3}})}));
  // Depthwise in float32 blocks of 16 channels (small maps, 5x5 windows, stride 2 and 3), a
  // partial last block; at least 16 blocks (two per thread up to 8 threads) where the flat rows
  // could take them.
  rows.push_back(conv2d_row({1, 1}, {2, 2}, {1, 1}, 18, true, ", padding=2, groups=18",
                            {randn_sample("channel blocks", {{8, 18, 7, 6}, {18, 1, 5, 5}, {18}})}));
  rows.push_back(conv2d_row({2, 2}, {1, 1}, {1, 1}, 17, true, ", stride=2, padding=1, groups=17",
                            {randn_sample("channel blocks", {{8, 17, 9, 8}, {17, 1, 3, 3}, {17}}),
                             // input rows of a tile and more: transposed row by row
                             randn_sample("channel blocks wide rows", {{8, 17, 9, 20}, {17, 1, 3, 3}, {17}})}));
  rows.push_back(conv2d_row({3, 3}, {1, 1}, {1, 1}, 16, false, ", stride=3, padding=1, groups=16",
                            {randn_sample("channel blocks", {{1, 16, 8, 7}, {32, 1, 3, 3}})}));

  // conv2d_epilogue, inputs (x, weight, scale, shift[, residual]): the fused kernel where autograd
  // does not record (the gradcheck's finite differences), the separate ops where it does.
  auto epilogue_row = [](EpilogueActivation act, std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                         int64_t groups, bool residual, const std::string& torch_conv_args,
                         const std::string& torch_act, std::vector<OpSample> samples) {
    std::string expr = "F.conv2d(a, b" + torch_conv_args + ") * c.view(1, -1, 1, 1) + d.view(1, -1, 1, 1)";
    if (residual) expr += " + e";
    if (!torch_act.empty()) expr = torch_act + "(" + expr + ")";
    std::vector<int> grads{0, 1, 2, 3};
    if (residual) grads.push_back(4);
    return make_row(
        Op::conv2d_epilogue, [samples] { return with_layouts(samples); },
        [=](In x) {
          return conv2d_epilogue(x[0], x[1], x[2], x[3], residual ? x[4] : Tensor(), act, stride, padding, {1, 1},
                                 groups);
        },
        expr, grads);
  };
  rows.push_back(
      epilogue_row(EpilogueActivation::ReLU, {1, 1}, {1, 1}, 1, true, ", padding=1", "F.relu",
                   {randn_sample("3x3", {{2, 3, 7, 5}, {4, 3, 3, 3}, {4}, {4}, {2, 4, 7, 5}}),
                    // 3 channels in, 8 out: the few-channel rows, with a residual
                    randn_sample("few channels", {{2, 3, 7, 19}, {8, 3, 3, 3}, {8}, {8}, {2, 8, 7, 19}}),
                    randn_sample("padded pointwise", {{1, 5, 4, 4}, {3, 5, 1, 1}, {3}, {3}, {1, 3, 6, 6}})}));
  rows.push_back(epilogue_row(EpilogueActivation::ReLU6, {1, 1}, {1, 1}, 1, true, ", padding=1", "F.relu6",
                              // several samples per GEMM (small maps)
                              {randn_sample("many samples", {{20, 2, 6, 6}, {3, 2, 3, 3}, {3}, {3}, {20, 3, 6, 6}})}));
  rows.push_back(epilogue_row(EpilogueActivation::SiLU, {2, 2}, {1, 1}, 3, false, ", stride=2, padding=1, groups=3",
                              "F.silu",
                              {randn_sample("depthwise", {{2, 3, 7, 6}, {3, 1, 3, 3}, {3}, {3}}),
                               randn_sample("multiplier 2", {{1, 3, 5, 5}, {6, 1, 3, 3}, {6}, {6}})}));
  rows.push_back(epilogue_row(EpilogueActivation::Hardswish, {1, 1}, {0, 0}, 1, false, "", "F.hardswish",
                              {randn_sample("pointwise", {{2, 6, 3, 5}, {4, 6, 1, 1}, {4}, {4}})}));
  rows.push_back(epilogue_row(EpilogueActivation::None, {1, 1}, {1, 1}, 2, true, ", padding=1, groups=2", "",
                              {randn_sample("grouped", {{2, 4, 5, 7}, {6, 2, 3, 3}, {6}, {6}, {2, 6, 5, 7}})}));

  // inverted_residual, inputs (x, then weight, scale and shift of expand, depthwise and project):
  // the one kernel where autograd does not record (small maps: layer by layer, or one band; the
  // bands are NnOps.InvertedResidualGivesTheBitsOfItsConvolutions'), conv2d_epilogue's where it
  // does and for other layouts.
  auto inverted_residual_row = [](int64_t stride, bool add_input, std::vector<OpSample> samples) {
    const int64_t E = samples.front().inputs[4].shape()[0];
    auto affine = [](const std::string& conv, const std::string& scale, const std::string& shift) {
      return conv + " * " + scale + ".view(1, -1, 1, 1) + " + shift + ".view(1, -1, 1, 1)";
    };
    std::string expr =
        "F.hardswish(" +
        affine("F.conv2d(F.relu6(" + affine("F.conv2d(a, b)", "c", "d") + "), e, stride=" + std::to_string(stride) +
                   ", padding=1, groups=" + std::to_string(E) + ")",
               "f", "g") +
        ")";
    expr = affine("F.conv2d(" + expr + ", h)", "i", "j") + (add_input ? " + a" : "");
    return make_row(
        Op::inverted_residual, [samples] { return with_layouts(samples); },
        [=](In x) {
          return inverted_residual(x[0], {x[1], x[2], x[3], EpilogueActivation::ReLU6},
                                   {x[4], x[5], x[6], EpilogueActivation::Hardswish}, {stride, stride}, {1, 1},
                                   {x[7], x[8], x[9], EpilogueActivation::None}, add_input);
        },
        expr, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  };
  rows.push_back(inverted_residual_row(
      1, true,
      {randn_sample("input added",
                    {{2, 4, 9, 7}, {12, 4, 1, 1}, {12}, {12}, {12, 1, 3, 3}, {12}, {12}, {4, 12, 1, 1}, {4}, {4}})}));
  rows.push_back(inverted_residual_row(
      2, false,
      {randn_sample("stride 2",
                    {{1, 3, 10, 11}, {8, 3, 1, 1}, {8}, {8}, {8, 1, 3, 3}, {8}, {8}, {5, 8, 1, 1}, {5}, {5}})}));

  // conv2d_epilogue_max_pool2d, inputs (x, weight, scale, shift): the one kernel where autograd
  // does not record (few channels: the convolution's rows pooled as they are made; more: the
  // convolution's own path, then the pooled rows), conv2d_epilogue and max_pool2d where it does and
  // for other layouts (the bits of both ways are NnOps.ConvMaxPoolGivesTheBitsOfItsTwoOps').
  rows.push_back(make_row(
      Op::conv2d_epilogue_max_pool2d,
      [] {
        return with_layouts({randn_sample("few channels", {{2, 3, 13, 11}, {8, 3, 7, 7}, {8}, {8}}),
                             randn_sample("more channels", {{1, 6, 9, 10}, {4, 6, 7, 7}, {4}, {4}})});
      },
      [](In x) {
        return conv2d_epilogue_max_pool2d(x[0], {x[1], x[2], x[3], EpilogueActivation::ReLU}, {2, 2}, {3, 3}, {1, 1}, 1,
                                          {3, 3}, std::array<int64_t, 2>{2, 2}, {1, 1});
      },
      "F.max_pool2d(F.relu(F.conv2d(a, b, stride=2, padding=3) * c.view(1, -1, 1, 1) + d.view(1, -1, 1, 1)), 3, 2, 1)",
      {0, 1, 2, 3}));

  auto conv1d_samples = [](std::vector<OpSample> cases) {
    OpSample nc = cases.front();
    nc.label = "non-contiguous " + nc.label;
    nc.inputs[0] = non_contiguous(nc.inputs[0]);
    cases.push_back(nc);
    return cases;
  };
  std::vector<OpSample> c1 = conv1d_samples({randn_sample("odd sizes", {{2, 3, 9}, {4, 3, 3}, {4}}),
                                             randn_sample("size-1", {{1, 1, 1}, {2, 1, 1}, {2}}),
                                             randn_sample("unbatched", {{3, 7}, {2, 3, 2}, {2}})});
  rows.push_back(make_row(
      Op::conv1d, [c1] { return c1; }, [](In x) { return conv1d(x[0], x[1], x[2]); }, "F.conv1d(a, b, c)", {0, 1, 2}));
  std::vector<OpSample> c2 = conv1d_samples(
      {randn_sample("odd sizes", {{2, 4, 11}, {6, 2, 3}, {6}}), randn_sample("batch 1", {{1, 4, 6}, {2, 2, 2}, {2}})});
  rows.push_back(make_row(
      Op::conv1d, [c2] { return c2; }, [](In x) { return conv1d(x[0], x[1], x[2], 2, 1, 2, 2); },
      "F.conv1d(a, b, c, stride=2, padding=1, dilation=2, groups=2)", {0, 1, 2}));
  return rows;
}

// ---------------------------------------------------------------- pooling

// Pooling samples: odd sizes, batch 1, size-1 planes, unbatched, channels-last, non-contiguous.
std::vector<OpSample> pool_samples(const std::vector<Shape>& shapes) {
  std::vector<OpSample> cases;
  for (const Shape& s : shapes) {
    std::string label = s.size() == 3 ? "unbatched" : s[0] == 1 ? "batch 1" : "odd sizes";
    cases.push_back(randn_sample(label + " " + shape_str(s), {s}));
  }
  return with_layouts(cases);
}

OpRow pool_row(Op op, std::function<Tensor(const Tensor&)> f, std::string torch, std::vector<Shape> shapes) {
  return make_row(
      op, [shapes] { return pool_samples(shapes); }, [f](In x) { return f(x[0]); }, std::move(torch), {0});
}

std::vector<OpRow> pool_rows() {
  std::vector<OpRow> rows;
  rows.push_back(pool_row(Op::max_pool2d,
                          [](const Tensor& x) {
                            return max_pool2d(x, {3, 3}, std::array<int64_t, 2>{2, 2}, {1, 1});
                          },
                          "F.max_pool2d(a, 3, 2, 1)", {{2, 3, 7, 9}, {1, 2, 1, 1}, {3, 5, 4}}));
  rows.push_back(pool_row(Op::max_pool2d,
                          [](const Tensor& x) {
                            return max_pool2d(x, {2, 2});
                          },
                          "F.max_pool2d(a, 2)", {{2, 3, 6, 7}, {1, 1, 2, 2}}));
  rows.push_back(pool_row(Op::max_pool2d,
                          [](const Tensor& x) {
                            return max_pool2d(x, {3, 2}, std::array<int64_t, 2>{2, 2}, {1, 0}, {1, 2}, true);
                          },
                          "F.max_pool2d(a, (3, 2), (2, 2), (1, 0), dilation=(1, 2), ceil_mode=True)",
                          {{2, 3, 8, 9}, {1, 2, 4, 3}, {2, 6, 7}}));
  rows.push_back(pool_row(Op::avg_pool2d,
                          [](const Tensor& x) {
                            return avg_pool2d(x, {3, 3}, std::array<int64_t, 2>{2, 2}, {1, 1});
                          },
                          "F.avg_pool2d(a, 3, 2, 1)", {{2, 3, 7, 9}, {1, 2, 1, 1}, {3, 5, 4}}));
  rows.push_back(pool_row(Op::avg_pool2d,
                          [](const Tensor& x) {
                            return avg_pool2d(x, {3, 2}, std::array<int64_t, 2>{2, 2}, {1, 1}, true, false);
                          },
                          "F.avg_pool2d(a, (3, 2), 2, 1, ceil_mode=True, count_include_pad=False)",
                          {{2, 3, 8, 9}, {1, 2, 4, 3}, {2, 6, 7}}));
  rows.push_back(pool_row(Op::avg_pool2d,
                          [](const Tensor& x) {
                            return avg_pool2d(x, {2, 2}, std::array<int64_t, 2>{3, 3}, {1, 1}, true, true, 3);
                          },
                          "F.avg_pool2d(a, 2, 3, 1, ceil_mode=True, divisor_override=3)",
                          {{2, 3, 8, 9}, {1, 2, 5, 3}}));
  rows.push_back(pool_row(Op::adaptive_avg_pool2d,
                          [](const Tensor& x) {
                            return adaptive_avg_pool2d(x, {3, 4});
                          },
                          "F.adaptive_avg_pool2d(a, (3, 4))", {{2, 3, 7, 9}, {1, 2, 2, 3}, {3, 5, 5}}));
  rows.push_back(pool_row(Op::adaptive_avg_pool2d,
                          [](const Tensor& x) {
                            return adaptive_avg_pool2d(x, {1, 1});
                          },
                          "F.adaptive_avg_pool2d(a, 1)", {{2, 3, 5, 4}, {1, 1, 1, 1}}));
  rows.push_back(pool_row(Op::adaptive_max_pool2d,
                          [](const Tensor& x) {
                            return adaptive_max_pool2d(x, {3, 4});
                          },
                          "F.adaptive_max_pool2d(a, (3, 4))", {{2, 3, 7, 9}, {1, 2, 5, 6}, {3, 5, 5}}));
  return rows;
}

// ---------------------------------------------------------------- normalisation

std::vector<OpRow> norm_rows() {
  std::vector<OpRow> rows;
  // Training mode without running statistics (those are tested in test_nn_ops.cpp).
  auto bn_samples = [] {
    std::vector<OpSample> c = with_layouts(
        {randn_sample("4-d", {{2, 3, 4, 5}, {3}, {3}}), randn_sample("2-d", {{4, 3}, {3}, {3}}),
         randn_sample("3-d", {{2, 3, 5}, {3}, {3}}), randn_sample("size-1 spatial", {{3, 2, 1, 1}, {2}, {2}})});
    return c;
  };
  // Training: the statistics kernel, channel_affine and the fused backward kernel.
  rows.push_back(make_row(Op::batch_norm_stats, bn_samples,
                          [](In x) { return batch_norm(x[0], Tensor(), Tensor(), x[1], x[2], true); },
                          "F.batch_norm(a, None, None, b, c, training=True)", {0, 1, 2}));
  // Evaluation mode with running statistics (positive variance), no bias.
  auto bn_eval_samples = [bn_samples] {
    std::vector<OpSample> out;
    for (const OpSample& s : bn_samples()) {
      int64_t C = s.inputs[0].shape()[1];
      out.push_back(
          {s.label,
           {s.inputs[0], sample_randn({C}, seed_of(s.label, 7)), positive({C}, seed_of(s.label, 8)), s.inputs[1]}});
    }
    return out;
  };
  rows.push_back(make_row(Op::batch_norm, bn_eval_samples,
                          [](In x) { return batch_norm(x[0], x[1], x[2], x[3], Tensor(), false); },
                          "F.batch_norm(a, b, c, d, None, training=False)", {0, 3}));
  // The same with a bias: eval-mode batch norm runs as one channel_affine op (x - mean) * scale
  // + bias, whose gradients reach x, the weight (through the scale) and the bias.
  auto bn_eval_bias_samples = [bn_eval_samples] {
    std::vector<OpSample> out = bn_eval_samples();
    for (OpSample& s : out) s.inputs.push_back(sample_randn({s.inputs[0].shape()[1]}, seed_of(s.label, 9)));
    return out;
  };
  rows.push_back(make_row(Op::channel_affine, bn_eval_bias_samples,
                          [](In x) { return batch_norm(x[0], x[1], x[2], x[3], x[4], false); },
                          "F.batch_norm(a, b, c, d, e, training=False)", {0, 3, 4}));

  rows.push_back(make_row(
      Op::layer_norm,
      [] {
        // The last: rows with whole vectors and a tail on every ISA, over several blocks of the
        // backward's sums (64 rows).
        return with_layouts({randn_sample("4-d", {{2, 3, 4, 5}, {5}, {5}}), randn_sample("1-d", {{5}, {5}, {5}}),
                             randn_sample("3-d", {{3, 1, 5}, {5}, {5}}),
                             randn_sample("150 rows of 37", {{3, 50, 37}, {37}, {37}})});
      },
      [](In x) { return layer_norm(x[0], x[1].shape(), x[1], x[2]); }, "F.layer_norm(a, b.shape, b, c)", {0, 1, 2}));
  rows.push_back(make_row(
      Op::layer_norm,
      [] {
        return with_layouts(
            {randn_sample("4-d", {{2, 3, 4, 5}, {4, 5}, {4, 5}}), randn_sample("2-d", {{4, 5}, {4, 5}, {4, 5}})});
      },
      [](In x) {
        return layer_norm(x[0], {4, 5}, x[1], x[2], 1e-3);
      },
      "F.layer_norm(a, (4, 5), b, c, eps=1e-3)", {0, 1, 2}));
  rows.push_back(make_row(
      Op::group_norm,
      [] {
        return with_layouts({randn_sample("4-d", {{2, 4, 3, 5}, {4}, {4}}), randn_sample("3-d", {{3, 6, 5}, {6}, {6}}),
                             randn_sample("2-d", {{3, 8}, {8}, {8}}),
                             randn_sample("batch 1", {{1, 2, 3, 3}, {2}, {2}})});
      },
      [](In x) { return group_norm(x[0], 2, x[1], x[2]); }, "F.group_norm(a, 2, b, c)", {0, 1, 2}));
  return rows;
}

// ---------------------------------------------------------------- softmax, dropout, linear algebra

std::vector<OpRow> softmax_rows() {
  std::vector<OpRow> rows;
  rows.push_back(make_row(
      Op::softmax, [] { return unary_samples(); }, [](In x) { return softmax(x[0], -1); }, "torch.softmax(a, -1)",
      {0}));
  rows.push_back(make_row(
      Op::log_softmax, [] { return unary_samples(); }, [](In x) { return log_softmax(x[0], -1); },
      "torch.log_softmax(a, -1)", {0}));
  // Along dim 1 of 4-d inputs (the class dim of dense prediction), and shifted by 90, where
  // exp overflows float32 unless the max is subtracted first.
  auto dim1 = [] {
    OpSample big = randn_sample("large values", {{2, 5, 3}});
    big.inputs[0] = add(big.inputs[0], scalar_like(90, DType::Float64));
    return with_layouts({randn_sample("4-d", {{2, 5, 3, 4}}), randn_sample("size-1", {{1, 1, 1, 1}}), big});
  };
  rows.push_back(make_row(Op::softmax, dim1, [](In x) { return softmax(x[0], 1); }, "torch.softmax(a, 1)", {0}));
  rows.push_back(
      make_row(Op::log_softmax, dim1, [](In x) { return log_softmax(x[0], 1); }, "torch.log_softmax(a, 1)", {0}));
  OpRow drop = make_row(
      Op::dropout, [] { return unary_samples(); }, [](In x) { return dropout(x[0], 0.5, true); },
      "F.dropout(a, 0.5, True)", {0});
  drop.random = true;
  drop.note = "masks come from different generators: PyTorch is compared by shape only";
  rows.push_back(drop);
  return rows;
}

std::vector<OpRow> linalg_rows() {
  std::vector<OpRow> rows;
  rows.push_back(make_row(
      Op::bmm,
      [] {
        std::vector<OpSample> c{
            randn_sample("odd sizes", {{3, 7, 5}, {3, 5, 9}}), randn_sample("batch 1", {{1, 4, 3}, {1, 3, 2}}),
            randn_sample("size-1", {{1, 1, 1}, {1, 1, 1}}), randn_sample("empty inner", {{2, 3, 0}, {2, 0, 4}})};
        OpSample nc = randn_sample("non-contiguous", {{2, 4, 3}, {2, 3, 5}});
        nc.inputs = {non_contiguous(nc.inputs[0]), non_contiguous(nc.inputs[1])};
        c.push_back(nc);
        return c;
      },
      [](In x) { return bmm(x[0], x[1]); }, "torch.bmm(a, b)", {0, 1}));
  rows.push_back(make_row(
      Op::matmul,
      [] {
        std::vector<OpSample> c{
            randn_sample("1-d @ 1-d", {{5}, {5}}),          randn_sample("2-d @ 1-d", {{3, 5}, {5}}),
            randn_sample("1-d @ 3-d", {{4}, {2, 4, 3}}),    randn_sample("2-d @ 2-d", {{3, 7}, {7, 2}}),
            randn_sample("3-d @ 2-d", {{2, 3, 4}, {4, 5}}), randn_sample("broadcast batch", {{2, 1, 3, 4}, {5, 4, 2}}),
            randn_sample("size-1", {{1, 1}, {1, 1}})};
        OpSample nc = randn_sample("non-contiguous", {{4, 3}, {3, 5}});
        nc.inputs = {non_contiguous(nc.inputs[0]), non_contiguous(nc.inputs[1])};
        c.push_back(nc);
        return c;
      },
      [](In x) { return matmul(x[0], x[1]); }, "torch.matmul(a, b)", {0, 1}));
  rows.push_back(make_row(
      Op::linear,
      [] {
        std::vector<OpSample> c{randn_sample("2-d", {{3, 4}, {5, 4}, {5}}),
                                randn_sample("3-d", {{2, 3, 4}, {2, 4}, {2}}), randn_sample("1-d", {{4}, {3, 4}, {3}}),
                                randn_sample("size-1", {{1, 1}, {1, 1}, {1}}),
                                // Rows with whole vectors and a tail on every ISA.
                                randn_sample("rows of 37 into 21", {{5, 7, 37}, {21, 37}, {21}})};
        OpSample nc = randn_sample("non-contiguous", {{4, 3}, {5, 3}, {5}});
        nc.inputs = {non_contiguous(nc.inputs[0]), non_contiguous(nc.inputs[1]), nc.inputs[2]};
        c.push_back(nc);
        return c;
      },
      [](In x) { return linear(x[0], x[1], x[2]); }, "F.linear(a, b, c)", {0, 1, 2}));
  rows.push_back(make_row(
      Op::linear,
      [] {
        return std::vector<OpSample>{randn_sample("no bias", {{3, 4}, {5, 4}}),
                                     randn_sample("no bias, 4-d", {{1, 2, 3, 37}, {21, 37}})};
      },
      [](In x) { return linear(x[0], x[1]); }, "F.linear(a, b)", {0, 1}));
  // linear_gelu_linear (an MLP's two layers): the one kernel where autograd does not record (layer
  // by layer at these sizes; the bands are NnOps.LinearGeluLinearGivesTheBitsOfItsTwoLinears'),
  // the two ops where it does.
  rows.push_back(make_row(
      Op::linear_gelu_linear,
      [] {
        std::vector<OpSample> c{randn_sample("2-d", {{3, 4}, {6, 4}, {6}, {2, 6}, {2}}),
                                randn_sample("3-d", {{2, 5, 7}, {9, 7}, {9}, {3, 9}, {3}})};
        OpSample nc = randn_sample("non-contiguous", {{4, 3}, {5, 3}, {5}, {2, 5}, {2}});
        nc.inputs = {non_contiguous(nc.inputs[0]), non_contiguous(nc.inputs[1]), nc.inputs[2],
                     non_contiguous(nc.inputs[3]), nc.inputs[4]};
        c.push_back(nc);
        return c;
      },
      [](In x) { return linear_gelu_linear(x[0], x[1], x[2], x[3], x[4]); },
      "F.linear(F.gelu(F.linear(a, b, c)), d, e)", {0, 1, 2, 3, 4}));
  // Attention: heads as ViT's (views of (N, L, H, D)), plain batches, one sequence, odd sizes.
  rows.push_back(make_row(
      Op::attention,
      [] {
        std::vector<OpSample> c{randn_sample("4-d", {{2, 3, 5, 4}, {2, 3, 6, 4}, {2, 3, 6, 7}}),
                                randn_sample("3-d", {{3, 7, 5}, {3, 9, 5}, {3, 9, 2}}),
                                randn_sample("2-d", {{4, 3}, {6, 3}, {6, 5}}),
                                randn_sample("size-1", {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}})};
        OpSample heads = randn_sample("heads of (N, L, H, D)", {{2, 5, 3, 4}, {2, 6, 3, 4}, {2, 6, 3, 4}});
        for (Tensor& t : heads.inputs) t = t.permute({0, 2, 1, 3});
        c.push_back(heads);
        OpSample nc = randn_sample("non-contiguous", {{2, 4, 3}, {2, 5, 3}, {2, 5, 6}});
        for (Tensor& t : nc.inputs) t = non_contiguous(t);
        c.push_back(nc);
        return c;
      },
      [](In x) { return attention(x[0], x[1], x[2]); }, "torch.softmax(a @ b.transpose(-2, -1), -1) @ c", {0, 1, 2}));
  // With a bias and a mask broadcast over the batch dims, as Swin's relative-position bias (per
  // head) and shifted-window mask (per window, 5-d).
  rows.push_back(make_row(
      Op::attention,
      [] {
        return std::vector<OpSample>{
            randn_sample("4-d", {{2, 3, 5, 4}, {2, 3, 6, 4}, {2, 3, 6, 3}, {3, 5, 6}, {2, 1, 5, 6}}),
            randn_sample("5-d windows",
                         {{2, 2, 3, 4, 3}, {2, 2, 3, 4, 3}, {2, 2, 3, 4, 2}, {1, 1, 3, 4, 4}, {1, 2, 1, 4, 4}}),
            randn_sample("full", {{2, 3, 2}, {2, 4, 2}, {2, 4, 3}, {2, 3, 4}, {2, 3, 4}})};
      },
      [](In x) { return attention(x[0], x[1], x[2], x[3], x[4]); },
      "torch.softmax(a @ b.transpose(-2, -1) + d + e, -1) @ c", {0, 1, 2, 3, 4}));
  return rows;
}

}  // namespace

std::vector<OpRow> nn_rows() {
  std::vector<OpRow> rows;
  for (auto family : {conv_rows, pool_rows, norm_rows, softmax_rows, linalg_rows}) {
    std::vector<OpRow> r = family();
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}

}  // namespace tvc::test
