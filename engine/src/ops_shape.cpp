// Shape and padding ops: cat, stack, split, chunk, pad, roll, interpolate.
// Shape legend: N batch, C channels, H,W input height and width, Ho,Wo output height and width.
//
// cat is the one op here with its own backward (the copy kernel writes each input into a narrow
// view of the output; the gradient of each input is the matching narrow of the output's
// gradient) besides constant pad, whose backward is a constant pad with the pads negated. Every
// other op is composed from views, cat, index_select and matmul, so autograd comes from those.
#include <algorithm>
#include <cmath>

#include "internal.h"

namespace tvc {

using autograd::GradList;

// ---------------------------------------------------------------- cat, stack, split, chunk

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  TVC_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  // PyTorch's legacy rule: 1-d tensors of size 0 are skipped whatever the other shapes are.
  std::vector<Tensor> parts;
  DType dtype = tensors[0].defined() ? tensors[0].dtype() : DType::Float32;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    TVC_CHECK(t.defined(), "cat: tensor at position ", i, " is undefined");
    TVC_CHECK(t.dim() > 0, "cat: zero-dimensional tensor (at position ", i, ") cannot be concatenated");
    dtype = promote_types(dtype, t.dtype());
    if (!(t.dim() == 1 && t.shape()[0] == 0)) parts.push_back(t);
  }
  if (parts.empty()) {
    wrap_dim(dim, 1, "cat");
    return empty({0}, {.dtype = dtype});
  }
  const Tensor& ref = parts[0];
  int64_t d = wrap_dim(dim, ref.dim(), "cat");
  Shape out_shape = ref.shape();
  out_shape[d] = 0;
  MemoryFormat format = ref.suggest_memory_format();
  for (const Tensor& t : parts) {
    bool same = t.dim() == ref.dim();
    for (int64_t k = 0; same && k < t.dim(); ++k) same = k == d || t.shape()[k] == ref.shape()[k];
    TVC_CHECK(same, "cat: tensors must have the same shape except in dim ", d, ", got ", ref.shape(), " and ",
              t.shape());
    out_shape[d] += t.shape()[d];
    if (t.suggest_memory_format() != format) format = MemoryFormat::Contiguous;
  }
  Tensor out = detail::empty_with_format(out_shape, dtype, format);
  std::vector<int64_t> starts, sizes;
  std::vector<DType> dtypes;
  {
    NoGradGuard no_grad;
    int64_t start = 0;
    for (const Tensor& t : parts) {
      int64_t n = t.shape()[d];
      if (t.numel() > 0) detail::run(Op::copy, {t}, {out.narrow(d, start, n)});
      starts.push_back(start);
      sizes.push_back(n);
      dtypes.push_back(t.dtype());
      start += n;
    }
  }
  autograd::record("CatBackward0", parts, {out}, [d, starts, sizes, dtypes](const GradList& g) -> GradList {
    GradList grads;
    for (size_t i = 0; i < starts.size(); ++i) {
      Tensor gi = g[0].narrow(d, starts[i], sizes[i]);
      grads.push_back(is_floating(dtypes[i]) ? gi.to(dtypes[i]) : Tensor());
    }
    return grads;
  });
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  TVC_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  TVC_CHECK(tensors[0].defined(), "stack: tensor at position 0 is undefined");
  int64_t d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TVC_CHECK(tensors[i].defined() && tensors[i].shape() == tensors[0].shape(),
              "stack: expects each tensor to be equal size, but got ", tensors[0].shape(), " at entry 0 and ",
              tensors[i].defined() ? tensors[i].shape() : Shape{}, " at entry ", i);
    parts.push_back(tensors[i].unsqueeze(d));
  }
  return cat(parts, d);
}

