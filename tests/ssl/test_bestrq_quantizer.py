"""Random-projection quantizer: shapes, frozen buffers, determinism, nearest-code-by-cosine, fp32."""

import math

import pytest
import torch
import torch.nn.functional as F

from usmkit.ssl.bestrq import BestRQConfig
from usmkit.ssl.quantizer import RandomProjectionQuantizer

SMALL = BestRQConfig(num_codebooks=2, codebook_size=64)
FEAT = 20


def _features(B=3, T=41, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, FEAT, generator=g), torch.tensor([T, 30, 9])[:B]


def test_shapes_dtype_and_lengths():
    q = RandomProjectionQuantizer(FEAT, SMALL)
    x, lens = _features()
    codes, target_lens = q.targets(x, lens)
    assert codes.shape == (3, 41 // 4, 2) and codes.dtype == torch.int64
    assert target_lens.tolist() == [10, 7, 2]
    assert codes.min() >= 0 and codes.max() < SMALL.codebook_size


def test_buffers_are_frozen_saved_and_well_formed():
    q = RandomProjectionQuantizer(FEAT, SMALL)
    assert list(q.parameters()) == []
    assert set(q.state_dict()) == {"projections", "codebooks"}
    assert q.projections.shape == (2, 4 * FEAT, 16) and q.codebooks.shape == (2, 64, 16)
    bound = math.sqrt(6.0 / (4 * FEAT + 16))  # Xavier-uniform for a (4F, 16) matrix
    assert q.projections.abs().max() <= bound
    assert q.projections.abs().max() > 0.9 * bound
    torch.testing.assert_close(q.codebooks.norm(dim=-1), torch.ones(2, 64))
    assert not torch.equal(q.projections[0], q.projections[1])  # independent codebooks


def test_seeded_and_independent_of_the_global_rng():
    torch.manual_seed(1)
    a = RandomProjectionQuantizer(FEAT, SMALL)
    torch.manual_seed(2)
    b = RandomProjectionQuantizer(FEAT, SMALL)
    c = RandomProjectionQuantizer(FEAT, BestRQConfig(num_codebooks=2, codebook_size=64, seed=1))
    x, lens = _features()
    assert torch.equal(a.targets(x, lens)[0], b.targets(x, lens)[0])
    assert not torch.equal(a.codebooks, c.codebooks)
    assert not torch.equal(a.targets(x, lens)[0], c.targets(x, lens)[0])


def test_target_is_the_nearest_code_by_cosine():
    q = RandomProjectionQuantizer(FEAT, SMALL)
    x, lens = _features(B=1, T=16)
    codes, _ = q.targets(x, lens)
    stacked = x.reshape(1, 4, 4 * FEAT)  # (B, T2, S*F): frames 4t..4t+3 side by side
    for n in range(2):
        proj = stacked[0] @ q.projections[n]  # (T2, C)
        cos = F.cosine_similarity(proj[:, None, :], q.codebooks[n][None, :, :], dim=-1)  # (T2, K)
        assert codes[0, :, n].tolist() == cos.argmax(dim=-1).tolist()


def test_targets_are_fp32_under_bf16_autocast():
    q = RandomProjectionQuantizer(FEAT, SMALL)
    x, lens = _features()
    want, _ = q.targets(x, lens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = q.targets(x, lens)
    assert torch.equal(got, want)


def test_targets_use_the_whole_range_of_codes_on_random_input():
    q = RandomProjectionQuantizer(FEAT, SMALL)
    x = torch.randn(8, 400, FEAT, generator=torch.Generator().manual_seed(5))
    codes, _ = q.targets(x, torch.full((8,), 400))
    for n in range(2):
        assert codes[..., n].unique().numel() > SMALL.codebook_size // 2


def test_wrong_feature_dim_is_a_clear_error():
    q = RandomProjectionQuantizer(FEAT, SMALL)
    with pytest.raises(ValueError, match=r"\(batch, frames, 20\)"):
        q.targets(torch.zeros(1, 8, 80), torch.tensor([8]))
    with pytest.raises(ValueError, match="input_dim"):
        RandomProjectionQuantizer(0, SMALL)
