// Image decoding and preprocessing (tvc/vision/preprocess.h) against PIL 9.4 and torchvision
// 0.14 on the same files, stage by stage: the decoded pixels and PIL's bilinear and bicubic
// resizes exactly, the normalised tensor of weights.transforms() within err = ||a - b|| / ||b||
// <= 1e-3 and, for torchvision's tags, byte for byte; the tag table of the 47 models against
// torchvision's; malformed files; and `tvc predict` against torchvision on the same weights.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <sstream>
#include <utility>

#include "compare.h"
#include "test_helpers.h"
#include "torch_golden.h"
#include "tvc/models/models.h"
#include "tvc/models/weights.h"
#include "tvc/ops.h"
#include "tvc/serialize.h"
#include "tvc/vision/preprocess.h"

namespace tvc {
namespace {

using ::testing::HasSubstr;

// Writes the test images into dir and, from PIL and torchvision, what each stage gives for them
// into dir/goldens.safetensors:
//   NAME.decoded          Image.open(NAME).convert("RGB"), uint8 (H, W, 3)
//   NAME.resized.S        F.resize(img, [S]) (PIL's bilinear), uint8 (H', W', 3)
//   NAME.resized_bicubic.S  F.resize(img, [S], BICUBIC) (PIL's bicubic), uint8 (H', W', 3)
//   NAME.out.R.C          ImageClassification(crop_size=C, resize_size=R)(img), float32 (3, C, C)
//   NAME.tag.MODEL.TAG    get_model_weights(MODEL)[TAG].transforms()(img), float32 (3, C, C)
//   NAME.resize.WxH       img.resize((W, H), Image.BILINEAR), uint8
//   NAME.resize_bicubic.WxH  img.resize((W, H), Image.BICUBIC), uint8
//   NAME.crop.C           F.center_crop(img, [C]), uint8
// The images: random content with some structure (JPEG of quality 90, 4:2:0 and progressive
// 4:4:4, grayscale), PNGs in every 8-bit color type, 1-bit gray, 16-bit RGB (written by hand:
// PIL writes none), and small ones that are upscaled or padded; gray16.png (16-bit gray) and
// cmyk.jpg, both refused.
const char* kMakeImages = R"(
import numpy as np, struct, zlib
from PIL import Image
from safetensors.torch import save_file
import torchvision.transforms.functional as F
from torchvision.models import get_model_weights
from torchvision.transforms import InterpolationMode
from torchvision.transforms._presets import ImageClassification
d = DIR
rng = np.random.default_rng(1234)

def content(h, w):
    base = Image.fromarray(rng.integers(0, 256, (h // 16 + 2, w // 16 + 2, 3), dtype=np.uint8)).resize((w, h), Image.BILINEAR)
    noise = rng.integers(-30, 31, (h, w, 3))
    return np.clip(np.asarray(base).astype(np.int64) + noise, 0, 255).astype(np.uint8)

def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)

def write_png16(path, rgb16):
    h, w, _ = rgb16.shape
    raw = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in rgb16)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) +
                png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))

Image.fromarray(content(375, 500)).save(d + "land.jpg", quality=90)
Image.fromarray(content(400, 300)).save(d + "portrait.jpg", quality=90, subsampling=0, progressive=True)
Image.fromarray(content(240, 321)[:, :, 0]).save(d + "gray.jpg", quality=90)
Image.fromarray(content(80, 100)).save(d + "tiny.jpg", quality=90)
Image.fromarray(content(250, 333)).save(d + "rgb.png")
rgba = np.concatenate([content(300, 260), rng.integers(0, 256, (300, 260, 1), dtype=np.uint8)], axis=2)
Image.fromarray(rgba, "RGBA").save(d + "rgba.png")
Image.fromarray(content(260, 240)).quantize(colors=200).save(d + "palette.png", transparency=3)
Image.fromarray(content(233, 241)[:, :, 1]).convert("LA").save(d + "gray_alpha.png")
Image.fromarray(content(230, 250)[:, :, 2] > 128).save(d + "bits.png")
write_png16(d + "rgb16.png", rng.integers(0, 65536, (240, 250, 3)))
Image.fromarray(content(100, 90)).save(d + "small.png")
Image.fromarray(rng.integers(0, 65536, (20, 30)).astype(np.uint16)).save(d + "gray16.png")
Image.fromarray(content(20, 30)).convert("CMYK").save(d + "cmyk.jpg")

