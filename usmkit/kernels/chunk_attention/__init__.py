from usmkit.kernels.chunk_attention.api import IMPLS, chunk_attention

__all__ = ["IMPLS", "chunk_attention"]
