"""``python -m usmkit.cli.transcribe_batch checkpoint=EXP inputs=DIR out=OUT.jsonl``: transcribe an archive.

The library is ``usmkit.inference.batch_transcribe``; this module reads the overrides, runs it and
prints the summary. Several GPUs: ``torchrun --nproc-per-node N -m usmkit.cli.transcribe_batch ...``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from usmkit.cli.compose import compose_dataclass
from usmkit.cli.logs import setup_logging
from usmkit.errors import interrupted_line, strip_debug_flag, user_errors

COMMAND = "usmkit.cli.transcribe_batch"

USAGE = """\
usage: python -m usmkit.cli.transcribe_batch checkpoint=EXP inputs=DIR|LIST|MANIFEST out=OUT.jsonl [key=value ...]
       torchrun --nproc-per-node N -m usmkit.cli.transcribe_batch ...      (N GPUs or processes, one merged OUT)

  checkpoint=PATH        a CTC checkpoint dir, or an experiment dir (its best/latest checkpoint)
  inputs=PATH            a folder (its audio files, recursively), a text file with one audio path a line
                         (relative to the list's folder), a lhotse cuts manifest (.jsonl.gz) or one audio file
  out=FILE               JSONL, one line per input: id, path, duration, text, confidence, words with
                         start/end/confidence. A rerun skips the ids already in it (resume after a kill)
  srt_dir=DIR            also one SubRip file per input (DIR/<id>.srt)
  ctm=FILE               also one CTM file of every word (written at the end)
  decode=ctc_greedy      or ctc_lexicon: words of the training transcripts and their word LM (lexicon.*),
                         searched by lexicon_workers=2 CPU processes beside the GPU
  bias_phrases=FILE      with ctc_lexicon: phrases to favour, one a line, optionally a tab and a boost per word
                         (default 5); their words join the lexicon (names, numbers, jargon)
  device=auto            auto, cpu, cuda, cuda:N
  precision=auto         auto (bf16 on CUDA, fp32 on CPU), bf16 or fp32
  compile=false          true: torch.compile the encoder's blocks (minutes to compile; for long runs)
  batch_seconds=600      audio per batch, padding included
  num_workers=2          DataLoader processes decoding audio (and computing features: features=workers)
  features=auto          workers, device (on the GPU), auto (device on CUDA, else workers)
  long_seconds=60        longer files are encoded alone, window by window, in flat memory (chunk-wise models)
  chunk_size=default     another attention mask for the same weights (null = full attention), left_chunks=...
  progress=true          a progress bar with RTFx (audio seconds per second) and ETA on stderr

Outputs lie apart from the inputs and the checkpoint, outside other work (a corpus, an experiment), and an
existing one must be this command's own (usmkit.checkpointing.output_dir). Confidences, other keys: docs/batch.md.
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
    with user_errors():  # a bad value, file or checkpoint: one line, exit code 2 (--debug: the traceback)
        from usmkit.inference.batch_transcribe import BatchConfig, transcribe_batch

        cfg = compose_dataclass(BatchConfig, argv, command=COMMAND, usage=USAGE)
        cfg.check()
        setup_logging()
        with interrupted_line(lambda: _resume_hint(cfg.out)):
            summary = transcribe_batch(cfg)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 holds the totals
        print_summary(summary)
    return 0


def _resume_hint(out: str) -> str:
    return (
        f"every input transcribed so far is in {out} (or its part files, under torchrun); run the same command "
        "again to transcribe the rest (it skips the ids already written)"
    )


def print_summary(summary) -> None:
    if summary.transcribed:
        print(
            f"transcribed {summary.transcribed} inputs ({summary.audio_seconds / 3600:.2f} h of audio) in "
            f"{summary.wall_seconds:.1f} s: RTFx {summary.rtfx:.1f} (after {summary.setup_seconds:.1f} s of setup); "
            f"{summary.already_done} were already in {summary.out}; "
            f"{summary.loader_wait_seconds:.1f} s waiting for the loader's workers (more num_workers if that is most)",
            file=sys.stderr,
        )
    else:
        print(f"nothing to transcribe: {summary.already_done} inputs were already in {summary.out}", file=sys.stderr)
    if summary.report.problems:
        print(summary.report.summary(), file=sys.stderr)
    print(f"wrote {summary.out} ({summary.records} lines)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
