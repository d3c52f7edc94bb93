"""Training entry point: ``python -m usmkit.train recipe=stage3_ctc [model=small] [trainer.max_steps=...]``.

Hydra composes ``usmkit/conf/train.yaml`` with the chosen recipe and overrides; the composed config
is converted to ``TrainConfig`` once, here, and everything below sees only dataclasses.
Several processes: ``torchrun --nproc-per-node 2 -m usmkit.train recipe=...`` (DDP; gloo on CPU);
``trainer.strategy=fsdp`` shards the model over them (torchrun also for one process).
"""

from __future__ import annotations

import usmkit.entrypoint  # noqa: F401  (first: sets the OpenMP wait policy before torch loads)

# isort: split
import functools
import gc
import logging
import math
import os
import sys
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from usmkit.checkpoint import MODEL_FILE, latest_checkpoint, load_tensors, load_weights, resolve_checkpoint, run_dir
from usmkit.config import ConfigError, TrainConfig, from_dict, tokenizer_path
from usmkit.data.ctc_budget import check_frame_budget, frame_budget
from usmkit.data.loader import make_loader, prepare_cuts, speaker_norms_for
from usmkit.data.manifests import load_cuts
from usmkit.data.normalize import STATS_FILE, load_or_compute_stats
from usmkit.data.tokenizer import MODEL_FILE as TOKENIZER_FILE
from usmkit.data.tokenizer import Tokenizer
from usmkit.errors import UsageError, strip_debug_from_sys_argv, user_errors
from usmkit.inference import make_dev_eval
from usmkit.tasks import build_task, check_task, train_spec
from usmkit.trainer import Trainer, check_options, resolve_device

log = logging.getLogger("usmkit.train")


def launched_distributed(strategy: str) -> bool:
    """Whether ``setup_distributed`` inits torch.distributed: torchrun started several processes, or one
    with ``trainer.strategy=fsdp`` (FSDP needs a process group even for one)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return world > 1 or (strategy == "fsdp" and "MASTER_ADDR" in os.environ)


def setup_distributed(device_name: str, strategy: str = "ddp") -> tuple[int, int, torch.device]:
    """Init torch.distributed when launched by torchrun (``launched_distributed``); returns (rank,
    world_size, device)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = resolve_device(device_name)
    if launched_distributed(strategy) and not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    return rank, world, device


def rank0_first(rank: int, fn):
    """Run ``fn`` on rank 0 first, then on the other ranks, which reuse what it cached on disk
    (stored features, statistics). One barrier per rank either way."""
    if rank != 0 and dist.is_initialized():
        dist.barrier()
    out = fn()
    if rank == 0 and dist.is_initialized():
        dist.barrier()
    return out


def load_tokenizer(cfg: TrainConfig, rank: int) -> Tokenizer:
    """The run's tokenizer: on ``resume``, the copy in the experiment directory; else ``tokenizer_path``,
    trained on the training transcripts (rank 0) when it is missing."""
    copy = Path(cfg.trainer.exp_dir) / TOKENIZER_FILE
    if cfg.resume and copy.is_file():
        return Tokenizer.load(copy)
    path = tokenizer_path(cfg)
    if not path.is_file():
        if rank == 0:
            log.info(
                "no tokenizer at %s: training one (%s, vocab %d) on the training transcripts",
                path,
                cfg.tokenizer_type,
                cfg.vocab_size,
            )
            cuts = load_cuts(
                cfg.data.manifest_dir, cfg.data.train_split, corpus=cfg.data.corpus, allow_urls=cfg.data.allow_urls
            )
            texts = [s.text for c in cuts for s in c.supervisions if s.text]
            Tokenizer.train(texts, path.parent, vocab_size=cfg.vocab_size, model_type=cfg.tokenizer_type)
        if dist.is_initialized():
            dist.barrier()
    return Tokenizer.load(path)


def compiled_lengths(cfg: TrainConfig) -> int:
    """With ``trainer.compile``: how many padded time lengths the training batches can take.

    The compiled step is static in time, so each length compiles a graph of its own, and
    ``torch._dynamo`` runs uncompiled whatever comes after its recompile limit (8 graphs per function).
    Unpadded batches (``data.pad_to_frames=0``) would take every length: refused.
    """
    data = cfg.data
    if data.pad_to_frames == 0:
        raise UsageError(
            "trainer.compile=true needs data.pad_to_frames (e.g. data.pad_to_frames=256): unpadded batches "
            "compile a new graph for every length, and past torch's recompile limit they run uncompiled"
        )
    if cfg.task.kind == "most" and cfg.task.most.pad_text_to == 0:
        raise UsageError(
            "trainer.compile=true with recipe=stage2 needs task.most.pad_text_to (set it to data.pad_to_frames): "
            "unpadded text compiles a new graph for every token and frame length"
        )
    slowest = min((1.0, *data.speed_perturb))  # a factor below 1 lengthens the audio
    max_frames = math.ceil(data.max_cut_duration / slowest * 1000 / data.features.frame_shift_ms)
    return math.ceil(max_frames / data.pad_to_frames)


