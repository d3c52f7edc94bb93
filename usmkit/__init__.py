"""usmkit: the Universal Speech Model recipe (BEST-RQ, MOST, CTC/LAS) on a chunk-wise-attention Conformer."""

__version__ = "0.1.0"
