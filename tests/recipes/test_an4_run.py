"""recipes/an4/run.py: the commands it builds from override dicts (they compose into the configs usmkit's
commands read), the mean +- sd report, and (slow) the whole recipe end to end on a tiny fake AN4. The steps it
runs them as: tests/recipes/test_steps.py; the encoder it hands on: tests/recipes/test_handoff.py."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

import pytest

from usmkit.checkpointing.checkpoint import MODEL_FILE
from usmkit.cli.compose import compose_train, compose_yaml
from usmkit.config import TrainConfig, from_dict
from usmkit.inference.evaluate import EvalConfig

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "an4"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def an4_run():
    """recipes/an4/run.py as a module (its folder on sys.path, as when it runs as a script: it imports settings.py
    and report.py)."""
    sys.path.insert(0, str(RECIPE))
    try:
        yield _load("an4_run", RECIPE / "run.py")
    finally:
        sys.path.remove(str(RECIPE))
        for name in ("an4_run", "settings", "report"):
            sys.modules.pop(name, None)


def _by_name(steps):
    return {step.name: step for step in steps}


def _overrides(step) -> dict[str, str]:
    return dict(a.split("=", 1) for a in step.argv() if "=" in a)


# ---- building commands ---------------------------------------------------------------------------


def test_every_run_with_its_seeds_and_what_it_starts_from(an4_run, tmp_path):
    s = an4_run.Settings(out=tmp_path, variants=("scratch", "cb1", "las", "most"), extra={"trainer.max_steps": 7})
    steps = _by_name(an4_run.train_steps(s))
    runs = [name for name in steps if name.split("_")[0] in s.variants and name.endswith(("_s0", "_s1", "_s2"))]
    assert len(runs) == 3 + 3 * 2 * 3  # scratch: 3 fine-tuning seeds; each BEST-RQ row: 3 x 2 pre-training seeds
    assert {"scratch_s2", "cb1_p1_s2", "las_p1_s0", "most_p0_s1"} <= set(runs)

    bestrq = _overrides(steps["bestrq_cb1_p1"])
    assert bestrq["recipe"] == "stage1" and bestrq["task.bestrq.num_codebooks"] == "1"
    assert bestrq["trainer.seed"] == bestrq["task.bestrq.seed"] == "1" and bestrq["data.train_split"] == "pool"

    cb1 = _overrides(steps["cb1_p1_s2"])
    assert cb1["recipe"] == "stage3_ctc" and cb1["trainer.seed"] == "2"
    assert cb1["init_from"] == str(tmp_path / "runs" / "bestrq_cb1_p1") and "bestrq_cb1_p1" in steps["cb1_p1_s2"].deps
    assert cb1["trainer.max_steps"] == "7" and steps["cb1_p1_s2"].argv().count("trainer.max_steps=7") == 1  # replaced
    assert "init_from" not in _overrides(steps["scratch_s1"])

    las = _overrides(steps["las_p1_s0"])  # from the 16-codebook encoder (--las-from)
    assert las["recipe"] == "stage3_las" and las["init_from"] == str(tmp_path / "runs" / "bestrq_cb16_p1")
    assert las["task.ctc_weight"] == "0.7"  # --las-ctc-weight's default; the CTC runs keep their task's
    assert "task.ctc_weight" not in _overrides(steps["cb1_p1_s2"])

    most, stage2 = _overrides(steps["most_p0_s1"]), _overrides(steps["most_cb16_p0"])
    assert most["init_from"] == str(tmp_path / "runs" / "most_cb16_p0") and most["recipe"] == "stage3_ctc"
    assert stage2["recipe"] == "stage2" and stage2["init_from"] == str(tmp_path / "runs" / "bestrq_cb16_p0")
    assert stage2["task.bestrq.num_codebooks"] == "16" and "prepare_an4_text" in steps["most_cb16_p0"].deps
    assert _overrides(steps["prepare_pool"])["inputs"].count(":unlabeled") == 2  # AN4 train audio and Kathleen's

    given = an4_run.Settings(out=tmp_path, variants=("cb1",), stage1={"cb1": "/enc/cb1"}, seeds=(0, 1))
    steps = _by_name(an4_run.train_steps(given))  # an encoder given: not pre-trained, no pre-training seeds
    assert "bestrq_cb1_p0" not in steps and "prepare_pool" not in steps
    assert _overrides(steps["cb1_s1"])["init_from"] == "/enc/cb1"

    weighted = an4_run.Settings(out=tmp_path, variants=("las",), seeds=(0,), pretrain_seeds=(0,), las_ctc_weight=0.5)
    assert _overrides(_by_name(an4_run.train_steps(weighted))["las_p0_s0"])["task.ctc_weight"] == "0.5"
    extra = an4_run.Settings(
        out=tmp_path, variants=("las",), seeds=(0,), pretrain_seeds=(0,), extra={"task.ctc_weight": 0.2}
    )
    assert _overrides(_by_name(an4_run.train_steps(extra))["las_p0_s0"])["task.ctc_weight"] == "0.2"  # --extra wins


def test_the_encoder_freeze_applies_to_runs_from_a_pre_trained_encoder_only(an4_run, tmp_path):
    keys = ("optim.freeze_encoder_steps", "optim.encoder_lr_scale")
    frozen = an4_run.Settings(
        out=tmp_path, variants=("scratch", "cb1", "las"), seeds=(0,), pretrain_seeds=(0,),
        freeze_encoder_steps=500, encoder_lr_scale=0.5,
    )  # fmt: skip
    steps = _by_name(an4_run.train_steps(frozen))
    for name in ("cb1_p0_s0", "las_p0_s0"):
        assert [_overrides(steps[name]).get(k) for k in keys] == ["500", "0.5"]
    for name in ("scratch_s0", "bestrq_cb1_p0", "prep_finetune"):  # a random encoder is never held still
        assert not set(keys) & set(_overrides(steps[name]))
    plain = _by_name(an4_run.train_steps(an4_run.Settings(out=tmp_path, variants=("cb1",), seeds=(0,))))
    assert not set(keys) & set(_overrides(plain["cb1_p0_s0"]))  # unset: the commands stay as they were

    _, parsed = an4_run.parse_args(["--variants", "cb1", "--freeze-encoder-steps", "500", "--encoder-lr-scale", "0.5"])
    assert (parsed.freeze_encoder_steps, parsed.encoder_lr_scale) == (500, 0.5)
    with pytest.raises(SystemExit):
        an4_run.parse_args(["--freeze-encoder-steps", "-1"])


def test_the_commands_compose_into_the_configs_usmkit_reads(an4_run, tmp_path):
    """Each kind of training step's overrides are real keys with valid values (Hydra, then the typed config)."""
    s = an4_run.Settings(out=tmp_path, variants=("cb1", "las", "most"), seeds=(0,), pretrain_seeds=(0,))
    steps = _by_name(an4_run.train_steps(s))
    for name, kind in (
        ("bestrq_cb1_p0", "bestrq"),
        ("most_cb16_p0", "most"),
        ("cb1_p0_s0", "ctc"),
        ("las_p0_s0", "las"),
    ):
        cfg = from_dict(TrainConfig, compose_train(steps[name].argv(), command="test"))
        assert cfg.task.kind == kind and cfg.trainer.exp_dir == str(tmp_path / "runs" / name), name
        assert cfg.model.overrides == {"subsampling_channels": 32} and cfg.vocab_size == 290
    tune = _by_name(an4_run.decode_steps(s))["tune_lexicon_cb1_p0_s0"]
    assert _overrides(tune)["orders"] == "[1,2]" and _overrides(tune)["set"] == "dev"
    assert not any("ensemble" in name for name in _by_name(an4_run.decode_steps(s)))  # one run a variant
    two = _by_name(an4_run.decode_steps(an4_run.Settings(out=tmp_path, variants=("cb1",), seeds=(0, 1))))
    greedy = _overrides(two["ctc_greedy_ensemble_cb1"])  # 2 fine-tuning x 2 pre-training seeds as one model
    assert greedy["test_sets"] == "[dev,test,test_8k]" and greedy["checkpoint"] == str(tmp_path / "runs" / "cb1_p0_s0")
    assert (
        greedy["ensemble"]
        == "[" + ",".join(str(tmp_path / "runs" / n) for n in ("cb1_p0_s1", "cb1_p1_s0", "cb1_p1_s1")) + "]"
    )
    evaluate = compose_yaml(
        "evaluate", _by_name(an4_run.decode_steps(s))["rescore_las_p0_s0"].argv(), command="t", schema=EvalConfig
    )
    assert from_dict(EvalConfig, evaluate).decode == "rescore"


