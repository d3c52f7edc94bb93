"""``python -m usmkit.cli.evaluate``'s own behaviour (the scoring is tested in tests/inference): a Ctrl-C is
one line and exit 130, keeping the sets already scored."""

from __future__ import annotations

import json

import pytest

import usmkit.cli.evaluate as evaluate_cli


@pytest.mark.parametrize("sets_before", [0, 1])
def test_ctrl_c_is_one_line_and_keeps_the_sets_scored(tmp_path, monkeypatch, capsys, sets_before):
    """A KeyboardInterrupt while decoding (after ``sets_before`` sets were scored) was a traceback."""
    out = tmp_path / "eval.json"

    def interrupted(cfg, on_set):
        for name in ["test", "test_other"][:sets_before]:
            on_set({"checkpoint": cfg.checkpoint, "decode": cfg.decode, "sets": {name: {"wer": 0.5}}})
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_cli, "evaluate", interrupted)
    monkeypatch.delenv("USMKIT_DEBUG", raising=False)
    try:
        evaluate_cli.main([f"checkpoint={tmp_path / 'exp'}", "test_sets=[test,test_other]", f"output={out}"])
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:  # (caught here so that it does not stop pytest itself)
        code = "a KeyboardInterrupt traceback"
    assert code == 130
    err = capsys.readouterr().err
    assert err.startswith("error: interrupted (Ctrl-C); ") and err.count("\n") == 1, err
    if sets_before:
        assert f"the test sets scored so far are in {out}" in err
        assert json.loads(out.read_text())["sets"] == {"test": {"wer": 0.5}}
    else:
        assert "no test set was scored yet" in err and not out.exists()
