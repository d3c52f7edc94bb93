"""usmkit.tasks: one ``Task`` per task kind, which the recipe and run loading ask instead of testing the kind."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from toy_batches import ctc_batch

from usmkit.config import ConfigError, TaskConfig, TrainConfig, from_dict
from usmkit.errors import UsageError
from usmkit.inference.batches import transcribe_batches
from usmkit.metrics import score
from usmkit.models.asr import AsrModel
from usmkit.models.presets import tiny
from usmkit.ssl.bestrq import BestRQModel
from usmkit.ssl.most import MostModel
from usmkit.ssl.most_config import MostConfig
from usmkit.tasks import build_task, task_for

ENCODER = tiny(input_dim=80, num_layers=2, dropout=0.0)
VOCAB = 40


class IdTokenizer:
    """Token ids as text: '3 4' <-> [3, 4]."""

    vocab_size = VOCAB

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


def _train_cfg(task: dict, **sections) -> TrainConfig:
    return from_dict(TrainConfig, {"task": task, **sections})


def test_each_kind_is_one_task_with_its_module_and_what_it_reads():
    expected = {  # kind: (module type, reads text, CTC head, graphs per padded length, takes another stage's heads)
        "ctc": (AsrModel, True, True, 1, False),
        "las": (AsrModel, True, True, 1, False),
        "bestrq": (BestRQModel, False, False, 1, False),
        "most": (MostModel, True, True, 2, True),
    }
    for kind, (module_type, text, ctc, graphs, heads) in expected.items():
        cfg = TaskConfig(kind=kind, ctc_weight=0.3 if kind == "las" else 1.0)
        task = task_for(cfg)
        assert task.kind == kind
        assert (task.text, task.ctc, task.graphs_per_length, task.init_heads is not None) == (text, ctc, graphs, heads)
        torch.manual_seed(0)
        module = task.build(ENCODER, VOCAB)
        assert type(module) is module_type
        torch.manual_seed(0)  # build_task is the same module, drawn the same way
        again = build_task(cfg, ENCODER, VOCAB)
        ours, theirs = module.state_dict(), again.state_dict()
        assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    las = task_for(TaskConfig(kind="las", ctc_weight=0.3)).build(ENCODER, VOCAB)
    assert las.las is not None and las.ctc is not None
    assert task_for(TaskConfig(kind="las", ctc_weight=0.0)).ctc is False  # attention only: no CTC frame budget
    assert task_for(TaskConfig(kind="most", most=MostConfig(align_from="exp/ctc"))).align_from == "exp/ctc"
    assert task_for(TaskConfig(kind="ctc")).align_from is None


def _check(task: dict, encoder=ENCODER, **sections) -> None:
    cfg = _train_cfg(task, **sections)
    task_for(cfg.task).check(cfg, encoder)


def test_most_task_refuses_what_its_three_streams_cannot_take():
    with pytest.raises(ValueError, match="MOST .* takes its three streams one utterance per row"):
        _check({"kind": "most"}, data={"pack_to_frames": 3000})
    with pytest.raises(ValueError, match="data.shar_dir streams one training split"):
        _check({"kind": "most"}, data={"shar_dir": "shards", "features": {"precomputed": False}})
    with pytest.raises(ValueError, match="task.most.text_layer=2 must be below the encoder's 2 blocks"):
        _check({"kind": "most", "most": {"text_layer": 2}})
    with pytest.raises(UsageError, match="task.most.pad_text_to"):
        _check({"kind": "most"}, trainer={"compile": True}, data={"pad_to_frames": 256})
    _check({"kind": "most", "most": {"pad_text_to": 64}}, trainer={"compile": True}, data={"pad_to_frames": 256})
    _check({"kind": "ctc"}, data={"pack_to_frames": 3000})  # the same settings are fine for a task of one stream


def test_bestrq_task_checks_its_stacked_frames_against_the_encoder():
    _check({"kind": "bestrq"})  # 4 stacked frames, 4x subsampling
    with pytest.raises(ValueError, match="task.bestrq.stack_frames=4 does not match model.subsampling_factor=8"):
        _check({"kind": "bestrq"}, dataclasses.replace(ENCODER, subsampling_factor=8))


def test_the_recipe_asks_the_task_for_its_checks(tmp_path):
    from usmkit.training.recipe import check_config

    cfg = _train_cfg({"kind": "most"}, data={"pack_to_frames": 3000}, trainer={"exp_dir": str(tmp_path / "exp")})
    with pytest.raises(ConfigError, match="MOST .*set data.pack_to_frames=0") as info:
        check_config(cfg)
    assert "\n" not in str(info.value)  # one line


def _texts_batch(B: int, seed: int):
    batch = ctc_batch(B, seed=seed)
    return dataclasses.replace(batch, texts=[" ".join(map(str, row.tolist())) for row in batch.tokens])


def test_dev_eval_scores_greedy_ctc_where_a_ctc_head_reads_the_encoder():
    batches = [_texts_batch(3, seed=1), _texts_batch(2, seed=2), _texts_batch(2, seed=3)]
    tok = IdTokenizer()
    torch.manual_seed(0)
    ctc = build_task(TaskConfig(kind="ctc"), ENCODER, VOCAB).eval()
    with torch.no_grad():  # as the trainer calls it
        results = task_for(TaskConfig(kind="ctc")).dev_eval(lambda: iter(batches), tok, max_batches=2)(ctc)
    records, _ = transcribe_batches(ctc, batches, tok, max_batches=2)  # what evaluation scores the same way
    expected = score([r["ref"] for r in records], [r["hyp"] for r in records])
    assert len(records) == 5 and results["dev_wer"] == expected.wer and results["dev_cer"] == expected.cer
    with torch.no_grad():
        losses = [float(ctc(b).loss) * b.size for b in batches[:2]]
    assert results["dev_loss"] == pytest.approx(sum(losses) / 5)
    # BEST-RQ, and an attention-only LAS model (no CTC head to decode greedily): the dev loss alone
    for cfg in (TaskConfig(kind="bestrq"), TaskConfig(kind="las", ctc_weight=0.0)):
        module = build_task(cfg, ENCODER, VOCAB).eval()
        with torch.no_grad():
            assert set(task_for(cfg).dev_eval(lambda: iter(batches), tok)(module)) == {"dev_loss"}
