"""The state layout the CTC kernels share with the ops' fake implementations."""


def padded_states(num_tokens: int) -> int:
    """S_PAD: the 2U + 1 states of a target of U tokens, rounded up to a power of two (one lane each)."""
    return 1 << (2 * num_tokens).bit_length()
