"""Pseudo-labeling (usmkit.inference.pseudo_label, python -m usmkit.cli.pseudo_label) with the tiny ``teacher``
(conftest.py) on the embedded corpus: the manifest the trainer's loader reads, the threshold, calibration."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from usmkit.cli.pseudo_label import main as cli_main
from usmkit.config import DataConfig, ModelSection, OptimConfig, TaskConfig, TrainConfig, TrainerConfig, to_dict
from usmkit.data.corpora.pool import PoolArgs
from usmkit.data.corpora.pool import run as pool_run
from usmkit.data.loader import split_loader
from usmkit.data.manifests import load_cuts, manifest_path
from usmkit.data.tokenizer import Tokenizer
from usmkit.errors import UsageError
from usmkit.inference.pseudo_label import PseudoLabelConfig, calibrate, pseudo_label, select
from usmkit.inference.transcript_journal import read_records
from usmkit.metrics import normalize_text
from usmkit.streaming.pipeline import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(teacher, inputs, out, **kw) -> PseudoLabelConfig:
    return PseudoLabelConfig(
        checkpoint=str(teacher), inputs=str(inputs), out=str(out), device="cpu", num_workers=0, progress=False, **kw
    )


@pytest.fixture(scope="module")
def labeled(teacher, synth_corpus, tmp_path_factory):
    """The teacher's pseudo-labels of the test split's audio, kept at the median confidence."""
    out = tmp_path_factory.mktemp("pseudo") / "corpus"
    inputs = manifest_path(synth_corpus, "synth", "cuts", "test")
    probe = _cfg(teacher, inputs, out, threshold=0.0)
    from usmkit.inference.batch_transcribe import transcribe_batch

    transcribe_batch(probe.batch_config())  # the transcripts, to pick a threshold between their confidences
    records = list(read_records(probe.transcripts()))
    threshold = sorted(r["confidence"] for r in records)[len(records) // 2]
    cfg = replace(probe, threshold=threshold)
    return cfg, pseudo_label(cfg), records


def test_threshold_filtering_keeps_what_it_should(labeled):
    cfg, result, records = labeled
    expected = {r["id"] for r in records if r["confidence"] >= cfg.threshold and r["words"]}
    assert 0 < len(expected) < len(records)  # the threshold splits them
    assert {r["id"] for r in select(records, cfg.threshold)} == expected
    cuts = load_cuts(cfg.out, cfg.split, corpus=cfg.corpus)
    assert sorted(c.id for c in cuts) == sorted(f"pseudo-{i}" for i in expected)
    assert (result.kept, result.total) == (len(expected), len(records))
    by_id = {f"pseudo-{r['id']}": r for r in records}
    for cut in cuts:
        (sup,) = cut.supervisions
        assert sup.text == normalize_text(by_id[cut.id]["text"]) and sup.custom["confidence"] >= cfg.threshold
        assert sup.language and sup.speaker  # kept from the input manifest
    with pytest.raises(UsageError, match="keeps none of the 12 utterances"):
        pseudo_label(replace(cfg, threshold=1.0))


def test_the_manifest_round_trips_through_the_training_loader(labeled, teacher):
    cfg, result, records = labeled
    assert result.cuts == manifest_path(cfg.out, cfg.corpus, "cuts", cfg.split)
    for kind in ("recordings", "supervisions"):
        assert manifest_path(cfg.out, cfg.corpus, kind, cfg.split).is_file()
    tokenizer = Tokenizer.load(Path(cfg.out) / "tokenizer" / "tokenizer.model")  # the teacher's, copied
    teacher_model = load_model(teacher)
    assert tokenizer.model_proto == teacher_model.tokenizer.model_proto
    data = DataConfig(manifest_dir=cfg.out, corpus=cfg.corpus, num_workers=0)
    loader, report = split_loader(data, cfg.split, tokenizer=tokenizer, stats=teacher_model.stats)
    assert report.num_skipped == 0
    seen = {}
    for batch in loader:
        for cut_id, text, n in zip(batch.cut_ids, batch.texts, batch.token_lens.tolist(), strict=True):
            seen[cut_id] = text
            assert n == len(tokenizer.encode(text)) > 0
    kept = {f"pseudo-{r['id']}": normalize_text(r["text"]) for r in select(records, cfg.threshold)}
    assert seen == kept


def test_a_student_trains_on_it_mixed_with_a_labeled_corpus(labeled, synth_corpus, tmp_path):
    """``prepare pool labeled=true`` mixes the pseudo-labels with the corpus's own train split; two steps of
    training read the mix (the tokenizer and feature statistics of the pseudo corpus's folder)."""
    from usmkit.training.recipe import run

    cfg, result, _ = labeled
    mix = tmp_path / "mix"
    pool_run(PoolArgs(out=str(mix), corpus="mix", split="train", labeled=True,
                      inputs=[f"{synth_corpus}:synth:train", f"{cfg.out}:pseudo:train"]))  # fmt: skip
    cuts = load_cuts(mix, "train", corpus="mix")
    assert len(cuts) == 40 + result.kept
    train = TrainConfig(
        task=TaskConfig(kind="ctc"),
        model=ModelSection(preset="tiny", overrides={"d_model": 32, "num_layers": 1, "num_heads": 2}),
        data=DataConfig(manifest_dir=str(mix), corpus="mix", max_duration=30.0, num_workers=0),
        optim=OptimConfig(warmup_steps=1, schedule="constant"),
        trainer=TrainerConfig(exp_dir=str(tmp_path / "student"), max_steps=2, eval_every=0, save_every=2,
                              progress=False, device="cpu", log_every=1),
        tokenizer=str(Path(cfg.out) / "tokenizer" / "tokenizer.model"),
    )  # fmt: skip
    run(train, yaml.safe_dump(to_dict(train)))
    rows = [json.loads(x) for x in (tmp_path / "student" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 2


def _word_errors(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance between two word sequences."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def test_calibration_numbers_equal_scoring_the_kept_subset_by_hand(teacher, synth_corpus, tmp_path):
    inputs = manifest_path(synth_corpus, "synth", "cuts", "test")
    thresholds = (0.0, 0.1, 0.15, 0.2, 0.3, 0.99)
    points, json_path, png_path = calibrate(_cfg(teacher, inputs, tmp_path, calibrate=True, thresholds=thresholds))
    records = list(read_records(tmp_path / "pseudo_calibration_train.jsonl"))
    refs = {c.id: normalize_text(c.supervisions[0].text) for c in load_cuts(synth_corpus, "test")}
    assert [p.threshold for p in points] == list(thresholds)
    assert len({p.kept for p in points}) > 2  # the grid spans the confidences
    total_s = sum(r["duration"] for r in records)
    for p in points:
        kept = [r for r in records if r["confidence"] >= p.threshold]
        assert (p.kept, p.kept_fraction) == (len(kept), pytest.approx(len(kept) / len(records)))
        assert p.kept_hours_fraction == pytest.approx(sum(r["duration"] for r in kept) / total_s)
        if not kept:
            assert p.wer is None
            continue
        errors = sum(_word_errors(refs[r["id"]].split(), normalize_text(r["text"]).split()) for r in kept)
        words = sum(len(refs[r["id"]].split()) for r in kept)
        assert p.wer == pytest.approx(errors / words)
    written = json.loads(json_path.read_text())
    assert written["utterances"] == 12 and [q["wer"] for q in written["points"]] == [p.wer for p in points]
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_calibrates_and_refuses_a_folder_of_other_work(teacher, synth_corpus, tmp_path, capsys):
    inputs = manifest_path(synth_corpus, "synth", "cuts", "test")
    base = [f"checkpoint={teacher}", f"inputs={inputs}", "device=cpu", "num_workers=0", "progress=false"]
    assert cli_main([*base, f"out={tmp_path / 'cal'}", "calibrate=true", "thresholds=[0.0,0.2]"]) == 0
    err = capsys.readouterr().err
    assert "pseudo-labels against the confidence threshold" in err and "pseudo_calibration_train.png" in err
    with pytest.raises(SystemExit) as exit_info:
        cli_main([*base, f"out={synth_corpus}"])  # another corpus's folder
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "the corpus folder of synth" in err[0]
    with pytest.raises(SystemExit) as exit_info:
        cli_main([*base, f"out={tmp_path / 'x'}", "threshold=1.5"])
    assert exit_info.value.code == 2 and "threshold=1.5 must lie in [0, 1]" in capsys.readouterr().err


def test_a_labelled_corpus_named_as_corpus_is_refused_and_kept(teacher, synth_corpus, tmp_path, capsys):
    """``out=C corpus=<C's own name>`` replaced a labelled corpus's train cuts with
    pseudo-labels (the folder was taken for an earlier pseudo-labelling because the names matched)."""
    import shutil

    corpus = tmp_path / "C"
    corpus.mkdir()
    for p in synth_corpus.glob("synth_*_train.jsonl.gz"):
        shutil.copy(p, corpus / p.name)
    before = {p.name: p.read_bytes() for p in corpus.iterdir()}
    argv = [f"checkpoint={teacher}", f"inputs={synth_corpus / 'audio' / 'test'}", f"out={corpus}", "corpus=synth",
            "threshold=0.0", "device=cpu", "num_workers=0", "progress=false"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert f"out={corpus} is the corpus folder of synth" in err[0] and "not the pseudo-labels of corpus synth" in err[0]
    assert {p.name: p.read_bytes() for p in corpus.iterdir()} == before
    with pytest.raises(UsageError, match="not the pseudo-labels"):
        pseudo_label(_cfg(teacher, synth_corpus / "audio" / "test", corpus, corpus="synth"))  # the library too
