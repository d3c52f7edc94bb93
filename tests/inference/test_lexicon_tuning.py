"""Lexicon tuning (usmkit.inference.lexicon_tuning, python -m usmkit.cli.tune_lexicon) on a tiny CTC model
trained a few steps on the embedded corpus: every grid point is scored as usmkit.cli.evaluate would score
it, the best is the lowest WER, and the command writes the grid and the choice as JSON."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from usmkit.cli.tune_lexicon import main as tune_main
from usmkit.config import DataConfig, ModelSection, OptimConfig, TaskConfig, TrainConfig, TrainerConfig, to_dict
from usmkit.decoding.ctc_lexicon import LexiconConfig
from usmkit.errors import UsageError
from usmkit.inference.evaluate import EvalConfig, evaluate
from usmkit.inference.lexicon_tuning import LexiconGrid, tune_lexicon
from usmkit.training.recipe import run

pytestmark = pytest.mark.usefixtures("one_thread")

# Word scores far apart: with an untrained model the beam emits no word at the low one and words at
# every chance at the high one, so the points score differently.
GRID = LexiconGrid(orders=(1, 2), lm_weights=(0.5,), word_scores=(-20.0, 0.0, 20.0))


@pytest.fixture(scope="module")
def ctc_run(synth_corpus, tmp_path_factory) -> Path:
    """A CTC model trained 4 steps on the embedded tiny corpus (its dev and test splits are decoded)."""
    exp = tmp_path_factory.mktemp("lexicon_tuning") / "exp"
    cfg = TrainConfig(
        task=TaskConfig(kind="ctc"),
        model=ModelSection(preset="tiny", overrides={"d_model": 64, "num_layers": 2, "num_heads": 2}),
        data=DataConfig(manifest_dir=str(synth_corpus), max_duration=20.0, num_workers=0),
        optim=OptimConfig(warmup_steps=2, schedule="constant"),
        trainer=TrainerConfig(
            exp_dir=str(exp), max_steps=4, eval_every=0, save_every=4, progress=False, device="cpu", log_every=1
        ),
    )  # the corpus's own tokenizer
    run(cfg, yaml.safe_dump(to_dict(cfg)))
    return exp


def test_every_point_is_scored_as_evaluate_scores_it_and_the_lowest_wer_wins(ctc_run):
    base = EvalConfig(checkpoint=str(ctc_run), device="cpu", lexicon=LexiconConfig(beam_size=20))
    seen = []
    tuning = tune_lexicon(base, GRID, split="dev", on_point=seen.append)

    assert [(p.order, p.lm_weight, p.word_score) for p in tuning.points] == GRID.points()
    assert seen == list(tuning.points) and tuning.split == "dev" and tuning.utterances > 0
    assert len({p.wer for p in tuning.points}) > 1  # the settings matter
    best = tuning.best_point
    assert best.wer == min(p.wer for p in tuning.points)
    assert tuning.best == replace(
        base.lexicon, order=best.order, lm_weight=best.lm_weight, word_score=best.word_score
    )  # beam settings kept
    assert tuning.overrides() == [
        f"lexicon.order={best.order}",
        f"lexicon.lm_weight={best.lm_weight}",
        f"lexicon.word_score={best.word_score}",
    ]
    # Two points, decoded by evaluate with those settings: the same WER and CER on dev.
    for point in (best, tuning.points[-1]):
        lexicon = replace(base.lexicon, order=point.order, lm_weight=point.lm_weight, word_score=point.word_score)
        scored = evaluate(replace(base, decode="ctc_lexicon", test_sets=("dev",), lexicon=lexicon))["sets"]["dev"]
        assert (scored["wer"], scored["cer"]) == pytest.approx((point.wer, point.cer)), point


def test_an_ensemble_is_tuned_as_one_model(ctc_run):
    ckpt = str(ctc_run / "checkpoints" / "step-000004")
    base = EvalConfig(checkpoint=ckpt, device="cpu", ensemble=(ckpt,), lexicon=LexiconConfig(beam_size=20))
    grid = LexiconGrid(orders=(1,), lm_weights=(0.5,), word_scores=(-20.0, 20.0))
    tuning = tune_lexicon(base, grid)
    assert tuning.ensemble == (ckpt, ckpt)
    for point in tuning.points:
        lexicon = replace(base.lexicon, order=point.order, lm_weight=point.lm_weight, word_score=point.word_score)
        scored = evaluate(replace(base, decode="ctc_lexicon", test_sets=("dev",), lexicon=lexicon))["sets"]["dev"]
        assert scored["wer"] == pytest.approx(point.wer), point


def test_command_writes_the_grid_and_the_choice(ctc_run, tmp_path, capsys):
    out = tmp_path / "tuning.json"
    argv = [f"checkpoint={ctc_run}", "set=dev", "orders=[1]", "lm_weights=[0.5,1]", "word_scores=[-20,20]"]
    assert tune_main([*argv, "device=cpu", "beam_size=20", f"output={out}"]) == 0
    result = json.loads(out.read_text())
    assert result["set"] == "dev" and len(result["grid"]) == 4
    assert [(g["lm_weight"], g["word_score"]) for g in result["grid"]] == [(0.5, -20), (0.5, 20), (1, -20), (1, 20)]
    best = min(result["grid"], key=lambda g: (g["wer"], g["cer"]))
    assert result["best"] == best and result["lexicon"]["beam_size"] == 20
    assert result["overrides"] == [
        f"lexicon.order={best['order']}",
        f"lexicon.lm_weight={best['lm_weight']}",
        f"lexicon.word_score={best['word_score']}",
    ]
    assert " ".join(result["overrides"]) in capsys.readouterr().out


def test_command_refuses_a_missing_set_or_an_empty_grid_in_one_line(ctc_run, tmp_path, capsys):
    for bad, expected in (
        ("set=dve", "test set(s) ['dve'] have no manifest"),
        ("word_scores=[]", "word_scores is empty"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            tune_main([f"checkpoint={ctc_run}", bad, "device=cpu", f"output={tmp_path / 'x.json'}"])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ("lm_weights=[nan]", "lm_weights=[nan] holds nan: every value must be a finite number"),
        ("word_scores=[0,inf]", "word_scores=[0.0, inf] holds inf"),
        ("set=test", "set=test is a test set: tune on a dev set"),
        ("set=test_other", "set=test_other is a test set"),
    ],
)
def test_a_non_finite_grid_value_or_a_test_set_is_one_error_line(ctc_run, tmp_path, capsys, bad, expected):
    """``lm_weights=[nan]`` recommended ``lm_weight=nan`` (at WER 100%), and ``set=test``
    tuned on the test set without a word although the help says never the test set."""
    with pytest.raises(SystemExit) as exit_info:
        tune_main([f"checkpoint={ctc_run}", bad, "device=cpu", f"output={tmp_path / 'x.json'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert not (tmp_path / "x.json").exists()


def test_a_test_set_is_tuned_only_when_asked_and_then_with_a_warning(ctc_run, caplog):
    cfg = EvalConfig(checkpoint=str(ctc_run), device="cpu", lexicon=LexiconConfig(beam_size=20))
    one = LexiconGrid(orders=(1,), lm_weights=(0.5,), word_scores=(0.0,))
    with pytest.raises(UsageError, match="add allow_test=true"):
        tune_lexicon(cfg, one, split="test")
    with caplog.at_level("WARNING", logger="usmkit.inference.lexicon_tuning"):
        tuning = tune_lexicon(cfg, one, split="test", allow_test=True)
    assert tuning.split == "test" and "tuning on the test set test (allow_test=true)" in caplog.text