names = ["land.jpg", "portrait.jpg", "gray.jpg", "tiny.jpg", "rgb.png", "rgba.png", "palette.png",
         "gray_alpha.png", "bits.png", "rgb16.png", "small.png"]
out = {}
for name in names:
    img = Image.open(d + name).convert("RGB")
    out[name + ".decoded"] = torch.from_numpy(np.array(img))
    for size in (232, 256, 160):
        out[name + ".resized.%d" % size] = torch.from_numpy(np.array(F.resize(img, [size])))
    for size in (256, 480, 160):
        resized = F.resize(img, [size], interpolation=InterpolationMode.BICUBIC)
        out[name + ".resized_bicubic.%d" % size] = torch.from_numpy(np.array(resized))
    for r, c in ((232, 224), (256, 224), (160, 176)):
        out[name + ".out.%d.%d" % (r, c)] = ImageClassification(crop_size=c, resize_size=r)(img).contiguous()
    for model, tag in TAGS:
        out[name + ".tag.%s.%s" % (model, tag)] = get_model_weights(model)[tag].transforms()(img).contiguous()
for name, sizes in (("land.jpg", ((123, 457), (500, 100), (37, 375), (1000, 20), (499, 376))),
                    ("small.png", ((7, 5), (90, 300)))):
    img = Image.open(d + name).convert("RGB")
    for w, h in sizes:
        out[name + ".resize.%dx%d" % (w, h)] = torch.from_numpy(np.array(img.resize((w, h), Image.BILINEAR)))
        out[name + ".resize_bicubic.%dx%d" % (w, h)] = torch.from_numpy(np.array(img.resize((w, h), Image.BICUBIC)))
for name in ("small.png", "tiny.jpg"):
    img = Image.open(d + name).convert("RGB")
    for c in (224, 95, 84, 81, 79):
        out[name + ".crop.%d" % c] = torch.from_numpy(np.array(F.center_crop(img, [c])))
save_file(out, d + "goldens.safetensors")
print("ok")
)";

// torchvision tags whose transforms are checked byte for byte: bicubic shrinking the larger
// images and enlarging tiny.jpg and small.png (efficientnet_b0, swin_s, vit_b_16's SWAG linear
// with crop = resize), bicubic enlarging every image (efficientnet_v2_l, 480, its own mean and
// std), and bilinear at the new models' sizes (efficientnet_b1 V2 255/240, convnext_tiny 236).
const std::vector<std::pair<std::string, std::string>> kTags = {
    {"efficientnet_b0", "IMAGENET1K_V1"},      {"swin_s", "IMAGENET1K_V1"},
    {"vit_b_16", "IMAGENET1K_SWAG_LINEAR_V1"}, {"efficientnet_v2_l", "IMAGENET1K_V1"},
    {"efficientnet_b1", "IMAGENET1K_V2"},      {"convnext_tiny", "IMAGENET1K_V1"}};

const std::vector<std::string> kImages = {"land.jpg", "portrait.jpg", "gray.jpg",    "tiny.jpg",
                                          "rgb.png",  "rgba.png",     "palette.png", "gray_alpha.png",
                                          "bits.png", "rgb16.png",    "small.png"};

