"""Supervised jobs on the wagma_rl.optim API: ResNet image classification and Transformer translation.

Entry point: ``mpiexec -n 4 python -m wagma_rl.supervised --config configs/resnet_shapes.yaml``.
"""
from .config import SupervisedConfig
from .train import main, train

__all__ = ["SupervisedConfig", "train", "main"]
