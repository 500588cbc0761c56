"""Data of the supervised jobs: generated tasks (shapes, a grammar) and a user's own files."""
from .batches import BatchSchedule, shard_indices
from .grammar import GrammarTask, generate_pairs
from .image_folder import list_image_folder, load_images
from .parallel_text import read_parallel
from .shapes import SHAPE_CLASSES, generate_shapes
from .streaming import ImageFiles, StreamedBatches, ordered_batches
from .vocab import BOS, EOS, PAD, UNK, Vocab

__all__ = ["BatchSchedule", "shard_indices", "GrammarTask", "generate_pairs", "list_image_folder",
           "load_images", "read_parallel", "SHAPE_CLASSES", "generate_shapes", "Vocab", "PAD", "BOS",
           "EOS", "UNK", "ImageFiles", "StreamedBatches", "ordered_batches"]