def test_lexicon_rescoring_of_las_runs_tests_once_with_the_weight_best_on_dev(an4_run, tmp_path):
    """A ``las`` run's lexicon n-best is rescored on dev at each weight, then on test once at the weight best
    on dev; the report's row carries that weight and its dev WER."""
    s = an4_run.Settings(out=tmp_path, variants=("las",), seeds=(0,), pretrain_seeds=(0,), narrowband_test=False)
    steps = _by_name(an4_run.decode_steps(s))
    out = tmp_path / "decode" / "las_p0_s0"
    out.mkdir(parents=True)
    (out / "lexicon_tuning_dev.json").write_text(
        json.dumps({"best": {"order": 2, "lm_weight": 0.5, "word_score": 1.0, "wer": 0.1}})
    )
    dev_wers = dict(zip(an4_run.RESCORE_WEIGHTS, (0.12, 0.08, 0.08, 0.11), strict=True))
    for w, wer in dev_wers.items():
        dev = _by_name(an4_run.decode_steps(s))[f"lexicon_rescore_dev_w{w}_las_p0_s0"]
        cfg = from_dict(EvalConfig, compose_yaml("evaluate", dev.argv(), command="t", schema=EvalConfig))
        assert cfg.decode == "lexicon_rescore" and cfg.test_sets == ("dev",) and cfg.rescore_ctc_weight == w
        assert cfg.lexicon.nbest == an4_run.RESCORE_NBEST and cfg.lexicon.order == 2 and cfg.lexicon.word_score == 1.0
        (out / f"lexicon_rescore_dev_w{w}.json").write_text(json.dumps({"sets": {"dev": {"wer": wer}}}))
    test = steps["lexicon_rescore_las_p0_s0"]
    assert set(test.deps) == {f"lexicon_rescore_dev_w{w}_las_p0_s0" for w in an4_run.RESCORE_WEIGHTS}
    cfg = from_dict(EvalConfig, compose_yaml("evaluate", test.argv(), command="t", schema=EvalConfig))
    assert cfg.test_sets == ("test",) and cfg.rescore_ctc_weight == 0.5  # the first of the two best on dev
    (out / "lexicon_rescore.json").write_text(json.dumps({"sets": {"test": {"wer": 0.07, "cer": 0.03}}}))
    assert sys.modules["report"].scores(s, "las_p0_s0", "lexicon_rescore") == {
        "dev_wer": 0.08, "test_wer": 0.07, "test_cer": 0.03, "rescore_ctc_weight": 0.5
    }  # fmt: skip


