// Image decoding (libjpeg, libpng) and torchvision's classification preprocessing on PIL images,
// reproduced step by step (see preprocess.h).
#include "tvc/vision/preprocess.h"

#include <jpeglib.h>
// jerror.h after jpeglib.h (it uses its types): the message codes of warnings.
#include <jerror.h>
#include <png.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "tvc/error.h"

namespace tvc::vision {

using models::Interpolation;
using models::Preprocessing;

namespace {

// ------------------------------------------------------------------ reading and checking

std::vector<uint8_t> read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TVC_CHECK(in, "cannot open image '", printable(path), "': ", std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TVC_CHECK(!in.bad(), "cannot read image '", printable(path), "'");
  return bytes;
}

// Refuses a header's size before anything of that size is allocated.
void check_size(const std::string& path, int64_t width, int64_t height) {
  TVC_CHECK(width > 0 && height > 0, "image '", printable(path), "': its header gives the size ", width, "x", height);
  TVC_CHECK(width <= kMaxImagePixels / height, "image '", printable(path), "': ", width, "x", height,
            " pixels is more than the ", kMaxImagePixels, " tvc decodes");
}

// ------------------------------------------------------------------ JPEG (libjpeg)
//
// libjpeg reports errors through error_exit, which must not return: it longjmps back into the
// decode_jpeg_* function that called libjpeg. Those functions are plain C in style (no object with
// a destructor is created between their setjmp and the libjpeg calls), and the state they change
// lives in the caller's JpegDecoder, not in their own locals.

// libjpeg warnings that mean the data is truncated or corrupt. PIL ignores warnings (and fails
// on truncation itself); a corrupt image is an error here rather than a partly gray picture.
bool is_corrupt_data_warning(int code) {
  switch (code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
    case JWRN_MUST_RESYNC:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_NOT_SEQUENTIAL:
      return true;
    default:
      return false;
  }
}

struct JpegErrorManager {
  jpeg_error_mgr pub;  // first: libjpeg sees a jpeg_error_mgr*
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_fail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void jpeg_message(j_common_ptr cinfo, int msg_level) {
  // msg_level -1: a warning; 0 and up: trace messages, ignored.
  if (msg_level < 0 && is_corrupt_data_warning(cinfo->err->msg_code)) jpeg_fail(cinfo);
}

struct JpegDecoder {
  // Zeroed, so destroying it is safe before (or without) jpeg_create_decompress: cinfo.mem is null.
  jpeg_decompress_struct cinfo{};
  JpegErrorManager err;
  JpegDecoder() {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = jpeg_fail;
    err.pub.emit_message = jpeg_message;
    err.message[0] = '\0';
  }
  ~JpegDecoder() { jpeg_destroy_decompress(&cinfo); }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
};

// Sets libjpeg up and reads the header; false when libjpeg failed (the message is in d->err).
bool decode_jpeg_header(JpegDecoder* d, const uint8_t* data, size_t size) {
  if (setjmp(d->err.jump)) return false;
  jpeg_create_decompress(&d->cinfo);
  jpeg_mem_src(&d->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&d->cinfo, TRUE);
  return true;
}

// Decodes the pixels into rgb (height * width * 3) with PIL's settings: libjpeg's defaults
// (JDCT_ISLOW, fancy upsampling), RGB out of 3 components, gray out of 1 (replicated, as
// convert("RGB") does). false when libjpeg failed.
bool decode_jpeg_pixels(JpegDecoder* d, uint8_t* rgb) {
  if (setjmp(d->err.jump)) return false;
  jpeg_decompress_struct* cinfo = &d->cinfo;
  cinfo->out_color_space = cinfo->num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(cinfo);
  const JDIMENSION width = cinfo->output_width;
  const int components = cinfo->output_components;
  JSAMPARRAY row = (*cinfo->mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(cinfo), JPOOL_IMAGE,
                                               width * static_cast<JDIMENSION>(components), 1);
  while (cinfo->output_scanline < cinfo->output_height) {
    uint8_t* out = rgb + static_cast<size_t>(cinfo->output_scanline) * width * 3;
    jpeg_read_scanlines(cinfo, row, 1);
    if (components == 3) {
      std::memcpy(out, row[0], static_cast<size_t>(width) * 3);
    } else {
      for (JDIMENSION x = 0; x < width; ++x) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = row[0][x];
    }
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

Image decode_jpeg(const std::string& path, const std::vector<uint8_t>& bytes) {
  JpegDecoder d;
  TVC_CHECK(decode_jpeg_header(&d, bytes.data(), bytes.size()), "cannot decode JPEG '", printable(path),
            "': ", printable(d.err.message));
  // PIL's modes: 1 component is "L", 3 are "RGB"; 4 (CMYK, YCCK) need PIL's own conversion.
  TVC_CHECK(d.cinfo.num_components == 1 || d.cinfo.num_components == 3, "cannot decode JPEG '", printable(path),
            "': it has ", d.cinfo.num_components,
            " color components (tvc reads grayscale and RGB/YCbCr JPEGs, not CMYK)");
  Image image{.height = d.cinfo.image_height, .width = d.cinfo.image_width, .rgb = {}};
  check_size(path, image.width, image.height);
  image.rgb.resize(static_cast<size_t>(image.height * image.width * 3));
  TVC_CHECK(decode_jpeg_pixels(&d, image.rgb.data()), "cannot decode JPEG '", printable(path),
            "': ", printable(d.err.message));
  TVC_CHECK(static_cast<int64_t>(d.cinfo.output_width) == image.width &&
                static_cast<int64_t>(d.cinfo.output_height) == image.height,
            "cannot decode JPEG '", printable(path), "': decoded size differs from the header's");
  return image;
}

// ------------------------------------------------------------------ PNG (libpng)
//
// libpng's errors longjmp to png_jmpbuf, set in the decode_png_* functions below (plain C in
// style as for JPEG); the message is kept in PngDecoder.

struct PngDecoder {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0, offset = 0;
  char message[256] = "";
  PngDecoder() = default;
  ~PngDecoder() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
  PngDecoder(const PngDecoder&) = delete;
  PngDecoder& operator=(const PngDecoder&) = delete;
};

void png_fail(png_structp png, png_const_charp message) {
  auto* d = static_cast<PngDecoder*>(png_get_error_ptr(png));
  std::snprintf(d->message, sizeof d->message, "%s", message);
  png_longjmp(png, 1);
}

// Warnings (bad ancillary chunks, known-incorrect sRGB profiles) do not stop PIL either.
void png_warn(png_structp, png_const_charp) {}

void png_read_memory(png_structp png, png_bytep out, png_size_t length) {
  auto* d = static_cast<PngDecoder*>(png_get_io_ptr(png));
  if (length > d->size - d->offset) png_error(png, "the file is truncated");
  std::memcpy(out, d->data + d->offset, length);
  d->offset += length;
}

// What decode_png_header found out: the size, and the layout of the rows libpng will give.
struct PngLayout {
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
  int file_channels = 0;  // samples a pixel in the file (1 for palette indices)
  int channels = 0;       // samples a pixel in the rows libpng gives
  size_t rowbytes = 0;
};

// Reads the header and sets up libpng's transformations to 8-bit samples as PIL's
// convert("RGB") sees them; false when libpng failed or the PNG is 16-bit grayscale.
bool decode_png_header(PngDecoder* d, PngLayout* layout) {
  if (setjmp(png_jmpbuf(d->png))) return false;
  png_read_info(d->png, d->info);
  png_get_IHDR(d->png, d->info, &layout->width, &layout->height, &layout->bit_depth, &layout->color_type, nullptr,
               nullptr, nullptr);
  layout->file_channels = png_get_channels(d->png, d->info);
  if (layout->bit_depth == 16) {
    // PIL 9.4 opens 16-bit grayscale as mode "I", whose conversion to RGB clips the values at
    // 255 (1000 becomes 255, not 3): refused rather than copied.
    if (!(layout->color_type & PNG_COLOR_MASK_COLOR)) {
      std::snprintf(d->message, sizeof d->message, "16-bit grayscale PNGs are not supported");
      return false;
    }
    png_set_strip_16(d->png);  // the high byte, as PIL's RGB;16B / RGBA;16B unpackers keep
  }
  // Palette entries become RGB (and RGBA where tRNS gives alpha, dropped below); 1, 2 and 4-bit
  // gray scales to 0-255 by bit replication, as PIL unpacks modes "1", "L;2" and "L;4".
  if (layout->color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(d->png);
  if (layout->color_type == PNG_COLOR_TYPE_GRAY && layout->bit_depth < 8) png_set_expand_gray_1_2_4_to_8(d->png);
  png_set_interlace_handling(d->png);
  png_read_update_info(d->png, d->info);
  layout->channels = png_get_channels(d->png, d->info);
  layout->rowbytes = png_get_rowbytes(d->png, d->info);
  return true;
}

bool decode_png_pixels(PngDecoder* d, png_bytepp rows) {
  if (setjmp(png_jmpbuf(d->png))) return false;
  png_read_image(d->png, rows);
  png_read_end(d->png, nullptr);  // checks the chunks after the pixels, up to IEND
  return true;
}

Image decode_png(const std::string& path, const std::vector<uint8_t>& bytes) {
  PngDecoder d;
  d.data = bytes.data();
  d.size = bytes.size();
  d.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &d, png_fail, png_warn);
  TVC_CHECK(d.png, "cannot decode PNG '", printable(path), "': libpng could not start");
  d.info = png_create_info_struct(d.png);
  TVC_CHECK(d.info, "cannot decode PNG '", printable(path), "': libpng could not start");
  png_set_read_fn(d.png, &d, png_read_memory);

  PngLayout layout;
  TVC_CHECK(decode_png_header(&d, &layout), "cannot decode PNG '", printable(path), "': ", printable(d.message));
  check_size(path, layout.width, layout.height);
  // zlib cannot inflate more than 1032 bytes out of one: a header promising more pixel bytes
  // than the file could hold is refused before the rows are allocated.
  const double packed_bytes =
      static_cast<double>(layout.height) *
      (1.0 + std::ceil(static_cast<double>(layout.width) * layout.file_channels * layout.bit_depth / 8.0));
  TVC_CHECK(packed_bytes <= 1032.0 * static_cast<double>(bytes.size()) + 4096.0, "cannot decode PNG '", printable(path),
            "': its header gives ", layout.width, "x", layout.height, " pixels, more than its ", bytes.size(),
            " bytes can hold");
  TVC_CHECK(layout.channels >= 1 && layout.channels <= 4 &&
                layout.rowbytes == static_cast<size_t>(layout.width) * static_cast<size_t>(layout.channels),
            "cannot decode PNG '", printable(path), "': unexpected sample layout (", layout.channels, " channels, ",
            layout.rowbytes, " bytes a row)");

  std::vector<uint8_t> samples(layout.rowbytes * layout.height);
  std::vector<png_bytep> rows(layout.height);
  for (png_uint_32 y = 0; y < layout.height; ++y) rows[y] = samples.data() + y * layout.rowbytes;
  TVC_CHECK(decode_png_pixels(&d, rows.data()), "cannot decode PNG '", printable(path), "': ", printable(d.message));

  // 1: gray, 2: gray + alpha, 3: RGB, 4: RGBA. Gray is replicated and alpha dropped, as
  // convert("RGB") does (no compositing onto a background).
  Image image{.height = layout.height, .width = layout.width, .rgb = {}};
  const int64_t n = image.height * image.width;
  image.rgb.resize(static_cast<size_t>(n * 3));
  const int c = layout.channels;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* s = samples.data() + i * c;
    uint8_t* o = image.rgb.data() + i * 3;
    if (c >= 3) {
      o[0] = s[0], o[1] = s[1], o[2] = s[2];
    } else {
      o[0] = o[1] = o[2] = s[0];
    }
  }
  return image;
}

// ------------------------------------------------------------------ PIL's resampling
//
// libImaging/Resample.c, one path for every filter: for each output pixel, the input pixels
// within `support` of its center (the filter's support, times the scale when shrinking, which is
// the antialiasing) weighted by the filter, the weights normalised to sum 1 in double, then
// turned into integers with PRECISION_BITS fractional bits; sums start at half a unit (rounding)
// and are clipped to 0..255 after dropping the fractional bits. The filters differ only in their
// function and support.

constexpr int kPrecisionBits = 32 - 8 - 2;

// The triangle: support 1.
double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Keys' cubic convolution with a = -0.5: support 2, negative lobes between 1 and 2.
double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

struct Filter {
  double (*weight)(double x);
  double support;
};

Filter filter_of(Interpolation interpolation) {
  switch (interpolation) {
    case Interpolation::Bilinear:
      return {bilinear_filter, 1.0};
    case Interpolation::Bicubic:
      return {bicubic_filter, 2.0};
  }
  throw Error(cat_str("resize: unknown interpolation ", static_cast<int>(interpolation)));
}

// The taps of every output pixel along one axis: first[i], count[i] input pixels, and their
// fixed-point weights at weights[i * ksize ...].
struct Taps {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;
};

Taps precompute_taps(int in_size, int out_size, const Filter& filter) {
  // PIL's box is float[4] = (0, 0, in_size, ...): the scale is (double)(float(in_size) - 0.f) / out.
  const double scale = static_cast<double>(static_cast<float>(in_size)) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = filter.support * filterscale;
  Taps taps;
  taps.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out_size);
  taps.count.resize(out_size);
  taps.weights.assign(static_cast<size_t>(out_size) * taps.ksize, 0);
  std::vector<double> k(taps.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    // (int) truncates toward zero, as in C; negative starts are clamped to 0 anyway.
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[x] = filter.weight((x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    for (int x = 0; x < xmax; ++x) {
      if (ww != 0.0) k[x] /= ww;
      // normalize_coeffs_8bpc: round half away from zero to PRECISION_BITS fractional bits.
      const double scaled = k[x] * (1 << kPrecisionBits);
      taps.weights[static_cast<size_t>(xx) * taps.ksize + x] =
          static_cast<int32_t>(k[x] < 0 ? -0.5 + scaled : 0.5 + scaled);
    }
    taps.first[xx] = xmin;
    taps.count[xx] = xmax;
  }
  return taps;
}

// clip8: the sum without its fractional bits (an arithmetic shift: negative sums, which the
// negative lobes of bicubic give, round down), clamped to 0..255.
uint8_t clip8(int32_t sum) { return static_cast<uint8_t>(std::clamp(sum >> kPrecisionBits, 0, 255)); }

// The sums cannot overflow int32 (as in PIL): the weights add up to about 1 << PRECISION_BITS and
// their absolute values to less than 1.5 times that (bicubic's negative lobes), so a sum stays
// within +-1.5 * 256 << PRECISION_BITS < 2^31.
Image resample_horizontal(const Image& in, int out_width, const Filter& filter) {
  const Taps taps = precompute_taps(static_cast<int>(in.width), out_width, filter);
  Image out{.height = in.height, .width = out_width, .rgb = std::vector<uint8_t>(in.height * out_width * 3)};
  for (int64_t y = 0; y < in.height; ++y) {
    const uint8_t* row = in.rgb.data() + y * in.width * 3;
    uint8_t* o = out.rgb.data() + y * out_width * 3;
    for (int xx = 0; xx < out_width; ++xx) {
      const int32_t* k = taps.weights.data() + static_cast<size_t>(xx) * taps.ksize;
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      for (int x = 0; x < taps.count[xx]; ++x) {
        const uint8_t* p = row + (taps.first[xx] + x) * 3;
        s0 += p[0] * k[x];
        s1 += p[1] * k[x];
        s2 += p[2] * k[x];
      }
      o[xx * 3 + 0] = clip8(s0), o[xx * 3 + 1] = clip8(s1), o[xx * 3 + 2] = clip8(s2);
    }
  }
  return out;
}

Image resample_vertical(const Image& in, int out_height, const Filter& filter) {
  const Taps taps = precompute_taps(static_cast<int>(in.height), out_height, filter);
  const int64_t row_len = in.width * 3;
  Image out{.height = out_height, .width = in.width, .rgb = std::vector<uint8_t>(out_height * row_len)};
  for (int yy = 0; yy < out_height; ++yy) {
    const int32_t* k = taps.weights.data() + static_cast<size_t>(yy) * taps.ksize;
    uint8_t* o = out.rgb.data() + yy * row_len;
    for (int64_t i = 0; i < row_len; ++i) {  // each channel of each pixel of the row
      int32_t s = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < taps.count[yy]; ++y) s += in.rgb[(taps.first[yy] + y) * row_len + i] * k[y];
      o[i] = clip8(s);
    }
  }
  return out;
}

void check_image(const Image& image, const char* op) {
  TVC_CHECK(image.height > 0 && image.width > 0 && image.width <= kMaxImagePixels / image.height &&
                image.rgb.size() == static_cast<size_t>(image.height * image.width * 3),
            op, ": the image is ", image.width, "x", image.height, " with ", image.rgb.size(),
            " bytes (expected a non-empty RGB image of width * height * 3 bytes)");
}

}  // namespace

Image decode_image(const std::string& path) {
  std::vector<uint8_t> bytes = read_whole_file(path);
  static const uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff) return decode_jpeg(path, bytes);
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPngSignature, 8) == 0) return decode_png(path, bytes);
  throw Error(cat_str("cannot decode image '", printable(path),
                      "': ", bytes.empty() ? "the file is empty" : "not a JPEG or PNG file (unknown first bytes)"));
}

