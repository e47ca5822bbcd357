// Recipes of `tvc train` (tools/recipe.h): files, flags, errors naming the key, the YAML round trip.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "recipe.h"
#include "tvc/error.h"

namespace tvc::tools {
namespace {

namespace fs = std::filesystem;

// A recipe file with the given text, removed with the fixture.
class RecipeFile : public ::testing::Test {
 protected:
  std::string write(const std::string& text, const std::string& name = "recipe.yaml") {
    dir_ = fs::temp_directory_path() / ("tvc-recipe-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(RecipeFile, YamlAndJsonGiveTheSameRecipe) {
  Recipe y = load_recipe(write(R"(backbone: resnet18
patches: {layer3: {wrap: se}, layer2.1: {inject: {type: eca}}}
image_size: 32
unfreeze_stages: [2, 3]
freeze_backbone: true
optimizer: adamw
lr: 0.001
ema: {decay: 0.99, every: 2}
)"));
  Recipe j = load_recipe(write(R"({"backbone": "resnet18", "patches": {"layer3": {"wrap": "se"},
  "layer2.1": {"inject": {"type": "eca"}}}, "image_size": 32, "unfreeze_stages": [2, 3],
  "freeze_backbone": true, "optimizer": "adamw", "lr": 0.001, "ema": {"decay": 0.99, "every": 2}})",
                               "recipe.json"));
  EXPECT_EQ(recipe_to_yaml(y), recipe_to_yaml(j));
  EXPECT_EQ(y.backbone, "resnet18");
  // Patches keep the file's order (they apply in it).
  EXPECT_EQ(y.patches, R"({"layer3":{"wrap":"se"},"layer2.1":{"inject":{"type":"eca"}}})");
  EXPECT_EQ(y.image_size, 32);
  EXPECT_EQ(y.unfreeze_stages, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(y.optimizer, "adamw");
  EXPECT_DOUBLE_EQ(y.lr, 0.001);
  ASSERT_TRUE(y.ema.has_value());
  EXPECT_DOUBLE_EQ(y.ema->decay, 0.99);
  EXPECT_EQ(y.ema->every, 2);
  EXPECT_EQ(y.ema->warmup, "timm");  // the default
  EXPECT_FALSE(y.swa.has_value());
}

TEST_F(RecipeFile, TheYamlOfARecipeLoadsBackEqual) {
  Recipe r;
  r.backbone = "convnext_tiny";
  r.patches = R"({"features.3":{"wrap":"layer_scale"}})";
  r.swa = SwaRecipe{.start_epoch = 1, .swa_lr = 0.01, .anneal_epochs = 2, .anneal_strategy = "linear"};
  r.crop_scale = {0.3, 0.9};
  r.lr = 0.123456789012345;
  r.out = "some dir/with: colon";
  const std::string text = recipe_to_yaml(r);
  Recipe back = load_recipe(write(text));
  EXPECT_EQ(recipe_to_yaml(back), text);
  EXPECT_EQ(back.lr, r.lr);  // doubles round-trip exactly
  EXPECT_EQ(back.out, r.out);
  ASSERT_TRUE(back.swa.has_value());
  EXPECT_EQ(back.swa->anneal_strategy, "linear");
}

TEST_F(RecipeFile, AMisspeltKeyIsAnErrorNamingItAndTheNearestKey) {
  std::string path = write("backbone: resnet18\nbatch_szie: 32\n");
  std::string e = error_of([&] { load_recipe(path); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'batch_szie'; did you mean 'batch_size'?"), std::string::npos) << e;
  e = error_of([&] { load_recipe(write("ema: {decay: 0.9, warmpu: timm}\n")); });
  EXPECT_NE(e.find("unknown key 'ema.warmpu'"), std::string::npos) << e;
  EXPECT_NE(e.find("decay, warmup, every"), std::string::npos) << e;
}

TEST_F(RecipeFile, BadValuesAreErrorsNamingTheKeyAndTheAllowedValues) {
  EXPECT_NE(error_of([&] {
              load_recipe(write("optimizer: rmsprop\n"));
            }).find("'optimizer' must be one of sgd, adamw, adam; got 'rmsprop'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_recipe(write("epochs: 0\n")); }).find("'epochs' must be in [1, 1000000], got 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_recipe(write("lr: fast\n")); }).find("'lr' must be a number, got 'fast'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_recipe(write("backbone: resnet19\n")); }).find("did you mean 'resnet18'"),
            std::string::npos);
  // (A patch's target path is checked when the model is built, before training starts.)
  EXPECT_NE(error_of([&] { load_recipe(write("patches: {layer3: {wrap: se, replace: se}}\n")); }).find("'patches'"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { load_recipe(write("ema: {decay: 0.9}\nswa: {start_epoch: 1}\n")); }).find("exclude each other"),
      std::string::npos);
  EXPECT_NE(error_of([&] { load_recipe(write("unfreeze_stages: [3]\n")); }).find("needs 'freeze_backbone: true'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_recipe(write("- a list\n")); }).find("a recipe is a map"), std::string::npos);
  EXPECT_NE(error_of([&] { load_recipe(write("lr: [unclosed\n")); }).find("not valid YAML or JSON"), std::string::npos);
  EXPECT_NE(error_of([] { load_recipe("/no/such/recipe.yaml"); }).find("/no/such/recipe.yaml: no such file"),
            std::string::npos);
}

TEST(Recipe, FlagsSetKeysWithDashesDotsAndTheFirstTrainsSpellings) {
  Recipe r = load_recipe("small_cnn");
  EXPECT_EQ(r.backbone, "small_cnn");
  EXPECT_EQ(r.optimizer, "adam");
  EXPECT_DOUBLE_EQ(r.lr, 0.002);
  set_recipe_key(r, "batch-size", "32");
  set_recipe_key(r, "data-dir", "/tmp/fm");
  set_recipe_key(r, "ema", "0.99");  // --ema D sets ema.decay
  EXPECT_EQ(r.batch_size, 32);
  EXPECT_EQ(r.fashion_mnist_dir, "/tmp/fm");
  ASSERT_TRUE(r.ema.has_value());
  EXPECT_DOUBLE_EQ(r.ema->decay, 0.99);
  set_recipe_key(r, "ema.every", "4");
  EXPECT_EQ(r.ema->every, 4);
  EXPECT_DOUBLE_EQ(r.ema->decay, 0.99);                           // a field keeps the others
  set_recipe_key(r, "patches", R"({"layer3": {"wrap": "se"}})");  // JSON text on the command line
  EXPECT_EQ(r.patches, R"({"layer3":{"wrap":"se"}})");
  set_recipe_key(r, "unfreeze_stages", "[1, 2]");
  EXPECT_EQ(r.unfreeze_stages, (std::vector<int64_t>{1, 2}));
  EXPECT_NE(error_of([&] {
              set_recipe_key(r, "batch-szie", "3");
            }).find("--batch-szie: unknown key 'batch_szie'; did you mean 'batch_size'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { set_recipe_key(r, "ema", "1.5"); }).find("'ema.decay' must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { set_recipe_key(r, "lr.x", "1"); }).find("only ema and swa have fields"), std::string::npos);
}

TEST(Recipe, TheRepositorysMainRecipeLoads) {
  Recipe r = load_recipe(std::string(TVC_SOURCE_ROOT) + "/recipes/fashion_resnet18_se_ema.yaml");
  EXPECT_EQ(r.backbone, "resnet18");
  EXPECT_EQ(r.patches, R"({"layer3":{"wrap":"se"}})");
  ASSERT_TRUE(r.ema.has_value());
  EXPECT_TRUE(r.data.empty());  // Fashion-MNIST
}

}  // namespace
}  // namespace tvc::tools
