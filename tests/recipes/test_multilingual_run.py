"""recipes/multilingual/run.py: the commands it builds (one multilingual model with language sampling, one
model per language, shared tokenizer, per-language scoring), the mean +- sd report, and (slow) the whole
recipe end to end on tiny packages written in the test."""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import pytest
from script_modules import script_module
from script_modules import step_overrides as _overrides

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "multilingual" / "run.py"


@pytest.fixture(scope="module")
def ml_run():
    with script_module("multilingual_run", RECIPE) as module:
        yield module


def test_steps_train_one_multilingual_model_and_one_per_language(ml_run, tmp_path):
    _, s = ml_run.parse_args(["--out", str(tmp_path), "--languages", "en,cs", "--seeds", "0,1", "--temperature", "2"])
    data = {step.name: step for step in ml_run.data_steps(s)}
    assert set(data) == {"prepare_asterisk", "prepare_fillets", "pool_train", "pool_dev"} | {
        f"pool_{split}_{lang}" for split in ("train", "dev", "test") for lang in ("en", "cs")
    }
    assert data["prepare_asterisk"].argv()[0] == "asterisk" and "languages=[en]" in data["prepare_asterisk"].argv()
    assert _overrides(data["pool_train"])["inputs"].count(":train") == 2
    train = {step.name: _overrides(step) for step in ml_run.train_steps(s)}
    assert set(train) == {f"{m}_s{seed}" for m in ("multi", "en", "cs") for seed in (0, 1)}
    multi, cs = train["multi_s1"], train["cs_s1"]
    assert (multi["data.train_split"], multi["data.dev_split"], multi["data.language_temperature"]) == (
        "train",
        "dev",
        "2.0",
    )
    assert (cs["data.train_split"], cs["data.dev_split"], cs["data.language_temperature"]) == (
        "train_cs",
        "dev_cs",
        "1.0",
    )
    assert multi["tokenizer"] == cs["tokenizer"] == str(s.tokenizer)  # one tokenizer: only the data differ
    assert multi["trainer.max_steps"] == cs["trainer.max_steps"] and multi["trainer.seed"] == cs["trainer.seed"] == "1"
    decode = {step.name: _overrides(step) for step in ml_run.decode_steps(s)}
    assert decode["decode_multi_s0"]["test_sets"] == "[dev_en,test_en,dev_cs,test_cs]"
    assert decode["decode_en_s0"]["test_sets"] == "[dev_en,test_en]"


def test_english_corpora_join_the_multilingual_training_and_are_scored_apart(ml_run, tmp_path):
    argv = ["--out", str(tmp_path), "--languages", "en,nl", "--seeds", "0", "--english", "d/an4:an4", "d/k:kathleen"]
    _, s = ml_run.parse_args(argv)
    data = {step.name: _overrides(step) for step in ml_run.data_steps(s)}
    assert data["pool_train"]["inputs"].endswith(",d/an4:an4:train,d/k:kathleen:train]")
    assert data["pool_dev"]["inputs"].endswith(",d/an4:an4:dev,d/k:kathleen:dev]")
    assert data["pool_test_an4"]["inputs"] == "[d/an4:an4:test]" and "pool_train_an4" not in data
    train = {step.name for step in ml_run.train_steps(s)}
    assert train == {"multi_s0", "en_s0", "nl_s0"}  # no single-corpus model of the English corpora
    decode = {step.name: _overrides(step) for step in ml_run.decode_steps(s)}
    assert decode["decode_multi_s0"]["test_sets"].endswith(",dev_an4,test_an4,dev_kathleen,test_kathleen]")


def test_report_means_and_sds_per_language_and_model(ml_run, tmp_path):
    _, s = ml_run.parse_args(["--out", str(tmp_path), "--languages", "en,ru", "--seeds", "0,1"])
    scores = {"multi_s0": 0.1, "multi_s1": 0.3, "en_s0": 0.2, "en_s1": 0.4, "ru_s0": 0.5}  # ru_s1 not decoded
    for name, wer in scores.items():
        langs = ["en", "ru"] if name.startswith("multi") else [name[:2]]
        sets = {f"{sp}_{x}": {"wer": wer, "cer": wer / 2} for x in langs for sp in ("dev", "test")}
        (tmp_path / "decode").mkdir(exist_ok=True)
        (tmp_path / "decode" / f"{name}.json").write_text(json.dumps({"sets": sets}))
    report = ml_run.build_report(s)
    by = {(e["language"], e["model"]): e for e in report["summary"]}
    assert by["en", "multilingual"]["test_wer_mean"] == pytest.approx(0.2)
    assert by["en", "multilingual"]["test_wer_sd"] == pytest.approx(statistics.stdev([0.1, 0.3]))
    assert by["en", "single"]["test_cer_mean"] == pytest.approx(0.15)
    assert by["ru", "single"]["runs"] == 1 and by["ru", "single"]["test_wer_sd"] is None
    assert report["missing"] == ["ru_s1"] and len(report["rows"]) == 4 + 2 + 1