class Preprocess : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    std::string code = kMakeImages;
    std::string tags = "TAGS = [";
    for (const auto& [model, tag] : kTags) tags += cat_str("('", model, "', '", tag, "'), ");
    code.replace(code.find("d = DIR"), 0, tags + "]\n");
    std::string quoted = "'";
    quoted += *dir_ / "";
    quoted += "'";
    code.replace(code.find("DIR"), 3, quoted);
    ok_ = test::torch_run_uncached(code) == "ok\n";
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(ok_) << "the Python script making the images failed"; }

  static std::string path(const std::string& name) { return *dir_ / name; }
  static Tensor golden(const std::string& key) {
    return io::SafetensorsFile::open(path("goldens.safetensors")).tensor(key);
  }

  static test::TempDir* dir_;
  static bool ok_;
};
test::TempDir* Preprocess::dir_ = nullptr;
bool Preprocess::ok_ = false;

// Where two uint8 images differ: "" when equal, else the count and the largest difference.
std::string pixel_diff(const vision::Image& ours, const Tensor& want) {
  if (want.shape() != Shape{ours.height, ours.width, 3})
    return cat_str("shape ", Shape{ours.height, ours.width, 3}, " vs PIL's ", want.shape());
  Tensor w = want.contiguous();
  const uint8_t* p = w.data_ptr<uint8_t>();
  int64_t differing = 0, largest = 0;
  for (size_t i = 0; i < ours.rgb.size(); ++i) {
    int64_t d = std::abs(int64_t{ours.rgb[i]} - int64_t{p[i]});
    differing += d != 0;
    largest = std::max(largest, d);
  }
  return differing == 0 ? "" : cat_str(differing, " of ", ours.rgb.size(), " values differ, by up to ", largest);
}

TEST_F(Preprocess, DecodingGivesPilsPixels) {
  for (const auto& name : kImages) {
    vision::Image image = vision::decode_image(path(name));
    EXPECT_EQ(pixel_diff(image, golden(name + ".decoded")), "") << name;
  }
}

TEST_F(Preprocess, ResizeGivesPilsPixels) {
  for (const auto& name : kImages) {
    vision::Image image = vision::decode_image(path(name));
    for (int64_t size : {232, 256, 160})
      EXPECT_EQ(pixel_diff(vision::resize_shorter_side(image, size), golden(cat_str(name, ".resized.", size))), "")
          << name << " resized to " << size;
  }
  for (const auto& [name, sizes] : std::vector<std::pair<std::string, std::vector<std::pair<int, int>>>>{
           {"land.jpg", {{123, 457}, {500, 100}, {37, 375}, {1000, 20}, {499, 376}}},
           {"small.png", {{7, 5}, {90, 300}}}}) {
    vision::Image image = vision::decode_image(path(name));
    for (auto [w, h] : sizes)
      EXPECT_EQ(pixel_diff(vision::resize(image, w, h, models::Interpolation::Bilinear),
                           golden(cat_str(name, ".resize.", w, "x", h))),
                "")
          << name << " resized to " << w << "x" << h;
  }
}

// PIL's bicubic (negative lobes, so sums below 0 and above 255 that clip) through the same path.
TEST_F(Preprocess, BicubicResizeGivesPilsPixels) {
  for (const auto& name : kImages) {
    vision::Image image = vision::decode_image(path(name));
    for (int64_t size : {256, 480, 160})
      EXPECT_EQ(pixel_diff(vision::resize_shorter_side(image, size, models::Interpolation::Bicubic),
                           golden(cat_str(name, ".resized_bicubic.", size))),
                "")
          << name << " resized (bicubic) to " << size;
  }
  for (const auto& [name, sizes] : std::vector<std::pair<std::string, std::vector<std::pair<int, int>>>>{
           {"land.jpg", {{123, 457}, {500, 100}, {37, 375}, {1000, 20}, {499, 376}}},
           {"small.png", {{7, 5}, {90, 300}}}}) {
    vision::Image image = vision::decode_image(path(name));
    for (auto [w, h] : sizes)
      EXPECT_EQ(pixel_diff(vision::resize(image, w, h, models::Interpolation::Bicubic),
                           golden(cat_str(name, ".resize_bicubic.", w, "x", h))),
                "")
          << name << " resized (bicubic) to " << w << "x" << h;
  }
}