Image resize(const Image& image, int64_t width, int64_t height, Interpolation interpolation) {
  check_image(image, "resize");
  TVC_CHECK(width > 0 && height > 0 && width <= kMaxImagePixels / height, "resize: cannot resize to ", width, "x",
            height);
  const Filter filter = filter_of(interpolation);
  // ImagingResampleInner: the horizontal pass, then the vertical one, each skipped when that
  // side keeps its size; both skipped is a copy.
  Image out = image;
  if (width != image.width) out = resample_horizontal(out, static_cast<int>(width), filter);
  if (height != image.height) out = resample_vertical(out, static_cast<int>(height), filter);
  return out;
}

Image resize_shorter_side(const Image& image, int64_t size, Interpolation interpolation) {
  check_image(image, "resize_shorter_side");
  TVC_CHECK(size > 0, "resize_shorter_side: size must be positive, got ", size);
  const bool portrait = image.width <= image.height;
  const int64_t shorter = portrait ? image.width : image.height;
  const int64_t longer = portrait ? image.height : image.width;
  // int(size * long / short): Python's true division in double, truncated.
  const auto new_long = static_cast<int64_t>(static_cast<double>(size * longer) / static_cast<double>(shorter));
  const int64_t new_width = portrait ? size : new_long, new_height = portrait ? new_long : size;
  if (new_width == image.width && new_height == image.height) return image;
  return resize(image, new_width, new_height, interpolation);
}