std::vector<Tensor> split(const Tensor& t, const std::vector<int64_t>& sizes, int64_t dim) {
  TVC_CHECK(t.dim() > 0, "split: cannot split a 0-d tensor");
  int64_t d = wrap_dim(dim, t.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    TVC_CHECK(s >= 0, "split: split sizes ", sizes, " must be non-negative");
    total += s;
  }
  TVC_CHECK(total == t.shape()[d], "split: split sizes ", sizes, " must sum to the size ", t.shape()[d], " of dim ", d,
            " (shape ", t.shape(), ")");
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(t.narrow(d, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim) {
  TVC_CHECK(t.dim() > 0, "split: cannot split a 0-d tensor");
  int64_t d = wrap_dim(dim, t.dim(), "split");
  int64_t n = t.shape()[d];
  TVC_CHECK(split_size >= 0, "split: split_size must be non-negative, got ", split_size);
  TVC_CHECK(split_size > 0 || n == 0, "split: split_size can be 0 only when the size of dim ", d, " is 0 (shape ",
            t.shape(), ")");
  // As PyTorch: ceil(n / split_size) pieces, at least one; the last may be smaller.
  int64_t pieces = split_size == 0 ? 1 : std::max<int64_t>((n + split_size - 1) / split_size, 1);
  std::vector<int64_t> sizes(pieces, split_size);
  sizes.back() = n - split_size * (pieces - 1);
  return split(t, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim) {
  TVC_CHECK(t.dim() > 0, "chunk: cannot chunk a 0-d tensor");
  TVC_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  int64_t d = wrap_dim(dim, t.dim(), "chunk");
  int64_t n = t.shape()[d];
  // As PyTorch: pieces of ceil(n / chunks), so fewer than `chunks` pieces may come back; an
  // empty dim gives `chunks` empty pieces.
  int64_t size = (n + chunks - 1) / chunks;
  if (n == 0) return split(t, std::vector<int64_t>(chunks, 0), d);
  return split(t, size, d);
}

// ---------------------------------------------------------------- pad

namespace {

// F.pad's constant mode: negative pads crop. Backward is the same pad with the pads negated.
Tensor constant_pad(const Tensor& t, const std::vector<int64_t>& pads, double value) {
  int64_t npairs = static_cast<int64_t>(pads.size()) / 2;
  Shape out_shape = t.shape();
  Tensor src = t;
  std::vector<std::pair<int64_t, int64_t>> dst_region;  // (dim, start) in the output
  for (int64_t k = 0; k < npairs; ++k) {
    int64_t d = t.dim() - 1 - k, l = pads[2 * k], r = pads[2 * k + 1], n = t.shape()[d];
    out_shape[d] = n + l + r;
    TVC_CHECK(out_shape[d] >= 0, "pad: the size ", n, " of dim ", d, " (shape ", t.shape(), ") with padding (", l, ", ",
              r, ") gives a negative size");
    int64_t len = std::max<int64_t>(n - std::max<int64_t>(-l, 0) - std::max<int64_t>(-r, 0), 0);
    src = src.narrow(d, std::min(std::max<int64_t>(-l, 0), n), len);
    dst_region.emplace_back(d, std::max<int64_t>(l, 0));
  }
  Tensor out = detail::empty_with_format(out_shape, t.dtype(), detail::result_format({t}));
  {
    NoGradGuard no_grad;
    out.fill_(value);
    Tensor dst = out;
    for (auto [d, start] : dst_region) dst = dst.narrow(d, start, src.shape()[d]);
    if (src.numel() > 0) detail::run(Op::copy, {src.detach()}, {dst});
  }
  std::vector<int64_t> negated;
  for (int64_t p : pads) negated.push_back(-p);
  autograd::record("ConstantPadNdBackward0", {t}, {out},
                   [negated](const GradList& g) -> GradList { return {constant_pad(g[0], negated, 0)}; });
  return out;
}

}  // namespace

Tensor pad(const Tensor& t, const std::vector<int64_t>& pads, PadMode pad_mode, double value) {
  TVC_CHECK(pads.size() % 2 == 0, "pad: padding length must be divisible by 2, got ", pads.size(),
            " values for an input of shape ", t.shape());
  int64_t npairs = static_cast<int64_t>(pads.size()) / 2;
  TVC_CHECK(npairs <= t.dim(), "pad: padding ", pads, " pads more dims than the input of shape ", t.shape(), " has");
  if (pad_mode == PadMode::Constant) return constant_pad(t, pads, value);
  const char* mode = to_string(pad_mode);
  TVC_CHECK(value == 0, "pad: mode '", mode, "' takes no value (got ", value, ")");
  // As PyTorch 1.13: reflect and replicate take an unbatched or batched input, circular a batched
  // one; only the batch may be empty (circular also allows an empty channel dim).
  bool batched = t.dim() == npairs + 2;
  if (pad_mode == PadMode::Circular)
    TVC_CHECK(batched, "pad: mode 'circular' with padding ", pads, " expects a ", npairs + 2,
              "-d (batched) input, got shape ", t.shape());
  else
    TVC_CHECK(batched || t.dim() == npairs + 1, "pad: mode '", mode, "' with padding ", pads, " expects a ", npairs + 1,
              "-d or ", npairs + 2, "-d (batched) input, got shape ", t.shape());
  for (int64_t d = batched ? 1 : 0; d < t.dim() && pad_mode != PadMode::Circular; ++d)
    TVC_CHECK(t.shape()[d] > 0, "pad: mode '", mode, "' needs non-empty dims except the batch, got shape ", t.shape());
  // Each padded dim becomes an index_select with the source index of every output position.
  // reflect and replicate map positions of the uncropped input; circular (as PyTorch) crops
  // negative pads first and wraps around what is left.
  Tensor r = t;
  for (int64_t k = 0; k < npairs; ++k) {
    int64_t d = t.dim() - 1 - k, l = pads[2 * k], rr = pads[2 * k + 1], n = t.shape()[d];
    TVC_CHECK(n > 0, "pad: mode '", mode, "' cannot pad dim ", d, " of size 0 (shape ", t.shape(), ")");
    TVC_CHECK(n + l + rr >= 0, "pad: the size ", n, " of dim ", d, " (shape ", t.shape(), ") with padding (", l, ", ",
              rr, ") gives a negative size");
    if (pad_mode == PadMode::Reflect)
      TVC_CHECK(l < n && rr < n, "pad: reflect padding (", l, ", ", rr, ") must be smaller than the size ", n,
                " of dim ", d, " (shape ", t.shape(), ")");
    if (pad_mode == PadMode::Circular) {
      TVC_CHECK(l <= n && rr <= n, "pad: circular padding (", l, ", ", rr,
                ") wraps around more than once "
                "the size ",
                n, " of dim ", d, " (shape ", t.shape(), ")");
      int64_t cl = std::max<int64_t>(-l, 0), cr = std::max<int64_t>(-rr, 0);
      TVC_CHECK(n - cl - cr > 0 || (l <= 0 && rr <= 0), "pad: circular padding (", l, ", ", rr, ") crops dim ", d,
                " of size ", n, " to nothing and then wraps around it");
      r = r.narrow(d, std::min(cl, n), std::max<int64_t>(n - cl - cr, 0));
      n = r.shape()[d];
      l = std::max<int64_t>(l, 0);
      rr = std::max<int64_t>(rr, 0);
    }
    int64_t out_n = n + l + rr;
    std::vector<int64_t> index(out_n);
    for (int64_t j = 0; j < out_n; ++j) {
      int64_t s = j - l;
      if (pad_mode == PadMode::Reflect)
        index[j] = s < 0 ? -s : s >= n ? 2 * (n - 1) - s : s;
      else if (pad_mode == PadMode::Replicate)
        index[j] = std::clamp<int64_t>(s, 0, n - 1);
      else
        index[j] = ((s % n) + n) % n;
    }
    r = index_select(r, d, tensor<int64_t>(index));
  }
  return r.contiguous(t.suggest_memory_format());
}

// ---------------------------------------------------------------- roll

Tensor roll(const Tensor& t, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) {
  if (dims.empty()) {
    TVC_CHECK(shifts.size() == 1, "roll: without dims, shifts must hold one value, got ", shifts);
    return roll(t.flatten(), shifts, {0}).view(t.shape());
  }
  TVC_CHECK(shifts.size() == dims.size(), "roll: shifts ", shifts, " and dims ", dims, " must have the same length");
  // Each dim's total shift (mod its size), then one pass: for every combination of one part per
  // rolled dim (the last s entries going to the front, the others after them), one block copy.
  std::vector<int64_t> shift(t.dim(), 0);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], t.dim(), "roll"), n = t.shape()[d];
    if (n > 0) shift[d] = (((shift[d] + shifts[i]) % n) + n) % n;
  }
  std::vector<int64_t> rolled;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (shift[d] != 0) rolled.push_back(d);
  if (rolled.empty()) return t.clone();
  Tensor out = empty(t.shape(), {.dtype = t.dtype(), .device = t.device()});
  {
    NoGradGuard no_grad;
    for (int64_t parts = 0; parts < int64_t{1} << rolled.size(); ++parts) {
      Tensor from = t.detach(), to = out;
      for (size_t j = 0; j < rolled.size(); ++j) {
        const int64_t d = rolled[j], n = t.shape()[d], s = shift[d];
        const bool tail = (parts >> j) & 1;
        from = from.narrow(d, tail ? n - s : 0, tail ? s : n - s);
        to = to.narrow(d, tail ? 0 : s, tail ? s : n - s);
      }
      to.copy_(from);
    }
  }
  if (!autograd::any_requires_grad({t})) return out;
  std::vector<int64_t> back;
  for (int64_t d : rolled) back.push_back(-shift[d]);
  autograd::record("RollBackward0", {t}, {out},
                   [back, rolled](const GradList& g) -> GradList { return {roll(g[0], back, rolled)}; });
  return out;
}

