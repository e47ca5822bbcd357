// The tvc command-line program.
//
//   tvc train [--recipe FILE|small_cnn] [--resume DIR] [--KEY VALUE ...]   (tools/recipe.h)
//   tvc eval RUN_OR_RECIPE --weights W [--data DIR] [--svg FILE]
//   tvc list
//   tvc bench MODEL [--batch N] [--size S] [--train] [--dtype float32|bfloat16] [--threads T] [--iterations K]
//             [--verbose]
//   tvc run MODEL --weights W --input X.safetensors --output Y.safetensors [--num-classes N]
//           [--train-mode] [--features]
//   tvc run BACKBONE --hybrid [--patches JSON] [--dropout P] --num-classes N --weights W
//           --input X.safetensors --output Y.safetensors [--features]
//   tvc backbones | tvc blocks | tvc info BACKBONE
//   tvc explain BACKBONE [--patches JSON] [--num-classes N] [--dropout P]
//   tvc predict MODEL --weights W [--preprocess-tag TAG] IMAGE...
//   tvc predict --recipe RUN --weights W IMAGE...
//   tvc inspect FILE [--widen] [--opaque]
//   tvc convert IN OUT [--dtype float16|bfloat16|float32] [--widen] [--unwrap] [--opaque]
//   tvc average --out OUT [--swa | --ema DECAY] [--use-buffers] [--plain] FILE...
//
// Exit status: 0 on success, 1 on an error (printed as `error: <message>` on stderr), 2 on a
// usage error (unknown option, bad value).
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "bench_cli.h"
#include "fashion_mnist.h"
#include "hybrid_cli.h"
#include "models_cli.h"
#include "recipe.h"
#include "trainer.h"
#include "tvc/dist/communicator.h"
#include "tvc/error.h"
#include "weights_cli.h"