def test_every_model_is_also_scored_on_the_narrowband_test_set_unless_turned_off(an4_run, tmp_path):
    """test_8k (test through an 8 kHz channel) is prepared beside test and scored with the same decoding and
    the lexicon settings chosen on wideband dev; --no-narrowband-test leaves both out."""
    s = an4_run.Settings(out=tmp_path, variants=("scratch",), seeds=(0,))
    steps = _by_name(an4_run.decode_steps(s))
    bandlimit = _overrides(steps["prepare_bandlimit"])
    assert steps["prepare_bandlimit"].positional == ("bandlimit",) and bandlimit["split"] == "test"
    assert bandlimit["src"] == str(tmp_path / "data" / "an4") and bandlimit["rate"] == "8000"
    assert _overrides(steps["ctc_greedy_scratch_s0"])["test_sets"] == "[dev,test,test_8k]"
    (tmp_path / "decode" / "scratch_s0").mkdir(parents=True)
    (tmp_path / "decode" / "scratch_s0" / "lexicon_tuning_dev.json").write_text(
        json.dumps({"best": {"order": 2, "lm_weight": 0.5, "word_score": 1.0, "wer": 0.1}})
    )
    lexicon = _overrides(steps["ctc_lexicon_scratch_s0"])
    assert lexicon["test_sets"] == "[test,test_8k]" and lexicon["lexicon.lm_weight"] == "0.5"
    assert "prepare_bandlimit" in steps["ctc_lexicon_scratch_s0"].deps
    _, off = an4_run.parse_args(["--no-narrowband-test", "--out", str(tmp_path)])
    steps = _by_name(an4_run.decode_steps(off))
    assert "prepare_bandlimit" not in steps and _overrides(steps["ctc_greedy_scratch_s0"])["test_sets"] == "[dev,test]"


