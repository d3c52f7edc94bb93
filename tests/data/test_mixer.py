"""MOST's data: the text-only reader and loader, and the three-stream mixer (its ratios, exact resume)."""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import replace
from itertools import islice

import pytest
import torch

from usmkit.checkpointing.checkpoint import decode_state, encode_state
from usmkit.config import TrainConfig, from_dict
from usmkit.data.loader import prepare_cuts
from usmkit.data.manifests import load_cuts
from usmkit.data.normalize import compute_global_stats
from usmkit.data.text_only import TextOnlyLoader, read_text_only, text_items
from usmkit.data.tokenizer import Tokenizer
from usmkit.data.validate import BadInputError
from usmkit.errors import UsageError
from usmkit.ssl.most_data import build_most_loader, seconds_per_token

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_DURATION = 12.0


def _cfg(corpus, **most) -> TrainConfig:
    return from_dict(
        TrainConfig,
        {
            "task": {"kind": "most", "most": most},
            "data": {
                "manifest_dir": str(corpus),
                "max_duration": MAX_DURATION,
                "num_workers": 0,
                "num_buckets": 2,
                "features": {"precomputed": False},  # the shared corpus stays read-only
            },
        },
    )


@pytest.fixture(scope="module")
def parts(synth_corpus):
    """Prepared paired cuts, tokenizer and stats of the tiny corpus (shared by every mixer built here)."""
    cfg = _cfg(synth_corpus)
    tokenizer = Tokenizer.load(synth_corpus / "tokenizer")
    paired, _ = prepare_cuts(load_cuts(synth_corpus, "train"), cfg.data, split="train", require_text=True)
    stats = compute_global_stats(paired, cfg.data.features, max_cuts=8)
    return tokenizer, paired, stats


def _mixer(corpus, parts, **most):
    tokenizer, paired, stats = parts
    cfg = _cfg(corpus, **most)

    def audio_only(split):
        return prepare_cuts(load_cuts(corpus, split), cfg.data, split=split, require_text=False)[0]

    return build_most_loader(
        cfg.task.most,
        cfg.data,
        paired,
        audio_only,
        tokenizer,
        stats,
        seed=cfg.trainer.seed,
        batches_per_step=cfg.optim.accum_steps,
    )


def _signature(batch) -> tuple:
    """What identifies a step: the cut ids and features of the audio batches, the text tokens, the step."""
    return (
        batch.step,
        tuple(batch.unlabeled.cut_ids),
        tuple(batch.paired.cut_ids),
        batch.text.tokens.tolist(),
        round(float(batch.unlabeled.features.sum()), 3),
        round(float(batch.paired.features.sum()), 3),
    )


def test_every_step_holds_one_batch_of_each_stream_sized_by_its_ratio(synth_corpus, parts):
    ratios = {"unlabeled_ratio": 0.75, "paired_ratio": 1.5, "text_ratio": 2.0, "text_seconds_per_token": 0.1}
    mixer = _mixer(synth_corpus, parts, **ratios)
    batches = list(islice(iter(mixer), 12))
    for b in batches:
        assert b.unlabeled is not None and b.paired is not None and b.text is not None
        assert b.num_frames == int(b.unlabeled.feature_lens.sum() + b.paired.feature_lens.sum())
        # lhotse fills a batch up to the budget (or the batch is one cut longer than the budget)
        for part, seconds, budget in (
            (b.unlabeled, b.unlabeled.feature_lens.sum() / 100, 0.75 * MAX_DURATION),
            (b.paired, b.paired.feature_lens.sum() / 100, 1.5 * MAX_DURATION),
            (b.text, b.text.token_lens.sum() * 0.1, 2.0 * MAX_DURATION),
        ):
            assert seconds <= budget + 0.05 or part.size == 1
    mean_seconds = {
        name: sum(float(getattr(b, name).feature_lens.sum()) / 100 for b in batches) / len(batches)
        for name in ("unlabeled", "paired")
    }
    assert mean_seconds["paired"] > 1.4 * mean_seconds["unlabeled"]  # twice the budget: about twice the audio
    assert [b.step for b in batches] == list(range(12))


def test_a_stream_no_loss_reads_is_not_loaded_and_steps_count_accumulated_batches(synth_corpus, parts):
    mixer = _mixer(synth_corpus, parts, bestrq_weight=0.0, text_weight=0.0)
    assert list(mixer.streams) == ["paired"]
    mixer.batches_per_step = 2
    batches = list(islice(iter(mixer), 4))
    assert all(b.unlabeled is None and b.text is None for b in batches)
    assert [b.step for b in batches] == [0, 0, 1, 1]


