"""Faults found by a third probe: a training run stopped by a signal, resume against a changed config,
and values no command can use.

Each test failed on the code before its fix, unless its docstring says the case was already handled.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_helpers import FAST_TRAIN, fast_config, fast_train, mounted_tmpfs

from usmkit.checkpointing import checkpoint as ck
from usmkit.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")


def _env(cwd: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(cwd)}


def _run(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """``python -m ARGS`` as a user runs it, with this tree first on the path."""
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=_env(cwd), capture_output=True, timeout=300, input=stdin
    )


def _one_error_line(proc: subprocess.CompletedProcess, *named: str, code: int = 2) -> str:
    err = proc.stderr.decode(errors="replace") if isinstance(proc.stderr, bytes) else proc.stderr
    assert proc.returncode == code, err[-3000:]
    lines = [line for line in err.strip().splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    for word in named:
        assert word in lines[0], lines[0]
    return lines[0]


def _metrics(exp: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (exp / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]


@pytest.fixture(scope="module")
def corpus(synth_corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("probe3") / "corpus"
    shutil.copytree(synth_corpus, out)  # training caches features and statistics next to the manifests
    return out


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory) -> Path:
    exp = tmp_path_factory.mktemp("probe3_runs") / "full"
    fast_train(corpus, exp)
    assert [s for s, _ in _metrics(exp)] == [1, 2, 3, 4, 5, 6]
    return exp


# ---- 1. SIGINT / SIGTERM during training -----------------------------------------------------------------
def _signal_during_step(monkeypatch, step: int, signum: int) -> None:
    """The process gets ``signum`` as it starts computing step ``step``."""
    original = Trainer._forward_backward

    def forward_backward(self, batch, sync):
        if self.step == step - 1:
            os.kill(os.getpid(), signum)
        return original(self, batch, sync)

    monkeypatch.setattr(Trainer, "_forward_backward", forward_backward)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_saves_the_step_it_came_in_and_resume_continues_exactly(
    corpus, uninterrupted, tmp_path, monkeypatch, signum
):
    """SIGINT ended training in a KeyboardInterrupt traceback, SIGTERM killed it outright: the steps since
    the last checkpoint were lost. Now the step in progress finishes, is saved, and the run ends with
    ``TrainingInterrupted`` (exit 130 / 143) saying where it saved and how to resume; the handlers in place
    before training are back."""
    from usmkit.training.stop_signals import TrainingInterrupted

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    exp = tmp_path / "run"
    with monkeypatch.context() as m:
        _signal_during_step(m, 3, signum)
        with pytest.raises(TrainingInterrupted) as e:
            fast_train(corpus, exp)
    assert e.value.exit_code == 128 + signum
    message = str(e.value)
    assert f"stopped by {signal.Signals(signum).name} after step 3 of 6" in message, message
    assert str(exp / "checkpoints" / "step-000003") in message and "resume=true" in message
    assert {s: signal.getsignal(s) for s in before} == before
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [2, 3]
    fast_train(corpus, exp, "resume=true")
    assert _metrics(exp) == _metrics(uninterrupted), "the same losses, bit for bit, as the uninterrupted run"


def test_ctrl_c_in_a_terminal_with_loader_workers_is_one_line_and_exit_130(corpus, uninterrupted, tmp_path):
    """A Ctrl-C reaches every process of the terminal's foreground group, the loader's workers too: they
    died with KeyboardInterrupt tracebacks and the trainer with its own. Now the workers ignore it, the
    trainer saves and says so in one line; resume=true ends with the uninterrupted run's losses."""
    exp = tmp_path / "run"
    argv = ["usmkit.cli.train", *FAST_TRAIN, "data.num_workers=2", f"data.manifest_dir={corpus}"]
    argv += [f"trainer.exp_dir={exp}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", *argv], cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if (exp / "metrics.jsonl").is_file() and _metrics(exp):
            os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: the trainer and its workers
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=240)
    proc.stderr = err
    line = _one_error_line(proc, "stopped by SIGINT after step", "resume=true", code=130)
    assert "Traceback" not in err.decode() and "KeyboardInterrupt" not in err.decode(), err.decode()[-3000:]
    saved = [c.step for c in ck.list_checkpoints(exp / "checkpoints")]
    assert saved and f"step-{saved[-1]:06d}" in line
    assert _run(*argv, "resume=true", cwd=tmp_path).returncode == 0
    assert _metrics(exp) == _metrics(uninterrupted)