def test_a_share_of_the_labels_fine_tunes_on_the_speakers_of_a_committed_list(an4_run, tmp_path):
    """--labels 10: a subset split of the listed speakers is prepared for training and decoding (the lexicon's
    LM reads the training text), every fine-tuning run and its preparation train on it; BEST-RQ does not."""
    _, s = an4_run.parse_args(["--labels", "10", "--out", str(tmp_path), "--variants", "scratch,cb1", "--seeds", "0"])
    for steps in (_by_name(an4_run.train_steps(s)), _by_name(an4_run.decode_steps(s))):
        subset = _overrides(steps["prepare_subset"])
        assert steps["prepare_subset"].positional == ("subset",) and subset["name"] == "train_10"
        assert subset["speakers"] == str(RECIPE / "lists" / "train_10.txt") and subset["split"] == "train"
    steps = _by_name(an4_run.train_steps(s))
    for name in ("prep_finetune", "scratch_s0", "cb1_p0_s0"):
        assert _overrides(steps[name])["data.train_split"] == "train_10"
    assert "prepare_subset" in steps["prep_finetune"].deps
    assert _overrides(steps["bestrq_cb1_p0"])["data.train_split"] == "pool"
    decode = _by_name(an4_run.decode_steps(s))
    assert "prepare_subset" in decode["tune_lexicon_scratch_s0"].deps
    assert "prepare_subset" in decode["ctc_greedy_scratch_s0"].deps
    _, full = an4_run.parse_args(["--out", str(tmp_path), "--variants", "scratch", "--seeds", "0"])
    steps = _by_name(an4_run.train_steps(full))
    assert "prepare_subset" not in steps and "data.train_split" not in _overrides(steps["scratch_s0"])
    with pytest.raises(SystemExit):
        an4_run.parse_args(["--labels", "20", "--out", str(tmp_path)])  # no list committed for 20%


def test_narrowband_copies_train_on_the_labels_and_their_8k_copy_pooled(an4_run, tmp_path):
    """--narrowband-copies: the labeled split is copied through the 8 kHz channel and pooled with itself (stored
    features, like the default), for training and for decoding (the lexicon's LM reads the training text); every
    fine-tuning run trains on the pooled split; off, nothing of it is prepared."""
    argv = ["--out", str(tmp_path), "--variants", "scratch", "--seeds", "0", "--narrowband-copies"]
    an4 = str(tmp_path / "data" / "an4")
    for labels, labeled in (("100", "train"), ("10", "train_10")):
        _, s = an4_run.parse_args([*argv, "--labels", labels])
        for steps in (_by_name(an4_run.train_steps(s)), _by_name(an4_run.decode_steps(s))):
            copy, pooled = steps["prepare_train_8k"], steps["prepare_train_nb"]
            assert copy.positional == ("bandlimit",) and pooled.positional == ("pool",)
            assert _overrides(copy) == {"src": an4, "split": labeled, "rate": "8000", "name": f"{labeled}_8k"}
            assert _overrides(pooled)["inputs"] == f"[{an4}:an4:{labeled},{an4}:an4:{labeled}_8k]"
            assert _overrides(pooled)["split"] == f"{labeled}_nb" and _overrides(pooled)["labeled"] == "true"
            assert "prepare_an4" in copy.deps and pooled.deps == ("prepare_train_8k",)
        steps = _by_name(an4_run.train_steps(s))
        for name in ("prep_finetune", "scratch_s0"):
            run = _overrides(steps[name])
            assert run["data.train_split"] == f"{labeled}_nb" and run["data.features.precomputed"] == "true"
        assert "prepare_train_nb" in steps["prep_finetune"].deps
        assert "prepare_train_nb" in _by_name(an4_run.decode_steps(s))["tune_lexicon_scratch_s0"].deps
    _, off = an4_run.parse_args(argv[:-1])
    assert "prepare_train_8k" not in _by_name(an4_run.train_steps(off))


