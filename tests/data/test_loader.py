"""The whole loader: Batch contract, audio-only cuts, exact resume (with and without workers), eval mode."""

from __future__ import annotations

import logging
import signal
import time
from itertools import islice

import pytest
import torch
from lhotse import CutSet
from lhotse.utils import fastcopy

from usmkit.data.config import DataConfig, FeatureConfig
from usmkit.data.loader import StopSignalsIgnored, make_loader, prepare_cuts, shutdown_workers
from usmkit.data.normalize import compute_global_stats
from usmkit.data.sampling import language_balanced, make_sampler


@pytest.fixture
def stats(audio_corpus):
    return compute_global_stats(audio_corpus, FeatureConfig(precomputed=False))


def test_batch_contract(audio_corpus, stats, tiny_tokenizer, build_config):
    cfg = build_config()
    loader = make_loader(audio_corpus, cfg, tokenizer=tiny_tokenizer, stats=stats, train=True)
    seen = []
    for batch in loader:
        B, T, F = batch.features.shape
        assert F == 80 and batch.features.dtype == torch.float32
        assert batch.feature_lens.dtype == torch.int64 and int(batch.feature_lens.max()) == T
        for i, L in enumerate(batch.feature_lens.tolist()):
            assert torch.all(batch.features[i, L:] == 0), "padding is zero"
        assert batch.tokens.dtype == torch.int64 and batch.tokens.shape[0] == B
        for i, text in enumerate(batch.texts):
            ids = tiny_tokenizer.encode(text)
            U = int(batch.token_lens[i])
            assert U == len(ids) > 0 and batch.tokens[i, :U].tolist() == ids
            assert torch.all(batch.tokens[i, U:] == -1)
        by_id = {c.id: c for c in audio_corpus}
        assert batch.texts == [by_id[i].supervisions[0].text for i in batch.cut_ids]
        assert batch.languages == [by_id[i].supervisions[0].language for i in batch.cut_ids]
        assert sum(by_id[i].duration for i in batch.cut_ids) <= cfg.max_duration or B == 1
        seen += batch.cut_ids
    assert sorted(seen) == sorted(audio_corpus.ids)


def test_audio_only_cuts_give_empty_tokens(audio_corpus, stats, tiny_tokenizer, build_config):
    unlabeled = CutSet.from_cuts(c.drop_supervisions() for c in audio_corpus)
    cuts, report = prepare_cuts(unlabeled, build_config(), split="pool", require_text=False)
    assert report.num_skipped == 0
    for tok in (None, tiny_tokenizer):
        batch = next(iter(make_loader(cuts, build_config(), tokenizer=tok, stats=stats, train=True)))
        assert batch.tokens.shape == (batch.size, 0) and batch.token_lens.tolist() == [0] * batch.size
        assert batch.texts == [""] * batch.size and batch.languages == [""] * batch.size


def test_eval_loader_is_deterministic_and_covers_every_cut_once(audio_corpus, stats, tiny_tokenizer, build_config):
    cfg = build_config()
    runs = []
    for _ in range(2):
        batches = list(make_loader(audio_corpus, cfg, tokenizer=tiny_tokenizer, stats=stats, train=False))
        runs.append(batches)
    ids = [i for b in runs[0] for i in b.cut_ids]
    assert sorted(ids) == sorted(audio_corpus.ids) and len(ids) == len(set(ids))
    for a, b in zip(*runs, strict=True):
        assert a.cut_ids == b.cut_ids
        assert torch.equal(a.features, b.features), "no augmentation at eval time"


def test_given_speaker_means_are_used_instead_of_recomputed(audio_corpus, stats, tiny_tokenizer, build_config):
    from usmkit.data.normalize import SpeakerNorm, speaker_norms

    def features(cfg, **kw) -> dict[str, torch.Tensor]:
        loader = make_loader(audio_corpus, cfg, tokenizer=tiny_tokenizer, stats=stats, train=False, **kw)
        return {i: b.features[j, : b.feature_lens[j]] for b in loader for j, i in enumerate(b.cut_ids)}

    plain = features(build_config())
    norms = speaker_norms(audio_corpus, FeatureConfig(precomputed=False), stats)
    identity = {
        s: SpeakerNorm(shift=torch.zeros_like(n.shift), scale=torch.ones_like(n.scale)) for s, n in norms.items()
    }
    given = features(build_config(speaker_mean_norm=True), speaker_norms=identity)
    computed = features(build_config(speaker_mean_norm=True))
    speaker = {c.id: c.supervisions[0].speaker for c in audio_corpus}
    for cut_id, feats in plain.items():
        torch.testing.assert_close(given[cut_id], feats)  # the identity given: nothing changed
        torch.testing.assert_close(computed[cut_id], feats - norms[speaker[cut_id]].shift, atol=0.05, rtol=0)  # dither