Image center_crop(const Image& image, int64_t size) {
  check_image(image, "center_crop");
  TVC_CHECK(size > 0, "center_crop: size must be positive, got ", size);
  // Zero padding where the image is smaller: (crop - side) // 2 before, the rest after.
  const int64_t pad_left = size > image.width ? (size - image.width) / 2 : 0;
  const int64_t pad_top = size > image.height ? (size - image.height) / 2 : 0;
  const int64_t padded_width = std::max(image.width, size), padded_height = std::max(image.height, size);
  // int(round((side - crop) / 2.0)): halves go to the even neighbour, as Python's round does.
  auto offset = [](int64_t excess) { return excess / 2 + ((excess % 2 == 1 && (excess / 2) % 2 == 1) ? 1 : 0); };
  const int64_t top = offset(padded_height - size), left = offset(padded_width - size);
  // Output pixel (y, x) is padded pixel (top + y, left + x), i.e. image pixel (.. - pad_top, .. - pad_left).
  Image out{.height = size, .width = size, .rgb = std::vector<uint8_t>(static_cast<size_t>(size * size * 3), 0)};
  for (int64_t y = 0; y < size; ++y) {
    const int64_t iy = top + y - pad_top;
    if (iy < 0 || iy >= image.height) continue;
    for (int64_t x = 0; x < size; ++x) {
      const int64_t ix = left + x - pad_left;
      if (ix < 0 || ix >= image.width) continue;
      std::memcpy(&out.rgb[(y * size + x) * 3], &image.rgb[(iy * image.width + ix) * 3], 3);
    }
  }
  return out;
}

Tensor to_normalized_tensor(const Image& image, const std::array<double, 3>& mean, const std::array<double, 3>& std) {
  check_image(image, "to_normalized_tensor");
  Tensor out = empty({3, image.height, image.width});
  float* o = out.data_ptr<float>();
  const int64_t n = image.height * image.width;
  for (int c = 0; c < 3; ++c) {
    // float32 throughout, as torchvision: img.to(float) / 255, then .sub_(mean).div_(std) with
    // mean and std as float32 tensors.
    const auto m = static_cast<float>(mean[c]), s = static_cast<float>(std[c]);
    TVC_CHECK(s != 0.0f, "to_normalized_tensor: std[", c, "] is zero");
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(image.rgb[i * 3 + c]) / 255.0f;
      o[c * n + i] = (v - m) / s;
    }
  }
  return out;
}

Tensor preprocess(const Image& image, const Preprocessing& p) {
  return to_normalized_tensor(center_crop(resize_shorter_side(image, p.resize_size, p.interpolation), p.crop_size),
                              p.mean, p.std);
}

}  // namespace tvc::vision