TEST_F(Preprocess, CenterCropPadsAndRoundsAsTorchvision) {
  for (const std::string name : {"small.png", "tiny.jpg"}) {
    vision::Image image = vision::decode_image(path(name));
    for (int64_t size : {224, 95, 84, 81, 79})
      EXPECT_EQ(pixel_diff(vision::center_crop(image, size), golden(cat_str(name, ".crop.", size))), "")
          << name << " cropped to " << size;
  }
}

TEST_F(Preprocess, MatchesTorchvisionTransforms) {
  const models::Preprocessing r50_default = models::weights_tag("resnet50", "DEFAULT").preprocessing;
  const models::Preprocessing r50_v1 = models::weights_tag("resnet50", "IMAGENET1K_V1").preprocessing;
  const models::Preprocessing mnv3 = models::weights_tag("mobilenet_v3_small", "DEFAULT").preprocessing;
  ASSERT_EQ(r50_default.resize_size, 232);
  ASSERT_EQ(r50_v1.resize_size, 256);
  ASSERT_EQ(mnv3.resize_size, 256);
  // Not a torchvision tag: a crop larger than the resize, so the crop pads.
  models::Preprocessing padded = r50_v1;
  padded.resize_size = 160;
  padded.crop_size = 176;
  double worst = 0;
  for (const auto& name : kImages) {
    vision::Image image = vision::decode_image(path(name));
    for (const auto& p : {r50_default, r50_v1, mnv3, padded}) {
      Tensor want = golden(cat_str(name, ".out.", p.resize_size, ".", p.crop_size));
      Tensor got = vision::preprocess(image, p);
      ASSERT_EQ(got.shape(), want.shape()) << name;
      ASSERT_EQ(got.dtype(), DType::Float32);
      double err = test::relative_error(got, want);
      worst = std::max(worst, err);
      EXPECT_LE(err, 1e-3) << name << " with resize " << p.resize_size << ", crop " << p.crop_size;
    }
  }
  std::printf("largest err of preprocess against torchvision: %.3g\n", worst);
  RecordProperty("largest_err", cat_str(worst));
}

// weights.transforms() of torchvision's tags, bicubic and bilinear, byte for byte (err 0).
TEST_F(Preprocess, TagTransformsAreTorchvisionsByteForByte) {
  for (const auto& [model, tag] : kTags) {
    const models::Preprocessing& p = models::weights_tag(model, tag).preprocessing;
    for (const auto& name : kImages) {
      Tensor want = golden(cat_str(name, ".tag.", model, ".", tag));
      Tensor got = vision::preprocess(vision::decode_image(path(name)), p);
      ASSERT_EQ(got.shape(), want.shape()) << name << " with " << model << " " << tag;
      EXPECT_TRUE(test::tensor_bytes(got) == test::tensor_bytes(want))
          << name << " with " << model << " " << tag << " (" << models::interpolation_name(p.interpolation) << "): err "
          << test::relative_error(got, want);
    }
  }
}

