"""``usmkit.cli.evaluate decode=lexicon_rescore``: the lexicon decoder's n-best, rescored by the attention decoder.

A joint CTC/LAS model (``las_teacher``: trained 4 steps on the embedded corpus, then re-initialized from a fixed
seed with a CTC head that emits words) decoded over the corpus's dev set: with ``rescore_ctc_weight=1`` the
rescoring keeps the lexicon's own ranking, so its hypotheses are ``decode=ctc_lexicon``'s; a wider n-best does
not change ``ctc_lexicon``'s first; with weight 0 the run decodes every utterance too (which candidate the
attention decoder picks is tested in ``tests/decoding/test_ctc_lexicon.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from usmkit.checkpointing.checkpoint import save_checkpoint
from usmkit.config import DataConfig, ModelSection, OptimConfig, TaskConfig, TrainConfig, TrainerConfig, to_dict
from usmkit.decoding.ctc_lexicon import LexiconConfig
from usmkit.inference.evaluate import EvalConfig, evaluate
from usmkit.runs import load_trained
from usmkit.tasks import build_task

pytest.importorskip("flashlight.lib.text.decoder")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def las_teacher(synth_corpus, tmp_path_factory) -> Path:
    from usmkit.training.recipe import run

    exp = tmp_path_factory.mktemp("las_teacher") / "exp"
    cfg = TrainConfig(
        task=TaskConfig(kind="las", ctc_weight=0.3),
        model=ModelSection(preset="tiny", overrides={"d_model": 64, "num_layers": 2, "num_heads": 2}),
        data=DataConfig(manifest_dir=str(synth_corpus), max_duration=20.0, num_workers=0),
        optim=OptimConfig(warmup_steps=2, schedule="constant"),
        trainer=TrainerConfig(
            exp_dir=str(exp), max_steps=2, eval_every=0, save_every=2, progress=False, device="cpu", log_every=1
        ),
    )
    run(cfg, yaml.safe_dump(to_dict(cfg)))
    _, cfg, tokenizer, ckpt = load_trained(str(exp), "cpu")
    torch.manual_seed(0)
    module = build_task(
        cfg.task, cfg.model.build_config(input_dim=cfg.data.features.num_mel_bins), tokenizer.vocab_size
    )
    with torch.no_grad():
        module.ctc.proj.weight.mul_(3.0)  # sharper posteriors
        module.ctc.proj.bias[0] += 5.0  # blank wins about half the frames
    save_checkpoint(exp / "checkpoints", 5, module.eval(), {}, (ckpt / "config.yaml").read_text())
    return exp


def hypotheses(checkpoint: Path, corpus: Path, **changes) -> list[str]:
    cfg = EvalConfig(checkpoint=str(checkpoint), test_sets=("dev",), manifest_dir=str(corpus), device="cpu", **changes)
    entry = evaluate(cfg)["sets"]["dev"]
    return [e["hyp"] for e in entry["examples"]]


def test_lexicon_rescoring_keeps_the_lexicon_ranking_at_weight_one_and_picks_among_its_nbest(las_teacher, synth_corpus):
    lexicon = LexiconConfig(order=1, beam_size=20, word_score=10.0)  # an untrained model: words only when cheap
    plain = hypotheses(las_teacher, synth_corpus, decode="ctc_lexicon", lexicon=lexicon)
    assert any(plain), "the teacher should say words"
    wide = LexiconConfig(order=1, beam_size=20, word_score=10.0, nbest=5)
    kept = hypotheses(las_teacher, synth_corpus, decode="lexicon_rescore", lexicon=wide, rescore_ctc_weight=1.0)
    assert kept == plain
    attention = hypotheses(las_teacher, synth_corpus, decode="lexicon_rescore", lexicon=wide, rescore_ctc_weight=0.0)
    nbest = hypotheses(las_teacher, synth_corpus, decode="ctc_lexicon", lexicon=wide)  # its first: the same as plain
    assert nbest == plain and len(attention) == len(plain)
