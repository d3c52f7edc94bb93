"""CPU dropout: torch's ``F.dropout`` against ours (``usmkit/models/dropout.py``), side by side.

    PYTHONPATH=. python experiments/dropout_cpu/dropout_cpu.py [--repeats 15]

Two measurements, interleaved so that this shared machine's drift hits both alike:

- one activation tensor (40, 300, 576), the size of a tiny Conformer's feed-forward hidden layer on a
  50-s batch: a dropout forward;
- the tiny model's whole training step (forward, CTC loss, backward) on a 50-s batch (10 x 5 s) with
  dropout 0.1, once with our Dropout modules and once with them swapped for ``nn.Dropout``.

Prints a table of medians and ratios and writes ``experiments/dropout_cpu/results/dropout_cpu.json``.
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import statistics
import time

import torch

from tools.results import result_path, run_header, write_result
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.ctc import CTCHead, ctc_loss
from usmkit.models.dropout import Dropout
from usmkit.models.presets import preset

OUT = result_path(__file__)


def ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def with_torch_dropout(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every one of our Dropout modules replaced by ``nn.Dropout`` of the same p."""
    for name, child in module.named_children():
        if isinstance(child, Dropout):
            setattr(module, name, torch.nn.Dropout(child.p))
        else:
            with_torch_dropout(child)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.manual_seed(0)

    x = torch.randn(40, 300, 576)
    ours_module = Dropout(0.1).train()
    tensor = {"torch": [], "ours": []}
    for _ in range(args.repeats):
        tensor["torch"].append(ms(lambda: torch.nn.functional.dropout(x, 0.1, training=True)))
        tensor["ours"].append(ms(lambda: ours_module(x)))

    def build(torch_dropout: bool):
        torch.manual_seed(0)
        encoder = ConformerEncoder(preset("tiny", dropout=0.1))
        head = CTCHead(encoder.output_dim, 320)
        model = torch.nn.ModuleDict({"encoder": encoder, "head": head}).train()
        return with_torch_dropout(model) if torch_dropout else model

    models = {"torch": build(True), "ours": build(False)}
    feats, lens = torch.randn(10, 500, 80), torch.full((10,), 500)
    tokens, token_lens = torch.randint(4, 320, (10, 40)), torch.full((10,), 40)

    def step(model) -> None:
        enc, enc_lens = model["encoder"](feats, lens)
        loss = ctc_loss(model["head"](enc), enc_lens, tokens, token_lens)
        loss.backward()
        model.zero_grad(set_to_none=True)

    for model in models.values():  # warm-up
        step(model)
    steps = {"torch": [], "ours": []}
    for _ in range(args.repeats):
        for name, model in models.items():
            steps[name].append(ms(lambda model=model: step(model)))

    result = run_header(
        **{
            "threads": torch.get_num_threads(),
            "repeats": args.repeats,
            "tensor_40x300x576_ms": {k: round(statistics.median(v), 2) for k, v in tensor.items()},
            "tiny_train_step_50s_batch_ms": {k: round(statistics.median(v), 1) for k, v in steps.items()},
        }
    )
    result["tensor_speedup"] = round(
        result["tensor_40x300x576_ms"]["torch"] / result["tensor_40x300x576_ms"]["ours"], 2
    )
    result["step_speedup"] = round(
        result["tiny_train_step_50s_batch_ms"]["torch"] / result["tiny_train_step_50s_batch_ms"]["ours"], 2
    )
    write_result(OUT, result)
    print(f"{'what':32s} {'torch ms':>9s} {'ours ms':>9s} {'ratio':>6s}")
    for key, ratio in (("tensor_40x300x576_ms", "tensor_speedup"), ("tiny_train_step_50s_batch_ms", "step_speedup")):
        print(f"{key:32s} {result[key]['torch']:9.1f} {result[key]['ours']:9.1f} {result[ratio]:6.2f}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
