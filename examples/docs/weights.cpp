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

void read_any_checkpoint();

void read_any_checkpoint() {
  // [doc]
  // A Lightning checkpoint: argparse.Namespace, NumPy values, the model's weights.
  tvc::io::Value ckpt = tvc::io::load_pth("epoch=9.ckpt", {.opaque_objects = true});
  std::cout << tvc::io::repr(*ckpt.find("hyper_parameters")) << "\n";  // argparse.Namespace(lr=0.1, ...)
  tvc::nn::StateDict weights =
      tvc::io::load_state_dict("epoch=9.ckpt", {.read = {.opaque_objects = true}, .unwrap = true});

  // torch.save(model): the state_dict model.state_dict() gives.
  tvc::nn::StateDict whole = tvc::io::load_state_dict("model.pt", {.read = {.opaque_objects = true}});
  // [end doc]
}
