"""USM's long-form experiment in miniature, and bounded-memory streaming of a 1-hour recording.

    PYTHONPATH=. python bench/longform.py wer --checkpoint exp/baseline_synth [--minutes 5]
    PYTHONPATH=. python bench/longform.py memory --checkpoint exp/demo_ctc

``wer``: recordings of at least ``--minutes`` minutes are made by concatenating held-out-voice
utterances (``test`` and ``test_other``, 0.3 s pauses). The checkpoint was trained on single
utterances (all under 15 s). The same weights decode them with chunk-wise attention (the trained
8 s chunks) and with full attention over the whole recording; the short-form test set is decoded
both ways too. USM Table 7 found full attention falls apart on long-form audio (deletions).

``memory``: streams 5-minute and 60-minute recordings through ``usmkit-transcribe`` (a streaming
checkpoint: causal convolution, finite left context) in fresh processes, and records each one's
peak resident memory: it must not grow with the length beyond the text.

Both merge their results into ``bench/results/longform.json``.
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from tools.results import REPO, result_path, run_header, write_result

sys.path.insert(0, str(REPO))
RESULTS = result_path("longform")
PAUSE = np.zeros(int(0.3 * 16000), dtype=np.float32)


def _merge(key: str, value: dict) -> None:
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    results[key] = value
    write_result(RESULTS, results)


def build_longform(data: Path, out: Path, minutes: float) -> dict:
    """Concatenate held-out utterances into >= ``minutes``-long recordings; lhotse manifests in ``out``."""
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    from usmkit.data.manifests import load_cuts, manifest_path

    (out / "audio").mkdir(parents=True, exist_ok=True)
    recordings, supervisions = [], []
    pieces, texts, seconds = [], [], 0.0

    def flush():
        idx = len(recordings)
        path = out / "audio" / f"longform_{idx:02d}.flac"
        sf.write(path, np.concatenate(pieces), 16000)
        rec = Recording.from_file(path, recording_id=f"longform_{idx:02d}")
        recordings.append(rec)
        supervisions.append(
            SupervisionSegment(
                id=rec.id,
                recording_id=rec.id,
                start=0.0,
                duration=rec.duration,
                text=" ".join(texts),
                language="en",
                speaker="mixed",
            )  # fmt: skip
        )

    for split in ("test", "test_other"):
        for cut in load_cuts(data, split):
            audio = cut.load_audio()[0].astype(np.float32)
            pieces += [audio, PAUSE]
            texts.append(cut.supervisions[0].text)
            seconds += len(audio) / 16000 + 0.3
            if seconds >= minutes * 60:
                flush()
                pieces, texts, seconds = [], [], 0.0
    recs, sups = RecordingSet.from_recordings(recordings), SupervisionSet.from_segments(supervisions)
    recs.to_file(manifest_path(out, "synth", "recordings", "longform"))
    sups.to_file(manifest_path(out, "synth", "supervisions", "longform"))
    CutSet.from_manifests(recordings=recs, supervisions=sups).to_file(manifest_path(out, "synth", "cuts", "longform"))
    durations = [r.duration for r in recordings]
    return {"recordings": len(recordings), "minutes_each": [round(d / 60, 2) for d in durations]}


def evaluate(checkpoint: str, manifest_dir: Path, split: str, chunk: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "usmkit.cli.evaluate", f"checkpoint={checkpoint}", f"manifest_dir={manifest_dir}",
           f"test_sets=[{split}]", f"chunk_size={chunk}", "max_duration=400", f"output={out}"]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, check=True)
    s = json.loads(out.read_text())["sets"][split]
    keep = {
        k: s[k] for k in ("wer", "cer", "substitutions", "deletions", "insertions", "ref_words", "utterances", "rtf")
    }
    if "per_language" in s:
        keep["per_language_wer"] = {lang: round(v["wer"], 4) for lang, v in s["per_language"].items()}
    return keep


def run_wer(args) -> None:
    data = Path(args.data)
    out = REPO / "data" / "synth_longform"
    # The long recordings need the training corpus' tokenizer path layout for nothing: the checkpoint
    # carries its tokenizer path and feature statistics; only the manifests are new.
    info = build_longform(data, out, args.minutes)
    table = {"short_form_test": {}, "long_form": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, chunk in (("chunkwise_8s", "default"), ("full_attention", "null")):
            table["long_form"][name] = evaluate(args.checkpoint, out, "longform", chunk, Path(tmp) / f"l_{name}.json")
            table["short_form_test"][name] = evaluate(
                args.checkpoint, data, "test", chunk, Path(tmp) / f"s_{name}.json"
            )
    print(f"\n{'set':16s} {'attention':16s} {'WER %':>7s} {'sub':>5s} {'del':>5s} {'ins':>5s}")
    for form, rows in table.items():
        for name, r in rows.items():
            print(
                f"{form:16s} {name:16s} {100 * r['wer']:7.2f} {r['substitutions']:5d} {r['deletions']:5d} {r['insertions']:5d}"
            )
    _merge(
        "wer",
        run_header(checkpoint=args.checkpoint, longform_recordings=info, **table),
    )


def run_memory(args) -> None:
    from usmkit.data.manifests import load_cuts

    data = Path(args.data)
    base = np.concatenate(
        [np.concatenate([c.load_audio()[0].astype(np.float32), PAUSE]) for c in load_cuts(data, "test")]
    )
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for minutes in (5, 60):
            n = int(minutes * 60 * 16000)
            audio = np.resize(base, n)  # repeats the held-out utterances up to the length
            wav = Path(tmp) / f"{minutes}min.wav"
            sf.write(wav, audio, 16000, subtype="PCM_16")
            out = Path(tmp) / f"{minutes}.json"
            del audio  # the parent's memory must not be what the child reports
            # VmHWM: peak RSS of this address space (reset at exec). getrusage's ru_maxrss is not usable
            # here: Linux carries it over fork/exec, so the child would report the parent's peak.
            probe = (
                "import re, sys; from usmkit.cli.transcribe import main; "
                f"code = main([{str(wav)!r}, '--checkpoint', {args.checkpoint!r}, '--json', {str(out)!r}, "
                "'--no-partials', '--threads', '1']); "
                "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1); "
                "print('MAXRSS_KB', hwm, file=sys.stderr); sys.exit(code)"
            )
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-2000:])
            rss_kb = int(proc.stderr.split("MAXRSS_KB")[1].split()[0])
            r = json.loads(out.read_text())
            rows[f"{minutes}min"] = {
                "audio_seconds": r["audio_seconds"],
                "peak_rss_mib": round(rss_kb / 1024, 1),
                "rtf": r["rtf"],
                "wall_seconds": round(time.perf_counter() - start, 1),
                "segments": len(r["segments"]),
            }
    _merge("memory", run_header(checkpoint=args.checkpoint, **rows))
    print(f"\n{'recording':10s} {'peak RSS MiB':>12s} {'RTF':>6s} {'wall s':>7s}")
    for name, r in rows.items():
        print(f"{name:10s} {r['peak_rss_mib']:12.1f} {r['rtf']:6.3f} {r['wall_seconds']:7.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("wer", "memory"))
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", default="data/synth")
    ap.add_argument("--minutes", type=float, default=5.0)
    args = ap.parse_args()
    run_wer(args) if args.what == "wer" else run_memory(args)


if __name__ == "__main__":
    main()
