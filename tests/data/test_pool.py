"""usmkit.data.corpora.pool: several corpora's audio as one unlabeled split."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

from usmkit.cli.prepare import main as prepare_main
from usmkit.data.corpora.common import unlabeled_cuts, write_unlabeled_split
from usmkit.data.corpora.pool import pooled_cuts, pooled_labeled_cuts
from usmkit.data.manifests import load_cuts
from usmkit.errors import UsageError


def _corpus(root, name: str, n: int, labeled: bool) -> None:
    """A manifest dir with ``n`` one-second recordings in split ``src`` (with transcripts or audio-only)."""
    root.mkdir(parents=True)
    cuts = []
    for i in range(n):
        path = root / f"{name}{i}.wav"
        sf.write(path, np.random.default_rng(i).normal(0, 0.1, 16000).astype(np.float32), 16000)
        rec = Recording.from_file(path, recording_id=f"{name}{i}")
        sup = SupervisionSegment(f"{name}{i}", rec.id, 0.0, 1.0, text="a b", speaker=f"{name}-spk", language="en")
        cuts.append(MonoCut(rec.id, 0.0, 1.0, 0, recording=rec, supervisions=[sup]))
    cuts = CutSet.from_cuts(cuts)
    write_unlabeled_split(root, name, "src", cuts if labeled else unlabeled_cuts(cuts, "en"))


def test_pool_keeps_every_cut_with_prefixed_ids_and_its_speaker(tmp_path):
    _corpus(tmp_path / "a", "a", 2, labeled=True)
    _corpus(tmp_path / "b", "b", 3, labeled=False)  # already audio-only: its custom speaker survives
    inputs = [f"{tmp_path / 'a'}:a:src", f"{tmp_path / 'b'}:b:src"]
    assert (
        prepare_main(["pool", f"out={tmp_path / 'pool'}", "corpus=p", "split=pool", f"inputs=[{','.join(inputs)}]"])
        == 0
    )
    pooled = list(load_cuts(tmp_path / "pool", "pool", corpus="p"))
    assert sorted(c.id for c in pooled) == ["a-a0", "a-a1", "b-b0", "b-b1", "b-b2"]
    assert all(not c.supervisions for c in pooled)
    assert {c.id: c.custom["speaker"] for c in pooled}["b-b2"] == "b-spk"
    assert pooled[0].load_audio().shape == (1, 16000)


@pytest.mark.parametrize("inputs", [[], ["data/an4:unlabeled"]])
def test_pool_refuses_bad_inputs_by_name(inputs):
    with pytest.raises(UsageError, match="manifest_dir:corpus:split"):
        pooled_cuts(inputs)


def test_labeled_pool_keeps_transcripts_and_writes_supervisions(tmp_path):
    _corpus(tmp_path / "a", "a", 2, labeled=True)
    _corpus(tmp_path / "b", "b", 1, labeled=True)
    inputs = f"inputs=[{tmp_path / 'a'}:a:src,{tmp_path / 'b'}:b:src]"
    assert prepare_main(["pool", f"out={tmp_path / 'en'}", "corpus=en", "split=train", "labeled=true", inputs]) == 0
    pooled = {c.id: c for c in load_cuts(tmp_path / "en", "train", corpus="en")}
    assert sorted(pooled) == ["a-a0", "a-a1", "b-b0"]
    assert [s.text for s in pooled["b-b0"].supervisions] == ["a b"]
    assert (tmp_path / "en" / "en_supervisions_train.jsonl.gz").is_file()


def test_labeled_pool_refuses_audio_only_cuts_by_id(tmp_path, capsys):
    _corpus(tmp_path / "b", "b", 1, labeled=False)
    with pytest.raises(SystemExit) as exit_info:
        prepare_main(
            [
                "pool",
                f"out={tmp_path / 'en'}",
                "corpus=en",
                "split=train",
                "labeled=true",
                f"inputs=[{tmp_path / 'b'}:b:src]",
            ]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "cut b0 of" in err and "has no transcript" in err
    with pytest.raises(UsageError, match="cut b0 of .* has no transcript"):
        pooled_labeled_cuts([f"{tmp_path / 'b'}:b:src"])
