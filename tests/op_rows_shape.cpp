// Op table rows: views, cat/stack/split/chunk, index_select/gather, pad, roll, interpolate.
#include "op_table.h"

namespace tvc::test {
namespace {

using In = const std::vector<Tensor>&;

// One-input samples of the given shapes, plus a non-contiguous one of nc_shape when given.
std::vector<OpSample> shaped(const std::vector<Shape>& shapes, std::optional<Shape> nc_shape = std::nullopt,
                             std::optional<Shape> cl_shape = std::nullopt) {
  std::vector<OpSample> out;
  for (size_t i = 0; i < shapes.size(); ++i)
    out.push_back({"shape " + shape_str(shapes[i]), {sample_randn(shapes[i], 100 + i)}});
  if (nc_shape)
    out.push_back({"non-contiguous " + shape_str(*nc_shape), {non_contiguous(sample_randn(*nc_shape, 98))}});
  if (cl_shape) out.push_back({"channels-last " + shape_str(*cl_shape), {channels_last(sample_randn(*cl_shape, 99))}});
  return out;
}

OpRow one_input(Op op, std::function<std::vector<OpSample>()> samples, std::function<Tensor(const Tensor&)> f,
                std::string torch, std::string note = "") {
  OpRow r = make_row(op, std::move(samples), [f](In x) { return f(x[0]); }, std::move(torch), {0});
  r.note = std::move(note);
  return r;
}

// Samples of three tensors to concatenate along dim (sizes along dim given, other dims `rest`
// with dim's position marked by -1).
std::vector<OpSample> cat_samples(int64_t dim) {
  auto shape_with = [](Shape rest, int64_t n) {
    for (int64_t& s : rest)
      if (s == -1) s = n;
    return rest;
  };
  struct C {
    const char* label;
    Shape rest;
    std::array<int64_t, 3> sizes;
  };
  std::vector<C> cases = dim == 0 ? std::vector<C>{{"1-d", {-1}, {3, 5, 1}},
                                                   {"2-d", {-1, 4}, {1, 4, 2}},
                                                   {"3-d with an empty piece", {-1, 2, 3}, {2, 0, 3}},
                                                   {"size-1", {-1, 1}, {1, 1, 1}}}
                                  : std::vector<C>{{"1-d", {-1}, {3, 5, 1}},
                                                   {"2-d", {4, -1}, {1, 4, 2}},
                                                   {"3-d with an empty piece", {2, 3, -1}, {2, 0, 3}},
                                                   {"empty other dim", {0, -1}, {2, 1, 3}}};
  std::vector<OpSample> out;
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<Tensor> in;
    for (int k = 0; k < 3; ++k)
      in.push_back(sample_randn(shape_with(cases[i].rest, cases[i].sizes[k]), 200 + 3 * i + k));
    out.push_back({cases[i].label, in});
  }
  Shape nc = dim == 0 ? Shape{3, 4} : Shape{4, 3};
  out.push_back(
      {"non-contiguous",
       {non_contiguous(sample_randn(nc, 210)), sample_randn(nc, 211), non_contiguous(sample_randn(nc, 212))}});
  // PyTorch's legacy rule: a 1-d empty tensor is skipped whatever the other shapes.
  out.push_back({"legacy 1-d empty", {sample_randn({2, 3}, 213), sample_randn({0}, 214), sample_randn({2, 3}, 215)}});
  Shape cl = {2, 3, 2, 3};
  out.push_back({"channels-last",
                 {channels_last(sample_randn(cl, 216)), channels_last(sample_randn(cl, 217)), sample_randn(cl, 218)}});
  return out;
}

std::vector<OpSample> stack_samples() {
  std::vector<OpSample> out;
  std::vector<Shape> shapes = {{}, {5}, {2, 3}, {1, 1}, {0, 3}, {2, 3, 4}};
  for (size_t i = 0; i < shapes.size(); ++i)
    out.push_back(
        {"shape " + shape_str(shapes[i]),
         {sample_randn(shapes[i], 300 + i), sample_randn(shapes[i], 310 + i), sample_randn(shapes[i], 320 + i)}});
  out.push_back({"non-contiguous",
                 {non_contiguous(sample_randn({3, 4}, 330)), sample_randn({3, 4}, 331),
                  non_contiguous(sample_randn({3, 4}, 332))}});
  return out;
}

// Samples whose last dim takes every size 0..7.
std::vector<OpSample> last_dim_samples() {
  std::vector<OpSample> out;
  for (int64_t n = 0; n <= 7; ++n) out.push_back({"last dim " + std::to_string(n), {sample_randn({2, n}, 400 + n)}});
  out.push_back({"1-d", {sample_randn({7}, 410)}});
  out.push_back({"non-contiguous", {non_contiguous(sample_randn({3, 5}, 411))}});
  return out;
}

// Pieces weighted by their position and concatenated back, so every piece's place is checked.
Tensor weighted_cat(const std::vector<Tensor>& pieces) {
  std::vector<Tensor> w;
  for (size_t i = 0; i < pieces.size(); ++i) w.push_back(pieces[i] * static_cast<double>(i + 1));
  return cat(w, -1);
}

Tensor ints(int64_t lo, int64_t hi, const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randint(lo, hi, shape, {.dtype = DType::Int64}, &gen);
}

std::vector<OpSample> index_select_samples() {
  return {
      {"2-d", {sample_randn({3, 5}, 500), tensor<int64_t>({4, 0, 0, 2, 1, 4})}},
      {"1-d", {sample_randn({7}, 501), tensor<int64_t>({6, 1, 6})}},
      {"3-d non-contiguous", {non_contiguous(sample_randn({2, 3, 4}, 502)), tensor<int64_t>({3, 3, 0})}},
      {"empty index", {sample_randn({3, 5}, 503), tensor<int64_t>(std::vector<int64_t>{})}},
      {"size-1", {sample_randn({1, 1}, 504), tensor<int64_t>({0, 0})}},
      {"channels-last", {channels_last(sample_randn({2, 3, 2, 3}, 505)), tensor<int64_t>({2, 0})}},
  };
}

std::vector<OpSample> gather_samples() {
  return {
      {"2-d", {sample_randn({3, 5}, 600), ints(0, 5, {3, 7}, 601)}},
      {"2-d smaller index", {sample_randn({4, 5}, 602), ints(0, 5, {2, 3}, 603)}},
      {"3-d non-contiguous", {non_contiguous(sample_randn({2, 4, 3}, 604)), ints(0, 4, {2, 5, 3}, 605)}},
      {"empty", {sample_randn({3, 5}, 606), ints(0, 5, {3, 0}, 607)}},
      {"size-1", {sample_randn({1, 1}, 608), ints(0, 1, {1, 1}, 609)}},
  };
}

OpRow pad_row(const std::vector<int64_t>& pads, const std::string& mode, std::vector<OpSample> samples) {
  std::string list;
  for (size_t i = 0; i < pads.size(); ++i) list += (i ? ", " : "") + std::to_string(pads[i]);
  bool constant = mode == "constant";
  std::string torch = "F.pad(a, [" + list + "], mode='" + mode + "'" + (constant ? ", value=0.5" : "") + ")";
  return make_row(
      Op::pad, [samples] { return samples; },
      [pads, mode, constant](In x) { return pad(x[0], pads, parse_mode<PadMode>(mode), constant ? 0.5 : 0.0); }, torch,
      {0});
}

// Samples of 4-d (N,C,H,W) inputs for interpolate; a 1x1 image only when the output size is given
// (a scale factor below 1 would shrink it to nothing).
std::vector<OpSample> image_samples(bool one_pixel) {
  std::vector<Shape> shapes = {{2, 3, 7, 9}, {1, 2, 2, 13}};
  if (one_pixel) shapes.push_back({1, 1, 1, 1});
  return shaped(shapes, Shape{1, 2, 5, 4}, Shape{2, 3, 4, 5});
}

OpRow interpolate_row(std::optional<std::array<int64_t, 2>> size, std::optional<std::array<double, 2>> scale,
                      const std::string& mode, bool align_corners, bool antialias) {
  std::string torch = "F.interpolate(a, ";
  if (size)
    torch += "size=(" + std::to_string((*size)[0]) + ", " + std::to_string((*size)[1]) + ")";
  else
    torch += "scale_factor=(" + std::to_string((*scale)[0]) + ", " + std::to_string((*scale)[1]) + ")";
  torch += ", mode='" + mode + "'";
  if (mode != "nearest") torch += std::string(", align_corners=") + (align_corners ? "True" : "False");
  if (antialias) torch += ", antialias=True";
  torch += ")";
  bool one_pixel = size.has_value();
  return make_row(
      Op::interpolate, [one_pixel] { return image_samples(one_pixel); },
      [=](In x) { return interpolate(x[0], size, scale, parse_mode<InterpolateMode>(mode), align_corners, antialias); },
      torch, {0});
}

}  // namespace