def run(cfg: TrainConfig, config_yaml: str) -> dict:
    """Build data, model and trainer from ``cfg`` and train; returns a small summary."""
    if cfg.trainer.compile:
        # Per padded length one graph, and one more for a batch of one row (torch specializes sizes 0 and 1).
        needed = 2 * compiled_lengths(cfg)
        if cfg.task.kind == "most":  # the text encoder's token lengths: at most as many as the frame lengths
            needed *= 2
        limit = torch._dynamo.config.recompile_limit
        if needed > limit:
            torch._dynamo.config.recompile_limit = needed
            log.info(
                "compiled step: up to %d graphs per function, torch's recompile limit %d -> %d", needed, limit, needed
            )
        if cfg.trainer.compile_mode == "reduce-overhead" and not cfg.data.fixed_batch_shapes:
            log.warning(
                "trainer.compile_mode=reduce-overhead records a CUDA graph for every batch shape, and bucketed "
                "batches vary in size: set data.fixed_batch_shapes=true for a few shapes"
            )
    try:  # the model's settings (preset name, overrides) are checked before any data is read
        encoder_cfg = cfg.model.build_config(input_dim=cfg.data.features.num_mel_bins)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model: {e}") from e
    try:  # so are the task's against the model's, and the trainer's options against the machine
        check_task(cfg.task, encoder_cfg)
        distributed = launched_distributed(cfg.trainer.strategy)
        check_options(cfg.trainer, cfg.optim, resolve_device(cfg.trainer.device), distributed)
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from e
    if cfg.init_from:
        resolve_checkpoint(cfg.init_from)  # a missing init_from is named now, not after data preparation
    if cfg.task.kind == "most":  # MOST: where text enters must be one of the encoder's blocks
        try:
            cfg.task.most.resolve_text_layer(encoder_cfg.num_layers)
        except ValueError as e:
            raise ConfigError(str(e)) from e
    rank, world, device = setup_distributed(cfg.trainer.device, cfg.trainer.strategy)
    torch.manual_seed(cfg.trainer.seed + rank)
    exp_dir = Path(cfg.trainer.exp_dir)
    if not cfg.resume and latest_checkpoint(exp_dir / "checkpoints") is not None:
        raise UsageError(
            f"{exp_dir} already holds checkpoints: pass resume=true to continue that run, "
            f"or choose another trainer.exp_dir"
        )
    data = cfg.data
    audio_only = cfg.task.kind == "bestrq"
    tokenizer = None if audio_only else load_tokenizer(cfg, rank)

    def prepare(split: str, require_text: bool = not audio_only):
        cuts, report = rank0_first(
            rank,
            lambda: prepare_cuts(
                load_cuts(data.manifest_dir, split, corpus=data.corpus, allow_urls=data.allow_urls),
                data,
                split=split,
                require_text=require_text,
            ),
        )
        if rank == 0 and report.num_skipped:
            log.warning("%s: %s", split, report.summary())
        return cuts

    train_cuts = prepare(data.train_split)
    if cfg.task.kind in ("ctc", "most") or (cfg.task.kind == "las" and cfg.task.ctc_weight > 0):
        # What CTC cannot align it ignores: counted now rather than found in the results.
        budget = frame_budget(train_cuts, tokenizer, encoder_cfg.subsampling_factor, data.features.frame_shift_ms)
        check_frame_budget(budget, data.train_split, warn=rank == 0)
    stats = rank0_first(rank, lambda: load_or_compute_stats(train_cuts, data))
    if rank == 0:
        exp_dir.mkdir(parents=True, exist_ok=True)
        stats.save(exp_dir / STATS_FILE, data.features)  # travels with the checkpoints
        if tokenizer is not None:  # so does the tokenizer the run loaded (the corpus's may be retrained)
            (exp_dir / TOKENIZER_FILE).write_bytes(tokenizer.model_proto)
    pin = device.type == "cuda"  # the trainer's host runs a step ahead: batch copies must not wait for the device
    if cfg.task.kind == "most":  # three streams in every step: unlabeled audio, paired, text-only
        from usmkit.ssl.alignment import check_aligner
        from usmkit.ssl.most_data import build_most_loader

        if cfg.task.most.align_from:
            check_aligner(cfg.task.most.align_from, tokenizer)
        audio_only_cuts = functools.partial(prepare, require_text=False)
        loader = build_most_loader(
            cfg, train_cuts, audio_only_cuts, tokenizer, stats, rank=rank, world_size=world, pin_memory=pin
        )
    else:
        loader = make_loader(
            train_cuts,
            data,
            tokenizer=tokenizer,
            stats=stats,
            train=True,
            rank=rank,
            world_size=world,
            seed=cfg.trainer.seed,
            pin_memory=pin,
            endless=True,  # the workers prefetch across epoch boundaries
        )
    dev_eval = None
    if cfg.trainer.eval_every and data.dev_split:
        dev_cuts = prepare(data.dev_split)
        dev_norms = speaker_norms_for(dev_cuts, data, stats)

        def dev_batches():  # a fresh loader per dev evaluation; the speaker means are computed once
            return make_loader(dev_cuts, data, tokenizer=tokenizer, stats=stats, train=False, speaker_norms=dev_norms)

        dev_eval = make_dev_eval(dev_batches, tokenizer, cfg.task.kind, max_batches=cfg.trainer.dev_max_batches)

    encoder_cfg = cfg.model.build_config(input_dim=data.features.num_mel_bins)
    vocab = tokenizer.vocab_size if tokenizer else 0
    module = build_task(cfg.task, encoder_cfg, vocab)
    if cfg.init_from and not (cfg.resume and latest_checkpoint(exp_dir / "checkpoints")):
        src = resolve_checkpoint(cfg.init_from)
        loaded = load_weights(module, src, prefix="encoder.")
        if rank == 0:
            log.info("initialized %d encoder tensors from %s", len(loaded), src)
        if cfg.task.kind == "most":  # stage 1's BEST-RQ heads and quantizer (a MOST run's text encoder), where they fit
            heads = module.init_heads_from(src)
            if rank == 0:
                log.info("initialized %d head tensors from %s: %s", len(heads), src, ", ".join(heads) or "none fit")
        if cfg.init_heads and tokenizer is not None:
            heads = init_ctc_head(module, src, tokenizer)
            if rank == 0 and heads:
                log.info("initialized the CTC head from %s (trained with this run's tokenizer)", src)
    if rank == 0:
        n = sum(p.numel() for p in module.parameters())
        log.info(
            "task %s, encoder %s: %.2fM parameters, device %s, world %d",
            cfg.task.kind,
            cfg.model.preset,
            n / 1e6,
            device,
            world,
        )

    trainer_cfg = cfg.trainer
    if str(device) != trainer_cfg.device:
        from dataclasses import replace

        trainer_cfg = replace(trainer_cfg, device=str(device))
    spec = train_spec(module, cfg.optim)
    trainer = Trainer(trainer_cfg, cfg.optim, module, loader, config_yaml, dev_eval=dev_eval, spec=spec)
    if cfg.resume and not trainer.resume():
        log.warning("resume=true but %s has no checkpoint yet: starting from step 0", exp_dir)
    result = trainer.fit()
    summary = {"step": result.step, "last_loss": result.last_loss, "best": result.best, "bad_steps": result.bad_steps}
    if rank == 0:
        log.info("done: %s", summary)
    if dist.is_initialized():
        # DDP's reducer goes first, while the process group it holds is still registered: were the reducer
        # the group's last owner, its destructor would join gloo's threads holding the GIL, and a thread
        # releasing a finished collective's tensor waits for that GIL (a hang at exit). The group itself
        # is destroyed with the GIL released.
        del trainer
        gc.collect()
        dist.destroy_process_group()
    return summary