// Every malformed file is a tvc::Error naming the file and what is wrong with it.
TEST_F(Preprocess, MalformedFilesAreErrors) {
  auto error_for = [](const std::string& file, const std::string& bytes) {
    test::write_file(path(file), bytes);
    return test::error_of([&] { vision::decode_image(path(file)); });
  };
  std::string jpeg = test::read_file(path("land.jpg")), png = test::read_file(path("rgb.png"));

  EXPECT_THAT(test::error_of([] { vision::decode_image(path("absent.jpg")); }),
              HasSubstr("cannot open image '" + path("absent.jpg") + "': No such file or directory"));
  EXPECT_THAT(error_for("empty.jpg", ""), HasSubstr("'" + path("empty.jpg") + "': the file is empty"));
  EXPECT_THAT(error_for("notes.jpg", "these are not pixels\n"),
              HasSubstr("cannot decode image '" + path("notes.jpg") + "': not a JPEG or PNG file"));
  EXPECT_THAT(error_for("cut.jpg", jpeg.substr(0, jpeg.size() / 2)),
              HasSubstr("cannot decode JPEG '" + path("cut.jpg") + "': Premature end of JPEG file"));
  EXPECT_THAT(error_for("header_only.jpg", jpeg.substr(0, 200)),
              HasSubstr("cannot decode JPEG '" + path("header_only.jpg") + "'"));
  // The frame header (SOF0: FF C0, length, precision, height, width) claiming 60000 x 60000.
  std::string huge = jpeg;
  size_t sof = huge.find("\xff\xc0");
  ASSERT_NE(sof, std::string::npos);
  huge.replace(sof + 5, 4, "\xea\x60\xea\x60");
  EXPECT_THAT(error_for("huge.jpg", huge), HasSubstr("'" + path("huge.jpg") + "': 60000x60000 pixels is more than"));

  // The first IDAT chunk (length, "IDAT", data, CRC) with a wrong CRC, then with corrupt data.
  size_t idat = png.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  const size_t idat_length = (size_t{uint8_t(png[idat - 4])} << 24) | (size_t{uint8_t(png[idat - 3])} << 16) |
                             (size_t{uint8_t(png[idat - 2])} << 8) | size_t{uint8_t(png[idat - 1])};
  std::string bad_crc = png;
  bad_crc[idat + 4 + idat_length] = static_cast<char>(bad_crc[idat + 4 + idat_length] ^ 0x5a);
  EXPECT_THAT(error_for("bad_crc.png", bad_crc),
              HasSubstr("cannot decode PNG '" + path("bad_crc.png") + "': IDAT: CRC error"));
  std::string bad_data = png;
  bad_data[idat + 10] = static_cast<char>(bad_data[idat + 10] ^ 0x5a);
  EXPECT_THAT(error_for("bad_data.png", bad_data),
              HasSubstr("cannot decode PNG '" + path("bad_data.png") + "': IDAT: "));
  EXPECT_THAT(test::error_of([] { vision::decode_image(path("cmyk.jpg")); }),
              HasSubstr("cannot decode JPEG '" + path("cmyk.jpg") + "': it has 4 color components"));
  EXPECT_THAT(test::error_of([] { vision::decode_image(path("gray16.png")); }),
              HasSubstr("cannot decode PNG '" + path("gray16.png") + "': 16-bit grayscale PNGs are not supported"));
  EXPECT_THAT(error_for("cut.png", png.substr(0, png.size() / 2)),
              HasSubstr("cannot decode PNG '" + path("cut.png") + "': the file is truncated"));
  // A valid IHDR claiming 15000 x 15000 pixels (under kMaxImagePixels) over 1000 bytes of image data:
  // refused from the file's size before the rows are allocated.
  std::string liar = test::torch_run_uncached(R"(
import struct, zlib, sys
ihdr = struct.pack(">IIBBBBB", 15000, 15000, 8, 2, 0, 0, 0)
chunk = lambda k, d: struct.pack(">I", len(d)) + k + d + struct.pack(">I", zlib.crc32(k + d) & 0xffffffff)
sys.stdout.write((b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 1000)) + chunk(b"IEND", b"")).hex())
)");
  std::string liar_bytes;
  for (size_t i = 0; i + 1 < liar.size(); i += 2)
    liar_bytes += static_cast<char>(std::stoi(liar.substr(i, 2), nullptr, 16));
  EXPECT_THAT(error_for("liar.png", liar_bytes), HasSubstr("cannot decode PNG '" + path("liar.png") +
                                                           "': its header gives 15000x15000 pixels, more than its"));
}