std::vector<OpRow> shape_rows() {
  std::vector<OpRow> rows;
  // ---- views
  auto viewable = [] { return shaped({{}, {7}, {2, 3, 4}, {1, 1, 3}, {0, 3}}); };
  rows.push_back(one_input(
      Op::view, viewable, [](const Tensor& a) { return a.view({-1}); }, "a.view(-1)"));
  rows.push_back(one_input(
      Op::reshape, [] { return unary_samples(); }, [](const Tensor& a) { return a.reshape({-1}); }, "a.reshape(-1)"));
  rows.push_back(one_input(
      Op::reshape,
      [] {
        return shaped({{2, 3, 4}, {6, 1}}, Shape{4, 6}, Shape{2, 3, 2, 2});
      },
      [](const Tensor& a) {
        return a.reshape({a.size(-1), -1});
      },
      "a.reshape(a.shape[-1], -1)"));
  rows.push_back(one_input(
      Op::permute,
      [] {
        return shaped({{2, 3, 4}, {1, 4, 1}, {2, 0, 3}}, Shape{3, 4, 5});
      },
      [](const Tensor& a) {
        return a.permute({2, 0, 1});
      },
      "a.permute(2, 0, 1)"));
  rows.push_back(one_input(
      Op::transpose, [] { return unary_samples(); }, [](const Tensor& a) { return a.transpose(0, -1); },
      "a.transpose(0, -1)"));
  auto with_dims = [] {
    return shaped({{7}, {3, 5}, {2, 3, 4}, {1, 1, 1}, {0, 3}, {4, 0}}, Shape{5, 3}, Shape{2, 3, 2, 3});
  };
  rows.push_back(one_input(
      Op::slice, with_dims, [](const Tensor& a) { return a.slice(-1, 1, INT64_MAX, 2); }, "a[..., 1::2]"));
  rows.push_back(one_input(
      Op::slice, with_dims, [](const Tensor& a) { return a.slice(0, -2, INT64_MAX); }, "a[-2:]"));
  rows.push_back(one_input(
      Op::narrow,
      [] {
        return shaped({{7}, {3, 5}, {2, 3, 4}, {1, 2}}, Shape{5, 3}, Shape{2, 3, 2, 3});
      },
      [](const Tensor& a) { return a.narrow(-1, 1, a.size(-1) - 2); }, "a.narrow(-1, 1, a.shape[-1] - 2)"));
  rows.push_back(one_input(
      Op::select,
      [] {
        return shaped({{7}, {3, 5}, {2, 3, 4}, {1, 1, 3}, {2, 0}}, Shape{5, 3}, Shape{2, 3, 2, 3});
      },
      [](const Tensor& a) { return a.select(0, -1); }, "a.select(0, -1)"));
  rows.push_back(one_input(
      Op::expand,
      [] {
        return shaped({{}, {1}, {3, 1}, {1, 4}, {2, 3}, {1, 0}}, Shape{1, 3});
      },
      [](const Tensor& a) {
        Shape s{2};
        for (int64_t n : a.shape()) s.push_back(n == 1 ? 3 : n);
        return a.expand(s);
      },
      "a.expand(2, *[3 if s == 1 else s for s in a.shape])"));
  rows.push_back(one_input(
      Op::unsqueeze, [] { return unary_samples(); }, [](const Tensor& a) { return a.unsqueeze(-1); },
      "a.unsqueeze(-1)"));
  rows.push_back(one_input(
      Op::unsqueeze, [] { return unary_samples(); }, [](const Tensor& a) { return a.unsqueeze(0); }, "a.unsqueeze(0)"));
  rows.push_back(one_input(
      Op::squeeze, [] { return unary_samples(); }, [](const Tensor& a) { return a.squeeze(); }, "a.squeeze()"));
  rows.push_back(one_input(
      Op::squeeze,
      [] {
        return shaped({{1, 3}, {3, 1}, {1}, {1, 0}, {2, 1, 1}}, Shape{1, 3});
      },
      [](const Tensor& a) { return a.squeeze(0); }, "a.squeeze(0)"));
  rows.push_back(one_input(
      Op::flatten, [] { return unary_samples(); }, [](const Tensor& a) { return a.flatten(); }, "a.flatten()"));
  rows.push_back(one_input(
      Op::flatten,
      [] {
        return shaped({{2, 3, 4}, {2, 0, 3}, {1, 1, 1}}, Shape{2, 3, 4}, Shape{2, 3, 2, 3});
      },
      [](const Tensor& a) { return a.flatten(1); }, "a.flatten(1)"));
  rows.push_back(one_input(
      Op::contiguous, [] { return unary_samples(); }, [](const Tensor& a) { return a.contiguous(); },
      "a.contiguous()"));
  rows.push_back(one_input(
      Op::to_dtype, [] { return unary_samples(); }, [](const Tensor& a) { return a.to(DType::Float64); },
      "a.to(torch.float64)", "float64 target only: a float32 result would defeat the float64 gradcheck"));
  // ---- cat, stack, split, chunk
  for (int64_t dim : {0, -1})
    rows.push_back(make_row(
        Op::cat, [dim] { return cat_samples(dim); },
        [dim](In x) {
          return cat({x[0], x[1], x[2]}, dim);
        },
        "torch.cat([a, b, c], " + std::to_string(dim) + ")", {0, 1, 2}));
  for (int64_t dim : {0, -1})
    rows.push_back(make_row(Op::stack, stack_samples,
                            [dim](In x) {
                              return stack({x[0], x[1], x[2]}, dim);
                            },
                            "torch.stack([a, b, c], " + std::to_string(dim) + ")", {0, 1, 2}));
  rows.push_back(one_input(
      Op::split, last_dim_samples, [](const Tensor& a) { return weighted_cat(split(a, 2, -1)); },
      "torch.cat([p * (i + 1) for i, p in enumerate(torch.split(a, 2, -1))], -1)"));
  rows.push_back(one_input(
      Op::split,
      [] {
        return shaped({{6}, {2, 6}, {0, 6}}, Shape{3, 6});
      },
      [](const Tensor& a) {
        return weighted_cat(split(a, std::vector<int64_t>{1, 3, 0, 2}, -1));
      },
      "torch.cat([p * (i + 1) for i, p in enumerate(torch.split(a, [1, 3, 0, 2], -1))], -1)"));
  rows.push_back(one_input(
      Op::chunk, last_dim_samples, [](const Tensor& a) { return weighted_cat(chunk(a, 3, -1)); },
      "torch.cat([p * (i + 1) for i, p in enumerate(torch.chunk(a, 3, -1))], -1)"));
  // ---- indexing
  rows.push_back(make_row(Op::index_select, index_select_samples, [](In x) { return index_select(x[0], -1, x[1]); },
                          "torch.index_select(a, -1, b)", {0}));
  rows.push_back(
      make_row(Op::gather, gather_samples, [](In x) { return gather(x[0], 1, x[1]); }, "torch.gather(a, 1, b)", {0}));
  // ---- pad, one row per mode
  rows.push_back(pad_row({1, 2, -1, 1}, "constant",
                         shaped({{3, 4}, {1, 1, 2, 1}, {0, 3, 4}, {2, 3, 5}}, Shape{2, 4, 3}, Shape{2, 3, 4, 5})));
  rows.push_back(pad_row({0, 0, 2, 0, -1, 1}, "constant", shaped({{2, 3, 4}, {2, 3, 2, 2}})));
  // Unbatched (C,H,W) and batched (N,C,H,W) inputs, the batch possibly empty (as F.pad allows).
  auto spatial = [] { return shaped({{2, 3, 4}, {1, 3, 3}, {0, 2, 4, 5}}, Shape{2, 4, 5}, Shape{2, 3, 4, 5}); };
  // circular takes batched inputs only; an empty channel dim is allowed there.
  auto batched = [] {
    return shaped({{1, 2, 3, 4}, {0, 2, 4, 5}, {2, 0, 3, 3}}, Shape{1, 2, 4, 5}, Shape{2, 3, 4, 5});
  };
  rows.push_back(pad_row({2, 1, 1, 2}, "reflect", spatial()));
  rows.push_back(pad_row({-1, 2, 2, -1}, "reflect", spatial()));
  rows.push_back(pad_row({3, 1}, "reflect", shaped({{2, 4}, {1, 3, 5}}, Shape{3, 4})));
  rows.push_back(pad_row({2, 1, 1, 2}, "replicate",
                         shaped({{2, 3, 4}, {1, 1, 1}, {1, 2, 1, 3}}, Shape{2, 4, 5}, Shape{2, 3, 4, 5})));
  rows.push_back(pad_row({-1, 3, 0, -1}, "replicate", spatial()));
  rows.push_back(pad_row({2, 1, 1, 2}, "circular", batched()));
  rows.push_back(pad_row({-1, 2, 2, -1}, "circular", batched()));
  rows.push_back(pad_row({2, -1}, "circular", shaped({{2, 3, 4}, {1, 1, 3}}, Shape{2, 4, 5})));
  // ---- roll
  rows.push_back(one_input(
      Op::roll,
      [] {
        return shaped({{3, 5}, {2, 3, 4}, {1, 1}, {0, 3}}, Shape{4, 5}, Shape{2, 3, 2, 3});
      },
      [](const Tensor& a) {
        return roll(a, {2, -1}, {0, -1});
      },
      "torch.roll(a, (2, -1), (0, -1))"));
  rows.push_back(one_input(
      Op::roll, [] { return unary_samples(); }, [](const Tensor& a) { return roll(a, {3}, {}); }, "torch.roll(a, 3)"));
  // ---- interpolate, every mode
  using Size = std::array<int64_t, 2>;
  using Scale = std::array<double, 2>;
  rows.push_back(interpolate_row(Size{5, 11}, std::nullopt, "nearest", false, false));
  rows.push_back(interpolate_row(std::nullopt, Scale{1.5, 0.5}, "nearest", false, false));
  for (bool ac : {false, true})
    for (std::string mode : {"bilinear", "bicubic"}) {
      rows.push_back(interpolate_row(Size{5, 11}, std::nullopt, mode, ac, false));
      rows.push_back(interpolate_row(std::nullopt, Scale{1.75, 0.5}, mode, ac, false));
      rows.push_back(interpolate_row(Size{2, 3}, std::nullopt, mode, ac, true));
      rows.push_back(interpolate_row(std::nullopt, Scale{0.5, 2.5}, mode, ac, true));
    }
  return rows;
}

}  // namespace tvc::test
