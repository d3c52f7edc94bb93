"""experiments/multilingual/crosslingual.py: the pools it pre-trains on (never a scored language's dev or test
audio), the fine-tuning runs it compares (same data, seed and steps; only the start differs), and its report
(mean +- sd, the relative CER gain over scratch, the target)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_modules import script_module
from script_modules import step_overrides as _overrides

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "experiments" / "multilingual" / "crosslingual.py"


@pytest.fixture(scope="module")
def xl():
    with script_module("crosslingual_study", STUDY) as module:
        yield module


def _settings(xl, tmp_path, *extra: str):
    argv = ["--ml", str(tmp_path / "ml"), "--out", str(tmp_path / "xl"), "--english", "d/an4:an4", *extra]
    return xl.parse_args(argv)[1]


def test_the_shared_pool_holds_no_scored_languages_dev_or_test_audio(xl, tmp_path):
    s = _settings(xl, tmp_path, "--clips", "clips_dir")
    pools = xl.pool_inputs(s)
    assert set(pools) == {"pool_all", "pool_cs", "pool_nl"}
    shared = [Path(x.rsplit(":", 2)[0]).name + ":" + x.split(":", 1)[1].rsplit("/", 1)[-1] for x in pools["pool_all"]]
    assert "fillets:fillets:train" in shared and not any(x.startswith("fillets:") and "train" not in x for x in shared)
    assert {"asterisk:asterisk:dev", "an4:an4:test", "clips:clips:unlabeled"} <= set(shared)
    assert pools["pool_cs"] == [f"{tmp_path / 'ml' / 'data' / 'fillets'}:fillets:train_cs"]
    data = {step.name: step for step in xl.data_steps(s)}
    assert data["prepare_clips"].argv()[0] == "audio_folder" and data["prepare_pool_all"].deps == ("prepare_clips",)


def test_the_starts_differ_only_in_the_encoder_they_begin_from(xl, tmp_path):
    s = _settings(xl, tmp_path, "--seeds", "0,1", "--labels", "0.2")
    pretrain = {step.name: _overrides(step) for step in xl.pretrain_steps(s)}
    assert set(pretrain) == {"bestrq_pool_all", "bestrq_pool_cs", "bestrq_pool_nl"}
    assert (
        len({(o["trainer.max_steps"], o["trainer.seed"], o["task.bestrq.num_codebooks"]) for o in pretrain.values()})
        == 1
    )
    runs = {step.name: _overrides(step) for step in xl.finetune_steps(s)}
    assert len(runs) == 2 * 2 * 3
    trio = [runs[f"nl_{start}_s1"] for start in xl.STARTS]
    assert "init_from" not in trio[0]
    assert trio[1]["init_from"].endswith("runs/bestrq_pool_all") and trio[2]["init_from"].endswith(
        "runs/bestrq_pool_nl"
    )
    same = (
        "data.train_split",
        "data.dev_split",
        "data.labeled_fraction",
        "trainer.seed",
        "trainer.max_steps",
        "tokenizer",
    )
    assert all({k: o[k] for k in same} == {k: trio[0][k] for k in same} for o in trio)
    assert (trio[0]["data.train_split"], trio[0]["data.labeled_fraction"], trio[0]["trainer.seed"]) == (
        "train_nl",
        "0.2",
        "1",
    )
    decode = {step.name: _overrides(step) for step in xl.decode_steps(s)}
    assert decode["decode_nl_pool_all_s1"]["checkpoint"].endswith("runs/nl_pool_all_s1/checkpoints/step-000600")
    frozen = {step.name: _overrides(step) for step in xl.finetune_steps(_settings(xl, tmp_path, "--frozen"))}
    assert "cs_scratch_s0" in frozen and "optim.freeze_encoder_steps" not in frozen["cs_scratch_s0"]
    own = frozen["cs_pool_own_frozen_s0"]
    assert (own["optim.freeze_encoder_steps"], own["optim.encoder_lr_scale"]) == ("150", "0.5")


def test_report_gives_the_gain_over_scratch_and_whether_the_target_is_met(xl, tmp_path):
    s = _settings(xl, tmp_path, "--languages", "cs", "--seeds", "0,1")
    cers = {"scratch": (0.50, 0.60), "pool_all": (0.38, 0.42), "pool_own": (0.50, 0.50)}
    for start, values in cers.items():
        for seed, cer in enumerate(values):
            name = f"cs_{start}_s{seed}"
            out = s.out / "decode" / f"{name}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            sets = {f"{split}_cs": {"wer": 2 * cer, "cer": cer} for split in ("dev", "test")}
            out.write_text(json.dumps({"sets": sets}))
            run = s.out / "runs" / name
            run.mkdir(parents=True)
            rows = [{"step": 10, "train/loss": 1.0}, {"step": 20, "dev/dev_loss": 2.0, "dev/dev_cer": cer}]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bestrq = s.out / "runs" / "bestrq_pool_all"
    bestrq.mkdir(parents=True)
    logged = [(10, 6.0, 0.1), (50, 4.0, 0.3), (60, 2.0, 0.5), (100, 3.0, 0.4)]
    metrics = [
        {"step": st, "train/loss": lo, "train/acc_mean": a, "train/perplexity_mean": 8.0} for st, lo, a in logged
    ]
    (bestrq / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    report = xl.build_report(s)
    first, second = report["pretraining"]["pool_all"]
    assert (first["step"], first["loss"], first["target_perplexity"]) == (50, 5.0, 8.0)
    assert first["accuracy"] == pytest.approx(0.2) and "prediction_perplexity" not in first
    assert (second["step"], second["loss"], second["accuracy"]) == (100, 2.5, pytest.approx(0.45))
    assert report["pretraining"]["pool_cs"] == []
    summary = {e["start"]: e for e in report["summary"]}
    assert summary["scratch"]["test_cer_mean"] == pytest.approx(0.55) and "test_cer_gain" not in summary["scratch"]
    assert summary["pool_all"]["test_cer_gain"] == pytest.approx(1 - 0.40 / 0.55) and summary["pool_all"]["target_met"]
    assert summary["pool_own"]["test_cer_gain"] == pytest.approx(1 - 0.50 / 0.55)
    assert not summary["pool_own"]["target_met"]
    assert report["rows"][0]["dev_cer_curve"] == [(20, 0.5)] and report["missing"] == []
    png = tmp_path / "plot.png"
    xl.plot(report, png)
    assert png.stat().st_size > 1000


@pytest.fixture(scope="module")
def table():
    with script_module("multilingual_table", REPO / "experiments" / "multilingual" / "table.py") as module:
        yield module


def test_the_table_takes_the_dev_chosen_fine_tuning_rule_and_has_a_row_per_language(table, tmp_path):
    def entry(lang, start, dev, test, runs=3):
        return {"language": lang, "start": start, "runs": runs, "dev_cer_mean": dev, "dev_cer_sd": 0.01,
                "test_cer_mean": test, "test_cer_sd": 0.02, "test_wer_mean": 2 * test, "test_wer_sd": 0.0}  # fmt: skip

    xl = {
        "settings": {"labels": 0.1},
        "summary": [
            entry("cs", "scratch", 0.8, 0.8),
            entry("cs", "pool_all", 0.6, 0.5),
            entry("cs", "pool_all_frozen", 0.5, 0.7, runs=1),  # only the dev-choice seed: not a candidate
            entry("cs", "pool_own", 0.7, 0.7),
            entry("cs", "pool_own_frozen", 0.65, 0.75),
        ],
    }
    single = {"language": "cs", "model": "single", "test_wer_mean": 0.9, "test_wer_sd": 0.1, "test_cer_mean": 0.5,
              "test_cer_sd": 0.05}  # fmt: skip
    ml = {"train_hours": {"en": 0.3, "cs": 1.36}, "summary": [single, {**single, "language": "en"}]}
    rows = table.table_rows(ml, xl)
    assert [r["language"] for r in rows] == ["en", "cs"]
    cs = rows[1]
    assert cs["pretrained_all_10"]["start"] == "pool_all" and cs["pretrained_own_10"]["start"] == "pool_own_frozen"
    assert rows[0]["scratch_10"] is None and rows[0]["multilingual"] is None
    text = table.markdown(rows, 0.1)
    assert "| cs | 1.36 | 90.0 +- 10.0 | 50.0 +- 5.0 | - | - | 80.0 +- 2.0 | 50.0 +- 2.0 | 75.0 +- 2.0 |" in text
    long = {"summary": [{**single, "model": "multilingual", "test_wer_mean": 0.7, "test_cer_mean": 0.3}]}
    rows = table.table_rows(ml, xl, long)
    assert rows[0]["multilingual_long"] is None and rows[1]["multilingual_long"]["test_cer_mean"] == 0.3
    assert "| - | - | 70.0 +- 10.0 | 30.0 +- 5.0 | 80.0 +- 2.0 |" in table.markdown(rows, 0.1, long_steps=4200)
    table.plot(rows, 0.1, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