// The 47 backbones of tvc (docs/models.md), registered or not yet.
const std::vector<std::string> kAllModels = {"resnet18",
                                             "resnet34",
                                             "resnet50",
                                             "resnet101",
                                             "resnet152",
                                             "wide_resnet50_2",
                                             "wide_resnet101_2",
                                             "resnext50_32x4d",
                                             "resnext101_32x8d",
                                             "resnext101_64x4d",
                                             "vgg11",
                                             "vgg13",
                                             "vgg16",
                                             "vgg19",
                                             "vgg11_bn",
                                             "vgg13_bn",
                                             "vgg16_bn",
                                             "vgg19_bn",
                                             "densenet121",
                                             "densenet161",
                                             "densenet169",
                                             "densenet201",
                                             "mobilenet_v2",
                                             "mobilenet_v3_small",
                                             "mobilenet_v3_large",
                                             "efficientnet_b0",
                                             "efficientnet_b1",
                                             "efficientnet_b2",
                                             "efficientnet_b3",
                                             "efficientnet_b4",
                                             "efficientnet_b5",
                                             "efficientnet_b6",
                                             "efficientnet_b7",
                                             "efficientnet_v2_s",
                                             "efficientnet_v2_m",
                                             "efficientnet_v2_l",
                                             "convnext_tiny",
                                             "convnext_small",
                                             "convnext_base",
                                             "convnext_large",
                                             "vit_b_16",
                                             "vit_b_32",
                                             "vit_l_16",
                                             "vit_l_32",
                                             "swin_t",
                                             "swin_s",
                                             "swin_b"};

// Every model's tags, in torchvision's order, with torchvision's default, file, sizes, mean, std
// and interpolation; tags need no registered model, and every registered model is one of the 47.
TEST(PreprocessTags, EveryModelHasTorchvisionsTags) {
  ASSERT_EQ(kAllModels.size(), 47u);
  std::string names;
  for (const auto& m : kAllModels) names += m + " ";
  nlohmann::json want = test::torch_json(R"(
import json
from torchvision.models import get_model_weights
out = {}
for model in ")" + names + R"(".split():
    weights = get_model_weights(model)
    out[model] = []
    for w in weights:
        t = w.transforms()
        out[model].append({"tag": w.name, "default": w.name == weights.DEFAULT.name, "file": w.url.rsplit("/", 1)[1],
                           "resize": t.resize_size, "crop": t.crop_size, "mean": t.mean, "std": t.std,
                           "interpolation": t.interpolation.value})
print(json.dumps(out))
)");
  ASSERT_FALSE(want.is_null());
  for (const auto& model : kAllModels) {
    SCOPED_TRACE(model);
    const nlohmann::json& tags = want.at(model);
    std::vector<std::string> want_names;
    for (const auto& t : tags) want_names.push_back(t.at("tag").get<std::string>());
    EXPECT_EQ(models::weights_tags(model), want_names);
    for (const auto& t : tags) {
      const std::string name = t.at("tag").get<std::string>();
      SCOPED_TRACE(name);
      const models::WeightsTag& ours = models::weights_tag(model, name);
      if (t.at("default").get<bool>()) {
        EXPECT_EQ(&models::weights_tag(model, "DEFAULT"), &ours);
      }
      EXPECT_EQ(ours.is_default, t.at("default").get<bool>());
      EXPECT_EQ(ours.file_name, t.at("file").get<std::string>());
      const models::Preprocessing& p = ours.preprocessing;
      EXPECT_EQ(std::vector<int64_t>{p.resize_size}, t.at("resize").get<std::vector<int64_t>>());
      EXPECT_EQ(std::vector<int64_t>{p.crop_size}, t.at("crop").get<std::vector<int64_t>>());
      EXPECT_EQ(std::vector<double>(p.mean.begin(), p.mean.end()), t.at("mean").get<std::vector<double>>());
      EXPECT_EQ(std::vector<double>(p.std.begin(), p.std.end()), t.at("std").get<std::vector<double>>());
      EXPECT_EQ(models::interpolation_name(p.interpolation), t.at("interpolation").get<std::string>());
    }
  }
  for (const auto& model : models::list())
    EXPECT_NE(std::find(kAllModels.begin(), kAllModels.end(), model), kAllModels.end()) << model;
  // A name neither tagged nor registered is still an unknown model.
  EXPECT_THAT(test::error_of([] { models::weights_tags("efficientnet_b9"); }),
              HasSubstr("unknown model 'efficientnet_b9'"));
  EXPECT_THAT(test::error_of([] { models::weights_tag("swin_t", "IMAGENET1K_V2"); }),
              HasSubstr("swin_t has no weights tagged 'IMAGENET1K_V2' (its tags: DEFAULT, IMAGENET1K_V1)"));
}

