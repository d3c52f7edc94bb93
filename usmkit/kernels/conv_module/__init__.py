"""Fused convolution-module middle (GLU, depthwise conv, LayerNorm, Swish): reference, Triton kernels, api."""
