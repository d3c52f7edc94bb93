"""Which directions a trained MOST model's text path carries its content in: those speech uses, or others.

    PYTHONPATH=. python experiments/most_study/most_text_path.py CHECKPOINT [CHECKPOINT ...] [--split dev] [--energy 0.99]

For each stage-2 checkpoint, on the paired utterances of ``--split`` (evaluation mode, durations from
forced alignment on the model's own CTC head, as in training without ``align_from``), the block-k inputs of both paths are decoded through the shared
blocks k.. and the CTC head (greedy), and scored against the transcripts (CER):

- ``speech``: the speech encoder's block-k input, as the model runs;
- ``text``: the text encoder's frames at the aligned durations (what the text-only loss trains on);
- ``text_in_speech_space``: the text frames projected onto the principal subspace of the speech
  states (the top components holding ``--energy`` of their variance, about the speech mean);
- ``text_outside_speech_space``: what the projection removes, added to the speech mean;
- ``speech_in_speech_space``: the speech states through the same projection (what it costs speech);
- ``text_plus_residual_noise``: the text frames plus Gaussian noise with the per-dimension variance of
  speech minus text (over the split's aligned frames): whether what separates text from speech
  decodes like noise.

If the text path decodes well only outside the speech subspace, the shared blocks learned to read text
from directions speech never occupies, and what they learn from text cannot reach speech.
Results go to ``experiments/most_study/results/most_text_path.json`` (``$OUT`` when set).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from tools.results import result_path, run_header, write_result

INPUTS = (
    "speech",
    "text",
    "text_in_speech_space",
    "text_outside_speech_space",
    "speech_in_speech_space",
    "text_plus_residual_noise",
)


def block_inputs(module, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """speech (B, T', D), text (B, T', D), lengths (B,), frame mask (B, T') of the utterances aligned."""
    from usmkit.ssl.alignment import forced_durations
    from usmkit.ssl.masking import valid_mask

    k = module.text_layer
    x, lengths = module.encoder.front_end(batch.features, batch.feature_lens)  # (B, T', D), (B,)
    h_k, _ = module.encoder.run_blocks(x, lengths, 0, k)
    enc, _ = module.encoder.run_blocks(h_k, lengths, k, len(module.encoder.blocks))
    durations, ok = forced_durations(module.ctc(enc), lengths, batch.tokens, batch.token_lens)
    states = module.text_encoder.encode_tokens(batch.tokens, batch.token_lens)  # (B, U, D)
    text, _ = module.text_encoder.frames(states, durations, num_frames=h_k.shape[1])  # (B, T', D)
    mask = valid_mask(lengths, h_k.shape[1]) & ok[:, None]  # (B, T')
    return h_k, text, lengths, mask


def speech_subspace(frames: torch.Tensor, energy: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (D,) and orthonormal basis (D, m) of the top principal components of frames (N, D) that
    hold ``energy`` of their variance."""
    mean = frames.mean(0)
    _, s, vh = torch.linalg.svd(frames - mean, full_matrices=False)
    share = (s**2).cumsum(0) / (s**2).sum()
    m = int((share < energy).sum()) + 1
    return mean, vh[:m].T


def measure(checkpoint: str, split: str, energy: float, device: str) -> dict:
    import jiwer

    from usmkit.data.loader import split_loader
    from usmkit.decoding import ctc_greedy
    from usmkit.runs import load_trained
    from usmkit.streaming.features import checkpoint_feature_stats

    module, cfg, tokenizer, path = load_trained(checkpoint, device)
    if cfg.task.kind != "most":
        raise SystemExit(f"{checkpoint}: a {cfg.task.kind!r} run, not MOST (stage 2)")
    data = replace(cfg.data, num_workers=0)
    loader, _ = split_loader(data, split, tokenizer=tokenizer, stats=checkpoint_feature_stats(path, data))
    batches = []
    with torch.no_grad():
        for batch in loader:
            batch = batch.to(device)
            batches.append((batch, *block_inputs(module, batch)))
        speech_frames = torch.cat([h[m] for _, h, _, _, m in batches])  # (N, D)
        mean, basis = speech_subspace(speech_frames.float(), energy)
        residual_std = torch.cat([(h - t)[m] for _, h, t, _, m in batches]).float().std(0)  # (D,)
        noise = torch.Generator(device=device).manual_seed(0)

        def inside(x):
            return mean + ((x - mean) @ basis) @ basis.T

        refs: list[str] = []
        hyps: dict[str, list[str]] = {name: [] for name in INPUTS}
        for batch, h_k, text, lengths, mask in batches:
            keep = mask.any(1)  # utterances whose alignment succeeded
            variants = {
                "speech": h_k,
                "text": text,
                "text_in_speech_space": inside(text),
                "text_outside_speech_space": text - inside(text) + mean,
                "speech_in_speech_space": inside(h_k),
                "text_plus_residual_noise": text
                + residual_std * torch.randn(text.shape, generator=noise, device=text.device),
            }
            refs += [t for t, kept in zip(batch.texts, keep.tolist(), strict=True) if kept]
            for name, x in variants.items():
                enc, _ = module.encoder.run_blocks(x, lengths, module.text_layer, len(module.encoder.blocks))
                ids = ctc_greedy(module.ctc(enc), lengths)
                hyps[name] += [tokenizer.decode(i) for i, kept in zip(ids, keep.tolist(), strict=True) if kept]
    cer = {name: round(100 * jiwer.cer(refs, hyps[name]), 2) for name in INPUTS}
    return {
        "checkpoint": str(path),
        "text_layer": module.text_layer,
        "text_detach_encoder": cfg.task.most.text_detach_encoder,
        "split": split,
        "utterances": len(refs),
        "speech_subspace_dims": f"{basis.shape[1]} of {basis.shape[0]}",
        "cer": cer,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--energy", type=float, default=0.99, help="share of the speech states' variance kept")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    runs = [measure(c, args.split, args.energy, args.device) for c in args.checkpoints]
    result = run_header(split=args.split, energy=args.energy, runs=runs)
    path = write_result(args.json or result_path(__file__), result)
    print(f"CER % on {args.split} ({args.energy:.0%} of the speech variance kept)")
    for r in runs:
        print(f"{r['checkpoint']} (speech subspace: {r['speech_subspace_dims']} dimensions)")
        for n in INPUTS:
            print(f"  {n:28s} {r['cer'][n]:6.2f}")
    print(f"JSON: {path}")


if __name__ == "__main__":
    main()
