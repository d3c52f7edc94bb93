"""Faults of evaluation (usmkit.inference.evaluate, usmkit.cli.evaluate): refused settings, partial results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fault_helpers import (
    REPO,
)

import usmkit.inference.evaluate as ev
from usmkit.decoding.ctc_lexicon import LexiconConfig
from usmkit.errors import UsageError


@pytest.fixture
def corpus(synth_corpus, tmp_path) -> Path:
    out = tmp_path / "corpus"
    shutil.copytree(synth_corpus, out)
    return out


def test_misspelled_test_set_is_refused_before_decoding(ctc_ckpt, corpus, monkeypatch):
    monkeypatch.setattr(ev, "transcribe_batches", lambda *a, **k: pytest.fail("decoding started"))
    cfg = ev.EvalConfig(checkpoint=str(ctc_ckpt), test_sets=("dev", "tset", "test", "tst"), manifest_dir=str(corpus))
    with pytest.raises(UsageError, match=r"test set\(s\) \['tset', 'tst'\] have no manifest .*'dev', .*'test'"):
        ev.evaluate(cfg)


def test_las_decoding_of_a_ctc_model_is_refused_before_decoding(ctc_ckpt, corpus, monkeypatch):
    monkeypatch.setattr(ev, "transcribe_batches", lambda *a, **k: pytest.fail("decoding started"))
    for mode in ("las_beam", "rescore", "lexicon_rescore"):
        cfg = ev.EvalConfig(
            checkpoint=str(ctc_ckpt), decode=mode, manifest_dir=str(corpus), lexicon=LexiconConfig(nbest=10)
        )
        with pytest.raises(UsageError, match=rf"decode={mode} needs an attention \(LAS\) decoder"):
            ev.evaluate(cfg)


def test_lexicon_rescoring_needs_an_nbest_list_and_a_weight_in_range():
    with pytest.raises(ValueError, match=r"lexicon_rescore .* set lexicon.nbest=10"):
        ev.EvalConfig(checkpoint="x", decode="lexicon_rescore")
    with pytest.raises(ValueError, match=r"rescore_ctc_weight must be in \[0, 1\]"):
        ev.EvalConfig(checkpoint="x", decode="rescore", rescore_ctc_weight=1.5)


def test_each_set_is_written_as_it_finishes(ctc_ckpt, corpus, monkeypatch, tmp_path):
    real = ev.transcribe_batches
    calls = []

    def failing_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(ev, "transcribe_batches", failing_second)
    out = tmp_path / "eval.json"
    cfg = ev.EvalConfig(checkpoint=str(ctc_ckpt), test_sets=("dev", "test"), manifest_dir=str(corpus), output=str(out))
    written = []

    def write(results):
        out.write_text(json.dumps(results))
        written.append(sorted(results["sets"]))

    with pytest.raises(RuntimeError, match="simulated"):
        ev.evaluate(cfg, on_set=write)
    assert written == [["dev"]] and "wer" in json.loads(out.read_text())["sets"]["dev"]


def test_evaluate_command_prints_one_line_and_exits_2(ctc_ckpt, corpus, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "usmkit.cli.evaluate",
        f"checkpoint={ctc_ckpt}",
        f"manifest_dir={corpus}",
        "test_sets=[dev,tset]",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: test set(s) ['tset'] have no manifest") and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("beam_size=-1", "beam_size must be >= 1, got -1"),
        ("beam_size=0", "beam_size must be >= 1, got 0"),
        ("max_duration=-5", "max_duration must be > 0 seconds"),
        ("max_duration=nan", "max_duration must be a finite number, got nan"),
        ("lexicon.lm_weight=nan", "lexicon.lm_weight must be a finite number, got nan"),
    ],
)
def test_meaningless_evaluate_values_are_one_line(ctc_ckpt, synth_corpus, tmp_path, capsys, override, named):
    """``beam_size=-1`` (with decode=ctc_beam) and ``max_duration=-5`` loaded the model and ended in a
    ValueError traceback from the decoder or the data config; NaN weights reached the decoder. Now refused
    with the config, before the model is loaded."""
    from usmkit.cli import evaluate

    argv = [f"checkpoint={ctc_ckpt}", f"manifest_dir={synth_corpus}", "test_sets=[dev]", "decode=ctc_beam", override]
    with pytest.raises(SystemExit) as e:  # (evaluate's main exits itself on a user error)
        evaluate.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err and len(err.strip().splitlines()) == 1, err


def test_ensemble_member_with_another_tokenizer_is_one_line_naming_it(ctc_ckpt, synth_corpus, tmp_path, capsys):
    """The member check raised a plain ValueError: a traceback, not the one line it was written as."""
    from fault_helpers import TEXTS

    from usmkit.cli import evaluate
    from usmkit.data.tokenizer import Tokenizer

    member = Path(shutil.copytree(ctc_ckpt, tmp_path / "member"))
    ours = Tokenizer.load(ctc_ckpt / "tokenizer" / "tokenizer.model")
    other = Tokenizer.train([t[::-1] for t in TEXTS], tmp_path / "other_tok", vocab_size=ours.vocab_size)
    assert other.vocab_size == ours.vocab_size and other.model_proto != ours.model_proto
    shutil.copy(other.path, member / "tokenizer.model")  # the run's copy, which load_trained reads first
    argv = [f"checkpoint={ctc_ckpt}", f"ensemble=[{member}]", f"manifest_dir={synth_corpus}", "test_sets=[dev]"]
    with pytest.raises(SystemExit) as e:
        evaluate.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"error: ensemble member {member / 'checkpoints' / 'step-000001'} has another tokenizer" in err, err
    assert "Traceback" not in err
