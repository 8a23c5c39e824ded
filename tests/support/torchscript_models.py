#!/usr/bin/env python3
"""TorchScript modules and PyTorch state_dicts for hpc_train's tests of --model FILE.pt and
--init-weights (tests/test_torchscript.sh, tests/test_torchscript_gpu.sh). Needs torch (Debian:
python3-torch); safetensors files are written and read with the standard library (the format of
tests/support/check_safetensors.py), not the safetensors package.

    torchscript_models.py script NAME OUT.pt --shape C,H,W --classes K [--seed S]
                          [--state-dict OUT.safetensors [--dtype F32|F16|BF16]]
        NAME: simple_cnn (bench/reference/models.py, scripted), resnet18 (the same, scripted),
        bn_dropout_cnn (BatchNorm and dropout), bn_dropout_cnn_tanh (the same parameters, other
        code), no_forward (an exported method, no forward)
    torchscript_models.py torch-save OUT.pt --shape C,H,W --classes K
        a simple_cnn state_dict saved with torch.save: a PyTorch zip without TorchScript code
    torchscript_models.py set-version IN.pt OUT.pt VERSION
        IN.pt with its format version record(s) replaced (a "newer PyTorch" file)
    torchscript_models.py edit-weights IN.safetensors OUT.safetensors [--drop NAME]...
                          [--add NAME=D0xD1...]...
    torchscript_models.py cifar-bin DIR --train N --test M
        CIFAR-10 binary batches (DIR/data_batch_1..5.bin, DIR/test_batch.bin) of learnable
        synthetic images, for hpc_train_data convert cifar10: each class a random pattern, each
        image its class's pattern plus noise
    torchscript_models.py fuzz-seeds DIR
        the seed corpus of fuzz_torchscript_file (fuzz/corpus/torchscript_file/): a small
        scripted module, the same with zip64 records, a torch.save state_dict
    torchscript_models.py evaluate MODULE.pt WEIGHTS.safetensors IDX_DIR --max-train N
                          --max-test M
        the module with the weights, in eval mode, on the first M test images of the IDX files
        in IDX_DIR (Fashion-MNIST), normalised as hpc_train_data normalises a dataset converted
        with --max-train N --max-test M; prints "test_loss L test_accuracy A"
    torchscript_models.py train MODULE.pt WEIGHTS.safetensors IDX_DIR --max-train N --steps S
                          --lr LR [--optimizer sgd|adamw|lamb|lars] [--momentum M]
                          [--dampening D] [--nesterov] [--weight-decay W]
                          [--trust-coefficient ETA] [--milestones A,B --gamma G]
                          [--label-smoothing E] [--no-decay-bias-bn]
                          [--ema-decay D --ema-out EMA.safetensors]
        PyTorch's reference trajectory: the module from the weights, trained in train mode on
        the first N train images (normalised as above) as one batch a step with torch.optim's
        optimizer (LAMB and LARS: tests/support/layerwise_optimizers.py, from their papers),
        MultiStepLR and CrossEntropyLoss(label_smoothing=E), with the parameters
        below 2-D in a group without weight decay (--no-decay-bias-bn), and an EMA of the weights
        (torch.optim.swa_utils.AveragedModel, avg_fn D x ema + (1 - D) x weights, updated after
        each step) written to EMA.safetensors; prints each step's loss, one a line
"""
import argparse
import ctypes
import gzip
import json
import math
import os
import struct
import sys
import zipfile

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "reference"))
import models  # noqa: E402  (bench/reference/models.py)
from check_safetensors import read_safetensors  # noqa: E402
import layerwise_optimizers  # noqa: E402

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
NAMES = {dtype: name for name, dtype in DTYPES.items()}


