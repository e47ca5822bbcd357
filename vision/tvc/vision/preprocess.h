// Images into a classifier's input, as torchvision's weights.transforms() prepares them (library
// tvc-vision: the only one that needs libjpeg and libpng).
//
//   tvc::vision::Image image = tvc::vision::decode_image("cat.jpg");  // = PIL's .convert("RGB")
//   const auto& prep = tvc::models::weights_tag("resnet50", "DEFAULT").preprocessing;
//   tvc::Tensor x = tvc::vision::preprocess(image, prep);            // float32 (3, 224, 224)
//
// Every step gives the same values as torchvision 0.14 on a PIL 9.4 image: decoding through the
// same libjpeg/libpng with PIL's settings, PIL's antialiased bilinear or bicubic resize (the
// same 8-bit fixed-point arithmetic, so the same uint8 pixels), torchvision's center crop (zero
// padding when the image is smaller) and its float32 normalisation.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tvc/models/weights.h"
#include "tvc/tensor.h"

namespace tvc::vision {

// An 8-bit RGB image, rows top to bottom, pixels left to right, channels R, G, B (HWC).
struct Image {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> rgb{};  // height * width * 3
};

// The most pixels an image may have (decoding refuses larger headers before allocating).
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

// Decodes a JPEG or PNG file (chosen by its first bytes) into RGB, with the pixels of PIL's
// Image.open(path).convert("RGB"): grayscale is replicated, alpha dropped (not composited),
// palettes looked up, 16-bit samples keep their high byte; no EXIF rotation, no gamma. Refused
// with a tvc::Error naming the file and the fault: a missing, empty, truncated or corrupt file,
// another format, CMYK JPEGs, 16-bit grayscale PNGs, more than kMaxImagePixels pixels.
Image decode_image(const std::string& path);

// PIL's Image.resize((width, height), Image.BILINEAR or Image.BICUBIC) of an RGB image:
// antialiased (the filter widens by the scale when shrinking), horizontal pass then vertical,
// each rounded to uint8 (bicubic's overshoot clipped to 0..255). The two interpolations share
// one resampling path; only the filter differs.
Image resize(const Image& image, int64_t width, int64_t height, models::Interpolation interpolation);

// torchvision's F.resize(img, [size], interpolation) of a PIL image: the shorter side becomes
// size, the longer int(size * long / short); an image already that size is returned as it is.
Image resize_shorter_side(const Image& image, int64_t size,
                          models::Interpolation interpolation = models::Interpolation::Bilinear);

// torchvision's F.center_crop(img, [size]) of a PIL image: zero padding (left/top get the
// smaller half) where the image is smaller than size, then the crop at
// int(round((side - size) / 2.0)) (Python's round: halves to even).
Image center_crop(const Image& image, int64_t size);

// The float32 (3, H, W) tensor of an image: each value / 255, minus mean[c], divided by std[c],
// in float32 as torchvision's convert_image_dtype and normalize compute it.
Tensor to_normalized_tensor(const Image& image, const std::array<double, 3>& mean, const std::array<double, 3>& std);

// weights.transforms()(image): resize_shorter_side(resize_size, interpolation),
// center_crop(crop_size), to_normalized_tensor(mean, std). float32 (3, crop_size, crop_size).
Tensor preprocess(const Image& image, const models::Preprocessing& p);

}  // namespace tvc::vision