def test_mixer_resumes_exactly_across_stream_epochs(synth_corpus, parts):
    """The steps after a state_dict round trip into a new mixer equal an uninterrupted run's, past the end of
    an epoch of the unlabeled stream (16 cuts: a few batches per epoch)."""
    uninterrupted = [_signature(b) for b in islice(iter(_mixer(synth_corpus, parts)), 14)]
    first = _mixer(synth_corpus, parts)
    head = [_signature(b) for b in islice(iter(first), 5)]
    tree, tensors = encode_state(first.state_dict())  # through what a checkpoint stores
    state = decode_state(json.loads(json.dumps(tree)), tensors)
    resumed = _mixer(synth_corpus, parts)
    resumed.load_state_dict(state)
    tail = [_signature(b) for b in islice(iter(resumed), 9)]
    assert head + tail == uninterrupted
    assert state["epochs"]["unlabeled"] == 0 and resumed.epochs["unlabeled"] >= 1  # the resumed part began an epoch
    with pytest.raises(ValueError, match="streams"):
        _mixer(synth_corpus, parts, text_weight=0.0).load_state_dict(state)


def test_text_only_loader_buckets_by_length_and_resumes(tmp_path, parts):
    tokenizer = parts[0]
    records = [{"text": " ".join(["one two three"] * (1 + i % 7)), "language": "en"} for i in range(60)]
    items = text_items(records + [{"text": "  ", "language": "en"}], tokenizer, seconds_per_token=0.1)
    assert len(items) == 60  # the empty sentence is left out
    cfg = replace(_cfg(tmp_path).data, max_duration=6.0, num_buckets=3)
    loader = TextOnlyLoader(items, cfg, seed=1)
    batches = list(loader)
    assert sum(b.size for b in batches) == 60
    for b in batches:
        assert int(b.token_lens.sum()) * 0.1 <= 6.0 + 1e-6 or b.size == 1
        assert all(int(n) == int((row >= 0).sum()) for row, n in zip(b.tokens, b.token_lens, strict=True))
    again = TextOnlyLoader(items, cfg, seed=1)
    it = iter(again)
    head = [next(it).tokens.tolist() for _ in range(3)]
    state = again.state_dict()
    rest = TextOnlyLoader(items, cfg, seed=1)
    rest.load_state_dict(state)
    assert head + [b.tokens.tolist() for b in rest] == [b.tokens.tolist() for b in batches]


def test_text_only_file_errors_name_the_file(tmp_path):
    with pytest.raises(UsageError, match="task.most.text_only"):
        read_text_only(tmp_path / "missing.jsonl.gz")
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write('{"text": "fine", "language": "en"}\n{"language": "en"}\n')
    with pytest.raises(BadInputError, match=r"bad.jsonl.gz, line 2"):
        read_text_only(bad)
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "a b", "language": "en"}\n')
    assert read_text_only(good) == [{"text": "a b", "language": "en"}]


def test_seconds_per_token_is_measured_on_the_paired_transcripts(parts):
    tokenizer, paired, _ = parts
    rate = seconds_per_token(paired, tokenizer)
    total = sum(c.duration for c in paired) / sum(len(tokenizer.encode(c.supervisions[0].text)) for c in paired)
    assert rate == pytest.approx(total)
    assert torch.isfinite(torch.tensor(rate)) and 0.02 < rate < 1.0


def test_over_long_text_only_sentences_are_left_out_and_counted(tmp_path, synth_corpus, parts, caplog):
    """A 20,000-word text-only sentence (one of 500,000 words took 1.5 GB and numpy warnings) is left out of
    the text stream with a warning saying how many and the limit, like over-long audio."""
    tokenizer = parts[0]
    records = [{"text": "one two three", "language": "en"}] * 20 + [{"text": "seven " * 20_000, "language": "en"}]
    with caplog.at_level(logging.WARNING, logger="usmkit.data.text_only"):
        items = text_items(records, tokenizer, seconds_per_token=0.1, max_tokens=1000)
    assert len(items) == 20 and max(len(item.tokens) for item in items) <= 1000
    assert "leaves out 1 sentences longer than data.max_text_tokens=1000 tokens" in caplog.text
    assert len(text_items(records, tokenizer, seconds_per_token=0.1, max_tokens=0)) == 21  # 0: no limit
    path = tmp_path / "text.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="usmkit.data.text_only"):
        _mixer(synth_corpus, parts, text_only=str(path), text_seconds_per_token=0.1)
    assert "leaves out 1 sentences longer than data.max_text_tokens=1000 tokens" in caplog.text  # the default