// ---------------------------------------------------------------- interpolate

namespace {

// PyTorch's area_pixel_compute_scale: the step in input coordinates per output pixel.
double pixel_scale(int64_t in, int64_t out, bool align_corners, std::optional<double> scale_factor) {
  if (align_corners) return out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0;
  if (scale_factor && *scale_factor > 0) return 1.0 / *scale_factor;
  return static_cast<double>(in) / static_cast<double>(out);
}

// The input row of every output row for PyTorch's legacy 'nearest', computed in float as
// PyTorch's float32 kernel does (src = floor(dst * scale)). This is PyTorch's NCHW path; its
// channels-last path (also taken for a single channel) instead copies an axis whose size is
// unchanged even when a scale factor other than 1 is given.
std::vector<int64_t> nearest_index(int64_t in, int64_t out, std::optional<double> scale_factor) {
  std::vector<int64_t> index(out);
  float scale = scale_factor && *scale_factor > 0 ? static_cast<float>(1.0 / *scale_factor)
                                                  : static_cast<float>(in) / static_cast<float>(out);
  for (int64_t o = 0; o < out; ++o)
    index[o] = std::min(static_cast<int64_t>(std::floor(static_cast<float>(o) * scale)), in - 1);
  return index;
}

double cubic_near(double x, double a) { return ((a + 2) * x - (a + 3)) * x * x + 1; }       // |x| <= 1
double cubic_far(double x, double a) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; }  // 1 < |x| < 2