def test_a_synthetic_pool_adds_the_synthesizers_audio_to_what_best_rq_learns_from(an4_run, tmp_path):
    """--pool an4,synth: the embedded synthesizer's corpus (--synth-size) is built and its train and unlabeled
    audio join AN4's in the BEST-RQ pool; the fine-tuning runs are unchanged; an unknown pool name is refused."""
    argv = ["--out", str(tmp_path), "--variants", "cb1", "--seeds", "0", "--pretrain-seeds", "0"]
    _, s = an4_run.parse_args([*argv, "--pool", "an4,synth", "--synth-size", "demo"])
    steps = _by_name(an4_run.train_steps(s))
    synth = tmp_path / "data" / "synth"
    assert steps["prepare_synth"].positional == ("synth",)
    assert _overrides(steps["prepare_synth"]) == {"out": str(synth), "size": "demo"}
    pool = _overrides(steps["prepare_pool"])
    assert pool["inputs"] == f"[{tmp_path / 'data' / 'an4'}:an4:unlabeled,{synth}:synth:train,{synth}:synth:unlabeled]"
    assert "prepare_synth" in steps["prepare_pool"].deps and "prepare_kathleen" not in steps
    assert "prepare_synth" not in _by_name(an4_run.decode_steps(s))  # decoding reads AN4 only
    with pytest.raises(SystemExit):
        an4_run.parse_args([*argv, "--pool", "an4,librispeech"])


# ---- the report ----------------------------------------------------------------------------------


def _write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))


def _eval(dev: float | None, test: float, test_8k: float | None = None) -> dict:
    sets = {"test": {"wer": test, "cer": test / 2}} | ({"test_8k": {"wer": test_8k, "cer": 0.0}} if test_8k else {})
    return {"sets": sets | ({"dev": {"wer": dev, "cer": dev / 2}} if dev is not None else {})}


def test_report_rows_per_seed_mean_and_sd_and_ensembles_apart(an4_run, tmp_path):
    s = an4_run.Settings(
        out=tmp_path, variants=("scratch", "cb1"), seeds=(0, 1, 2), pretrain_seeds=(0,), ensembles=("scratch",)
    )
    test_wers = {"scratch": [0.10, 0.12, 0.17], "cb1": [0.08, 0.09, 0.13]}
    for variant, name_of in (("scratch", "scratch_s{}"), ("cb1", "cb1_p0_s{}")):
        for seed, wer in enumerate(test_wers[variant]):
            folder = tmp_path / "decode" / name_of.format(seed)
            _write(folder / "ctc_greedy.json", _eval(wer + 0.05, wer + 0.04, test_8k=3 * wer))
            if not (variant == "cb1" and seed == 2):  # not decoded with the lexicon yet
                _write(
                    folder / "lexicon_tuning_dev.json",
                    {"best": {"order": 2, "lm_weight": 0.5, "word_score": 1.0, "wer": wer + 0.01}},
                )
                _write(folder / "ctc_lexicon.json", _eval(None, wer))
    _write(tmp_path / "decode" / "ensemble_scratch" / "ctc_greedy.json", _eval(0.11, 0.09))

    report = an4_run.build_report(s, "python recipes/an4/run.py report")
    rows = {(r["run"], r["decode"]): r for r in report["rows"]}
    row = rows[("cb1_p0_s1", "ctc_lexicon")]
    assert len(rows) == 11 and {k: v for k, v in row.items() if not k.endswith(("_wer", "_cer"))} == {
        "variant": "cb1", "seed": 1, "pretrain_seed": 0, "run": "cb1_p0_s1", "decode": "ctc_lexicon",
        "lexicon": {"order": 2, "lm_weight": 0.5, "word_score": 1.0}, "finetune_steps": None,
    }  # fmt: skip
    assert (row["dev_wer"], row["test_wer"], row["test_cer"]) == pytest.approx((0.10, 0.09, 0.045))
    assert (
        rows[("scratch_s2", "ctc_greedy")]["seed"] == 2 and rows[("scratch_s2", "ctc_greedy")]["pretrain_seed"] is None
    )
    summary = {(r["variant"], r["decode"]): r for r in report["summary"]}
    lexicon = summary[("scratch", "ctc_lexicon")]
    assert lexicon["runs"] == 3 and lexicon["test_wer_mean"] == pytest.approx(0.13)
    assert lexicon["test_wer_sd"] == pytest.approx(statistics.stdev([0.10, 0.12, 0.17]))  # sample sd: 0.0361
    assert lexicon["dev_wer_mean"] == pytest.approx(0.14)
    assert "test_8k_wer_mean" not in lexicon  # (not scored on test_8k here)
    greedy = summary[("scratch", "ctc_greedy")]
    assert rows[("scratch_s1", "ctc_greedy")]["test_8k_wer"] == pytest.approx(0.36)
    assert greedy["test_8k_wer_mean"] == pytest.approx(0.39) and greedy["test_8k_wer_sd"] == pytest.approx(
        statistics.stdev([0.30, 0.36, 0.51])
    )
    assert summary[("cb1", "ctc_lexicon")]["runs"] == 2  # what is there
    assert report["ensembles"] == [
        {
            "variant": "scratch",
            "members": ["scratch_s0", "scratch_s1", "scratch_s2"],
            "decode": "ctc_greedy",
            "dev_wer": 0.11,
            "test_wer": 0.09,
            "test_cer": 0.045,
        }
    ]  # fmt: skip  (read back as written: no arithmetic)
    assert report["test_configurations"] == 12  # 11 single-model rows + 1 ensemble, each scored on test once
    assert report["missing"] == ["cb1_p0_s2 ctc_lexicon", "ensemble_scratch ctc_lexicon"]
    assert sys.modules["report"].mean_sd([0.2]) == (0.2, None)


