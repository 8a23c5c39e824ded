#!/usr/bin/env python3
"""PyTorch's answers for tests/test_model_zoo.cpp: every network of hpc_train's model registry
built in PyTorch (bench/reference/models.py: torchvision's networks, and our own definitions of
simple_cnn, resnet18 and wide_resnet16_8), with its state_dict, an input, its logits and its
FLOP count written to files that the C++ test compares with hpc_train's own.

    model_zoo_reference.py OUT_DIR

writes, for each model NAME,
    OUT_DIR/NAME.safetensors     the state_dict, in state_dict order (the order of the data in
                                 the file); __metadata__: model, channels, height, width,
                                 num_classes
    OUT_DIR/NAME.io.safetensors  `input` [2, C, H, W] (float32) and `logits` [2, classes], the
                                 network's output in evaluation mode (fp32)
and OUT_DIR/flops.json, [{"model", "channels", "height", "width", "num_classes",
"forward_flops"}, ...]: 2 x the multiply-accumulates of every convolution and linear layer of one
sample's forward pass, counted by forward hooks from the shapes the layers really see.

Batch norm is made non-trivial first: random affine weights, then running statistics gathered
from random batches in training mode, so that the evaluation-mode forward normalises with
statistics that are neither 0/1 nor the batch's own, and the logits stay near unit scale (the
C++ test's tolerance is absolute up to |logit| 1 and relative above).

Needs torch and torchvision (Debian: python3-torch python3-torchvision; run.sh installs them).
It checks one claim itself: bench/reference/models.py's own resnet18 is torchvision's resnet18
with the CIFAR stem (same state_dict, same logits).
"""
import contextlib
import json
import pathlib
import struct
import sys

try:
    import torch
    from torch import nn
    import torchvision  # noqa: F401  (models.build imports it; fail here with a clear message)
except ImportError as error:
    sys.exit(f"model_zoo_reference.py needs torch and torchvision ({error}); on Debian: "
             "apt-get install python3-torch python3-torchvision")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "reference"))
import models  # noqa: E402

BATCH = 2
CIFAR = (3, 32, 32)
IMAGENET_SMALL = (3, 64, 64)
CLASSES = 10

# The shape each network is compared at: CIFAR-sized where the network is made for CIFAR, a
# small image for the ImageNet stem. VGG at both: on 32x32 its adaptive pool repeats a 1x1 map
# to 7x7, on 64x64 it averages overlapping windows of a 2x2 map.
COMPARED_AT = {
    "simple_cnn": (1, 28, 28),
    "resnet18": CIFAR,
    "resnet34": CIFAR,
    "resnet50": CIFAR,
    "resnet18_imagenet": IMAGENET_SMALL,
    "resnet34_imagenet": IMAGENET_SMALL,
    "resnet50_imagenet": IMAGENET_SMALL,
    "wide_resnet16_8": CIFAR,
    "vgg11_bn": CIFAR,
    "vgg16_bn": IMAGENET_SMALL,
}

# FLOPs also at other shapes: one channel and odd sides (the floor of every stride-2 layer), a
# non-square image for VGG, and the ImageNet 224 x 224 of the published figures.
EXTRA_FLOP_SHAPES = {
    "simple_cnn": [(3, 32, 32), (1, 9, 13)],
    "vgg11_bn": [(1, 40, 48)],
    "vgg16_bn": [(1, 40, 48), (3, 33, 63), (3, 32, 32)],
}
for _name in ("resnet18", "resnet34", "resnet50", "wide_resnet16_8"):
    EXTRA_FLOP_SHAPES[_name] = [(1, 29, 31)]
for _name in ("resnet18_imagenet", "resnet34_imagenet", "resnet50_imagenet"):
    EXTRA_FLOP_SHAPES[_name] = [(1, 29, 31), (3, 224, 224)]

DTYPES = {torch.float32: "F32", torch.int64: "I64"}


def write_safetensors(path, tensors, metadata):
    """`tensors` (name -> tensor) in the given order, as safetensors (standard library only,
    as tests/support/check_safetensors.py reads it)."""
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name, tensor in tensors.items():
        data = tensor.detach().contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for data in blobs:
            file.write(data)