// The (out, in) matrix that interpolates one axis, row o holding the weights of output o,
// following PyTorch's upsample kernels (bilinear, bicubic with A = -0.75 and clamped borders)
// and, with antialias, its _upsample_*_aa kernels (PIL-style separable filters whose support
// grows with the downscale factor, weights normalised to sum 1; bicubic there uses A = -0.5).
std::vector<double> axis_weights(InterpolateMode mode, int64_t in, int64_t out, bool align_corners, bool antialias,
                                 std::optional<double> scale_factor) {
  std::vector<double> w(out * in, 0.0);
  double scale = pixel_scale(in, out, align_corners, scale_factor);
  if (antialias) {
    double taps = mode == InterpolateMode::Bilinear ? 2 : 4;
    double support = scale >= 1 ? taps * 0.5 * scale : taps * 0.5;
    double invscale = scale >= 1 ? 1.0 / scale : 1.0;
    auto filter = [mode](double x) {
      x = std::fabs(x);
      if (mode == InterpolateMode::Bilinear) return x < 1 ? 1 - x : 0.0;
      return x < 1 ? cubic_near(x, -0.5) : x < 2 ? cubic_far(x, -0.5) : 0.0;
    };
    for (int64_t o = 0; o < out; ++o) {
      double center = scale * (static_cast<double>(o) + 0.5);
      int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
      int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in);
      double total = 0;
      for (int64_t j = lo; j < hi; ++j)
        total += w[o * in + j] = filter((static_cast<double>(j) - center + 0.5) * invscale);
      if (total != 0)
        for (int64_t j = lo; j < hi; ++j) w[o * in + j] /= total;
    }
    return w;
  }
  for (int64_t o = 0; o < out; ++o) {
    double x = static_cast<double>(o);
    double src = align_corners ? scale * x : scale * (x + 0.5) - 0.5;
    if (mode == InterpolateMode::Bilinear) {
      if (in == out) {  // PyTorch copies an axis whose size does not change
        w[o * in + o] = 1;
        continue;
      }
      src = std::max(src, 0.0);
      int64_t i0 = static_cast<int64_t>(src);
      int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
      double l1 = std::clamp(src - static_cast<double>(i0), 0.0, 1.0);
      w[o * in + i0] += 1 - l1;
      w[o * in + i1] += l1;
    } else {
      const double a = -0.75;
      int64_t i = static_cast<int64_t>(std::floor(src));
      double t = src - static_cast<double>(i);
      double c[4] = {cubic_far(t + 1, a), cubic_near(t, a), cubic_near(1 - t, a), cubic_far(2 - t, a)};
      for (int64_t j = 0; j < 4; ++j) w[o * in + std::clamp<int64_t>(i - 1 + j, 0, in - 1)] += c[j];
    }
  }
  return w;
}

}  // namespace

