"""Models of the supervised jobs: ResNet image classifiers and a seq2seq Transformer."""
from .resnet import ResNet, resnet18, resnet50
from .transformer import Seq2SeqTransformer

__all__ = ["ResNet", "resnet18", "resnet50", "Seq2SeqTransformer"]
