"""Goldens of the C API's install test (tests/test_install.sh), with Debian's torch:
torchvision's resnet18 with 10 classes on random weights (every BatchNorm buffer randomised),
saved by torch.save; a random (2, 3, 64, 64) input; the eval-mode output.

    c_api_goldens.py OUT_DIR   writes weights.pth, input.f32, expected.f32 (float32, row-major)
"""
import sys

import torch
import torchvision


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
    model.eval()
    torch.save(model.state_dict(), f"{out}/weights.pth")
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        y = model(x)
    x.numpy().tofile(f"{out}/input.f32")
    y.numpy().tofile(f"{out}/expected.f32")


if __name__ == "__main__":
    main()