# ---- 5, 7. config values refused at config check ---------------------------------------------------------
def test_keep_last_zero_or_negative_is_refused(tmp_path):
    """``trainer.keep_last=0`` was accepted, and every save then deleted every checkpoint, the one just
    written too (``prune_checkpoints`` keeps none)."""
    from composed_config import train_config

    from usmkit.config import ConfigError

    for value in ("0", "-1"):
        with pytest.raises(ConfigError, match=rf"trainer.keep_last must be >= 1, got {value}"):
            train_config(*FAST_TRAIN, f"trainer.exp_dir={tmp_path / 'exp'}", f"trainer.keep_last={value}")


@pytest.mark.parametrize(
    "override",
    ["trainer.max_minutes=inf", "data.max_duration=nan", "task.ctc_weight=-inf", "model.dropout=nan", "optim.lr=nan"],
)
def test_non_finite_config_floats_are_refused_naming_the_key(tmp_path, override):
    """NaN passes every range check (each comparison is false) and inf most upper bounds: ``data.max_duration=nan``,
    ``model.dropout=nan``, ``task.ctc_weight=-inf``, ``trainer.max_minutes=inf`` were accepted (``optim.lr=nan`` was
    already refused, by its own check)."""
    from composed_config import train_config

    from usmkit.config import ConfigError

    key, value = override.split("=")
    with pytest.raises(ConfigError, match=rf"^{key} must be a finite number, got {value}$"):
        train_config(*FAST_TRAIN, f"trainer.exp_dir={tmp_path / 'exp'}", override)


def test_non_finite_float_on_the_command_line_is_one_line(tmp_path):
    proc = _run("usmkit.cli.train", *FAST_TRAIN, f"trainer.exp_dir={tmp_path / 'exp'}", "data.max_duration=nan",
                cwd=tmp_path)  # fmt: skip
    _one_error_line(proc, "data.max_duration must be a finite number, got nan")
    assert not (tmp_path / "exp").exists()


# ---- 2. resume=true against a changed model, task or vocabulary ------------------------------------------
@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("model.overrides={d_model: 32, num_layers: 2, num_heads: 2}", "model.overrides.d_model was 64"),
        ("task.kind=las", "task.kind was ctc"),
        ("vocab_size=300", "vocab_size was 512"),
        ("data.features.num_mel_bins=64", "data.features.num_mel_bins was 80"),
    ],
)
def test_resume_with_a_changed_model_task_or_vocab_is_refused_before_anything_is_written(
    uninterrupted, corpus, tmp_path, override, named
):
    """A changed model size or feature count failed with "does not fit this model" only after the data was
    prepared, having overwritten the run's config.yaml and statistics with the new settings' ones; a changed
    vocab_size was ignored (the run's tokenizer copy was used) and recorded in config.yaml as if it had
    applied. Now one line names the key, its saved and its new value, and the folder is as it was."""
    from usmkit.config import ConfigError

    exp = tmp_path / "run"
    shutil.copytree(uninterrupted, exp)
    before = {p: p.read_bytes() for p in exp.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match="resume=true, but ") as e:
        fast_train(corpus, exp, "resume=true", override)
    assert named in str(e.value) and "start a new run in another trainer.exp_dir" in str(e.value), str(e.value)
    assert {p: p.read_bytes() for p in exp.rglob("*") if p.is_file()} == before


def test_resume_with_changed_harmless_keys_still_runs(uninterrupted, corpus, tmp_path):
    """More steps, a longer schedule, other workers and log intervals, features computed on the fly instead
    of stored: the run resumes."""
    exp = tmp_path / "run"
    shutil.copytree(uninterrupted, exp)
    extra = ["trainer.max_steps=7", "optim.warmup_steps=3", "data.num_workers=0", "trainer.log_every=2",
             "data.features.precomputed=false"]  # fmt: skip
    assert fast_train(corpus, exp, "resume=true", *extra)["step"] == 7


