"""Batch transcription end to end: audio files on disk to transcripts on disk, in audio seconds per second (RTFx).

    PYTHONPATH=. python bench/batch_transcribe.py --hours 10 --models usm600m,large,exp/small_ctc --baseline [--repeats 3]
    PYTHONPATH=. python bench/batch_transcribe.py --hours 10 --models usm600m --gpus 1,4      # scaling, torchrun
    PYTHONPATH=. python bench/batch_transcribe.py --cpu-plumbing   # a few minutes on a CPU: checks the plumbing only

Audio: ``--hours`` of FLAC files of ``--min-seconds`` to ``--max-seconds`` (uniform, seeded), cut from the
embedded corpus's utterances played in a loop (``--corpus DIR``, else the tiny corpus is built into the work
folder). ``--unique`` files are written; the rest are links to them (every file is decoded all the same;
the page cache holds them, as it would a warm archive). Speed only: what is said does not matter.

Models (``--models``, comma-separated): a preset name (``usm600m``, ``large``, ...) is a checkpoint of that
size with random weights, written with usmkit's own checkpoint writer (the corpus's tokenizer, feature
statistics of its audio). Its CTC head's blank logit is raised by ``--blank-bias`` so that, like a trained
model, it emits a few tokens a second: with an untrained head every frame emits one and the host's word
bookkeeping, not the model, would be measured. A path is a trained checkpoint, used as it is.

Each usmkit row runs ``python -m usmkit.cli.transcribe_batch`` in a fresh process (``torchrun`` for
``--gpus N`` > 1) with the given ``--batch-seconds``, ``--num-workers``, ``--compile`` and ``--precision``.
``rtfx`` is the command's own: audio seconds over the seconds from its first batch to its last line
written (after loading and compiling: ``setup_s``); ``rtfx_end_to_end`` divides by the whole process's time.

``--baseline``: for each preset row, a torchaudio pipeline at equal size in the same call:
``torchaudio.models.Conformer`` (full attention) between usmkit's conv subsampling and CTC head, the same
files, sorting and batching, the same log-mel filterbank on the device, bf16 autocast and
``torch.compile`` as the usmkit row, CTC greedy, one JSONL line per file. ``ratio`` = usmkit / torchaudio.

Every row runs ``--repeats`` times (3 by default, ``tools.repeats``), the rows taking turns within each
repeat; a row's figures are the median of its repeats, with min, max and each repeat's own result under
``repeats``. ``ratios`` are the median of the ratios taken within each repeat, ``ratio_ranges`` their min and
max.

Results: ``bench/results/batch_transcribe[_<variant>].json`` (``--cpu-plumbing``: ``_cpu_plumbing``).
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from tools.repeats import add_repeats_argument, combine, summarize
from tools.results import REPO, result_path, run_header, write_result

sys.path.insert(0, str(REPO))

SUMMARY = re.compile(
    r"transcribed (\d+) inputs \(([\d.]+) h of audio\) in ([\d.]+) s: RTFx ([\d.]+) \(after ([\d.]+) s of setup\)"
)
VARIED = (
    "each repeat runs every row once, in turn: usmkit in a fresh transcribe_batch process (the inductor cache warm "
    "after the first), torchaudio built and compiled again in this process; the same files"
)
LOADER_WAIT = re.compile(r"([\d.]+) s waiting for the loader's workers")


# ---------------------------------------------------------------------------------------------- audio
def corpus_dir(args) -> Path:
    """The embedded corpus to cut audio from: ``--corpus``, or the tiny one built into the work folder."""
    if args.corpus:
        return Path(args.corpus)
    out = Path(args.work) / "corpus"
    if not (out / "synth_cuts_train.jsonl.gz").is_file():
        from usmkit.data.synth import SynthConfig, build_corpus

        build_corpus(SynthConfig(out=out, size="tiny", seed=0, workers=4, external_engines=False))
    return out


def _write_flac(job: tuple[str, np.ndarray]) -> None:
    sf.write(job[0], job[1], 16000, format="FLAC")


def make_audio(args, corpus: Path) -> tuple[Path, float, int]:
    """``--hours`` of FLAC files in ``<work>/audio`` (reused when its ``plan.json`` matches); returns the
    folder, the seconds of audio and the number of files."""
    from usmkit.data.manifests import load_cuts

    folder = Path(args.work) / "audio"
    plan = {"hours": args.hours, "min": args.min_seconds, "max": args.max_seconds, "unique": args.unique, "seed": 0}
    stamp = folder / "plan.json"
    if stamp.is_file() and json.loads(stamp.read_text())["plan"] == plan:
        info = json.loads(stamp.read_text())
        return folder, info["seconds"], info["files"]
    rng = np.random.default_rng(0)
    lengths = rng.uniform(args.min_seconds, args.max_seconds, size=args.unique)  # of the distinct files
    durations: list[float] = []
    while sum(durations) < args.hours * 3600:
        durations.append(float(lengths[len(durations) % args.unique]))
    speech = np.concatenate([c.load_audio()[0] for c in load_cuts(corpus, "train")]).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    unique = min(args.unique, len(durations))
    jobs = []
    for i in range(unique):
        start = int(rng.integers(0, speech.size))
        samples = np.take(speech, np.arange(start, start + int(durations[i] * 16000)), mode="wrap")
        jobs.append((str(folder / f"f{i:06d}.flac"), samples))
    with multiprocessing.Pool(min(os.cpu_count() or 1, 16)) as pool:
        pool.map(_write_flac, jobs, chunksize=4)
    for i in range(unique, len(durations)):  # the rest: links to the distinct files, in turn
        link = folder / f"f{i:06d}.flac"
        link.unlink(missing_ok=True)
        link.symlink_to(f"f{i % unique:06d}.flac")
    seconds = float(sum(durations))
    stamp.write_text(json.dumps({"plan": plan, "seconds": seconds, "files": len(durations)}))
    return folder, seconds, len(durations)


# ---------------------------------------------------------------------------------------------- checkpoints
def random_checkpoint(name: str, args, corpus: Path) -> Path:
    """An experiment dir with a ``name``-sized CTC checkpoint of random weights (seeded), the corpus's
    tokenizer and feature statistics."""
    import torch
    import yaml

    from usmkit.checkpointing.checkpoint import save_checkpoint
    from usmkit.config import DataConfig, ModelSection, TaskConfig, TrainConfig, TrainerConfig, to_dict
    from usmkit.data.manifests import load_cuts
    from usmkit.data.normalize import STATS_FILE, compute_global_stats
    from usmkit.data.tokenizer import MODEL_FILE, Tokenizer
    from usmkit.tasks import build_task

    exp = Path(args.work) / f"random_{name}"
    if (exp / "checkpoints").is_dir():
        return exp
    tokenizer = Tokenizer.load(corpus / "tokenizer" / MODEL_FILE)
    cfg = TrainConfig(
        task=TaskConfig(kind="ctc"),
        model=ModelSection(preset=name, dropout=0.0),
        data=DataConfig(manifest_dir=str(corpus)),
        trainer=TrainerConfig(exp_dir=str(exp)),
        tokenizer=str(corpus / "tokenizer" / MODEL_FILE),
    )
    torch.manual_seed(0)
    module = build_task(
        cfg.task, cfg.model.build_config(input_dim=cfg.data.features.num_mel_bins), tokenizer.vocab_size
    )
    with torch.no_grad():
        module.ctc.proj.bias[0] += args.blank_bias
    exp.mkdir(parents=True, exist_ok=True)
    (exp / MODEL_FILE).write_bytes(tokenizer.model_proto)
    stats = compute_global_stats(load_cuts(corpus, "train"), cfg.data.features, max_cuts=40)
    stats.save(exp / STATS_FILE, cfg.data.features)
    save_checkpoint(exp / "checkpoints", 0, module.eval(), {}, yaml.safe_dump(to_dict(cfg)))
    return exp


def parameters(exp: Path) -> int:
    """Parameters of the checkpoint ``exp`` resolves to, from its safetensors header."""
    from safetensors import safe_open

    from usmkit.checkpointing.checkpoint import MODEL_FILE, resolve_checkpoint

    with safe_open(str(resolve_checkpoint(exp) / MODEL_FILE), "pt") as f:
        return int(sum(np.prod(f.get_slice(k).get_shape()) for k in f.keys()))


# ---------------------------------------------------------------------------------------------- usmkit rows
def usmkit_row(args, name: str, exp: Path, audio: Path, seconds: float, gpus: int) -> dict:
    out = Path(args.work) / f"out_{Path(name).name}_{gpus}.jsonl"
    for p in out.parent.glob(out.name + "*"):
        p.unlink()
    overrides = [
        f"checkpoint={exp}", f"inputs={audio}", f"out={out}", f"device={args.device}", f"precision={args.precision}",
        f"compile={str(args.compile).lower()}", f"batch_seconds={args.batch_seconds}", f"num_workers={args.num_workers}",
        "progress=false", *args.extra,
    ]  # fmt: skip
    module = ["-m", "usmkit.cli.transcribe_batch", *overrides]
    if gpus > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", *module]
    else:
        cmd = [sys.executable, *module]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    match = SUMMARY.search(done.stderr)
    if done.returncode != 0 or match is None:
        return {"pipeline": "usmkit", "model": name, "gpus": gpus, "error": done.stderr[-2000:]}
    files, _, loop_s, rtfx, setup_s = match.groups()
    lines = sum(1 for _ in out.open())
    return {
        "pipeline": "usmkit",
        "model": name,
        "gpus": gpus,
        "params": parameters(exp),
        "files": int(files),
        "lines_written": lines,
        "audio_hours": round(seconds / 3600, 3),
        "setup_s": float(setup_s),
        "loop_s": float(loop_s),
        "process_s": round(wall, 1),
        "rtfx": float(rtfx),
        "rtfx_end_to_end": round(seconds / wall, 1),
        "loader_wait_s": float(LOADER_WAIT.search(done.stderr).group(1)) if LOADER_WAIT.search(done.stderr) else None,
    }


# ---------------------------------------------------------------------------------------------- torchaudio baseline
def torchaudio_row(args, name: str, exp: Path, audio: Path) -> dict:
    """The torchaudio pipeline at ``name``'s size (see the module docstring), in this process."""
    import torch
    import torchaudio

    from usmkit.device import autocast_context, resolve_device
    from usmkit.inference.batch_audio import FbankFrontEnd, padded_batch
    from usmkit.inference.batch_inputs import BatchUnit, find_inputs, plan_units
    from usmkit.models.ctc import CTCHead
    from usmkit.models.presets import preset
    from usmkit.models.subsampling import Conv2dSubsampling
    from usmkit.streaming.pipeline import load_model

    device = resolve_device(args.device)
    loaded = load_model(exp, "cpu")  # the tokenizer, features and statistics of the usmkit row
    features = loaded.cfg.data.features
    cfg = preset(name)

    class TorchaudioCtc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.subsampling = Conv2dSubsampling(features.num_mel_bins, cfg.conv_channels, cfg.d_model, 0.0)
            self.conformer = torchaudio.models.Conformer(
                input_dim=cfg.d_model, num_heads=cfg.num_heads, ffn_dim=cfg.ff_mult * cfg.d_model,
                num_layers=cfg.num_layers, depthwise_conv_kernel_size=cfg.conv_kernel, dropout=0.0,
            )  # fmt: skip
            self.head = CTCHead(cfg.d_model, loaded.tokenizer.vocab_size)

        def forward(self, feats, lens):
            x, x_lens = self.subsampling(feats, lens)
            x, x_lens = self.conformer(x, x_lens)
            return self.head(x), x_lens

    torch.manual_seed(0)
    model = TorchaudioCtc().to(device).eval()
    with torch.no_grad():
        model.head.proj.bias[0] += args.blank_bias
    params = sum(p.numel() for p in model.parameters())
    step = torch.compile(model, dynamic=True) if args.compile else model
    front = FbankFrontEnd(features, loaded.stats).to(device)
    items, _ = find_inputs(str(audio))
    units = plan_units(items, rank=0, world=1, batch_seconds=args.batch_seconds, max_batch_size=128, long_seconds=None)

    class Files(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            mine = units if info is None else units[info.id :: info.num_workers]
            for unit in mine:
                assert isinstance(unit, BatchUnit)
                waves = [torch.from_numpy(sf.read(i.path, dtype="float32")[0]) for i in unit.items]
                yield (
                    [i.id for i in unit.items],
                    padded_batch(waves, features),
                    torch.tensor([w.numel() for w in waves]),
                )

    loader = torch.utils.data.DataLoader(
        Files(), batch_size=None, num_workers=args.num_workers, pin_memory=device.type == "cuda",
        prefetch_factor=4 if args.num_workers else None,
    )  # fmt: skip
    out = Path(args.work) / f"out_torchaudio_{name}.jsonl"

    def run(batches, write):
        for ids, waves, n in batches:
            with torch.inference_mode():
                feats, lens = front(waves.to(device, non_blocking=True), n)
                with autocast_context(device, args.precision):
                    log_probs, out_lens = step(feats, lens)
                best, out_lens = log_probs.argmax(-1).cpu(), out_lens.cpu()
            for row, utt in enumerate(ids):
                path = torch.unique_consecutive(best[row, : int(out_lens[row])])
                write.write(json.dumps({"id": utt, "text": loaded.tokenizer.decode(path[path != 0].tolist())}) + "\n")

    setup_start = time.perf_counter()
    first = next(iter(loader))  # warm-up (compiles), like the usmkit command's before its clock
    with open(os.devnull, "w") as sink:
        run([first, (first[0][:1], first[1][:1], first[2][:1])], sink)
    if device.type == "cuda":
        torch.cuda.synchronize()
    setup = time.perf_counter() - setup_start
    start = time.perf_counter()
    with out.open("w") as f:
        run(loader, f)
    loop = time.perf_counter() - start
    seconds = sum(i.duration for i in items)
    return {
        "pipeline": "torchaudio",
        "model": name,
        "gpus": 1,
        "params": params,
        "files": len(items),
        "lines_written": sum(1 for _ in out.open()),
        "audio_hours": round(seconds / 3600, 3),
        "setup_s": round(setup, 1),
        "loop_s": round(loop, 1),
        "rtfx": round(seconds / loop, 1),
    }


# ---------------------------------------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hours", type=float, default=10.0)
    p.add_argument("--min-seconds", type=float, default=10.0)
    p.add_argument("--max-seconds", type=float, default=30.0)
    p.add_argument("--unique", type=int, default=256, help="distinct files written; the rest link to them")
    p.add_argument("--models", default="usm600m,large", help="presets (random weights) or checkpoint paths")
    p.add_argument("--gpus", default="1", help="process counts per usmkit row, e.g. 1,4 (torchrun for > 1)")
    p.add_argument("--baseline", action="store_true", help="a torchaudio pipeline per preset row")
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--batch-seconds", type=float, default=1920.0)
    p.add_argument("--num-workers", type=int, default=12)
    p.add_argument("--blank-bias", type=float, default=8.0)
    p.add_argument("--corpus", help="an embedded-corpus folder (default: the tiny one, built into --work)")
    p.add_argument("--work", help="audio, checkpoints and outputs (default: a temporary folder)")
    p.add_argument("--extra", nargs="*", default=[], metavar="KEY=VALUE", help="more keys of every usmkit row")
    p.add_argument("--variant", help="result file suffix")
    p.add_argument("--cpu-plumbing", action="store_true", help="tiny rows on the CPU: the plumbing, not a result")
    add_repeats_argument(p)
    args = p.parse_args()
    if args.cpu_plumbing:
        args.hours, args.min_seconds, args.max_seconds, args.unique = 0.02, 5.0, 15.0, 8
        args.models, args.gpus, args.baseline, args.device, args.compile = "tiny", "1,2", True, "cpu", False
        args.batch_seconds, args.num_workers, args.variant = 60.0, 1, args.variant or "cpu_plumbing"
    work = tempfile.TemporaryDirectory(prefix="usmkit-bench-batch-") if not args.work else None
    args.work = args.work or work.name
    corpus = corpus_dir(args)
    audio, seconds, files = make_audio(args, corpus)
    print(f"{files} files, {seconds / 3600:.2f} h of audio in {audio}", flush=True)
    exps = {}
    for name in args.models.split(","):
        exps[name] = random_checkpoint(name, args, corpus) if not Path(name).exists() else Path(name)
    runs: dict[tuple[str, str, int], list[dict]] = {}  # (model, pipeline, gpus) -> one row per repeat
    for i in range(args.repeats):  # every row once per repeat, so drift over the call hits them alike
        for name, exp in exps.items():
            for gpus in (int(g) for g in args.gpus.split(",")):
                runs.setdefault((name, "usmkit", gpus), []).append(usmkit_row(args, name, exp, audio, seconds, gpus))
                print(f"repeat {i}: {json.dumps(runs[name, 'usmkit', gpus][-1])}", flush=True)
            if args.baseline and not Path(name).exists():
                runs.setdefault((name, "torchaudio", 1), []).append(torchaudio_row(args, name, exp, audio))
                print(f"repeat {i}: {json.dumps(runs[name, 'torchaudio', 1][-1])}", flush=True)
    rows = [combine(r, VARIED) for r in runs.values()]
    ratios, ratio_ranges = {}, {}
    for name in exps:

        def rates(pipeline, gpus, name=name):  # rtfx per repeat (None where the repeat failed)
            return [r.get("rtfx") for r in runs.get((name, pipeline, gpus), [])]

        pairs = {f"{name}: usmkit / torchaudio": (rates("usmkit", 1), rates("torchaudio", 1))}
        for gpus in (int(g) for g in args.gpus.split(",")):
            if gpus > 1:
                pairs[f"{name}: {gpus} processes / 1"] = (rates("usmkit", gpus), rates("usmkit", 1))
        for key, (num, den) in pairs.items():
            each = [round(a / b, 2) for a, b in zip(num, den, strict=False) if a and b]
            if each:  # the median of the repeats' ratios, each taken within one repeat
                ratios[key] = summarize(each)["median"]
                ratio_ranges[key] = [min(each), max(each)]
    result = run_header(
        cpu_plumbing_only=bool(args.cpu_plumbing),
        audio_hours=round(seconds / 3600, 3),
        files=files,
        file_seconds=[args.min_seconds, args.max_seconds],
        batch_seconds=args.batch_seconds,
        num_workers=args.num_workers,
        extra=args.extra,
        compile=args.compile,
        precision=args.precision,
        blank_bias=args.blank_bias,
        repeats=args.repeats,
        rows=rows,
        ratios=ratios,
        ratio_ranges=ratio_ranges,
    )
    path = write_result(result_path("batch_transcribe", args.variant), result)
    print(json.dumps(ratios, indent=1))
    print(f"wrote {path}")
    if work is not None:
        work.cleanup()


if __name__ == "__main__":
    main()
