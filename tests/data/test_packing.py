"""Packed batches (usmkit.data.packing): the row packer, the sampler that fills fixed rows, the loader's
packed batches (fixed shape, each utterance's features intact), exact resume, and the settings refused."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from itertools import islice

import pytest
import torch

from usmkit.data.config import DataConfig, FeatureConfig, SpecAugmentConfig
from usmkit.data.loader import make_loader, prepare_cuts
from usmkit.data.normalize import compute_global_stats
from usmkit.data.packing import RowPacker, cut_frames
from usmkit.data.sampling import make_sampler

SHIFT = 0.01


def test_row_packer_places_first_fit_in_aligned_slots():
    packer = RowPacker(rows=3, frames=16, align=4)
    assert [packer.slot(n) for n in (1, 4, 5, 16)] == [4, 4, 8, 16]
    assert packer.assign([9, 5, 3, 13, 2]) == [[0, 2], [1, 4], [3]]  # slots 12, 8, 4, 16, 4: first row with room
    with pytest.raises(ValueError, match="does not fit a packed row of 16"):
        packer.assign([17])
    feats = torch.arange(6 * 17 * 2, dtype=torch.float32).view(6, 17, 2)
    with pytest.raises(ValueError, match="more than the 3"):
        packer.pack(feats, torch.tensor([16] * 4 + [1, 1]), [16] * 4 + [1, 1])


def test_row_packer_keeps_the_frames_the_sampler_counted():
    """An utterance whose features came out a frame longer than counted keeps the counted frames, so the
    rows the sampler planned still hold the batch."""
    packer = RowPacker(rows=1, frames=8, align=4)
    feats = torch.ones(2, 5, 3)
    order, packed, lens, packing = packer.pack(feats, torch.tensor([5, 4]), [4, 4])
    assert order == [0, 1] and lens.tolist() == [4, 4] and packing.offsets.tolist() == [0, 4]
    assert packed.shape == (1, 8, 3) and (packing.segment_ids == torch.tensor([[0] * 4 + [1] * 4])).all()


def _packed_config(build_config, **overrides):
    args = dict(max_duration=40.96, pack_to_frames=1024, max_cut_duration=10.24, num_buckets=4)
    return build_config(**{**args, **overrides})


def test_packed_sampler_fills_its_rows_and_sees_every_cut_once(build_metadata_cuts, build_config):
    """Every batch fits its rows, an epoch holds every cut once, and the rows are mostly speech (bucketed
    batches padded to multiples of 256 frames, as compiled training pads them, are about 62% speech here)."""
    cuts = build_metadata_cuts({"en": 300})  # 0.5-4.0 s: 50-400 frames
    cfg = _packed_config(build_config)
    packer = RowPacker(4, 1024, 4)  # 40.96 s of rows of 10.24 s
    epochs = []
    for epoch in (0, 1):
        sampler = make_sampler(cuts, cfg, train=True, seed=1, packer=packer)
        sampler.set_epoch(epoch)
        batches = [list(b) for b in sampler]
        valid = 0
        for batch in batches:
            sizes = [cut_frames(c, SHIFT) for c in batch]
            assert len(packer.assign(sizes)) <= packer.rows, "a batch needs more rows than it has"
            valid += sum(sizes)
        ids = [c.id for b in batches for c in b]
        assert Counter(ids) == Counter(cuts.ids), "every cut once per epoch"
        fill = valid / (len(batches) * packer.rows * packer.frames)
        assert fill > 0.9, f"packed rows are only {fill:.0%} speech"
        epochs.append(ids)
    assert epochs[0] != epochs[1], "reshuffled per epoch"
    with pytest.raises(ValueError, match="every cut"):
        make_sampler(cuts, cfg, train=False, packer=packer)


def test_packed_sampler_resumes_exactly(build_metadata_cuts, build_config):
    cuts = build_metadata_cuts({"en": 80})
    cfg = _packed_config(build_config, max_duration=20.48)
    packer = RowPacker(2, 1024, 4)
    reference = [[c.id for c in b] for b in make_sampler(cuts, cfg, train=True, seed=3, packer=packer)]
    first = make_sampler(cuts, cfg, train=True, seed=3, packer=packer)
    head = [[c.id for c in b] for b in islice(first, 3)]
    resumed = make_sampler(cuts, cfg, train=True, seed=3, packer=packer)
    resumed.load_state_dict(first.state_dict())
    assert head + [[c.id for c in b] for b in resumed] == reference


@pytest.fixture
def packed_corpus(audio_corpus, tmp_path):
    """The 12-cut corpus (0.4-1.6 s) with stored features, a packed config of 2 rows of 192 frames, its stats."""
    cfg = DataConfig(
        manifest_dir=str(tmp_path), max_duration=3.84, num_buckets=2, num_workers=0, pack_to_frames=192,
        max_cut_duration=1.92, features=FeatureConfig(precomputed=True), spec_augment=SpecAugmentConfig(enabled=False),
    )  # fmt: skip
    cuts, _ = prepare_cuts(audio_corpus, cfg, split="train", require_text=True)
    return cfg, cuts, compute_global_stats(cuts, cfg.features)


def test_packed_batches_have_one_shape_and_each_utterance_intact(packed_corpus, tiny_tokenizer):
    cfg, cuts, stats = packed_corpus
    loader = make_loader(cuts, cfg, tokenizer=tiny_tokenizer, stats=stats, train=True, pack_align=4)
    plain = make_loader(cuts, cfg, tokenizer=tiny_tokenizer, stats=stats, train=False)  # one utterance per row
    alone = {i: (b.features[j, : b.feature_lens[j]], b.tokens[j]) for b in plain for j, i in enumerate(b.cut_ids)}
    seen = []
    for batch in loader:
        p = batch.packing
        assert batch.features.shape == (2, 192, 80) and p.segment_ids.shape == (2, 192)
        assert batch.size == len(batch.cut_ids) == len(p.rows) == batch.tokens.shape[0]
        assert (p.offsets % 4 == 0).all()
        for u, cut_id in enumerate(batch.cut_ids):
            n, r, o = int(batch.feature_lens[u]), int(p.rows[u]), int(p.offsets[u])
            feats, tokens = alone[cut_id]
            assert n == len(feats)
            torch.testing.assert_close(batch.features[r, o : o + n], feats)
            assert (p.segment_ids[r, o : o + n] == u).all()
            assert torch.equal(batch.tokens[u, : int(batch.token_lens[u])], tokens[: int(batch.token_lens[u])])
        assert (batch.features[p.segment_ids < 0] == 0).all(), "padding is zero"
        seen += batch.cut_ids
    assert sorted(seen) == sorted(cuts.ids)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_packed_loader_resumes_exactly(packed_corpus, tiny_tokenizer, num_workers):
    cfg, cuts, stats = packed_corpus
    cfg = replace(cfg, num_workers=num_workers, spec_augment=SpecAugmentConfig())  # augmentation seeded per batch

    def build():
        return make_loader(cuts, cfg, tokenizer=tiny_tokenizer, stats=stats, train=True, seed=7, pack_align=4)

    def take(batches):
        return [(b.cut_ids, b.packing.offsets.tolist(), float(b.features.sum())) for b in batches]

    full = build()
    full.set_epoch(1)
    reference = take(full)
    assert len(reference) >= 4
    first = build()
    first.set_epoch(1)
    it = iter(first)
    head = take(islice(it, 2))
    state = first.state_dict()
    del it
    resumed = build()
    resumed.load_state_dict(state)
    assert head + take(resumed) == reference


def test_packing_needs_where_utterances_may_start(packed_corpus, tiny_tokenizer):
    cfg, cuts, stats = packed_corpus
    with pytest.raises(ValueError, match="pack_align"):
        make_loader(cuts, cfg, tokenizer=tiny_tokenizer, stats=stats, train=True)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(pad_to_frames=256), "pad_to_frames=256"),
        (dict(pad_to_frames=256, fixed_batch_shapes=True), "fixed_batch_shapes=true"),
        (dict(speed_perturb=(0.9, 1.1), features=FeatureConfig(precomputed=False)), "speed_perturb"),
        (dict(max_cut_duration=30.0), "max_cut_duration=5.12"),
        (dict(pack_to_frames=-1), ">= 0"),
        (dict(pack_to_frames=100_000_000, max_duration=30.0), "between 512 .* and 3000 \\(one row a batch\\)"),
    ],
)
def test_settings_packing_cannot_go_with_are_refused_in_one_line(overrides, match):
    with pytest.raises(ValueError, match=match) as info:
        DataConfig(**{"pack_to_frames": 512, "max_cut_duration": 5.12, **overrides})
    assert "\n" not in str(info.value)