namespace {

constexpr const char* kOpaqueHelp =
    "Read objects of classes outside the allow-list (Lightning and timm checkpoints, whole-model saves) as data: "
    "nothing from the file is imported or run";

// `tvc train`: the recipe (the file, or small_cnn without --recipe and --backbone) with the
// flags' keys applied, run by the small CNN's loop or the trainer. A bad key or value is a usage
// error (exit status 2).
int run_train(const std::string& recipe_name, const std::string& resume, const std::vector<std::string>& flags) {
  std::vector<std::pair<std::string, std::string>> keys;
  for (size_t i = 0; i < flags.size(); ++i) {
    const std::string& f = flags[i];
    if (f.rfind("--", 0) != 0 || f.size() == 2) {
      std::fprintf(stderr, "error: train: unexpected argument '%s' (flags are --KEY VALUE)\n",
                   tvc::printable(f).c_str());
      return 2;
    }
    std::string key = f.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < flags.size() && flags[i + 1].rfind("--", 0) != 0) {
      value = flags[++i];
    } else {
      value = "true";  // a bare flag: --nesterov, --freeze-backbone
    }
    keys.emplace_back(key, value);
  }
  tvc::tools::Recipe recipe;
  try {
    const bool backbone_flag =
        std::any_of(keys.begin(), keys.end(), [](const auto& k) { return k.first == "backbone"; });
    if (!resume.empty()) {
      recipe = tvc::tools::load_recipe((std::filesystem::path(resume) / "recipe.yaml").string());
      for (const auto& [key, value] : keys)
        TVC_CHECK(key == "threads" || key == "workers" || key == "rank_timeout" || key == "rank-timeout",
                  "train --resume: --", key,
                  " cannot change a run midway (only --threads, --workers and --rank-timeout)");
    } else if (!recipe_name.empty()) {
      recipe = tvc::tools::load_recipe(recipe_name);
    } else if (!backbone_flag || std::any_of(keys.begin(), keys.end(), [](const auto& k) {
                 return k.first == "backbone" && k.second == "small_cnn";
               })) {
      recipe = tvc::tools::load_recipe("small_cnn");
    }
    for (const auto& [key, value] : keys) tvc::tools::set_recipe_key(recipe, key, value);
    tvc::tools::check_recipe(recipe);
  } catch (const tvc::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  // Under mpirun/srun each process is a rank of a data-parallel run: rank 0 alone prints (the
  // others' stdout is dropped; errors still reach stderr).
  if (tvc::dist::world()->rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
    std::fprintf(stderr, "warning: rank %d: cannot silence stdout\n", tvc::dist::world()->rank());
  return tvc::tools::train_recipe(recipe, resume);
}

int run(int argc, char** argv) {
  CLI::App app{"tvc: a C++20 tensor and neural-network engine", "tvc"};
  app.require_subcommand(1);

  CLI::Validator positive(
      [](std::string& value) -> std::string {
        double v = 0;
        return CLI::detail::lexical_cast(value, v) && v > 0 ? "" : "Value " + value + " is not a positive number";
      },
      "POSITIVE");

  // train: --recipe and --resume, then any recipe key as --KEY VALUE (tools/recipe.h), read
  // after parsing from the arguments CLI11 leaves over.
  std::string train_recipe_name, train_resume;
  CLI::App* train_cmd = app.add_subcommand(
      "train", "Train: a small CNN on Fashion-MNIST by default, or a recipe (a backbone fine-tuned with EMA/SWA)");
  train_cmd->allow_extras();
  train_cmd->add_option("--recipe", train_recipe_name,
                        "A YAML/JSON recipe file, or a built-in recipe: small_cnn (the default without --backbone)");
  train_cmd->add_option("--resume", train_resume, "Continue the run in this output folder from its last checkpoint");
  train_cmd->footer(
      "Any recipe key is also a flag, --KEY VALUE (dashes or underscores), overriding the recipe file: "
      "--backbone NAME, --weights TAG|FILE, --patches JSON, --num-classes N, --dropout P, --freeze-backbone true, "
      "--unfreeze-stages [2,3], --data DIR (an image folder; default Fashion-MNIST), --val-data DIR, --val-split F, "
      "--train-subset N, --image-size S, --batch-size B, --epochs N, --optimizer sgd|adamw|adam, --lr LR, "
      "--momentum M, --nesterov true, --weight-decay WD, --scheduler cosine|step|onecycle|constant, "
      "--warmup-epochs E, --label-smoothing E, --clip-grad-norm N, --ema DECAY (or --ema.decay, --ema.every, "
      "--ema.warmup), --swa.start_epoch E, --swa.swa_lr LR, --swa.anneal_epochs E, --seed S, --threads T, "
      "--workers W, --out DIR, --checkpoint-every STEPS, --max-batches N, --data-dir DIR (the Fashion-MNIST "
      "files), --sync-bn true and --rank-timeout S (under mpirun: docs/distributed.md). docs/training.md describes "
      "every key.");
  tvc::tools::EvalOptions eval;
  CLI::App* eval_cmd = app.add_subcommand(
      "eval", "Accuracy, per-class accuracy and confusion matrix of trained weights on a recipe's test data");
  eval_cmd->add_option("RUN", eval.recipe, "A tvc train output folder (its recipe.yaml) or a recipe file")->required();
  eval_cmd
      ->add_option("--weights", eval.weights, "A .safetensors/.pth of tvc train's exports (final, best, final_ema...)")
      ->required();
  eval_cmd->add_option("--data", eval.data, "An image folder to evaluate on instead of the recipe's test data");
  eval_cmd->add_flag("--opaque", eval.opaque, kOpaqueHelp);
  eval_cmd->add_option("--svg", eval.svg_out, "Also write the confusion matrix as an SVG file");
  eval_cmd->add_option("--batch-size", eval.batch_size, "Images per forward pass (default: the recipe's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));

  std::string inspect_path;
  tvc::tools::InspectOptions inspect;
  CLI::App* inspect_cmd =
      app.add_subcommand("inspect", "Print a weight file's tensors (name, dtype, shape), totals and metadata");
  inspect_cmd->add_option("FILE", inspect_path, "A safetensors file or a torch.save .pth (zip or legacy)")->required();
  inspect_cmd->add_flag("--widen", inspect.widen,
                        "Show .pth element types tvc lacks (uint16, float8...) widened instead of failing");
  inspect_cmd->add_flag("--opaque", inspect.opaque, kOpaqueHelp);

  std::string convert_in, convert_out, convert_dtype;
  tvc::tools::ConvertOptions convert;
  CLI::App* convert_cmd =
      app.add_subcommand("convert", "Convert a weight file between safetensors and .pth (chosen by OUT's extension)");
  convert_cmd->add_option("IN", convert_in, "A safetensors file or a torch.save .pth (zip or legacy)")->required();
  convert_cmd->add_option("OUT", convert_out, "The file to write: NAME.safetensors, NAME.pth or NAME.pt")->required();
  convert_cmd->add_option("--dtype", convert_dtype, "Convert floating-point tensors to this dtype")
      ->check(CLI::IsMember({"float16", "bfloat16", "float32"}));
  convert_cmd->add_flag("--widen", convert.widen,
                        "Load element types tvc lacks (uint16/32/64, float8) widened (int32/int64/float32)");
  convert_cmd->add_flag("--unwrap", convert.unwrap,
                        "Keep only the weights of a training checkpoint (state_dict/model, no module. prefix)");
  convert_cmd->add_flag("--opaque", convert.opaque, kOpaqueHelp);

  std::vector<std::string> average_files;
  std::string average_out;
  std::optional<double> average_ema;
  tvc::swa::AverageFilesOptions average;
  CLI::App* average_cmd = app.add_subcommand(
      "average", "Average weight files (SWA: equal weights; or an EMA in file order) as AveragedModel would");
  average_cmd->add_option("--out", average_out, "The file to write: NAME.safetensors, NAME.pth or NAME.pt")->required();
  bool average_swa = false;
  CLI::Option* swa_flag =
      average_cmd->add_flag("--swa", average_swa, "Equal-weight average of all files (the default)");
  average_cmd->add_option("--ema", average_ema, "Exponential moving average in file order with this decay")
      ->check(CLI::Range(0.0, 1.0))
      ->excludes(swa_flag);
  average_cmd->add_flag("--use-buffers", average.use_buffers,
                        "Average floating buffers (BatchNorm statistics) too; else they are the last file's");
  average_cmd->add_flag("--opaque", average.read.opaque_objects, kOpaqueHelp);
  average_cmd->add_flag("--plain", average.plain,
                        "Write the averaged model's own state_dict (loads into torchvision) instead of "
                        "AveragedModel's (module.*, n_averaged)");
  average_cmd->add_option("FILE", average_files, "Weight files (.pth or .safetensors, any mix), in order")->required();

  CLI::App* list_cmd = app.add_subcommand("list", "Print every model name, one per line");

  tvc::tools::BenchOptions bench;
  CLI::App* bench_cmd = app.add_subcommand(
      "bench", "Time a model's forward passes (or training steps) here, as a share of the machine's measured peak");
  bench_cmd->add_option("MODEL", bench.model, "A model name (tvc list), randomly initialised")->required();
  bench_cmd->add_option("--batch", bench.batch, "Images per step")->check(positive);
  bench_cmd->add_option("--size", bench.size, "Input height and width")->check(positive);
  bench_cmd->add_flag("--train", bench.train, "Time training steps: forward, cross-entropy, backward, SGD step");
  bench_cmd->add_option("--dtype", bench.dtype, "float32, or bfloat16 inference (weights converted once; AVX512_BF16)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  bench_cmd->add_option("--threads", bench.threads, "Threads (default: all cores)")->check(CLI::Range(0, 4096));
  bench_cmd->add_option("--iterations", bench.iterations, "Timed steps (default: as many as fit in about 3 s)")
      ->check(CLI::Range(0, 1000000));
  bench_cmd->add_flag("--verbose", bench.verbose,
                      "Also print each kernel's time per step, with its layer, path and output shape");

  tvc::tools::RunOptions run;
  CLI::App* run_cmd = app.add_subcommand("run", "Run a model on the float32 tensor `input` of a safetensors file");
  run_cmd->add_option("MODEL", run.model, "A model name (tvc list)")->required();
  run_cmd
      ->add_option("--weights", run.weights,
                   "A torchvision tag (DEFAULT, IMAGENET1K_V1, ...) or a .pth/.safetensors file")
      ->required();
  run_cmd->add_option("--input", run.input, "A safetensors file with `input`, float32 (N, 3, H, W)")->required();
  run_cmd->add_option("--output", run.output, "The safetensors file to write: `output` (N, num_classes)")->required();
  run_cmd
      ->add_option("--num-classes", run.num_classes,
                   "Outputs of the classifier (default: the weights' class count; --hybrid: 1000)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  run_cmd->add_flag("--train-mode", run.train_mode,
                    "Batch norm uses batch statistics (dropout and stochastic depth stay off)");
  run_cmd->add_flag("--opaque", run.opaque, kOpaqueHelp);
  run_cmd->add_flag("--features", run.features,
                    "Also write each stage's output under its node name (with --hybrid: stage.K, the stem's first)");
  bool run_hybrid = false;
  tvc::tools::HybridOptions run_hybrid_options;
  run_cmd->add_flag("--hybrid", run_hybrid,
                    "Build MODEL as a HybridModel (weights: a tag, or a file of HybridModel or torchvision names)");
  run_cmd->add_option("--patches", run_hybrid_options.patches, "With --hybrid: the patches as JSON")
      ->capture_default_str();
  run_cmd->add_option("--dropout", run_hybrid_options.dropout, "With --hybrid: dropout before the classifier")
      ->check(CLI::Range(0.0, 0.999999));

  CLI::App* backbones_cmd = app.add_subcommand("backbones", "Print the backbones the hybrid layer supports");
  CLI::App* blocks_cmd = app.add_subcommand("blocks", "Print the block types patches can insert");
  std::string info_backbone;
  CLI::App* info_cmd = app.add_subcommand("info", "Print a backbone's structure (stem, stages, head, channels)");
  info_cmd->add_option("BACKBONE", info_backbone, "A backbone (tvc backbones)")->required();
  tvc::tools::HybridOptions explain;
  CLI::App* explain_cmd = app.add_subcommand("explain", "Print a hybrid model's description box");
  explain_cmd->add_option("BACKBONE", explain.backbone, "A backbone (tvc backbones)")->required();
  explain_cmd->add_option("--patches", explain.patches, "The patches as JSON")->capture_default_str();
  explain_cmd->add_option("--num-classes", explain.num_classes, "Outputs of the classifier")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  explain_cmd->add_option("--dropout", explain.dropout, "Dropout before the classifier")
      ->check(CLI::Range(0.0, 0.999999));

  tvc::tools::PredictOptions predict;
  CLI::App* predict_cmd = app.add_subcommand(
      "predict", "Classify JPEG/PNG images: the five likeliest ImageNet classes of each, with probabilities");
  std::string predict_run;
  predict_cmd->add_option("MODEL", predict.model, "A model name (tvc list); not given with --recipe")->required();
  predict_cmd
      ->add_option("--weights", predict.weights,
                   "A torchvision tag (DEFAULT, IMAGENET1K_V1, ...) or a .pth/.safetensors file")
      ->required();
  predict_cmd->add_option(
      "--recipe", predict_run,
      "A tvc train output folder: its recipe's model, preprocessing and classes (weights: its exports)");
  predict_cmd->add_option("--preprocess-tag", predict.preprocess_tag,
                          "The tag whose preprocessing (resize, crop, normalisation) to apply; default: the weights' "
                          "tag, or DEFAULT when the weights are a file");
  predict_cmd->add_option("IMAGE", predict.images, "JPEG or PNG files");
  predict_cmd->add_flag("--opaque", predict.opaque, kOpaqueHelp);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help (code 0) or the usage error
    return code == 0 ? 0 : 2;
  }

  if (train_cmd->parsed()) {
    int status = run_train(train_recipe_name, train_resume, train_cmd->remaining());
    if (status != 0) return status;
  }
  if (eval_cmd->parsed()) tvc::tools::evaluate(eval);
  if (average_cmd->parsed()) {
    if (average_ema) {
      average.method = tvc::swa::AverageFilesOptions::Method::ema;
      average.ema_decay = *average_ema;
    }
    tvc::tools::average_weights(average_files, average_out, average);
  }
  if (list_cmd->parsed()) tvc::tools::list_models();
  if (bench_cmd->parsed()) tvc::tools::bench_model(bench);
  if (run_cmd->parsed() && run_hybrid) {
    run_hybrid_options.backbone = run.model;
    run_hybrid_options.num_classes = run.num_classes.value_or(1000);
    TVC_CHECK(!run.train_mode, "run --hybrid: --train-mode is not supported (the hybrid runs in eval mode)");
    tvc::tools::run_hybrid({.hybrid = run_hybrid_options,
                            .weights = run.weights,
                            .input = run.input,
                            .output = run.output,
                            .features = run.features,
                            .opaque = run.opaque});
  } else if (run_cmd->parsed()) {
    TVC_CHECK(run_hybrid_options.patches == "{}" && run_hybrid_options.dropout == 0,
              "run: --patches and --dropout need --hybrid");
    tvc::tools::run_model(run);
  }
  if (backbones_cmd->parsed()) tvc::tools::list_backbones();
  if (blocks_cmd->parsed()) tvc::tools::list_blocks();
  if (info_cmd->parsed()) tvc::tools::backbone_info(info_backbone);
  if (explain_cmd->parsed()) tvc::tools::explain_hybrid(explain);
  if (predict_cmd->parsed() && !predict_run.empty()) {
    // Without MODEL, CLI11 gave the first image to MODEL.
    predict.images.insert(predict.images.begin(), predict.model);
    tvc::tools::predict_with_recipe(predict_run, predict.weights, predict.images, predict.opaque);
  } else if (predict_cmd->parsed()) {
    tvc::tools::predict(predict);
  }
  if (inspect_cmd->parsed()) tvc::tools::inspect_weights(inspect_path, inspect);
  if (convert_cmd->parsed()) {
    if (convert_dtype == "float16") convert.dtype = tvc::DType::Float16;
    if (convert_dtype == "bfloat16") convert.dtype = tvc::DType::BFloat16;
    if (convert_dtype == "float32") convert.dtype = tvc::DType::Float32;
    tvc::tools::convert_weights(convert_in, convert_out, convert);
  }
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) throw std::runtime_error("cannot write to standard output");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A closed pipe on stdout (tvc train | head -1) is a write error, not a signal.
  std::signal(SIGPIPE, SIG_IGN);
#ifdef __GLIBC__
  // Training allocates and frees the same few-MB activations every step: keep them on the heap
  // instead of fresh (page-faulting, zero-filled) mmaps, and do not give the heap back to the OS.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    // A tvc::Error escapes the names and paths in it itself; the one-line messages of the
    // libraries' exceptions (std::filesystem's name paths as they are) are escaped whole.
    const bool escaped = dynamic_cast<const tvc::Error*>(&e) != nullptr;
    std::fprintf(stderr, "error: %s\n", escaped ? e.what() : tvc::printable(e.what()).c_str());
  } catch (...) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: unknown exception\n");
  }
  // A rank of a data-parallel run that fails ends the job: the others would wait for it.
  tvc::dist::abort_world(1);
  return 1;
}
