"""Build the embedded synthetic corpus: plan, synthesize in parallel, write manifests and tokenizer.

Output under ``cfg.out``:

    audio/{split}/{id}.flac                          16 kHz mono FLAC
    synth_{recordings,supervisions,cuts}_{split}.jsonl.gz   train, dev, test, test_other, test_textonly
    synth_{recordings,cuts}_unlabeled.jsonl.gz       audio only: cuts without supervisions,
                                                     custom={"language", "speaker"}
    synth_text_only.jsonl.gz                         {"text", "language"} per line
    tokenizer/tokenizer.{model,vocab}                trained on train + text_only text (never eval text)
    corpus.json                                      summary; written last, so it marks a complete build
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import time
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from lhotse import CutSet, MonoCut, Recording, RecordingSet, SupervisionSegment, SupervisionSet
from lhotse.audio import AudioSource
from tqdm import tqdm

from usmkit.checkpointing.atomic import replaced_atomically
from usmkit.data.corpora import print_split_table
from usmkit.data.manifests import manifest_path, text_only_path, write_jsonl, write_manifest
from usmkit.data.synth.external import detect_external_engines
from usmkit.data.synth.plan import AUDIO_SPLITS, CorpusPlan, Utterance, get_size, plan_corpus, shard_seed
from usmkit.data.synth.render import SAMPLE_RATE, Rendered, ShardTask, render_shard
from usmkit.data.tokenizer import Tokenizer

CORPUS = "synth"
SUMMARY_FILE = "corpus.json"
# Utterances per worker process. espeak-ng carries state from one utterance to the next, so the
# audio bytes depend on the shard boundaries: this is a constant, not an option, so that the corpus
# is a function of (seed, size) alone.
SHARD_SIZE = 32


@dataclass(frozen=True)
class SynthConfig:
    """``python -m usmkit.cli.prepare synth`` options (key=value on the command line)."""

    out: Path = Path("data/synth")
    size: str = "default"  # "default" (~3 h train) or "tiny" (tests)
    seed: int = 0
    force: bool = False  # rebuild even when out/corpus.json says this seed and size are built
    workers: int = 0  # synthesis processes; 0 = os.cpu_count()
    vocab_size: int = 512  # tokenizer pieces, including 4 specials and 256 byte-fallback pieces
    external_engines: bool = True  # add flite/festival voices to train when their binaries are installed


@dataclass(frozen=True)
class BuildResult:
    summary: dict[str, Any]
    skipped: bool  # True: an identical build was already there


def _validate(cfg: SynthConfig) -> None:
    get_size(cfg.size)
    if cfg.seed < 0:
        raise ValueError(f"seed must be >= 0, got {cfg.seed}")
    if cfg.workers < 0:
        raise ValueError(f"workers must be >= 0 (0 = all cores), got {cfg.workers}")


def _existing_summary(out: Path) -> dict[str, Any] | None:
    path = out / SUMMARY_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _shard_tasks(plan: CorpusPlan, audio_dir: Path, binaries: dict[str, str]) -> list[ShardTask]:
    tasks = []
    for split in AUDIO_SPLITS:
        utterances = plan.utterances[split]
        for index, start in enumerate(range(0, len(utterances), SHARD_SIZE)):
            chunk = utterances[start : start + SHARD_SIZE]
            tasks.append(ShardTask(chunk, audio_dir, shard_seed(plan.seed, split, index), binaries))
    return tasks


def _synthesize(tasks: list[ShardTask], workers: int) -> dict[str, Rendered]:
    """Run every shard in a fresh process (forkserver, one task per child) with a progress bar."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["__main__", "usmkit.data.synth.build"])
    total = sum(len(t.utterances) for t in tasks)
    rendered: dict[str, Rendered] = {}
    audio_seconds = 0.0
    with (
        context.Pool(processes=workers, maxtasksperchild=1) as pool,
        tqdm(total=total, unit="utt", desc="synthesizing", smoothing=0.05) as bar,
    ):
        for shard in pool.imap_unordered(render_shard, tasks):
            for item in shard:
                rendered[item.id] = item
                audio_seconds += item.num_samples / SAMPLE_RATE
            bar.update(len(shard))
            bar.set_postfix(audio=f"{audio_seconds / 3600:.2f}h")
    return rendered


