"""Fine-tuning throughput of an imported w2v-BERT 2.0 encoder against usmkit's own ``usm600m``, in one call.

    PYTHONPATH=. python bench/pretrained_throughput.py [--import-dir exp/w2vbert] [--seconds 300] [--steps 10] [--json OUT]
    PYTHONPATH=. python bench/pretrained_throughput.py --smoke   # tiny shapes on the CPU: the script runs

One step = encoder forward + CTC head and loss, backward, AdamW update (bf16 autocast, fp32 weights, on CUDA),
each model's blocks compiled one by one (``--no-compile``: eager), on a batch of ``--utterances`` random
utterances holding ``--seconds`` of audio in all (features at 10 ms: w2v-BERT stacks 2 frames into 20 ms
encoder frames, ``usm600m`` subsamples 4x to 40 ms, so at equal audio w2v-BERT's blocks see twice the frames).
Reported per model: audio hours per GPU-hour (audio seconds / step time), step time (median), peak GPU memory,
parameters. ``--import-dir``: the encoder weights of ``python -m usmkit.cli.import_encoder``'s output (its
encoder config too); without it the ``w2v_bert_2`` preset with random weights (the same shapes and cost).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from common import result_path, run_header, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from usmkit.models.config import ConformerConfig  # noqa: E402
from usmkit.models.conformer import ConformerBlock, ConformerEncoder  # noqa: E402
from usmkit.models.ctc import CTCHead, ctc_loss  # noqa: E402
from usmkit.models.presets import preset  # noqa: E402

VOCAB = 512
SMOKE = dict(d_model=64, num_layers=2, num_heads=4, subsampling_channels=None)


def encoder_config(name: str, import_dir: str | None, smoke: bool) -> ConformerConfig:
    if name == "w2v_bert_2" and import_dir:
        record = json.loads((Path(import_dir) / "imported.json").read_text())
        return ConformerConfig(**record["encoder"])
    extra = {k: v for k, v in SMOKE.items() if not (name == "w2v_bert_2" and k == "subsampling_channels")}
    return preset(name, **(extra if smoke else {}))


def measure(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    cfg = encoder_config(name, args.import_dir, args.smoke)
    torch.manual_seed(0)
    encoder = ConformerEncoder(cfg).to(device)
    if name == "w2v_bert_2" and args.import_dir:
        from safetensors.torch import load_file

        weights = load_file(Path(args.import_dir) / "checkpoints" / "step-000000" / "model.safetensors")
        encoder.load_state_dict({k.removeprefix("encoder."): v for k, v in weights.items()}, strict=True)
    head = CTCHead(cfg.d_model, VOCAB).to(device)
    params = [*encoder.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-5, fused=device.type == "cuda")
    if not args.no_compile:
        for module in encoder.modules():
            if isinstance(module, ConformerBlock):
                module.compile()
    B = args.utterances
    T = int(args.seconds / B * 100)  # 10 ms feature frames per utterance
    feats = torch.randn(B, T, cfg.input_dim, device=device)
    lengths = torch.full((B,), T, device=device)
    tokens = torch.randint(1, VOCAB, (B, max(1, T // 40)), device=device)  # ~2.5 tokens a second
    token_lens = torch.full((B,), tokens.shape[1], device=device)
    times = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(args.warmup + args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            enc, enc_lens = encoder(feats, lengths)
            loss = ctc_loss(head(enc), enc_lens, tokens, token_lens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    return {
        "model": name,
        "imported_weights": bool(name == "w2v_bert_2" and args.import_dir),
        "parameters": sum(p.numel() for p in encoder.parameters()),
        "encoder_frames_per_utterance": int(encoder.output_lengths(lengths)[0]),
        "audio_seconds_per_step": args.seconds,
        "step_s_median": round(step_s, 4),
        "audio_h_per_gpu_h": round(args.seconds / step_s, 1),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--import-dir", default=None, help="output folder of usmkit.cli.import_encoder")
    parser.add_argument("--seconds", type=float, default=300.0, help="audio seconds per batch (all utterances)")
    parser.add_argument("--utterances", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, eager, on the CPU")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.utterances, args.steps, args.warmup, args.no_compile = 4.0, 2, 2, 1, True
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    rows = [measure(name, args, device) for name in ("w2v_bert_2", "usm600m")]
    for row in rows:
        print(json.dumps(row))
    if not args.smoke:
        result = {**run_header(), "rows": rows}
        print(f"wrote {write_result(args.json or result_path(__file__), result)}")


if __name__ == "__main__":
    main()
