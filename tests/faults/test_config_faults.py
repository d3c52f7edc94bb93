"""Faults of configuration and arguments (usmkit.config, usmkit.cli.args, usmkit.errors): one error line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from composed_config import train_config
from fault_helpers import (
    FAST_TRAIN,
    REPO,
    expect_one_error_line,
    run_module,
    run_text,
    worker_config,
    worker_train,
)

from usmkit.config import ConfigError


@pytest.mark.parametrize(
    ("command", "override", "named"),
    [
        ("usmkit.cli.train", "trainer.max_stepz=3", "unknown key trainer.max_stepz"),
        ("usmkit.cli.train", "recipe=stage9", "choose one of stage1"),
        ("usmkit.cli.train", "trainer.max_steps=many", "trainer.max_steps"),
        ("usmkit.cli.train", "trainer.max_steps=[3", "overrides look like key=value"),
        ("usmkit.cli.evaluate", "decodee=ctc_greedy", "unknown key decodee"),
        ("usmkit.cli.export", "formats=onnx", "unknown key formats"),
    ],
)
def test_config_errors_are_one_line_and_exit_2(tmp_path, command, override, named):
    proc = run_text(command, override, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], proc.stderr


def test_documented_data_allow_urls_is_accepted(tmp_path):
    proc = run_text("usmkit.cli.train", "data.allow_urls=true", "trainer.max_steps=0", "--cfg", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "allow_urls: true" in proc.stdout


def test_user_errors_exit_codes_and_debug(monkeypatch, capsys):
    from usmkit.checkpointing.checkpoint import CheckpointWriteError
    from usmkit.errors import DEBUG_ENV, UsageError, strip_debug_flag, user_errors

    monkeypatch.setenv(DEBUG_ENV, "")  # recorded: strip_debug_flag below sets it, the teardown undoes that
    for error, code in ((UsageError("bad value x=1; pass x=2"), 2), (CheckpointWriteError("disk full"), 1)):
        with pytest.raises(SystemExit) as e, user_errors():
            raise error
        assert e.value.code == code and capsys.readouterr().err == f"error: {error}\n"
    with pytest.raises(SystemExit), user_errors():
        open("/nonexistent/file.wav")
    assert capsys.readouterr().err == "error: /nonexistent/file.wav: No such file or directory\n"
    assert strip_debug_flag(["a=1", "--debug"]) == ["a=1"]
    with pytest.raises(UsageError), user_errors():  # --debug (or USMKIT_DEBUG=1): the traceback
        raise UsageError("shown with its traceback")


def test_keep_last_zero_or_negative_is_refused(tmp_path):
    """``trainer.keep_last=0`` was accepted, and every save then deleted every checkpoint, the one just
    written too (``prune_checkpoints`` keeps none)."""

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

    from usmkit.config import ConfigError

    key, value = override.split("=")
    with pytest.raises(ConfigError, match=rf"^{key} must be a finite number, got {value}$"):
        train_config(*FAST_TRAIN, f"trainer.exp_dir={tmp_path / 'exp'}", override)


def test_non_finite_float_on_the_command_line_is_one_line(tmp_path):
    proc = run_module("usmkit.cli.train", *FAST_TRAIN, f"trainer.exp_dir={tmp_path / 'exp'}", "data.max_duration=nan",
                cwd=tmp_path)  # fmt: skip
    expect_one_error_line(proc, "data.max_duration must be a finite number, got nan")
    assert not (tmp_path / "exp").exists()


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


def test_bad_config_values_are_refused_before_any_data_is_read(tmp_path):
    with pytest.raises(ConfigError, match=r"optim.lr must be a positive number, got -0.1"):
        worker_config(tmp_path / "no-corpus", tmp_path / "exp", "optim.lr=-0.1")
    with pytest.raises(ConfigError, match="model: unknown encoder preset 'huge'"):  # not "no cuts manifest"
        worker_train(tmp_path / "no-corpus", tmp_path / "exp", "model.preset=huge")
    with pytest.raises(FileNotFoundError, match="no checkpoint found at"):
        worker_train(tmp_path / "no-corpus", tmp_path / "exp", f"init_from={tmp_path / 'nope'}")
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "usmkit.cli.train",
        "recipe=stage3_ctc",
        f"data.manifest_dir={tmp_path}/none",
        "optim.lr=-1",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "error: optim.lr must be a positive number, got -1.0"
    assert "Traceback" not in proc.stderr  # and no "no cuts manifest" error: no data was looked at


@pytest.mark.slow
def test_debug_flag_shows_the_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "usmkit.cli.train", "recipe=stage3_ctc", "optim.lr=-1", "--debug"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "optim.lr" in proc.stderr
