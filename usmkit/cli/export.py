"""``python -m usmkit.cli.export checkpoint=EXP format=onnx|aoti [quantize=int8] [out=DIR]``: export a checkpoint."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from usmkit.cli.compose import compose_dataclass
from usmkit.decoding.ctc_lexicon import STREAMING_LEXICON, LexiconConfig
from usmkit.errors import UsageError, strip_debug_flag, user_errors

USAGE = """\
usage: python -m usmkit.cli.export checkpoint=EXP format=onnx|aoti [quantize=int8] [out=DIR]

  checkpoint=PATH     a streaming CTC checkpoint dir, or an experiment dir (its best/latest checkpoint)
  format=onnx|aoti    onnx: ONNX files for onnxruntime (or any ONNX engine); aoti: AOTInductor packages
                      (.pt2, compiled for this machine's CPU by its C++ compiler; takes minutes for big models)
  quantize=int8       int8 weights for the linear layers (onnxruntime dynamic quantization; format=onnx only)
  out=DIR             output directory (default <exp_dir>/export_<format>[_int8]); an earlier export there
                      is replaced
  threads=N           torch threads while exporting (default: torch's choice)
  lexicon.order=1     the bundled lexicon decoding (the checkpoint's training transcripts' words and word
  lexicon.lm_weight=0.5   LM, as usmkit-transcribe --lexicon builds them): LM order (0 = none, 1, 2), LM
  lexicon.word_score=0.0  weight, score per word, lexicon.beam_size=200, lexicon.lm_path=FILE (your own
                      ARPA/KenLM LM, copied in): what --lexicon decodes with unless told otherwise

Run it with usmkit-transcribe FILE --engine onnx|aoti --model DIR [--lexicon]. Layout of the files: docs/export.md.
"""


@dataclass(frozen=True)
class ExportArgs:
    checkpoint: str = ""
    format: str = ""
    quantize: str = "none"
    out: str = ""
    threads: int = 0
    lexicon: LexiconConfig = field(default_factory=lambda: STREAMING_LEXICON)


def _size(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.1f} MB"


def main(argv: Sequence[str] | None = None) -> int:
    argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
    with user_errors():  # a bad checkpoint or value: one line, exit code 2 (--debug: the traceback)
        args = compose_dataclass(ExportArgs, argv, command="usmkit.cli.export", usage=USAGE)
        if not args.checkpoint or not args.format:
            raise UsageError("pass checkpoint=EXP and format=onnx|aoti (python -m usmkit.cli.export --help)")
        import torch

        from usmkit.export.build import export_checkpoint

        if args.threads:
            torch.set_num_threads(args.threads)
        start = time.perf_counter()
        out, manifest = export_checkpoint(
            args.checkpoint,
            args.format,  # type: ignore[arg-type]
            args.quantize,  # type: ignore[arg-type]
            args.out or None,
            lexicon=args.lexicon,
        )
        took = time.perf_counter() - start
    print(f"exported {manifest.source_checkpoint} ({manifest.format}, quantize={manifest.quantize}) in {took:.0f} s:")
    for name in (manifest.stream_step.file, manifest.offline.file):
        print(f"  {out / name}  {_size(out / name)}")
    print(f"  {out / 'export.json'}  (inputs, outputs, chunking, features; tokenizer and feature stats beside it)")
    lexicon = manifest.lexicon
    if lexicon is not None:
        print(f"  {out / 'lexicon'}/  ({lexicon.words} words of {lexicon.transcripts} training transcripts, "
              f"{'word LM' if lexicon.lm else 'no LM'}: --lexicon)")  # fmt: skip
    else:
        print("  no lexicon: the checkpoint's training transcripts could not be read (see the warning above)")
    print(f"run it: usmkit-transcribe AUDIO --engine {manifest.format} --model {out}{' --lexicon' if lexicon else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
