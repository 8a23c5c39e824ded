"""hpc_train's networks in PyTorch, with the structure and parameter names of src/models.cpp.

Weights that hpc_train exports (safetensors) load into these with load_state_dict(strict=True);
a change to a network there must be made here too (tests/support/check_safetensors.py lists the
same names and shapes without PyTorch).

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


def build(name, channels, height, width, num_classes):
    """The network `name` (as hpc_train's --model) for images [channels, height, width]."""
    if name == "simple_cnn":
        return SimpleCnn(channels, height, width, num_classes)
    if name == "resnet18":
        return ResNet18(channels, num_classes)
    raise ValueError(f"unknown model {name!r}; known: simple_cnn, resnet18")