def _ids(batches) -> list[list[str]]:
    return [b.cut_ids for b in batches]


def _small_batches(audio_corpus, tmp_path, num_workers):
    """A config of 2.5-s batches in 2 buckets over stored features, and the corpus prepared for it."""
    cfg = DataConfig(
        manifest_dir=str(tmp_path),
        max_duration=2.5,
        num_buckets=2,
        num_workers=num_workers,
        features=FeatureConfig(precomputed=True),
    )
    cuts, _ = prepare_cuts(audio_corpus, cfg, split="train", require_text=True)
    return cfg, cuts


@pytest.mark.parametrize("num_workers", [0, 1])
def test_resume_from_state_dict_yields_the_same_batches(audio_corpus, stats, tiny_tokenizer, tmp_path, num_workers):
    cfg, cuts = _small_batches(audio_corpus, tmp_path, num_workers)

    def build():
        return make_loader(cuts, cfg, tokenizer=tiny_tokenizer, stats=stats, train=True, seed=7)

    full = build()
    full.set_epoch(1)
    reference = _ids(full)
    assert len(reference) >= 4

    k = 2
    first = build()
    first.set_epoch(1)
    it = iter(first)
    head = _ids(islice(it, k))
    state = first.state_dict()
    del it  # the interrupted run ends here (its workers may have prefetched further)

    resumed = build()
    resumed.load_state_dict(state)
    assert head + _ids(resumed) == reference

    resumed.set_epoch(2)  # the next epoch starts from its beginning, reshuffled
    nxt = _ids(resumed)
    assert sorted(i for b in nxt for i in b) == sorted(i for b in reference for i in b) and nxt != reference


@pytest.mark.parametrize("num_workers", [0, 1])
def test_endless_loader_runs_through_the_epochs_and_resumes_anywhere(
    audio_corpus, stats, tiny_tokenizer, tmp_path, num_workers
):
    """An endless pass yields the batches of one-epoch passes over epochs 0, 1, 2 (features included), says
    each batch's epoch, and resumes from any state: mid-epoch, after an epoch's last batch, or in the same
    loader after a pass left early (whose workers had run ahead)."""
    cfg, cuts = _small_batches(audio_corpus, tmp_path, num_workers)

    def build(endless):
        return make_loader(cuts, cfg, tokenizer=tiny_tokenizer, stats=stats, train=True, seed=7, endless=endless)

    def take(loader, n, it=None):
        return [(loader.epoch, b.cut_ids, float(b.features.sum())) for b in islice(it or loader, n)]

    by_epoch = build(endless=False)
    reference = []
    for epoch in range(3):
        by_epoch.set_epoch(epoch)
        reference += take(by_epoch, None)
    first_epoch = sum(1 for epoch, *_ in reference if epoch == 0)
    assert 4 <= first_epoch < len(reference)

    assert take(build(endless=True), len(reference)) == reference
    for k in (2, first_epoch, first_epoch + 1):  # mid-epoch, after the last batch of epoch 0, one past it
        first = build(endless=True)
        it = iter(first)
        head = take(first, k, it)
        state = first.state_dict()
        del it  # the interrupted run ends here
        resumed = build(endless=True)
        resumed.load_state_dict(state)
        assert head + take(resumed, len(reference) - k) == reference, k

    again = build(endless=True)
    assert take(again, 3) + take(again, len(reference) - 3) == reference


def test_resume_language_balanced_infinite_stream(build_metadata_cuts, build_config):
    cuts = build_metadata_cuts({"en": 40, "de": 10})
    cfg = build_config(language_temperature=3.0, max_duration=10.0)

    def sampler():
        return make_sampler(language_balanced(cuts, cfg.language_temperature, seed=5), cfg, train=True, seed=5)

    reference = [[c.id for c in b] for b in islice(sampler(), 40)]
    assert sum(map(len, reference)) > len(cuts), "the stream runs past one pass over the corpus"
    s = sampler()
    _ = list(islice(s, 25))
    state = s.state_dict()
    resumed = sampler()
    resumed.load_state_dict(state)
    assert [[c.id for c in b] for b in islice(resumed, 15)] == reference[25:]


