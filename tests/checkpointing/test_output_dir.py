"""The one output guard (usmkit.checkpointing.output_dir): a path that is, contains or lies inside an input,
lies inside usmkit work the command does not own, or holds what is not the command's own is refused before
anything is written; the command's own earlier output, a new path and an empty folder pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from usmkit.checkpointing.output_dir import (
    check_experiment_dir,
    check_output,
    check_output_dir,
    check_output_file,
    folder_kind,
    is_experiment,
)
from usmkit.errors import UsageError


def _checkpoint(exp: Path, step: int = 1500) -> Path:
    """A stand-in for ``<exp>/checkpoints/step-N`` as the guard sees it (its files' names)."""
    ckpt = exp / "checkpoints" / f"step-{step:06d}"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"weights")
    (ckpt / "config.yaml").write_text("trainer: {}\nmodel: {}\n")
    (exp / "config.yaml").write_text("trainer: {}\nmodel: {}\n")
    return ckpt


def _text_file(path: Path, text: str = "mine\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _file(out: Path, **kw) -> None:
    check_output(
        out, option="ctm=", own_words="a CTM file", own=lambda p: p.read_text().startswith("utt"), folder=False, **kw
    )


def test_a_file_output_over_weights_or_inside_an_experiment_is_refused_and_nothing_changes(tmp_path):
    ckpt = _checkpoint(tmp_path / "exp")
    weights = ckpt / "model.safetensors"
    with pytest.raises(UsageError, match=r"ctm=.*model.safetensors lies inside a checkpoint"):
        _file(weights)
    with pytest.raises(UsageError, match="lies inside an experiment directory"):
        _file(tmp_path / "exp" / "words.ctm")
    assert weights.read_bytes() == b"weights"
    _file(tmp_path / "exp" / "words.ctm", home=[ckpt])  # beside the work it reads: evaluate's result files


def test_a_file_output_replaces_only_its_own_kind(tmp_path):
    notes = _text_file(tmp_path / "notes.txt")
    with pytest.raises(UsageError, match=r"ctm=.*notes.txt exists and is not a CTM file"):
        _file(notes)
    assert notes.read_text() == "mine\n"
    _file(_text_file(tmp_path / "old.ctm", "utt 1 0.0 0.1 a 0.9\n"))  # an earlier output: replaced
    _file(_text_file(tmp_path / "empty.ctm", ""))
    _file(tmp_path / "new.ctm")
    with pytest.raises(UsageError, match="is a folder"):
        _file(tmp_path)


@pytest.mark.parametrize(
    ("out", "message"),
    [("corpus", "is also src="), ("corpus/audio", "lies inside src="), (".", "contains src=")],
)
def test_an_output_folder_is_apart_from_the_inputs(tmp_path, out, message):
    src = tmp_path / "corpus"
    _text_file(src / "audio" / "a.flac", "audio")
    with pytest.raises(UsageError, match=message):
        check_output_dir(tmp_path / out, option="out=", own_kind="shar", own_words="a Shar folder",
                         own=lambda p: False, inputs=[(f"src={src}", src)])  # fmt: skip
    assert (src / "audio" / "a.flac").read_text() == "audio"


def test_an_output_folder_inside_a_corpus_or_a_non_empty_foreign_folder_is_refused(tmp_path):
    corpus = tmp_path / "corpus"
    _text_file(corpus / "synth_cuts_train.jsonl.gz", "")
    own = dict(option="srt_dir=", own_words="a folder of SubRip files", own=lambda p: False, folder=True)
    with pytest.raises(UsageError, match=r"lies inside the corpus folder of synth"):
        check_output(corpus / "srt", **own)
    _text_file(tmp_path / "mine" / "notes.txt")
    with pytest.raises(UsageError, match=r"exists and is not a folder of SubRip files"):
        check_output(tmp_path / "mine", **own)
    (tmp_path / "empty").mkdir()
    check_output(tmp_path / "empty", **own)


def test_config_yaml_above_an_output_does_not_make_an_experiment(tmp_path):
    """Only a folder's own config.yaml or train.log names it an experiment: many projects have one at their root."""
    _text_file(tmp_path / "config.yaml", "a: 1\n")
    assert folder_kind(tmp_path) is not None and folder_kind(tmp_path, above=True) is None
    _file(tmp_path / "words.ctm")


def test_json_results_refuse_weights_and_accept_their_own(tmp_path):
    ckpt = _checkpoint(tmp_path / "exp")
    keys = ("checkpoint", "sets")
    with pytest.raises(UsageError, match="not an evaluation result"):
        check_output_file(ckpt / "model.safetensors", option="output=", own_words="an evaluation result",
                          own_keys=keys, home=[ckpt])  # fmt: skip
    mine = _text_file(ckpt / "eval.json", json.dumps({"checkpoint": "x", "sets": {}}))
    check_output_file(mine, option="output=", own_words="an evaluation result", own_keys=keys, home=[ckpt])


def test_exp_dir_with_a_users_config_and_metrics_is_refused_and_left_as_it_was(tmp_path):
    """training in a folder with someone's config.yaml and metrics.jsonl replaced the
    config and rewrote the metrics."""
    user = tmp_path / "U"
    config = _text_file(user / "config.yaml", "learning_rate: 3\n")
    metrics = _text_file(user / "metrics.jsonl", '{"epoch": 1, "acc": 0.5}\n')
    with pytest.raises(UsageError, match=r"config.yaml or metrics.jsonl is not a training run's.*choose another"):
        check_experiment_dir(user)
    assert config.read_text() == "learning_rate: 3\n" and metrics.read_text() == '{"epoch": 1, "acc": 0.5}\n'
    config.unlink()
    with pytest.raises(UsageError, match="not a training run's"):
        check_experiment_dir(user)  # the metrics alone


def test_exp_dir_of_other_files_is_refused_and_a_run_or_a_new_folder_passes(tmp_path):
    _text_file(tmp_path / "notes" / "notes.txt")
    with pytest.raises(UsageError, match="is a folder of other files, not an experiment directory"):
        check_experiment_dir(tmp_path / "notes")
    run = tmp_path / "run"
    _text_file(run / "config.yaml", yaml.safe_dump({"trainer": {"exp_dir": str(run)}, "model": {"preset": "tiny"}}))
    _text_file(run / "metrics.jsonl", '{"step": 10, "loss": 2.0}\n')
    assert is_experiment(run)
    check_experiment_dir(run)
    _text_file(tmp_path / "logged" / "train.log", "")  # what the command opens before the run checks again
    check_experiment_dir(tmp_path / "logged")
    check_experiment_dir(tmp_path / "new")
    with pytest.raises(UsageError, match="lies inside an experiment directory"):
        check_experiment_dir(run / "sub")


def test_a_run_stopped_before_its_first_checkpoint_is_an_experiment(tmp_path):
    """A folder of the names a run writes beside its checkpoints (here its tokenizer copy) is a run's, and a
    linked config.yaml is replaced by the run, never written through: neither is refused. One more file of
    another name, and the folder is not a run's."""
    run = tmp_path / "run"
    _text_file(run / "tokenizer.model", "pieces")
    check_experiment_dir(run)
    _text_file(tmp_path / "elsewhere.yaml", "someone else's\n")
    (run / "config.yaml").symlink_to(tmp_path / "elsewhere.yaml")
    check_experiment_dir(run)
    other = tmp_path / "other"
    _text_file(other / "tokenizer.model", "pieces")
    _text_file(other / "notes.txt")
    with pytest.raises(UsageError, match="is a folder of other files"):
        check_experiment_dir(other)