def test_resume_refusal_on_the_command_line_writes_nothing(uninterrupted, corpus, tmp_path):
    exp = tmp_path / "run"
    shutil.copytree(uninterrupted, exp)
    before = sorted(p.relative_to(exp) for p in exp.rglob("*"))
    argv = [*FAST_TRAIN, f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", "resume=true", "model=small"]
    _one_error_line(_run("usmkit.cli.train", *argv, cwd=tmp_path), "model.preset was tiny", "and is small now")
    assert sorted(p.relative_to(exp) for p in exp.rglob("*")) == before  # not even a train.log


# ---- 3. resume uses the run's own feature statistics -----------------------------------------------------
def test_resume_normalizes_with_the_runs_own_statistics_not_the_corpus_file(uninterrupted, corpus, tmp_path):
    """A resumed run read the corpus's ``feature_stats`` file, which another run (another sample of cuts, a
    changed corpus) may have recomputed since, trained on with features normalized differently from the
    steps before, and replaced the run's own copy with it. Now it keeps the copy it started with."""
    from usmkit.data.normalize import STATS_FILE, FeatureStats, stats_path
    from usmkit.training.recipe import TrainingRecipe

    changed_corpus = Path(shutil.copytree(corpus, tmp_path / "corpus"))
    exp = Path(shutil.copytree(uninterrupted, tmp_path / "run"))
    own = (exp / STATS_FILE).read_bytes()
    cfg, yaml_text = fast_config(changed_corpus, exp, "resume=true", "trainer.max_steps=7")
    corpus_file = stats_path(cfg.data.manifest_dir, cfg.data.features.sample_rate)
    recomputed = FeatureStats.load(corpus_file)
    FeatureStats(mean=recomputed.mean + 1.0, std=recomputed.std * 2.0).save(corpus_file, cfg.data.features)

    TrainingRecipe(cfg, yaml_text).run()
    assert (exp / STATS_FILE).read_bytes() == own, "the run's copy was replaced by the corpus's new file"


# ---- 4. sample rates no recording has, or that cannot be resampled ---------------------------------------
def _wav_declaring(path: Path, rate: int) -> Path:
    """One second of speech-like 16 kHz samples in a WAV whose header says ``rate``."""
    import struct

    import soundfile as sf
    from fault_helpers import SR, speechlike

    sf.write(path, speechlike(1.0), SR, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    data[24:32] = struct.pack("<II", rate, (2 * rate) & 0xFFFFFFFF)  # sample rate, byte rate
    path.write_bytes(bytes(data))
    return path


UNUSABLE_RATES = {1: "its sample rate, 1 Hz, is outside", 2_000_000_000: "2000000000 Hz, is outside",
                  44101: "44101 Hz cannot be resampled to 16000 Hz"}  # fmt: skip


def test_unusable_sample_rates_are_one_line_in_usmkit_transcribe(ctc_ckpt, tmp_path, capsys):
    """A header saying 1 Hz transcribed for minutes (16000 s of "audio"), 2 GHz printed "no speech detected",
    exit 0, and 44101 Hz ended in "RuntimeError: ... can't allocate memory" (a 44101 x 16000 resampling
    filter, 2.8 GB), exit 1. Now one line naming the file, exit 2; the usual rates still transcribe."""
    from usmkit.cli import transcribe

    common = ["--checkpoint", str(ctc_ckpt), "--step", "eager", "--no-partials"]
    for rate, words in UNUSABLE_RATES.items():
        wav = _wav_declaring(tmp_path / f"r{rate}.wav", rate)
        assert transcribe.main([str(wav), *common]) == 2
        err = capsys.readouterr().err
        assert f"error: {wav}: " in err and words in err and "ffmpeg" in err, err
    for rate in (8000, 16000, 22050, 44100, 48000):
        assert transcribe.main([str(_wav_declaring(tmp_path / f"ok{rate}.wav", rate)), *common]) == 0
    capsys.readouterr()
    assert transcribe.main(["-", "--sample-rate", "44101", *common]) == 2
    assert "--sample-rate 44101: 44101 Hz cannot be resampled" in capsys.readouterr().err


def test_unusable_sample_rates_are_named_by_batch_transcription_and_corpus_validation(ctc_ckpt, tmp_path):
    """Batch transcription called the 2 GHz file "too short" and planned the 1 Hz one as 16000 s of audio;
    corpus validation passed all three into training. Now each is named (the skipped files' summary; the
    44101 Hz file's reason is logged as transcribe's), and validation names the file and its rate."""
    from lhotse import CutSet, Recording

    from usmkit.data.validate import BadInputError, validate_cuts

    inputs = tmp_path / "in"
    inputs.mkdir()
    for rate in (*UNUSABLE_RATES, 16000, 44100):
        _wav_declaring(inputs / f"r{rate}.wav", rate)
    out = tmp_path / "out.jsonl"
    proc = _run("usmkit.cli.transcribe_batch", f"checkpoint={ctc_ckpt}", f"inputs={inputs}", f"out={out}",
                "num_workers=0", cwd=tmp_path)  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert "2 unusable sample rate (r1.wav, r2000000000.wav), 1 unreadable audio (r44101.wav)" in err, err[-3000:]
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == ["r16000.wav", "r44100.wav"]

    for rate, words in UNUSABLE_RATES.items():
        cuts = CutSet.from_cuts([Recording.from_file(inputs / f"r{rate}.wav").to_cut()])
        with pytest.raises(BadInputError, match=f"unusable sample rate.*r{rate}.wav.*{words}"):
            validate_cuts(cuts, require_text=False)
    good = CutSet.from_cuts([Recording.from_file(inputs / f"r{r}.wav").to_cut() for r in (16000, 44100)])
    assert len(validate_cuts(good, require_text=False)[0]) == 2


# ---- 8, 9. numeric options of usmkit-transcribe and usmkit-serve -----------------------------------------
@pytest.mark.parametrize(
    "option",
    [
        ["--endpoint-blank", "nan"],
        ["--endpoint-silence", "inf"],
        ["--max-segment", "nan"],
        ["--silence-db", "nan"],
        ["--silence-db", "10"],
        ["--lm-weight", "nan", "--lexicon"],
        ["--lm-weight", "-1", "--lexicon"],
        ["--word-score", "inf", "--lexicon"],
        ["--rescore-ctc-weight", "nan", "--decode", "ctc_beam", "--rescore"],
    ],
)
def test_meaningless_numbers_for_usmkit_transcribe_are_one_line(ctc_ckpt, tmp_path, capsys, option):
    """``--endpoint-blank nan`` / ``--max-segment inf`` ended in "ValueError: cannot convert float NaN to
    integer" (exit 1); ``--silence-db nan`` or ``10`` (above full scale) transcribed as if nothing was
    wrong; a NaN/negative LM weight reached the lexicon decoder. Now argparse's check names the option."""
    import soundfile as sf
    from fault_helpers import SR, speechlike

    from usmkit.cli import transcribe

    audio = tmp_path / "talk.wav"
    sf.write(audio, speechlike(1.0), SR)
    assert transcribe.main([str(audio), "--checkpoint", str(ctc_ckpt), "--step", "eager", *option]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"argument {option[0]}: must be" in err, err


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_serve_port_out_of_range_is_one_line(ctc_ckpt, capsys, port):
    """``--port 70000`` loaded the model and ended in "OverflowError: bind(): port must be 0-65535" with a
    traceback. Now refused with the arguments."""
    from usmkit.cli import serve

    with pytest.raises(SystemExit) as e:  # (serve's main exits itself)
        serve.main(["--checkpoint", str(ctc_ckpt), "--step", "eager", "--port", port])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --port: must be a TCP port, 0 to 65535" in err and "Traceback" not in err, err


# ---- 11, 12. evaluate: meaningless numbers, an ensemble member of another vocabulary ----------------------
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


# ---- 10. batch transcription's outputs ---------------------------------------------------------------------
def test_batch_outputs_never_replace_a_file_that_is_not_theirs(ctc_ckpt, tmp_path):
    """``out=notes.txt`` (a file without a newline) was truncated to nothing and filled with transcripts
    (its "cut short last line" dropped); ``ctm=`` set to the input recording replaced the recording, and
    ``ctm=`` equal to ``out=`` replaced the transcripts with the CTM. Each is now one line before any work."""
    import soundfile as sf
    from fault_helpers import SR, speechlike

    audio = tmp_path / "talk.wav"
    sf.write(audio, speechlike(1.0), SR)
    recording = audio.read_bytes()
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, no newline")
    common = [f"checkpoint={ctc_ckpt}", f"inputs={audio}", "num_workers=0"]
    _one_error_line(_run("usmkit.cli.transcribe_batch", *common, f"out={notes}", cwd=tmp_path),
                    "not a transcript file", str(notes))  # fmt: skip
    assert notes.read_text() == "my notes, no newline"

    out = tmp_path / "out.jsonl"
    _one_error_line(_run("usmkit.cli.transcribe_batch", *common, f"out={out}", f"ctm={audio}", cwd=tmp_path),
                    f"ctm={audio} is also inputs=")  # fmt: skip
    _one_error_line(_run("usmkit.cli.transcribe_batch", *common, f"out={out}", f"ctm={out}", cwd=tmp_path),
                    f"ctm={out} is also out=")  # fmt: skip
    listed = tmp_path / "list.txt"
    listed.write_text("talk.wav\n")
    proc = _run("usmkit.cli.transcribe_batch", *common[:1], f"inputs={listed}", f"out={out}", f"ctm={audio}",
                "num_workers=0", cwd=tmp_path)  # fmt: skip
    _one_error_line(proc, f"ctm={audio} exists and is not a CTM file")
    assert audio.read_bytes() == recording and not out.exists()

    proc = _run("usmkit.cli.transcribe_batch", *common, f"out={out}", f"ctm={tmp_path / 'words.ctm'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    proc = _run("usmkit.cli.transcribe_batch", *common, f"out={out}", cwd=tmp_path)  # a rerun: its own file
    assert proc.returncode == 0 and len(out.read_text().splitlines()) == 1, proc.stderr.decode()[-3000:]


# ---- 6. output paths under a file, or on a read-only location ----------------------------------------------
def _writers(ctc_ckpt: Path, corpus: Path, where: Path, wav: Path) -> dict[str, list[str]]:
    """Each command that writes a folder or a result file, with its output at ``where / <name>``."""
    import soundfile as sf
    from fault_helpers import SR, speechlike

    sf.write(wav, speechlike(1.0), SR)
    return {
        "train": ["usmkit.cli.train", *FAST_TRAIN, f"data.manifest_dir={corpus}", f"trainer.exp_dir={where / 'exp'}"],
        "evaluate": ["usmkit.cli.evaluate", f"checkpoint={ctc_ckpt}", f"manifest_dir={corpus}", "test_sets=[dev]",
                     f"output={where / 'eval.json'}"],
        "transcribe": ["usmkit.cli.transcribe", str(wav), "--checkpoint", str(ctc_ckpt), "--step", "eager",
                       "--json", str(where / "talk.json")],
        "average": ["usmkit.cli.average", str(ctc_ckpt), "--last", "1", "--out", str(where / "avg")],
        "prepare": ["usmkit.cli.prepare", "synth", f"out={where / 'corpus'}", "size=tiny"],
        "export": ["usmkit.cli.export", f"checkpoint={ctc_ckpt}", "format=onnx", f"out={where / 'export'}"],
        "transcribe_batch": ["usmkit.cli.transcribe_batch", f"checkpoint={ctc_ckpt}", f"inputs={wav}",
                             f"out={where / 'out.jsonl'}"],
    }  # fmt: skip


def test_outputs_under_a_file_are_one_line_before_any_work(ctc_ckpt, synth_corpus, tmp_path):
    """Training and prepare ended in a NotADirectoryError traceback, batch transcription in FileExistsError;
    evaluate and usmkit-transcribe said one line, but only after decoding everything. Now every command names
    the file in the way before it starts."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for name, argv in _writers(ctc_ckpt, synth_corpus, a_file, tmp_path / "talk.wav").items():
        line = _one_error_line(_run(*argv, cwd=tmp_path), f"{a_file} is a file, so nothing can be written under it")
        assert a_file.read_text() == "mine", (name, line)


def test_outputs_on_a_read_only_location_are_one_line_before_any_work(ctc_ckpt, synth_corpus, tmp_path):
    """A read-only mount (root only; skipped elsewhere)."""
    with mounted_tmpfs(tmp_path / "ro", "ro,size=64k") as ro:
        for argv in _writers(ctc_ckpt, synth_corpus, ro, tmp_path / "talk.wav").values():
            _one_error_line(_run(*argv, cwd=tmp_path), f"{ro} is read-only here")