def tensor_bytes(tensor):
    """The bytes of a tensor, row-major (without numpy, which PyTorch wheels do not require)."""
    tensor = tensor.detach().cpu().contiguous()
    return ctypes.string_at(tensor.data_ptr(), tensor.numel() * tensor.element_size())


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: torch.Tensor}, written in the given order."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, tensor in tensors.items():
        blob = tensor_bytes(tensor)
        header[name] = {"dtype": NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def load_safetensors(path):
    tensors, _ = read_safetensors(path)
    state = {}
    for t in tensors:
        dtype = DTYPES[t.dtype]
        raw = torch.frombuffer(bytearray(t.data), dtype=torch.int16 if dtype == torch.bfloat16
                               else dtype) if t.data else torch.empty(0, dtype=dtype)
        if dtype == torch.bfloat16:
            raw = raw.view(torch.bfloat16)
        state[t.name] = raw.reshape(t.shape)
    return state


class BnDropoutCnn(nn.Module):
    """Two convolutions with BatchNorm, then dropout before the classifier: buffers to broadcast
    and checkpoint, and a layer that behaves differently in training and eval mode."""

    def __init__(self, channels, height, width, num_classes):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(32 * (height // 4) * (width // 4), num_classes)

    def forward(self, images):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(images))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(self.dropout(torch.flatten(x, 1)))


class BnDropoutCnnTanh(BnDropoutCnn):
    """BnDropoutCnn with tanh for ReLU: the same parameters and buffers, other code."""

    def forward(self, images):
        x = F.max_pool2d(torch.tanh(self.bn1(self.conv1(images))), 2)
        x = F.max_pool2d(torch.tanh(self.bn2(self.conv2(x))), 2)
        return self.fc(self.dropout(torch.flatten(x, 1)))


class ScriptableResNet18(models.ResNet18):
    """models.ResNet18 (same parameters and names) with a forward that TorchScript compiles: it
    cannot iterate over a tuple of submodules."""

    def forward(self, images):
        x = F.relu(self.bn1(self.conv1(images)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


class NoForward(nn.Module):
    """A module with parameters and an exported method, but no forward."""

    def __init__(self, num_classes):
        super().__init__()
        self.fc = nn.Linear(4, num_classes)

    @torch.jit.export
    def predict(self, features):
        return self.fc(features)


def build(name, channels, height, width, classes):
    if name == "simple_cnn":
        return models.SimpleCnn(channels, height, width, classes)
    if name == "resnet18":
        return ScriptableResNet18(channels, classes)
    if name == "bn_dropout_cnn":
        return BnDropoutCnn(channels, height, width, classes)
    if name == "bn_dropout_cnn_tanh":
        return BnDropoutCnnTanh(channels, height, width, classes)
    if name == "no_forward":
        return NoForward(classes)
    raise SystemExit(f"unknown module {name!r}")


def shape_arg(text):
    return [int(v) for v in text.split(",")]


def command_script(args):
    torch.manual_seed(args.seed)
    channels, height, width = args.shape
    module = build(args.name, channels, height, width, args.classes)
    torch.jit.script(module).save(args.out)
    if args.state_dict:
        dtype = DTYPES[args.dtype]
        write_safetensors(args.state_dict,
                          {k: v.to(dtype) if v.is_floating_point() else v
                           for k, v in module.state_dict().items()})


def command_torch_save(args):
    channels, height, width = args.shape
    torch.save(models.SimpleCnn(channels, height, width, args.classes).state_dict(), args.out)


def command_set_version(args):
    with zipfile.ZipFile(args.input) as source, zipfile.ZipFile(args.out, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("/version") or info.filename.endswith("/.data/version"):
                data = f"{args.version}\n".encode()
            target.writestr(info, data)


def command_edit_weights(args):
    state = load_safetensors(args.input)
    for name in args.drop:
        del state[name]
    for item in args.add:
        name, _, shape = item.partition("=")
        state[name] = torch.zeros([int(d) for d in shape.split("x")])
    write_safetensors(args.out, state)


def command_cifar_bin(args):
    os.makedirs(args.dir, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    patterns = torch.randint(0, 256, (10, 3, 32, 32), generator=generator)

    def records(count):
        labels = torch.randint(0, 10, (count,), generator=generator)
        noise = torch.randint(-48, 49, (count, 3, 32, 32), generator=generator)
        images = (patterns[labels] + noise).clamp(0, 255).to(torch.uint8)
        return b"".join(bytes([int(label)]) + tensor_bytes(image)
                        for label, image in zip(labels, images))

    per_batch = [args.train // 5 + (1 if b < args.train % 5 else 0) for b in range(5)]
    for b, count in enumerate(per_batch, start=1):
        with open(os.path.join(args.dir, f"data_batch_{b}.bin"), "wb") as file:
            file.write(records(count))
    with open(os.path.join(args.dir, "test_batch.bin"), "wb") as file:
        file.write(records(args.test))


def command_fuzz_seeds(args):
    os.makedirs(args.dir, exist_ok=True)
    torch.manual_seed(0)
    small = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    module = os.path.join(args.dir, "scripted")
    torch.jit.script(small).save(module)
    torch.save(small.state_dict(), os.path.join(args.dir, "torch_save"))
    # Every record in its zip64 form: the limits that make zipfile write them, lowered.
    limits = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 0, 0
    try:
        with zipfile.ZipFile(module) as source, \
                zipfile.ZipFile(os.path.join(args.dir, "scripted_zip64"), "w") as target:
            for info in source.infolist():
                target.writestr(info, source.read(info))
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = limits


def read_idx(path, count):
    with gzip.open(path, "rb") as file:
        data = file.read()
    (magic,) = struct.unpack(">I", data[:4])
    dims = struct.unpack(f">{magic & 0xff}I", data[4:4 + 4 * (magic & 0xff)])
    body = data[4 + 4 * len(dims):]
    item = math.prod(dims[1:])
    return torch.frombuffer(bytearray(body[:count * item]), dtype=torch.uint8).reshape(
        count, *dims[1:])


def normalised_split(idx_dir, split, max_train, count):
    """The first `count` images and labels of a split (split: "train" or "t10k"), normalised as
    hpc_train_data normalises a dataset converted with --max-train max_train."""
    train = read_idx(os.path.join(idx_dir, "train-images-idx3-ubyte.gz"), max_train)
    images = read_idx(os.path.join(idx_dir, f"{split}-images-idx3-ubyte.gz"), count)
    labels = read_idx(os.path.join(idx_dir, f"{split}-labels-idx1-ubyte.gz"), count)
    # hpc_train_data's mean and population std of the train split (exact sums, then float32).
    pixels = train.to(torch.float64).flatten()
    mean = pixels.sum().item() / pixels.numel() / 255.0
    variance = (pixels * pixels).sum().item() / pixels.numel() / (255.0 * 255.0) - mean * mean
    mean = torch.tensor(mean, dtype=torch.float32)
    std = torch.tensor(math.sqrt(variance), dtype=torch.float32)
    return images.unsqueeze(1).to(torch.float32).div_(255.0).sub_(mean).div_(std), labels.long()


def command_evaluate(args):
    x, labels = normalised_split(args.idx_dir, "t10k", args.max_train, args.max_test)
    module = torch.jit.load(args.module)
    module.load_state_dict(load_safetensors(args.weights), strict=True)
    module.eval()
    with torch.no_grad():
        logits = module(x)
        loss = F.cross_entropy(logits, labels, reduction="sum").item() / len(labels)
        accuracy = (logits.argmax(1) == labels).double().mean().item()
    print(f"test_loss {loss!r} test_accuracy {accuracy!r}")


def command_train(args):
    torch.set_num_threads(1)  # as the tests' ranks (OMP_NUM_THREADS=1)
    x, labels = normalised_split(args.idx_dir, "train", args.max_train, args.max_train)
    module = torch.jit.load(args.module)
    module.load_state_dict(load_safetensors(args.weights), strict=True)
    module.train()
    parameters = list(module.parameters())
    if args.no_decay_bias_bn:
        parameters = [{"params": [p for p in parameters if p.dim() >= 2]},
                      {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0}]
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(parameters, lr=args.lr, momentum=args.momentum,
                                    dampening=args.dampening, weight_decay=args.weight_decay,
                                    nesterov=args.nesterov)
    elif args.optimizer == "lamb":
        optimizer = layerwise_optimizers.Lamb(parameters, lr=args.lr,
                                              weight_decay=args.weight_decay)
    elif args.optimizer == "lars":
        optimizer = layerwise_optimizers.Lars(parameters, lr=args.lr, momentum=args.momentum,
                                              nesterov=args.nesterov,
                                              weight_decay=args.weight_decay,
                                              trust_coefficient=args.trust_coefficient)
    else:
        optimizer = torch.optim.AdamW(parameters, lr=args.lr, weight_decay=args.weight_decay)
    ema = None
    if args.ema_decay > 0:
        decay = args.ema_decay
        ema = torch.optim.swa_utils.AveragedModel(
            module, avg_fn=lambda averaged, current, _: decay * averaged + (1 - decay) * current)
    milestones = [int(m) for m in args.milestones.split(",")] if args.milestones else []
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma=args.gamma)
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(module(x), labels, label_smoothing=args.label_smoothing)
        loss.backward()
        optimizer.step()
        schedule.step()
        if ema is not None:
            ema.update_parameters(module)
        print(repr(loss.item()))
    if ema is not None:
        write_safetensors(args.ema_out, {name: value.detach() for name, value
                                         in ema.module.state_dict().items()})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("script")
    p.add_argument("name")
    p.add_argument("out")
    p.add_argument("--shape", type=shape_arg, required=True)
    p.add_argument("--classes", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--state-dict")
    p.add_argument("--dtype", default="F32", choices=["F32", "F16", "BF16"])
    p.set_defaults(run=command_script)
    p = commands.add_parser("torch-save")
    p.add_argument("out")
    p.add_argument("--shape", type=shape_arg, required=True)
    p.add_argument("--classes", type=int, required=True)
    p.set_defaults(run=command_torch_save)
    p = commands.add_parser("set-version")
    p.add_argument("input")
    p.add_argument("out")
    p.add_argument("version")
    p.set_defaults(run=command_set_version)
    p = commands.add_parser("edit-weights")
    p.add_argument("input")
    p.add_argument("out")
    p.add_argument("--drop", action="append", default=[])
    p.add_argument("--add", action="append", default=[])
    p.set_defaults(run=command_edit_weights)
    p = commands.add_parser("cifar-bin")
    p.add_argument("dir")
    p.add_argument("--train", type=int, required=True)
    p.add_argument("--test", type=int, required=True)
    p.set_defaults(run=command_cifar_bin)
    p = commands.add_parser("fuzz-seeds")
    p.add_argument("dir")
    p.set_defaults(run=command_fuzz_seeds)
    p = commands.add_parser("evaluate")
    p.add_argument("module")
    p.add_argument("weights")
    p.add_argument("idx_dir")
    p.add_argument("--max-train", type=int, required=True)
    p.add_argument("--max-test", type=int, required=True)
    p.set_defaults(run=command_evaluate)
    p = commands.add_parser("train")
    p.add_argument("module")
    p.add_argument("weights")
    p.add_argument("idx_dir")
    p.add_argument("--max-train", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw", "lamb", "lars"])
    p.add_argument("--trust-coefficient", type=float, default=1e-3)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--dampening", type=float, default=0.0)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--milestones", default="")
    p.add_argument("--gamma", type=float, default=0.1)
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--no-decay-bias-bn", action="store_true")
    p.add_argument("--ema-decay", type=float, default=0.0)
    p.add_argument("--ema-out")
    p.set_defaults(run=command_train)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
