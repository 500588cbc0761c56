"""ResNet-18 and ResNet-50 (He et al. 2016) written out, with a width knob for small runs.

``small_input=True`` uses the CIFAR stem (3x3 conv, no max-pool) for 32x32-ish images; False uses
the ImageNet stem (7x7 stride-2 conv and max-pool).
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet50"]


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, in_ch: int, ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)
        self.shortcut = _shortcut(in_ch, ch * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4) with a residual connection (ResNet-50/101/152)."""

    expansion = 4

    def __init__(self, in_ch: int, ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, ch, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)
        self.conv3 = nn.Conv2d(ch, ch * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(ch * self.expansion)
        self.shortcut = _shortcut(in_ch, ch * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return torch.relu(out + self.shortcut(x))


def _shortcut(in_ch: int, out_ch: int, stride: int) -> nn.Module:
    if stride == 1 and in_ch == out_ch:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))


class ResNet(nn.Module):
    """A ResNet: stem, four stages of residual blocks (widths w, 2w, 4w, 8w), pooling, linear head.

    Args:
        block: :class:`BasicBlock` or :class:`Bottleneck`.
        layers: blocks per stage, e.g. ``(2, 2, 2, 2)`` for ResNet-18.
        num_classes: output classes.
        width: channels of the first stage (64 in the paper; smaller for quick runs).
        in_channels: image channels.
        small_input: CIFAR-style stem for small images instead of the ImageNet stem.
    """

    def __init__(self, block: type, layers: tuple[int, ...], *, num_classes: int, width: int = 64,
                 in_channels: int = 3, small_input: bool = True):
        super().__init__()
        if small_input:
            self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        else:
            self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 7, 2, 3, bias=False),
                                      nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                                      nn.MaxPool2d(3, 2, 1))
        stages, in_ch = [], width
        for i, n in enumerate(layers):
            ch, stride = width * 2 ** i, 1 if i == 0 else 2
            blocks = []
            for j in range(n):
                blocks.append(block(in_ch, ch, stride if j == 0 else 1))
                in_ch = ch * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(in_ch, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        # Zero-init the last BN of each block so every block starts as the identity (Goyal et al.).
        for m in self.modules():
            if isinstance(m, BasicBlock):
                nn.init.zeros_(m.bn2.weight)
            elif isinstance(m, Bottleneck):
                nn.init.zeros_(m.bn3.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def resnet18(*, num_classes: int, width: int = 64, in_channels: int = 3, small_input: bool = True) -> ResNet:
    """ResNet-18 (basic blocks 2-2-2-2)."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes=num_classes, width=width,
                  in_channels=in_channels, small_input=small_input)


def resnet50(*, num_classes: int, width: int = 64, in_channels: int = 3, small_input: bool = True) -> ResNet:
    """ResNet-50 (bottleneck blocks 3-4-6-3)."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes=num_classes, width=width,
                  in_channels=in_channels, small_input=small_input)
