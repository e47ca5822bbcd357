// Averaging weight files (checkpoint averaging, "model soups"): the library side of
// `tvc average`, built on AveragedModel.
//
//   tvc::swa::average_weight_files({"ep8.pth", "ep9.pth", "ep10.safetensors"}, "swa.pth", {});
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tvc/nn/module.h"
#include "tvc/serialize.h"

namespace tvc::swa {

// The module a bare state_dict describes: a tree of plain modules, one per dotted prefix, holding
// each entry as a parameter or, when its last name part is running_mean, running_var or
// num_batches_tracked or its dtype is an integer one, as a buffer. The tensors are the dict's
// (not copied). A name that is both an entry and a prefix of others throws naming it.
std::shared_ptr<nn::Module> module_from_state_dict(const nn::StateDict& state_dict);

struct AverageFilesOptions {
  enum class Method { swa, ema };
  Method method = Method::swa;
  double ema_decay = 0.999;  // Method::ema: a <- decay * a + (1 - decay) * x, in file order
  bool use_buffers = false;  // average floating buffers too (else they are the last file's)
  bool plain = false;        // write the averaged model's own state_dict (no module., no n_averaged)
  io::ReadOptions read{};    // how the files are read (opaque_objects for whole-model saves...)
};

struct AverageFilesReport {
  int64_t files = 0;
  int64_t averaged = 0;  // tensors averaged
  int64_t copied = 0;    // tensors taken from the last file (buffers)
};

// Averages the files in order exactly as AveragedModel(model of the first file, options)
// followed by update_parameters(model loaded with file i) for every file would, and writes the
// result to out (format by extension, crash-safe): PyTorch's AveragedModel state_dict
// ("module.<name>" and "n_averaged"), or with plain the averaged model's own. Files may be
// .pth or safetensors in any mix; {"state_dict": ...}-style checkpoints are unwrapped. Each
// file's tensors are converted to the first file's dtypes. Only the average and one file's
// weights are held at a time. A file whose keys or shapes differ from the first file's throws
// naming the file and the first such key, and out is not written.
AverageFilesReport average_weight_files(const std::vector<std::string>& paths, const std::string& out,
                                        const AverageFilesOptions& options = {});

}  // namespace tvc::swa
