// The example of docs/weights.md, compiled by the build (tools/check_doc_examples.py).
#include <iostream>

#include "tvc/nn/module.h"
#include "tvc/serialize.h"

void use_weight_files(tvc::nn::Module& model);

void use_weight_files(tvc::nn::Module& model) {
  // [doc]
  model.load_state_dict("resnet50-11ad3fa6.pth");           // any format, dtypes converted
  tvc::io::load_into(model, "ckpt.pth", {.unwrap = true});  // a training checkpoint
  tvc::io::save_safetensors("out.safetensors", model.state_dict(), {{"format", "pt"}});
  tvc::io::save_pth("out.pth", tvc::io::Value(model.state_dict()));  // torch.load(weights_only=True) reads it

  tvc::io::SafetensorsFile f = tvc::io::SafetensorsFile::open("big.safetensors");
  tvc::Tensor w = f.tensor("fc.weight", {.map = true});   // a view of the mapping
  tvc::io::Value ckpt = tvc::io::load_pth("ckpt.pth");    // the whole checkpoint tree
  for (auto& [path, t] : tvc::io::flatten_tensors(ckpt))  // "optimizer.state.0.exp_avg"
    std::cout << path << " " << t.shape() << "\n";
  // [end doc]
}
