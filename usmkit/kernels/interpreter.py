"""Fixes for running the Triton kernels on CPU under Triton's interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations


def patch_interpreter_loop_bounds() -> None:
    """Let Triton 3.6's interpreter take tensor loop bounds under numpy >= 2.4.

    The interpreter turns ``range(lo, hi)`` bounds into ints with ``int()`` on 1-element arrays, which numpy 2.4
    refuses (triton-lang/triton#9171). Only under TRITON_INTERPRET=1, and only if that conversion fails.
    """
    import numpy as np
    from triton.runtime import interpreter

    try:
        int(np.ones(1, dtype=np.int32))
        return
    except TypeError:
        pass
    original = interpreter._patch_lang_tensor
    if getattr(original, "_usmkit_patched", False):
        return

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._usmkit_patched = True
    interpreter._patch_lang_tensor = patched
