"""The trainer at USM sizes on one GPU: hours of audio per GPU-hour, loader wait, GPU busy, peak memory, MFU.

    PYTHONPATH=. python bench/trainer_throughput.py [--variants base,large,usm600m,usm2b_ac] [--repeats 3]
        [--compare-subsampling] [--manifest-dir data/synth] [--budget-scale 1.0] [--num-workers 10] [--json OUT]
    PYTHONPATH=. python bench/trainer_throughput.py --dry-run    # CPU, model=tiny: checks the plumbing
    PYTHONPATH=. python bench/trainer_throughput.py --variants large,large_fsdp --world-sizes 1,2,4 --json multi_gpu.json
    PYTHONPATH=. python bench/trainer_throughput.py --variants base_ea,base,base_wh   # eager, compiled blocks, whole

Each variant is the actual training command, ``python -m usmkit.cli.train recipe=stage3_ctc model=SIZE
data.pad_to_frames=256 trainer.compile=true trainer.precision=bf16 ...``, on the embedded corpus's
bucketed batches (built first when missing: ``python -m usmkit.cli.prepare synth out=data/synth size=default
workers=16``; a ``model=tiny`` run with no steps then stores its features, so no variant pays for them).
Each runs in its own process group with an empty inductor cache, and is killed after its time budget
(nothing is saved). Each variant runs ``--repeats`` times (3 by default, ``tools.repeats``): every figure
below is the median of the repeats, with their min, max and each repeat's own result under ``repeats``; each
repeat is a fresh trainer process on the same corpus, seed and batches, and repeats after the first reuse the
variant's inductor cache (so ``first_log_s`` falls; the steady-state figures come after compiling either way).
Variant names are ``SIZE[_s8][_ac][_fsdp][_p64][_pk][_xs][_tri][_fx][_fc][_fb][_cg][_ea][_wh][_dSECONDS]``:

- ``_s8``: ``model.subsampling_factor=8 model.chunk_size=100`` (the same 8 s chunks, of 80 ms frames);
- ``_ac``: ``trainer.activation_checkpointing=true``;
- ``_fsdp``: ``trainer.strategy=fsdp``, launched by ``torchrun --nproc-per-node 1``;
- ``_p64``: ``data.pad_to_frames=64 data.num_buckets=30`` instead of ``data.pad_to_frames=256``: 13%
  of the frames padding instead of 30%, for 11 compiled lengths instead of 4 (``experiments/padding_waste``);
- ``_pk``: packed rows, ``data.pack_to_frames=2048 data.max_cut_duration=20.48`` instead of
  ``data.pad_to_frames=256``: several utterances per row, 3-5% of the frames padding, one batch shape (so
  ``_cg`` records one graph; ``_pk`` never adds ``data.fixed_batch_shapes``);
- ``_xs``: the CUDA caching allocator with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (segments
  that grow in place, so batches of changing shapes need not free the cache and wait for the device);
- ``_tri``: ``model.attention_impl=triton`` (the project's chunk-attention kernel) instead of ``sdpa``
  (PyTorch's fused attention with a padding mask, which picks cuDNN's kernel on Hopper);
- ``_fx``: ``model.attention_impl=flex`` (FlexAttention with a block mask built from the chunk and
  utterance layout);
- ``_fc``: ``model.conv_impl=triton`` (the convolution module's middle as one fused Triton kernel,
  ``usmkit.kernels.conv_module``);
- ``_fb``: ``data.fixed_batch_shapes=true``: one batch size per padded length, so a few batch shapes;
- ``_cg``: ``_fb`` with ``trainer.compile_mode=reduce-overhead``: the compiled blocks replay as CUDA graphs,
  one recorded per batch shape (its budget is 1.5x, for the recording);
- ``_ea``: eager, ``trainer.compile=false`` (against the compiled default: what compiling gains);
- ``_wh``: ``trainer.compile_scope=whole`` (the whole step as one graph) instead of ``blocks`` (each
  Conformer block and the front end on its own);
- ``_dSECONDS``: ``data.max_duration=SECONDS`` (audio per batch) instead of the size's default (``SIZES``).

``--compare-subsampling`` runs ``large`` and ``large_s8`` side by side instead of the default list,
``--compare-padding`` ``large`` and ``large_p64``. ``--world-sizes 1,2,4`` runs every variant on that many
GPUs of this machine (``torchrun --standalone --nproc-per-node N``; DDP, or FSDP2 for ``_fsdp``) and
adds ``scaling_efficiency``: the per-GPU rate on N GPUs over the rate of the same variant on 1 GPU. An
``_fsdp`` variant whose plain twin is in the list (``large,large_fsdp``) skips its own 1-GPU launch and is
compared with the twin's: one GPU working alone is the baseline of both strategies
(``scaling_baseline`` names the row).

Measured from the trainer's own ``metrics.jsonl`` (one row per ``trainer.log_every`` steps), in steady
state: the windows of the second half of the run, when the padded lengths have been compiled.

- ``audio_h_per_gpu_h``: seconds of valid audio trained per wall second (``train/frames_per_s`` x the
  10 ms hop), the median over the steady windows; equally hours of audio per GPU-hour. With several
  processes it is rank 0's (each rank trains its own batches of the same size), i.e. per GPU.
- ``loader_wait``: the share of wall time the loop blocked in ``next(loader)`` (``train/loader_wait``).
  The step ends in a device sync (``loss.item()``), so the GPU idles meanwhile.
- ``gpu_busy``: ``nvidia-smi``'s ``utilization.gpu`` (time with a kernel running), sampled every 200 ms
  over the steady windows.
- ``peak_mem_gib``: ``torch.cuda.max_memory_allocated`` (``train/max_mem_gib``).
- ``alloc_retries_steady`` ("cache frees"): how often, in steady state, the caching allocator found no
  free block, released its cache and retried (``num_alloc_retries``, ``train/alloc_retries``); each
  release frees device memory, which waits for the GPU to finish its work.
- ``mfu``: model FLOPs per audio second (forward + backward of the encoder and CTC head, counted by
  ``torch.utils.flop_counter`` on fake tensors for a 2.56 s utterance, plus the chunk attention, which
  the counter leaves out; activation checkpointing's recomputation is not counted) x audio seconds per
  second / the bf16 matmul peak measured at the start (``bench/train_throughput.py``'s 8192^3 matmuls).
  ``ceiling_audio_h_per_gpu_h`` is the audio rate at 100% of that peak.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tools.repeats import add_repeats_argument, repeat
from tools.results import result_path, run_header, write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# size -> (time budget s, data.max_duration s of audio per batch, trainer.log_every). A budget covers
# start-up (model init, loader), compiling each padded length (~60-70 s for base on an H200,
# experiments/compile_scope/results/trainer_compile.json) and ~30 s of steady state; the default list takes
# ~7.5 min a repeat.
SIZES = {
    "tiny": (60, 60, 2),
    "base": (95, 400, 5),
    "large": (105, 300, 5),
    "usm600m": (115, 300, 5),
    "usm2b": (135, 200, 5),
}
DEFAULT_VARIANTS = "base,large,usm600m,usm2b_ac"
PADDING = {  # batch padding: 4 padded lengths with ~30% padding, or 11 with ~13% (experiments/padding_waste/results/padding_waste.json)
    "p256": ["data.pad_to_frames=256"],
    "p64": ["data.pad_to_frames=64", "data.num_buckets=30"],
    "pk": ["data.pack_to_frames=2048", "data.max_cut_duration=20.48"],  # packed rows of 20.48 s, one shape
}
VARIED = (
    "a fresh trainer process each repeat, same corpus, seed and batches; repeats after the first reuse the "
    "variant's inductor cache"
)
HOP_S = 0.01  # feature frame shift of the corpus (data.features.frame_shift_ms=10)
PROBE_FRAMES = 256  # the utterance the FLOPs are counted on: 2.56 s


FLAGS = (
    "s8",
    "ac",
    "fsdp",
    "p64",
    "pk",
    "xs",
    "tri",
    "fx",
    "fc",
    "fb",
    "cg",
    "ea",
    "wh",
)  # each explained in the module docstring
NAME_PATTERN = "SIZE" + "".join(f"[_{flag}]" for flag in FLAGS) + "[_dSECONDS]"


@dataclass(frozen=True)
class Variant:
    """A variant name (``NAME_PATTERN``), parsed."""

    size: str
    factor: int  # subsampling
    ac: bool  # activation checkpointing
    fsdp: bool
    padding: str  # a PADDING key
    expandable: bool  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    triton_attention: bool  # model.attention_impl=triton
    flex_attention: bool  # model.attention_impl=flex
    fused_conv: bool  # model.conv_impl=triton
    fixed_shapes: bool  # data.fixed_batch_shapes=true
    cuda_graphs: bool  # trainer.compile_mode=reduce-overhead (with fixed shapes)
    eager: bool  # trainer.compile=false
    whole: bool  # trainer.compile_scope=whole
    max_duration: int | None  # seconds of audio per batch; None = the size's (SIZES)


def parse_variant(name: str) -> Variant:
    size, *flags = name.split("_")
    durations = [int(f[1:]) for f in flags if re.fullmatch(r"d\d+", f)]
    unknown = {f for f in flags if not re.fullmatch(r"d\d+", f)} - set(FLAGS)
    if size not in SIZES or unknown or len(durations) > 1:
        raise SystemExit(f"unknown variant {name!r}: {NAME_PATTERN} with SIZE in {sorted(SIZES)}")
    if "pk" in flags and ({"p64", "fb"} & set(flags)):
        raise SystemExit(f"variant {name!r}: _pk fixes the batch shape itself, and not with _p64 or _fb")
    if "ea" in flags and ({"cg", "wh"} & set(flags)):
        raise SystemExit(f"variant {name!r}: _ea trains eager, so not with _cg or _wh (compile settings)")
    padding = "p64" if "p64" in flags else "pk" if "pk" in flags else "p256"
    return Variant(size, 8 if "s8" in flags else 4, "ac" in flags, "fsdp" in flags,
                   padding, "xs" in flags, "tri" in flags, "fx" in flags, "fc" in flags,
                   ("fb" in flags or "cg" in flags) and "pk" not in flags, "cg" in flags,
                   "ea" in flags, "wh" in flags, durations[0] if durations else None)  # fmt: skip


def flops_per_audio_second(size: str, factor: int, vocab: int = 512) -> float:
    """Training FLOPs (forward + backward) per second of audio, for one ``PROBE_FRAMES`` utterance."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from usmkit.models.conformer import ConformerEncoder
    from usmkit.models.ctc import CTCHead
    from usmkit.models.presets import preset

    cfg = preset(size, dropout=0.0, subsampling_factor=factor, chunk_size=800 // factor)
    with FakeTensorMode():  # shapes only: no memory, no arithmetic
        encoder, head = ConformerEncoder(cfg), CTCHead(cfg.d_model, vocab)
        counter = FlopCounterMode(display=False)
        with counter:
            enc, _ = encoder(torch.randn(1, PROBE_FRAMES, cfg.input_dim), torch.tensor([PROBE_FRAMES]))
            head(enc).sum().backward()
    frames = enc.shape[1]  # all in one chunk (chunk_size is 8 s): every query attends to every key
    attention = 3 * 4 * frames * frames * cfg.d_model * cfg.num_layers  # QK^T and AV, forward + 2x backward
    return (counter.get_total_flops() + attention) / (PROBE_FRAMES * HOP_S)


def measure_peak() -> float:
    """The bf16 matmul peak (FLOP/s), in a process of its own so this one never holds GPU memory."""
    code = "import torch; from tools.train_step import measure_peak; "
    code += "print(measure_peak(torch.device('cuda')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


class GpuSampler:
    """``nvidia-smi``'s utilization.gpu every 200 ms, each sample stamped with ``time.time()`` on arrival."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200", "-i", "0"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
        except OSError:
            self.proc = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.samples.append((time.time(), float(line.strip())))
            except ValueError:
                pass

    def mean(self, start: float, end: float) -> float | None:
        values = [u for t, u in self.samples if start <= t <= end]
        return round(statistics.mean(values) / 100, 3) if values else None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()


def ensure_corpus(args) -> None:
    """Build the corpus when its manifests are missing, then store its features with a 0-step tiny run."""
    manifest = Path(args.manifest_dir) / "synth_cuts_train.jsonl.gz"
    if not manifest.is_file():
        size = "tiny" if args.dry_run else "default"
        cmd = [sys.executable, "-m", "usmkit.cli.prepare", "synth", f"out={args.manifest_dir}", f"size={size}",
               f"workers={args.synth_workers}"]  # fmt: skip
        print("building the corpus:", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=ROOT, env=_env(), check=True)
    with tempfile.TemporaryDirectory(prefix="trainer_throughput_prep_") as tmp:
        cmd = [sys.executable, "-m", "usmkit.cli.train", "recipe=stage3_ctc", "model=tiny", "trainer.device=cpu",
               f"data.manifest_dir={args.manifest_dir}", "trainer.max_steps=0", "trainer.eval_every=0",
               "trainer.progress=false", f"trainer.exp_dir={tmp}/exp"]  # fmt: skip
        subprocess.run(cmd, cwd=ROOT, env=_env(), check=True, capture_output=True)


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return os.environ | {"PYTHONPATH": path, **extra}


def command(name: str, args, exp: Path, world: int = 1) -> list[str]:
    v = parse_variant(name)
    _, default_duration, log_every = SIZES[v.size]
    max_duration = v.max_duration or args.max_duration or default_duration
    overrides = [
        "recipe=stage3_ctc", f"model={v.size}", f"data.manifest_dir={args.manifest_dir}",
        f"data.max_duration={max_duration}", f"data.num_workers={args.num_workers}",
        *PADDING[v.padding], "trainer.max_steps=1000000", f"trainer.log_every={log_every}",
        "trainer.eval_every=0", "trainer.save_every=0", "trainer.progress=false", f"trainer.exp_dir={exp}",
    ]  # fmt: skip
    if args.dry_run:  # compiling on a CPU takes minutes (experiments/compile_scope); fp32 as CPU runs train
        overrides += ["trainer.device=cpu", "trainer.precision=fp32", "trainer.compile=false"]
    else:
        overrides += ["trainer.precision=bf16", f"trainer.compile={str(not v.eager).lower()}"]
    if v.whole:
        overrides.append("trainer.compile_scope=whole")
    if v.factor == 8:
        overrides += ["model.subsampling_factor=8", "model.chunk_size=100"]
    if v.ac:
        overrides.append("trainer.activation_checkpointing=true")
    if v.triton_attention:
        overrides.append("model.attention_impl=triton")
    if v.flex_attention:
        overrides.append("model.attention_impl=flex")
    if v.fused_conv:
        overrides.append("model.conv_impl=triton")
    if v.fixed_shapes:
        overrides.append("data.fixed_batch_shapes=true")
    if v.cuda_graphs:
        overrides.append("trainer.compile_mode=reduce-overhead")
    if v.fsdp:
        overrides.append("trainer.strategy=fsdp")
    if v.fsdp or world > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world), "-m"]
    else:
        launcher = [sys.executable, "-m"]
    return [*launcher, "usmkit.cli.train", *overrides]


def run_variant(
    name: str, args, work: Path, peak: float | None, gpu: GpuSampler | None, world: int = 1, rep: int = 0
) -> dict:
    """One launch of variant ``name`` on ``world`` GPUs (repeat ``rep``: its own experiment folder and log)."""
    v = parse_variant(name)
    budget = SIZES[v.size][0] * args.budget_scale * (1.5 if v.cuda_graphs else 1.0)
    exp = work / f"{name}_x{world}_r{rep}"
    metrics = exp / "metrics.jsonl"
    log_path = work / f"{name}_x{world}_r{rep}.log"
    cmd = command(name, args, exp, world)
    env = _env(TORCHINDUCTOR_CACHE_DIR=str(work / f"inductor_{name}"))
    if v.expandable:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if args.dry_run:  # the CPU trains: one thread, as CPU runs train (on a GPU the host's threads init the model)
        env["OMP_NUM_THREADS"] = "1"
    seen: list[tuple[dict, float]] = []  # (metrics row, time.time() when it appeared)

    def poll() -> None:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        for line in lines[len(seen) :]:
            if line.endswith("}"):
                seen.append((json.loads(line), time.time()))

    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
        while proc.poll() is None and time.time() - t0 < budget:
            poll()
            time.sleep(0.2)
        poll()
        finished = proc.poll() is not None
        if not finished:
            os.killpg(proc.pid, signal.SIGKILL)  # the trainer, its loader workers (and torchrun's worker)
            proc.wait()
    result: dict = {"command": "python " + shlex.join(cmd[1:]), "budget_s": round(budget)}
    if finished and proc.returncode != 0:
        tail = log_path.read_text()[-1500:]
        oom = "OutOfMemoryError" in tail or "out of memory" in tail
        return result | {"error": ("CUDA out of memory: " if oom else "") + f"exit {proc.returncode}: {tail[-600:]}"}
    rows = [(r, t) for r, t in seen if "train/frames_per_s" in r]
    result["first_log_s"] = round(rows[0][1] - t0, 1) if rows else None
    result["steps"] = rows[-1][0]["step"] if rows else 0
    steady = rows[len(rows) // 2 :] if len(rows) >= 4 else []
    if len(steady) < 2:
        return result | {"error": f"only {len(rows)} windows logged in {budget:.0f} s: raise --budget-scale"}
    fps = [r["train/frames_per_s"] for r, _ in steady]
    audio = statistics.median(fps) * HOP_S  # seconds of audio per second
    result |= {
        "windows": len(steady),
        "audio_h_per_gpu_h": round(audio),
        "audio_h_per_gpu_h_range": [round(min(fps) * HOP_S), round(max(fps) * HOP_S)],
        "loader_wait": round(statistics.median(r["train/loader_wait"] for r, _ in steady), 4),
        "loader_wait_max": round(max(r["train/loader_wait"] for r, _ in steady), 4),
        "last_loss": round(steady[-1][0]["train/loss"], 3),
    }
    mem = [r["train/max_mem_gib"] for r, _ in rows if "train/max_mem_gib" in r]
    if mem:
        result["peak_mem_gib"] = round(max(mem), 1)
    retries = [(r["step"], r["train/alloc_retries"]) for r, _ in rows if "train/alloc_retries" in r]
    if retries:  # the allocator's cache frees in steady state (each one waits for the device)
        result["alloc_retries"] = retries[-1][1]
        result["alloc_retries_steady"] = retries[-1][1] - retries[len(retries) // 2 - 1][1]
    if gpu is not None:
        result["gpu_busy"] = gpu.mean(rows[len(rows) // 2 - 1][1], steady[-1][1])  # from the window before
    flops = flops_per_audio_second(v.size, v.factor)
    result["gflop_per_audio_s"] = round(flops / 1e9, 1)
    if peak:
        result["mfu"] = round(flops * audio / peak, 3)
        result["ceiling_audio_h_per_gpu_h"] = round(peak / flops)
    return result


def scaling_baseline(name: str, variants: list[str]) -> str:
    """The variant whose 1-GPU rate ``name``'s N-GPU rate is divided by: its plain twin for an ``_fsdp``
    variant when the twin runs too, else itself."""
    twin = "_".join(flag for flag in name.split("_") if flag != "fsdp")
    return twin if twin != name and twin in variants else name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--variants",
        default=None,
        help=f"comma-separated {NAME_PATTERN} (default {DEFAULT_VARIANTS})",
    )
    ap.add_argument("--compare-subsampling", action="store_true", help="large against large_s8")
    ap.add_argument("--compare-padding", action="store_true", help="large against large_p64")
    ap.add_argument("--manifest-dir", default="data/synth")
    ap.add_argument("--synth-workers", type=int, default=16)
    ap.add_argument("--num-workers", type=int, default=10, help="data.num_workers of every variant")
    ap.add_argument("--max-duration", type=float, default=0, help="data.max_duration (0: the size's default)")
    ap.add_argument("--budget-scale", type=float, default=1.0, help="multiplies every size's time budget")
    ap.add_argument("--dry-run", action="store_true", help="CPU, model=tiny (and tiny_fsdp), no compile")
    ap.add_argument("--world-sizes", default="1", help="comma-separated GPU counts to run every variant on")
    ap.add_argument("--json", default=None)
    add_repeats_argument(ap)
    args = ap.parse_args()
    if args.dry_run:
        variants = (args.variants or "tiny,tiny_fsdp").split(",")
        args.num_workers = min(args.num_workers, 1)
    else:
        default = "large,large_s8" if args.compare_subsampling else DEFAULT_VARIANTS
        variants = (args.variants or ("large,large_p64" if args.compare_padding else default)).split(",")
    for v in variants:
        parse_variant(v)
    worlds = [int(w) for w in args.world_sizes.split(",")]
    json_path = Path(
        args.json
        or result_path(
            "trainer_throughput",
            "subsampling" if args.compare_subsampling else "padding" if args.compare_padding else None,
        )
    )
    t0 = time.time()
    ensure_corpus(args)
    prep_s = round(time.time() - t0, 1)
    peak = None if args.dry_run else measure_peak()
    result = run_header(
        measured_bf16_matmul_tflops=round(peak / 1e12, 1) if peak else None,
        corpus_and_features_s=prep_s,
        manifest_dir=args.manifest_dir,
        num_workers=args.num_workers,
        repeats=args.repeats,
        variants={},
    )
    gpu = None if args.dry_run else GpuSampler()
    try:
        with tempfile.TemporaryDirectory(prefix="trainer_throughput_", ignore_cleanup_errors=True) as tmp:
            for name in variants:
                baseline = scaling_baseline(name, variants)
                for world in worlds:
                    if world == 1 and baseline != name and len(worlds) > 1:
                        continue  # compared with the plain twin's 1-GPU launch
                    key = name if worlds == [1] else f"{name}_x{world}"
                    r = repeat(
                        lambda i, name=name, world=world: run_variant(name, args, Path(tmp), peak, gpu, world, i),
                        args.repeats,
                        VARIED,
                    ) | {"world_size": world}
                    base = result["variants"].get(f"{baseline}_x1", {}).get("audio_h_per_gpu_h")
                    if world > 1 and base and r.get("audio_h_per_gpu_h"):
                        r["scaling_efficiency"] = round(r["audio_h_per_gpu_h"] / base, 3)
                        r["scaling_baseline"] = f"{baseline}_x1"
                    result["variants"][key] = r
                    print(f"{key:14s} {json.dumps({k: x for k, x in r.items() if k != 'repeats'})}", flush=True)
                    write_result(json_path, result)
    finally:
        if gpu is not None:
            gpu.stop()
    result["total_s"] = round(time.time() - t0, 1)
    write_result(json_path, result)
    head = f"{'variant':14s} {'audio h/GPU-h':>13s} {'min-max':>11s} {'scaling':>7s} {'loader wait':>11s} {'GPU busy':>8s} {'peak GiB':>8s} {'MFU':>6s} {'ceiling':>8s} {'1st log s':>9s} {'cache frees':>11s}"
    print("\n" + head)
    for name, r in result["variants"].items():
        if "error" in r:
            print(f"{name:14s} {r['error'][:100]}")
            continue

        def spread(r, key):
            lo, hi = r.get("repeats", {}).get("min", {}).get(key), r.get("repeats", {}).get("max", {}).get(key)
            return f"{lo:.0f}-{hi:.0f}" if lo is not None else "-"

        def cell(key, fmt, r=r):
            return format(r[key], fmt) if r.get(key) is not None else "-"

        print(
            f"{name:14s} {cell('audio_h_per_gpu_h', '.0f'):>13s} {spread(r, 'audio_h_per_gpu_h'):>11s} "
            f"{cell('scaling_efficiency', '.2f'):>7s} {cell('loader_wait', '.1%'):>11s} "
            f"{cell('gpu_busy', '.0%'):>8s} {cell('peak_mem_gib', '.1f'):>8s} {cell('mfu', '.1%'):>6s} "
            f"{cell('ceiling_audio_h_per_gpu_h', '.0f'):>8s} {cell('first_log_s', '.0f'):>9s} "
            f"{cell('alloc_retries_steady', '.0f'):>11s}"
        )
    print(f"total {result['total_s']:.0f} s (corpus and features {prep_s:.0f} s); JSON: {json_path}")


if __name__ == "__main__":
    main()