def init_ctc_head(module: torch.nn.Module, src: Path, tokenizer: Tokenizer) -> list[str]:
    """Load checkpoint ``src``'s CTC head (``ctc.*``) into ``module`` if ``src``'s run was trained with
    ``tokenizer`` (its token ids mean the same pieces) and the shapes fit; returns the keys loaded."""
    if getattr(module, "ctc", None) is None:
        return []
    stored_tokenizer = run_dir(src) / TOKENIZER_FILE
    if not stored_tokenizer.is_file() or stored_tokenizer.read_bytes() != tokenizer.model_proto:
        return []
    own = module.state_dict()
    head = {k: v for k, v in load_tensors(src / MODEL_FILE).items() if k.startswith("ctc.")}
    if not head or any(k not in own or own[k].shape != v.shape for k, v in head.items()):
        return []
    module.load_state_dict(head, strict=False)
    return sorted(head)


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(dcfg: DictConfig) -> None:
    with user_errors():  # a bad value or file: one line and exit code 2 (--debug: the traceback)
        container = OmegaConf.to_container(dcfg, resolve=True)
        cfg = from_dict(TrainConfig, container)  # every value checked here, before any data is read
        run(cfg, OmegaConf.to_yaml(container))


if __name__ == "__main__":
    strip_debug_from_sys_argv()
    from usmkit.cpu_defaults import cpu_overrides

    extra, note = cpu_overrides(sys.argv[1:], torch.cuda.is_available())
    if note:  # a bare headline command on a CPU: minutes, not hours (printed, and saved with the config)
        print(note, file=sys.stderr, flush=True)
        sys.argv += extra
    main()