@contextlib.contextmanager
def no_initialisation():
    """Builds whose weights do not matter (FLOP counting): the modules' and torchvision's
    initialisers (looked up in torch.nn.init when called) leave the tensors as allocated, which
    saves drawing some 100 million random numbers per VGG."""
    names = ("kaiming_uniform_", "kaiming_normal_", "uniform_", "normal_", "constant_", "ones_",
             "zeros_")
    saved = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def count_flops(model, shape):
    """2 x multiply-accumulates of every Conv2d and Linear in one sample's forward pass."""
    macs = []

    def conv_hook(module, inputs, output):
        kernel = module.kernel_size[0] * module.kernel_size[1]
        macs.append(output.numel() * module.in_channels // module.groups * kernel)

    def linear_hook(module, inputs, output):
        macs.append(output.numel() * module.in_features)

    handles = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            handles.append(module.register_forward_hook(conv_hook))
        elif isinstance(module, nn.Linear):
            handles.append(module.register_forward_hook(linear_hook))
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, *shape))  # values do not matter (no_initialisation)
    for handle in handles:
        handle.remove()
    return 2 * sum(macs)


@torch.no_grad()
def make_batch_norm_nontrivial(model, shape):
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for norm in norms:
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.2, 0.2)
        norm.momentum = None  # a plain average of the batches' statistics
    model.train()
    for _ in range(2):
        model(torch.randn(8, *shape))
    for norm in norms:
        norm.momentum = 0.1


def reference(name, shape, out_dir):
    torch.manual_seed(0)
    model = models.build(name, *shape, CLASSES)
    make_batch_norm_nontrivial(model, shape)
    model.eval()
    images = torch.randn(BATCH, *shape)
    with torch.no_grad():
        logits = model(images)
    metadata = {"model": name, "channels": str(shape[0]), "height": str(shape[1]),
                "width": str(shape[2]), "num_classes": str(CLASSES)}
    write_safetensors(out_dir / f"{name}.safetensors", model.state_dict(), metadata)
    write_safetensors(out_dir / f"{name}.io.safetensors",
                      {"input": images, "logits": logits}, metadata)
    return model, images, logits


def check_resnet18_is_torchvision_with_cifar_stem(ours, images, logits):
    theirs = models.torchvision_resnet(18, images.shape[1], CLASSES, cifar_stem=True)
    if list(theirs.state_dict()) != list(ours.state_dict()):
        sys.exit("bench/reference/models.py's resnet18 has other state_dict keys (or order) "
                 "than torchvision's resnet18 with the CIFAR stem")
    theirs.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        difference = (theirs.eval()(images) - logits).abs().max().item()
    print(f"resnet18: torchvision's resnet18 with the CIFAR stem, same weights: "
          f"max |logit difference| {difference:.3g}")
    if not difference <= 1e-6:
        sys.exit("bench/reference/models.py's resnet18 computes other logits than torchvision's")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # CI's 2 cores run other tests beside this one
    flops = []
    for name in models.NAMES:
        shape = COMPARED_AT[name]
        model, images, logits = reference(name, shape, out_dir)
        if name == "resnet18":
            check_resnet18_is_torchvision_with_cifar_stem(model, images, logits)
        for flop_shape in [shape] + EXTRA_FLOP_SHAPES[name]:
            if flop_shape == shape:
                flop_model = model
            else:
                with no_initialisation():
                    flop_model = models.build(name, *flop_shape, CLASSES)
            flops.append({"model": name, "channels": flop_shape[0], "height": flop_shape[1],
                          "width": flop_shape[2], "num_classes": CLASSES,
                          "forward_flops": count_flops(flop_model, flop_shape)})
        print(f"{name}: {shape}, {sum(p.numel() for p in model.parameters())} parameters, "
              f"logits in [{logits.min().item():.3f}, {logits.max().item():.3f}]", flush=True)
    (out_dir / "flops.json").write_text(json.dumps(flops, indent=1) + "\n")


if __name__ == "__main__":
    main()