# ---- end to end ----------------------------------------------------------------------------------


def _fake_an4(root: Path) -> Path:
    """tests/data/test_an4_kathleen.py's miniature AN4 (12 training and 4 test utterances in the real layout),
    its audio made 1.5-2.5 s long so that a CTC model has the frames for its transcripts."""
    an4 = _load("an4_fixture", REPO / "tests" / "data" / "test_an4_kathleen.py")
    an4.make_an4(root)
    for i, path in enumerate(sorted(root.glob("wav/*/*/*.sph"))):
        an4.write_sphere(path, an4.samples(1.5 + 0.1 * (i % 10), seed=i))
    return root


@pytest.mark.slow
def test_recipe_end_to_end_on_a_tiny_an4_then_a_rerun_skips_everything(an4_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    corpus, report_path = _fake_an4(tmp_path / "an4_corpus"), tmp_path / "an4.json"
    argv = [
        "--out", "out", "--an4", str(corpus), "--dev-utterances", "4", "--pool", "an4", "--variants", "scratch,cb1",
        "--seeds", "0,1", "--pretrain-seeds", "0", "--ensembles", "scratch", "--model-overrides",
        "{d_model: 64, num_layers: 2, num_heads: 2, subsampling_channels: 32}", "--finetune-steps", "3",
        "--finetune-warmup", "1", "--pretrain-steps", "2", "--pretrain-warmup", "1", "--max-duration", "20",
        "--pretrain-max-duration", "20", "--workers", "0", "--device", "cpu", "--jobs", "2", "--lm-orders", "1",
        "--lm-weights", "0.5", "--word-scores", "0", "--save-encoder", "cb1", "--report", str(report_path),
    ]  # fmt: skip
    # The steps' python -m usmkit.cli.* import this tree.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    assert an4_run.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "ETA" in out and "configurations scored on test" in out

    report = json.loads(report_path.read_text())
    rows = {(r["run"], r["decode"]): r for r in report["rows"]}
    assert set(rows) == {
        (run, d)
        for run in ("scratch_s0", "scratch_s1", "cb1_p0_s0", "cb1_p0_s1")
        for d in ("ctc_greedy", "ctc_lexicon")
    }
    assert rows[("cb1_p0_s1", "ctc_greedy")]["seed"] == 1 and rows[("cb1_p0_s1", "ctc_greedy")]["pretrain_seed"] == 0
    assert all(0 <= r["dev_wer"] and 0 <= r["test_wer"] and r["finetune_steps"] == 3 for r in rows.values())
    assert all(0 <= r["test_8k_wer"] for r in rows.values())  # every model also scored on the narrowband test set
    for entry in report["summary"]:
        group = [
            r["test_wer"] for r in rows.values() if (r["variant"], r["decode"]) == (entry["variant"], entry["decode"])
        ]
        assert entry["runs"] == 2 and entry["test_wer_mean"] == pytest.approx(statistics.fmean(group))
        assert entry["test_wer_sd"] == pytest.approx(statistics.stdev(group))
    assert [(e["variant"], e["decode"]) for e in report["ensembles"]] == [
        ("scratch", "ctc_greedy"),
        ("scratch", "ctc_lexicon"),
    ]
    assert report["test_configurations"] == 10 and report["missing"] == []
    assert (tmp_path / "out" / "bestrq_encoder" / MODEL_FILE).is_file()

    def nothing_runs(step, argv):
        raise AssertionError(f"{step.name} ran again")

    assert an4_run.main(argv, execute=nothing_runs) == 0
    out = capsys.readouterr().out
    assert "0 to run" in out and "to run" in out and "ran again" not in out
    assert json.loads(report_path.read_text())["rows"] == report["rows"]