def test_train_loader_options(audio_corpus, stats, tiny_tokenizer, build_config, build_corpus, tmp_path):
    half = make_loader(
        audio_corpus, build_config(labeled_fraction=0.5), tokenizer=tiny_tokenizer, stats=stats, train=True
    )
    assert len([i for b in half for i in b.cut_ids]) == 6
    unlabeled = make_loader(audio_corpus, build_config(labeled_fraction=0.5), stats=stats, train=True)
    assert len([i for b in unlabeled for i in b.cut_ids]) == 12, "labeled_fraction only thins labeled loaders"
    short = make_loader(
        audio_corpus, build_config(max_cut_duration=1.0), tokenizer=tiny_tokenizer, stats=stats, train=True
    )
    kept = [i for b in short for i in b.cut_ids]
    assert kept and all(c.duration <= 1.0 for c in audio_corpus.subset(cut_ids=kept))
    everything = make_loader(
        audio_corpus, build_config(max_cut_duration=1.0), tokenizer=tiny_tokenizer, stats=stats, train=False
    )
    assert len([i for b in everything for i in b.cut_ids]) == 12, "evaluation never drops cuts"


def test_config_and_loader_reject_inconsistent_setups(audio_corpus, stats, build_config):
    with pytest.raises(ValueError, match="speed_perturb"):
        DataConfig(speed_perturb=(0.9, 1.0, 1.1), features=FeatureConfig(precomputed=True))
    with pytest.raises(ValueError, match="on_bad_input"):
        DataConfig(on_bad_input="ignore")
    with pytest.raises(ValueError, match="no stored features"):
        make_loader(audio_corpus, build_config(features=FeatureConfig(precomputed=True)), stats=stats, train=True)
    perturbed = build_config(speed_perturb=(0.9, 1.0, 1.1), num_workers=1)
    loader = make_loader(audio_corpus, perturbed, stats=stats, train=True)
    assert sum(b.size for b in loader) == len(audio_corpus)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_gives_the_same_augmented_features(audio_corpus, stats, tiny_tokenizer, num_workers):
    """Augmentation on (speed, gain, noise, SpecAugment): a resumed loader yields the very same features
    as an uninterrupted one, whichever worker builds each batch."""
    cfg = DataConfig(
        max_duration=2.5,
        num_buckets=2,
        num_workers=num_workers,
        speed_perturb=(0.9, 1.0, 1.1),
        gain_db=6.0,
        noise_snr_db=(10.0, 30.0),
        features=FeatureConfig(precomputed=False),
    )

    def build():
        return make_loader(audio_corpus, cfg, tokenizer=tiny_tokenizer, stats=stats, train=True, seed=3)

    reference = list(build())
    assert len(reference) >= 4
    k = 3
    first = build()
    it = iter(first)
    head = list(islice(it, k))
    state = first.state_dict()
    del it
    torch.manual_seed(1234)  # the caller's RNG does not matter
    resumed = build()
    resumed.load_state_dict(state)
    got = head + list(resumed)
    assert [b.cut_ids for b in got] == [b.cut_ids for b in reference]
    for a, b in zip(got, reference, strict=True):
        assert torch.equal(a.features, b.features)


def test_batches_pin_through_the_data_loaders_pin_function(
    audio_corpus, stats, tiny_tokenizer, build_config, monkeypatch
):
    """``make_loader(pin_memory=True)`` asks its DataLoader to pin, and the DataLoader's pin function reaches
    every tensor of a ``Batch`` through ``Batch.pin_memory`` (faked here: this machine may have no GPU)."""
    from torch.utils.data._utils.pin_memory import pin_memory

    from usmkit.data.batch import Batch

    cfg = build_config()
    assert make_loader(
        audio_corpus, cfg, tokenizer=tiny_tokenizer, stats=stats, train=True, pin_memory=True
    )._loader.pin_memory
    batch = next(iter(make_loader(audio_corpus, cfg, tokenizer=tiny_tokenizer, stats=stats, train=False)))
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: pinned.append(self) or self.clone())
    out = pin_memory(batch)
    assert type(out) is Batch and len(pinned) == 4
    assert all(
        torch.equal(getattr(out, f), getattr(batch, f)) for f in ("features", "feature_lens", "tokens", "token_lens")
    )
    assert (out.texts, out.cut_ids, out.languages) == (batch.texts, batch.cut_ids, batch.languages)


@pytest.mark.gpu
def test_a_pinned_batch_is_page_locked(audio_corpus, stats, tiny_tokenizer, build_config):
    batch = next(iter(make_loader(audio_corpus, build_config(), tokenizer=tiny_tokenizer, stats=stats, train=False)))
    out = batch.pin_memory()
    assert out.features.is_pinned() and out.tokens.is_pinned() and torch.equal(out.features, batch.features)