def test_a_character_vocabulary_and_a_named_recipe(ml_run, tmp_path, monkeypatch):
    from lhotse import MonoCut, SupervisionSegment

    import usmkit.data.manifests

    argv = ["--out", str(tmp_path), "--vocab-size", "chars", "--recipe", "stage3_ctc_cpu", "--languages", "ru,cs"]
    _, s = ml_run.parse_args(argv)
    texts = ["привет мир", "dobrý den", "ahoj světe"]
    cuts = [
        MonoCut(f"c{i}", 0, 1, 0, supervisions=[SupervisionSegment(f"c{i}", "r", 0, 1, text=x)])
        for i, x in enumerate(texts)
    ]
    monkeypatch.setattr(usmkit.data.manifests, "load_cuts", lambda *a, **k: cuts)
    ml_run.train_tokenizer(s)
    from usmkit.data.tokenizer import Tokenizer, minimum_vocab_size

    tokenizer = Tokenizer.load(s.tokenizer)
    assert tokenizer.vocab_size == minimum_vocab_size(texts)  # one piece per character: no multi-letter pieces
    assert tokenizer.decode(tokenizer.encode("světe мир")) == "světe мир"
    train = _overrides(ml_run.train_steps(s)[0])
    assert train["recipe"] == "stage3_ctc_cpu" and train["trainer.dev_max_batches"] == "0"
    assert ml_run.build_report(s)["settings"]["vocab_size"] == "chars"
    assert _overrides(ml_run.decode_steps(s)[0])["checkpoint"] == str(tmp_path / "runs" / "multi_s0")  # its best
    _, last = ml_run.parse_args([*argv, "--checkpoint", "last", "--steps", "600"])
    assert _overrides(ml_run.decode_steps(last)[0])["checkpoint"].endswith("runs/multi_s0/checkpoints/step-000600")
    _, multi = ml_run.parse_args([*argv, "--models", "multilingual", "--seeds", "0,1"])
    assert list(ml_run.run_names(multi)) == ["multi_s0", "multi_s1"]
    assert ml_run.build_report(multi)["missing"] == ["multi_s0", "multi_s1"]  # the single models are not asked for


@pytest.mark.slow
def test_recipe_end_to_end_on_tiny_packages(ml_run, tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(REPO / "tests" / "data"))
    try:
        import test_asterisk
        import test_fillets
    finally:
        sys.path.remove(str(REPO / "tests" / "data"))
    debs = tmp_path / "debs"
    test_asterisk.make_debs(debs)
    test_fillets.make_debs(debs)
    wavs, _ = test_asterisk.package_files("en")  # again without the fixture's unreadable file (it stops prepare)
    wavs = {path: data for path, data in wavs.items() if not path.endswith("broken.wav")}
    test_asterisk.write_deb(debs, "asterisk-core-sounds-en-wav", wavs, version="1.6.1-1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    argv = [
        "--debs", str(debs), "--out", str(tmp_path / "out"), "--languages", "en,ru,cs", "--seeds", "0",
        "--steps", "2", "--model-overrides", "{d_model: 64, num_layers: 2, num_heads: 2, subsampling_channels: 32}",
        "--max-duration", "20", "--workers", "0", "--device", "cpu", "--vocab-size", "300", "--temperature", "3",
    ]  # fmt: skip
    assert ml_run.main(argv) == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["missing"] == []
    assert {(e["language"], e["model"]) for e in report["summary"]} == {
        (lang, model) for lang in ("en", "ru", "cs") for model in ("single", "multilingual")
    }
    assert all(0 <= r["test_wer"] and 0 <= r["test_cer"] for r in report["rows"])
    log = (tmp_path / "out" / "logs" / "multi_s0.log").read_text()
    assert "language sampling (T=3)" in log
