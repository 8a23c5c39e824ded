"""hpc_train's networks in PyTorch, with the structure and parameter names of src/model/models.cpp.

Weights that hpc_train exports (safetensors) load into these with load_state_dict(strict=True);
a change to a network there must be made here too (tests/support/check_safetensors.py lists the
same names and shapes without PyTorch for simple_cnn and resnet18, and asks build() for the rest).

simple_cnn, resnet18 and wide_resnet16_8 are defined here; the other networks of the model zoo
are torchvision's (torchvision.models, imported only when one of them is built), with the CIFAR
stem put in where the name asks for it and the first convolution sized for the dataset's
channels. tests/test_model_zoo.cpp checks every one against hpc_train (names, shapes, order,
logits, FLOPs).

    model = build("resnet18", channels=3, height=32, width=32, num_classes=10)
"""
import torch
import torch.nn.functional as F
from torch import nn


class SimpleCnn(nn.Module):
    """The origin's network: two 3x3 convolutions (padded) with ReLU and 2x2 max-pooling, then
    two linear layers."""

    def __init__(self, channels, height, width, num_classes):
        super().__init__()
        if height < 4 or width < 4:
            raise ValueError(f"simple_cnn needs images of at least 4x4 pixels, "
                             f"got {height}x{width}")
        self.conv1 = nn.Conv2d(channels, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        # Two 2x2 max-pools (floor) shrink each side by 4.
        self.fc1 = nn.Linear(64 * (height // 4) * (width // 4), 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, images):
        x = F.max_pool2d(F.relu(self.conv1(images)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: two 3x3 convolutions with batch norm, identity or 1x1 shortcut."""

    def __init__(self, in_channels, out_channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        # None is no submodule: no "downsample.*" keys, as in hpc_train.
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(y + shortcut)


class ResNet18(nn.Module):
    """ResNet-18, CIFAR variant: a 3x3 stride-1 stem without max-pooling, BasicBlocks
    [2, 2, 2, 2]."""

    def __init__(self, channels, num_classes):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 64, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        in_channels = 64
        for index, width in enumerate((64, 128, 256, 512)):
            stride = 1 if index == 0 else 2
            layer = nn.Sequential(BasicBlock(in_channels, width, stride),
                                  BasicBlock(width, width, 1))
            setattr(self, f"layer{index + 1}", layer)
            in_channels = width
        self.fc = nn.Linear(512, num_classes)

    def forward(self, images):
        x = F.relu(self.bn1(self.conv1(images)))
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = layer(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


class WideBlock(nn.Module):
    """The wide ResNet's pre-activation block: batch norm and ReLU before each 3x3 convolution;
    where the width or resolution changes, a 1x1 convolution of the activated input as the
    shortcut (downsample.0, torchvision's index), else the identity of the input."""

    def __init__(self, in_channels, out_channels, stride):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False))

    def forward(self, x):
        activated = F.relu(self.bn1(x))
        y = self.conv2(F.relu(self.bn2(self.conv1(activated))))
        return y + (x if self.downsample is None else self.downsample(activated))


class WideResNet(nn.Module):
    """WRN-depth-k for CIFAR (Zagoruyko & Komodakis, 2016): a 3x3 convolution to 16 channels,
    three stages of (depth - 4) / 6 pre-activation blocks 16k, 32k and 64k wide (the first block
    of stages 2 and 3 with stride 2), batch norm and ReLU, global average pool, linear. No
    dropout. Names follow torchvision's ResNet where it has the part; the final batch norm is
    `bn`, as in the authors' code. Initialised as torchvision initialises its ResNets."""

    def __init__(self, channels, num_classes, depth=16, widen_factor=8):
        super().__init__()
        if (depth - 4) % 6 != 0:
            raise ValueError(f"a wide ResNet's depth is 6n + 4, not {depth}")
        blocks = (depth - 4) // 6
        self.conv1 = nn.Conv2d(channels, 16, 3, padding=1, bias=False)
        in_channels = 16
        for index in range(3):
            width = (16 << index) * widen_factor
            layer = []
            for block in range(blocks):
                layer.append(WideBlock(in_channels, width, 2 if index > 0 and block == 0 else 1))
                in_channels = width
            setattr(self, f"layer{index + 1}", nn.Sequential(*layer))
        self.bn = nn.BatchNorm2d(in_channels)
        self.fc = nn.Linear(in_channels, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, images):
        x = self.conv1(images)
        for layer in (self.layer1, self.layer2, self.layer3):
            x = layer(x)
        x = F.relu(self.bn(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def torchvision_first_conv(conv, in_channels, kernel_size, stride, padding):
    """A first convolution like `conv` but for `in_channels` (and this kernel, stride and
    padding), initialised as torchvision initialises convolutions."""
    replacement = nn.Conv2d(in_channels, conv.out_channels, kernel_size, stride=stride,
                            padding=padding, bias=conv.bias is not None)
    nn.init.kaiming_normal_(replacement.weight, mode="fan_out", nonlinearity="relu")
    if replacement.bias is not None:
        nn.init.zeros_(replacement.bias)
    return replacement


def torchvision_resnet(depth, channels, num_classes, cifar_stem):
    """torchvision's resnet{depth}; with the CIFAR stem (3x3 stride-1 conv1, no max-pool) if
    asked. The module replaced keeps its place, so the state_dict's order is torchvision's."""
    import torchvision

    model = getattr(torchvision.models, f"resnet{depth}")(weights=None, num_classes=num_classes)
    if cifar_stem:
        model.conv1 = torchvision_first_conv(model.conv1, channels, 3, 1, 1)
        model.maxpool = nn.Identity()
    elif channels != 3:
        model.conv1 = torchvision_first_conv(model.conv1, channels, 7, 2, 3)
    return model


def torchvision_vgg_bn(depth, channels, height, width, num_classes):
    """torchvision's vgg{depth}_bn, its first convolution sized for `channels`."""
    import torchvision

    if height < 32 or width < 32:
        raise ValueError(f"vgg{depth}_bn needs images of at least 32x32 pixels, "
                         f"got {height}x{width}")
    model = getattr(torchvision.models, f"vgg{depth}_bn")(weights=None, num_classes=num_classes)
    if channels != 3:
        model.features[0] = torchvision_first_conv(model.features[0], channels, 3, 1, 1)
    return model


# The names of hpc_train's --model, as src/model/model_names.cpp lists them.
NAMES = ("simple_cnn", "resnet18", "resnet34", "resnet50", "resnet18_imagenet",
         "resnet34_imagenet", "resnet50_imagenet", "wide_resnet16_8", "vgg11_bn", "vgg16_bn")


def build(name, channels, height, width, num_classes):
    """The network `name` (as hpc_train's --model) for images [channels, height, width]."""
    if name == "simple_cnn":
        return SimpleCnn(channels, height, width, num_classes)
    if name == "resnet18":
        return ResNet18(channels, num_classes)
    if name in ("resnet34", "resnet50"):
        return torchvision_resnet(int(name[6:]), channels, num_classes, cifar_stem=True)
    if name in ("resnet18_imagenet", "resnet34_imagenet", "resnet50_imagenet"):
        return torchvision_resnet(int(name[6:8]), channels, num_classes, cifar_stem=False)
    if name == "wide_resnet16_8":
        return WideResNet(channels, num_classes, depth=16, widen_factor=8)
    if name in ("vgg11_bn", "vgg16_bn"):
        return torchvision_vgg_bn(int(name[3:5]), channels, height, width, num_classes)
    raise ValueError(f"unknown model {name!r}; known: {', '.join(NAMES)}")