@pytest.mark.parametrize("precomputed", [False, True])
def test_fixed_batch_shapes_reach_the_batches(audio_corpus, stats, tiny_tokenizer, tmp_path, precomputed):
    """With data.fixed_batch_shapes the loader's feature tensors take one (B, T) per padded length: the
    sampler's frame counts match the features' (stored or computed on the fly)."""
    cfg = DataConfig(
        manifest_dir=str(tmp_path),
        max_duration=2.56,
        pad_to_frames=64,
        fixed_batch_shapes=True,
        num_workers=0,
        features=FeatureConfig(precomputed=precomputed),
    )
    cuts, _ = prepare_cuts(audio_corpus, cfg, split="train", require_text=True)
    shapes = set()
    for epoch in range(3):
        loader = make_loader(cuts, cfg, tokenizer=tiny_tokenizer, stats=stats, train=True, seed=epoch)
        for batch in loader:
            B, T, _ = batch.features.shape
            assert T % 64 == 0 and B == 256 // T, f"batch {B} x {T}"
            assert int(batch.feature_lens.max()) > T - 64, "padded to the batch's own length"
            shapes.add((B, T))
    assert len(shapes) >= 2


class _Handlers(torch.utils.data.Dataset):
    """Item i: the worker's SIGINT and SIGTERM handlers and what its own ``worker_init_fn`` recorded."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> tuple:
        return signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), _Handlers.ran


_Handlers.ran = None


def _record_worker(worker_id: int) -> None:
    _Handlers.ran = f"worker {worker_id}"


def test_loader_workers_ignore_stop_signals_and_run_the_callers_init():
    """A signal to the whole process group (a scheduler's SIGTERM, a terminal's Ctrl-C) must not end the loader's
    workers: the main process finishes its step with their batches and saves it."""
    loader = torch.utils.data.DataLoader(
        _Handlers(), batch_size=None, num_workers=1, worker_init_fn=StopSignalsIgnored(_record_worker)
    )
    for sigint, sigterm, ran in loader:
        assert sigint == signal.SIG_IGN and sigterm == signal.SIG_IGN and ran == "worker 0"


class _Stuck(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if i > 0:
            time.sleep(120)  # a worker that never answers the request to stop
        return i


def test_shutdown_ends_a_worker_that_ignores_the_request_and_sigterm():
    """torch ends a worker that does not stop when asked with SIGTERM, which ours ignore: ``shutdown_workers``
    kills it, and the main process is not failed by that worker's exit."""
    loader = torch.utils.data.DataLoader(_Stuck(), batch_size=None, num_workers=1, worker_init_fn=StopSignalsIgnored())
    live = iter(loader)
    assert next(live) == 0
    workers = list(live._workers)
    shutdown_workers(live)
    assert not any(w.is_alive() for w in workers)
    time.sleep(0.2)  # a SIGCHLD handler that failed the process would have raised by now


def test_over_long_transcripts_are_left_out_of_training_and_counted(
    audio_corpus, stats, tiny_tokenizer, build_config, caplog
):
    """A transcript of 2,000 words on a cut of about a second (more tokens than the cut has feature frames:
    no model can emit them) trained at 3.2 GB and 16 s a step without a word: training leaves it out and
    says so; ``max_text_tokens`` sets a limit of its own. Evaluation keeps every cut."""
    long = audio_corpus[0]
    sup = long.supervisions[0]
    long = fastcopy(long, supervisions=[fastcopy(sup, text=" ".join(["the cat"] * 1000))])
    cuts = CutSet.from_cuts([long, *list(audio_corpus)[1:]])
    with caplog.at_level(logging.WARNING, logger="usmkit.data.loader"):
        seen = [i for b in make_loader(cuts, build_config(), tokenizer=tiny_tokenizer, stats=stats, train=True)
                for i in b.cut_ids]  # fmt: skip
    assert sorted(seen) == sorted(list(cuts.ids)[1:])
    assert "training leaves out 1 cuts whose transcripts have more tokens than max_text_tokens=1000 or the cut's" in (
        caplog.text
    )
    counts = sorted(len(tiny_tokenizer.encode(c.supervisions[0].text)) for c in cuts)
    cfg = build_config(max_text_tokens=counts[5])
    seen = [i for b in make_loader(cuts, cfg, tokenizer=tiny_tokenizer, stats=stats, train=True) for i in b.cut_ids]
    assert len(seen) == sum(n <= counts[5] for n in counts)
    evaluated = [
        i for b in make_loader(cuts, cfg, tokenizer=tiny_tokenizer, stats=stats, train=False) for i in b.cut_ids
    ]
    assert sorted(evaluated) == sorted(cuts.ids)
