"""The convolution module's compiled depthwise path (K shifted multiply-adds) equals the eager one on the CPU.

Inductor's C++ backend once miscomputed that sum when it started from the bias and was fused with the
norm after it (every value wrong, no error); the depthwise sum now adds the bias last. This runs the
case that failed: depthwise + norm + Swish + pointwise, streaming context and zero padding.
"""

import pytest
import torch

from usmkit.models.convolution import ConvolutionModule

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # inductor compiles for ~15 s per case


@pytest.mark.parametrize("with_context", [True, False])
def test_compiled_depthwise_and_norm_equal_eager_on_cpu(with_context):
    torch.manual_seed(0)
    conv = ConvolutionModule(128, kernel_size=5, causal=True, dropout=0.0).eval()
    y = torch.randn(2, 16, 128)  # (B, T, D)
    context = torch.randn(2, 4, 128) if with_context else None  # (B, K - 1, D)

    def branch(y, context):
        return conv.pointwise_out(conv.depthwise(y, context))  # (B, T, D)

    torch._dynamo.reset()
    with torch.no_grad():
        expected = branch(y, context)
        compiled = torch.compile(branch, dynamic=False)(y, context)
    torch.testing.assert_close(compiled, expected, atol=1e-5, rtol=1e-5)
