"""Settings for a headline command run as it is on a machine without a GPU.

``python -m usmkit.cli.train recipe=stage1|stage2|stage3_joint|stage3_ctc|stage3_las`` with nothing but the recipe
(and where it reads and writes) runs the recipe's full settings on a GPU. On a CPU those would take
hours, so the entry point adds the overrides below, chosen so that the run is useful in minutes on
two cores (the demo's settings: a character-level tokenizer, intermediate CTC, short warm-up), and
prints them with the expected time. Any key the user names is the user's; naming anything beyond
the recipe and paths turns these defaults off, so scripts and tests get exactly what they ask for.
"""

from __future__ import annotations

from collections.abc import Sequence

# Keys that do not make a run "configured": which recipe, where from, where to.
PLAIN_KEYS = ("recipe", "init_from", "trainer.exp_dir", "data.manifest_dir", "resume", "hydra.", "+hydra.")

_COMMON = (
    "data.max_duration=50",
    "model.dropout=0.0",
    "model.overrides={subsampling_channels: 32}",
    "optim.warmup_steps=100",
    "trainer.dev_max_batches=4",
)
_TOKENIZER = ("vocab_size=290", "tokenizer=${data.manifest_dir}/tokenizer_290/tokenizer.model")
_NO_SPEC = ("data.spec_augment.enabled=false",)  # a few hundred steps do not overfit; masking only slows them
# Against overfitting the training voices when the run is longer (make demo's 1500 steps).
LIGHT_SPEC = ("data.spec_augment.time_masks=2", "data.spec_augment.freq_width=15")
# A CTC model that learns in minutes on 2 cores (make demo trains it with its own tokenizer path,
# steps and LIGHT_SPEC; the bare stage-3 commands add _NO_SPEC).
CPU_CTC = (*_COMMON, "optim.lr=2.5e-3", "task.inter_ctc_weight=0.3")
# MOST (stage 2, and the joint fine-tuning that starts from its checkpoint, so the same model settings)
CPU_MOST = (*_COMMON, *_TOKENIZER, *_NO_SPEC, "optim.lr=2.5e-3", "task.bestrq.num_codebooks=4", "trainer.max_steps=300",
            "trainer.eval_every=150", "trainer.save_every=150")  # fmt: skip
# recipe -> (overrides, seconds per step on a 2-core CPU, measured with these settings)
CPU_RECIPES: dict[str, tuple[tuple[str, ...], float]] = {
    "stage1": (
        (*_COMMON, "task.bestrq.num_codebooks=4", "trainer.max_steps=300", "trainer.eval_every=150",
         "trainer.save_every=150"),
        0.4,
    ),
    "stage2": ((*CPU_MOST, "task.most.text_warmup_steps=100"), 0.8),
    "stage3_joint": (CPU_MOST, 0.4),  # stage 2's settings: it starts from that checkpoint
    "stage3_ctc": (
        (*CPU_CTC, *_NO_SPEC, *_TOKENIZER, "trainer.max_steps=900", "trainer.eval_every=300", "trainer.save_every=300"),
        0.25,
    ),
    "stage3_las": (
        (*CPU_CTC, *_NO_SPEC, *_TOKENIZER, "trainer.max_steps=900", "trainer.eval_every=300", "trainer.save_every=300"),
        0.32,
    ),
}  # fmt: skip


def is_plain(argv: Sequence[str]) -> bool:
    """Whether ``argv`` names nothing but the recipe, the paths and resume."""
    return all(a.startswith(PLAIN_KEYS) for a in argv if "=" in a)


def recipe_of(argv: Sequence[str], default: str = "stage3_ctc") -> str:
    return next((a.split("=", 1)[1] for a in argv if a.startswith("recipe=")), default)


def cpu_overrides(argv: Sequence[str], has_gpu: bool) -> tuple[list[str], str | None]:
    """The overrides to add to ``argv`` and a line saying so (None: none added)."""
    recipe = recipe_of(argv)
    if has_gpu or not is_plain(argv) or recipe not in CPU_RECIPES:
        return [], None
    overrides, seconds_per_step = CPU_RECIPES[recipe]
    steps = int(next(o.split("=")[1] for o in overrides if o.startswith("trainer.max_steps=")))
    minutes = steps * seconds_per_step / 60
    note = (
        f"no GPU here: {recipe} runs with CPU settings (about {minutes:.0f} minutes on 2 cores): "
        f"{' '.join(overrides)}. Name any setting on the command line to run the recipe as written."
    )
    return list(overrides), note