Tensor interpolate(const Tensor& input, std::optional<std::array<int64_t, 2>> size,
                   std::optional<std::array<double, 2>> scale_factor, InterpolateMode mode, bool align_corners,
                   bool antialias) {
  TVC_CHECK(input.dim() == 4, "interpolate: expects a 4-d (N,C,H,W) input, got shape ", input.shape());
  TVC_CHECK(size.has_value() != scale_factor.has_value(),
            "interpolate: give exactly one of size and scale_factor (input shape ", input.shape(), ")");
  TVC_CHECK(mode != InterpolateMode::Nearest || (!align_corners && !antialias),
            "interpolate: align_corners and antialias apply to modes 'bilinear' and 'bicubic' only");
  TVC_CHECK(mode == InterpolateMode::Nearest || is_floating(input.dtype()), "interpolate: mode '", to_string(mode),
            "' needs a floating input, got ", dtype_name(input.dtype()));
  int64_t in_h = input.shape()[2], in_w = input.shape()[3];
  std::array<int64_t, 2> out_size{};
  std::array<std::optional<double>, 2> scales;
  for (int k = 0; k < 2; ++k) {
    int64_t in = input.shape()[2 + k];
    if (size) {
      out_size[k] = (*size)[k];
    } else {
      double s = (*scale_factor)[k];
      TVC_CHECK(s > 0 && std::isfinite(s), "interpolate: scale factors must be positive, got ", s);
      out_size[k] = static_cast<int64_t>(std::floor(static_cast<double>(in) * s));
      // With align_corners PyTorch derives the scale from the sizes only.
      if (!align_corners) scales[k] = s;
    }
  }
  TVC_CHECK(in_h > 0 && in_w > 0 && out_size[0] > 0 && out_size[1] > 0,
            "interpolate: input and output sizes must be greater than 0, got input ", input.shape(),
            " and output size [", out_size[0], ", ", out_size[1], "]");
  MemoryFormat format = input.suggest_memory_format();
  if (mode == InterpolateMode::Nearest) {
    Tensor r = index_select(input, 2, tensor<int64_t>(nearest_index(in_h, out_size[0], scales[0])));
    r = index_select(r, 3, tensor<int64_t>(nearest_index(in_w, out_size[1], scales[1])));
    return r.contiguous(format);
  }
  // out = W_h @ x @ W_w^T with per-axis weight matrices built in float64.
  auto matrix = [&](int k) {
    int64_t in = input.shape()[2 + k];
    return tensor<double>(axis_weights(mode, in, out_size[k], align_corners, antialias, scales[k]),
                          Shape{out_size[k], in})
        .to(input.dtype());
  };
  Tensor y = matmul(input, matrix(1).t());                       // (N,C,H,Wo)
  y = matmul(y.transpose(2, 3), matrix(0).t()).transpose(2, 3);  // (N,C,Ho,Wo)
  return y.contiguous(format);
}

}  // namespace tvc