def _manifests(
    utterances: tuple[Utterance, ...], rendered: dict[str, Rendered], labeled: bool
) -> tuple[RecordingSet, SupervisionSet, CutSet]:
    recordings, supervisions, cuts = [], [], []
    for u in utterances:
        item = rendered[u.id]
        duration = item.num_samples / SAMPLE_RATE
        recording = Recording(
            id=u.id,
            sources=[AudioSource(type="file", channels=[0], source=str(item.path))],
            sampling_rate=SAMPLE_RATE,
            num_samples=item.num_samples,
            duration=duration,
        )
        recordings.append(recording)
        if labeled:
            supervision = SupervisionSegment(
                id=u.id,
                recording_id=u.id,
                start=0.0,
                duration=duration,
                channel=0,
                text=u.text,
                language=u.language,
                speaker=u.voice.name,
            )
            supervisions.append(supervision)
            cuts.append(MonoCut(u.id, 0.0, duration, 0, recording=recording, supervisions=[supervision]))
        else:
            custom = {"language": u.language, "speaker": u.voice.name}
            cuts.append(MonoCut(u.id, 0.0, duration, 0, recording=recording, supervisions=[], custom=custom))
    return RecordingSet.from_recordings(recordings), SupervisionSet.from_segments(supervisions), CutSet.from_cuts(cuts)