// tvc predict with random resnet18 weights standing in for torchvision's file: five classes per
// image, sorted, named, with torchvision's probabilities for the same weights and images.
TEST_F(Preprocess, PredictPrintsTorchvisionsTopFive) {
  test::TempDir home;
  std::filesystem::create_directories(home / "hub/checkpoints");
  manual_seed(11);
  models::BackbonePtr model = models::create("resnet18");
  const std::string weights = home / "hub/checkpoints/resnet18-f37072fd.pth";
  io::save_pth(weights, io::Value(model->state_dict()));
  const std::vector<std::string> images = {path("land.jpg"), path("palette.png"), path("gray.jpg")};
  std::string args = "predict resnet18 --weights DEFAULT";
  for (const auto& image : images) args += " " + image;
  test::TvcRun run = test::run_tvc(home, args, "export TORCH_HOME=" + home.path().string() + "; ");
  ASSERT_EQ(run.status, 0) << run.err;

  nlohmann::json torch_probs = test::torch_json(cat_str(R"(
import json, torchvision
from PIL import Image
from torchvision.models import ResNet18_Weights
model = torchvision.models.resnet18()
model.load_state_dict(torch.load(')",
                                                        weights, R"('))
model.eval()
t = ResNet18_Weights.DEFAULT.transforms()
x = torch.stack([t(Image.open(p).convert("RGB")) for p in )",
                                                        nlohmann::json(images).dump(), R"(])
with torch.no_grad():
    print(json.dumps((torch.softmax(model(x), 1) * 100).tolist()))
)"));
  ASSERT_EQ(torch_probs.size(), images.size());

  std::istringstream out(run.out);
  std::string line;
  const std::regex row(R"(  ( *\d+\.\d\d)%  (\d+)  (.+))");
  const auto& names = models::imagenet_categories();
  for (size_t i = 0; i < images.size(); ++i) {
    ASSERT_TRUE(std::getline(out, line));
    EXPECT_EQ(line, images[i]);
    std::vector<double> want(torch_probs[i].begin(), torch_probs[i].end());
    std::vector<double> want_sorted = want;
    std::sort(want_sorted.rbegin(), want_sorted.rend());
    double previous = 101, total = 0;
    for (int j = 0; j < 5; ++j) {
      ASSERT_TRUE(std::getline(out, line));
      std::smatch m;
      ASSERT_TRUE(std::regex_match(line, m, row)) << "'" << line << "'";
      double prob = std::stod(m[1]);
      size_t cls = std::stoul(m[2]);
      ASSERT_LT(cls, names.size());
      EXPECT_EQ(m[3].str(), names[cls]);
      EXPECT_LE(prob, previous);
      previous = prob;
      total += prob;
      // torchvision's probability of the same class, and its j-th largest (robust to near ties).
      EXPECT_NEAR(prob, want[cls], 0.006) << images[i] << " class " << cls;
      EXPECT_NEAR(prob, want_sorted[j], 0.006) << images[i] << " rank " << j;
    }
    EXPECT_LE(total, 100.03);
  }
  EXPECT_FALSE(std::getline(out, line)) << "extra output: " << line;

  // An image that is not one: exit status 1, the file named.
  test::write_file(home / "notes.jpg", "not an image");
  test::TvcRun bad = test::run_tvc(home, "predict resnet18 --weights DEFAULT " + (home / "notes.jpg"),
                                   "export TORCH_HOME=" + home.path().string() + "; ");
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("error: cannot decode image '" + (home / "notes.jpg") + "': not a JPEG or PNG file"));
}

}  // namespace
}  // namespace tvc