def _split_summary(utterances: tuple[Utterance, ...], rendered: dict[str, Rendered]) -> dict[str, Any]:
    languages: dict[str, dict[str, float]] = {}
    seconds = 0.0
    for u in utterances:
        duration = rendered[u.id].num_samples / SAMPLE_RATE
        seconds += duration
        entry = languages.setdefault(u.language, {"utterances": 0, "hours": 0.0})
        entry["utterances"] += 1
        entry["hours"] += duration / 3600
    voices = sorted({u.voice.name for u in utterances})
    return {
        "hours": round(seconds / 3600, 4),
        "utterances": len(utterances),
        "voices": len(voices),
        "voice_names": voices,
        "languages": {
            k: {"utterances": v["utterances"], "hours": round(v["hours"], 4)} for k, v in sorted(languages.items())
        },
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with replaced_atomically(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def print_summary(summary: dict[str, Any]) -> None:
    rows = {
        split: {
            "hours": s["hours"],
            "utterances": s["utterances"],
            "speakers": s["voices"],
            "languages": s["languages"],
        }
        for split, s in summary["splits"].items()
    }
    text_only = summary["text_only"]
    rows["text_only"] = {"hours": None, "utterances": text_only["sentences"], "languages": text_only["languages"]}
    footer = (
        f"generated in {summary['generation_seconds']:.1f} s (synthesis {summary['synthesis_seconds']:.1f} s, "
        f"{summary['synthesis_realtime_factor']:.0f}x real time); tokenizer: {summary['tokenizer']['vocab_size']} "
        f"pieces; {len(summary['heldout_words'])} held-out words"
    )
    print_split_table(f"synth corpus (size={summary['size']}, seed={summary['seed']})", rows, footer)


def build_corpus(cfg: SynthConfig) -> BuildResult:
    """Build the corpus described by ``cfg`` (or find it already built)."""
    _validate(cfg)
    out = cfg.out.expanduser().resolve()
    existing = _existing_summary(out)
    if existing and not cfg.force and existing.get("seed") == cfg.seed and existing.get("size") == cfg.size:
        return BuildResult(existing, skipped=True)
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    audio_dir = out / "audio"
    if (out / SUMMARY_FILE).exists():
        # A previous build of ours is here (corpus.json proves it): drop its audio so no stale file remains.
        (out / SUMMARY_FILE).unlink()
        shutil.rmtree(audio_dir, ignore_errors=True)

    engines = detect_external_engines() if cfg.external_engines else []
    plan = plan_corpus(cfg.seed, cfg.size, engines)
    binaries = {engine.name: engine.binary for engine in engines}
    tasks = _shard_tasks(plan, audio_dir, binaries)
    synthesis_start = time.perf_counter()
    rendered = _synthesize(tasks, cfg.workers or os.cpu_count() or 1)
    synthesis_seconds = time.perf_counter() - synthesis_start

    splits = {}
    for split in AUDIO_SPLITS:
        labeled = split != "unlabeled"
        recordings, supervisions, cuts = _manifests(plan.utterances[split], rendered, labeled)
        write_manifest(recordings, manifest_path(out, CORPUS, "recordings", split))  # paths relative to out
        if labeled:
            write_manifest(supervisions, manifest_path(out, CORPUS, "supervisions", split))
        write_manifest(cuts, manifest_path(out, CORPUS, "cuts", split))
        splits[split] = _split_summary(plan.utterances[split], rendered)
    write_jsonl(({"text": t, "language": lang} for t, lang in plan.text_only), text_only_path(out, CORPUS))

    texts = [u.text for u in plan.utterances["train"]] + [t for t, _ in plan.text_only]
    tokenizer = Tokenizer.train(texts, out / "tokenizer", vocab_size=cfg.vocab_size)

    text_only_languages: dict[str, int] = {}
    for _, lang in plan.text_only:
        text_only_languages[lang] = text_only_languages.get(lang, 0) + 1
    audio_seconds = sum(r.num_samples for r in rendered.values()) / SAMPLE_RATE
    summary = {
        "corpus": CORPUS,
        "seed": cfg.seed,
        "size": cfg.size,
        "sample_rate": SAMPLE_RATE,
        "generation_seconds": round(time.perf_counter() - start, 2),
        "synthesis_seconds": round(synthesis_seconds, 2),
        "synthesis_realtime_factor": round(audio_seconds / max(synthesis_seconds, 1e-9), 1),
        "workers": cfg.workers or os.cpu_count(),
        "engines": ["espeak-ng"] + [e.name for e in engines],
        "packages": {p: version(p) for p in ("espeakng-loader", "wordfreq", "sentencepiece", "lhotse")},
        "splits": splits,
        "text_only": {"sentences": len(plan.text_only), "languages": dict(sorted(text_only_languages.items()))},
        "heldout_words": list(plan.heldout_words),
        "voices": {group: [asdict(v) for v in voices] for group, voices in plan.voices.items()},
        "tokenizer": {"path": "tokenizer/tokenizer.model", "vocab_size": tokenizer.vocab_size},
    }
    _write_json(out / SUMMARY_FILE, summary)
    return BuildResult(summary, skipped=False)


USAGE = """\
usage: python -m usmkit.cli.prepare synth [key=value ...]

Synthesize the embedded multi-voice corpus (espeak-ng; no download) and train its tokenizer.

  out=PATH            output directory (default data/synth)
  size=NAME           default|demo|english|tiny. default: ~3 h train in five languages + dev/test/test_other/
                      test_textonly + 1 h unlabeled + 20k texts; demo: English, 400 words, 1.8 h (make demo);
                      english: English, 1000 words, 5.2 h + 2.6 h unlabeled (the MOST study); tiny: tests
  seed=INT            corpus seed (default 0): same seed, same texts, voices and audio bytes
  force=true          rebuild even if out/corpus.json shows this seed and size already built
  workers=INT         synthesis processes (default 0 = all cores)
  vocab_size=INT      tokenizer pieces incl. 4 specials and 256 byte pieces (default 512)
  external_engines=false   do not add flite/festival voices even if installed
"""


def run(cfg: SynthConfig) -> None:
    """``python -m usmkit.cli.prepare synth key=value ...`` (``USAGE``)."""
    result = build_corpus(cfg)
    if result.skipped:
        print(
            f"{cfg.out}/corpus.json: the corpus with seed={cfg.seed} size={cfg.size} is already built; "
            "nothing to do (force=true rebuilds it)"
        )
    print_summary(result.summary)


ARGS = SynthConfig
