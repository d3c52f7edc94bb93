"""Training from lhotse Shar shards (usmkit.data.shar, usmkit.data.loader.SharLoader): the converter, every
cut once per epoch over the processes and loader workers, exact resume, and what is refused."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from usmkit.data.batch import Batch
from usmkit.data.loader import SharLoader, make_loader
from usmkit.data.shar import INDEX, SharArgs, SharError, run, shar_cuts, split_shards, write_split
from usmkit.data.tokenizer import MODEL_FILE
from usmkit.data.validate import BadInputError
from usmkit.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def shards(tmp_path, build_corpus) -> Path:
    """24 cuts of 0.4-1.6 s in 8 shards of 3: ``<tmp>/shar/train``."""
    cuts = build_corpus(tmp_path / "corpus", {"en": 16, "de": 8})
    write_split(cuts, tmp_path / "shar" / "train", shard_size=3)
    return tmp_path / "shar"


def _loader(shards: Path, build_config, tiny_tokenizer, *, rank: int = 0, world: int = 1, workers: int = 2):
    cfg = build_config(shar_dir=str(shards), num_workers=workers, max_duration=2.5)
    meta = shar_cuts(split_shards(shards, "train"), audio=False)
    return make_loader(meta, cfg, tokenizer=tiny_tokenizer, stats=None, train=True, rank=rank, world_size=world)


def _epochs_of(loader: SharLoader, epochs: int) -> dict[int, list[str]]:
    """The cut ids each epoch's batches held, read until every stream is past ``epochs - 1``."""
    seen: dict[int, list[str]] = {}
    for batch in loader:
        seen.setdefault(loader.epoch, []).extend(batch.cut_ids)
        if min(e for e, _ in loader.positions) >= epochs:
            break
    loader.close()
    return seen


def test_the_converter_writes_every_split_as_shards_with_an_index(tmp_path, build_corpus):
    from lhotse import CutSet

    from usmkit.data.corpora.common import write_split as write_manifests

    corpus = tmp_path / "corpus"
    cuts = build_corpus(corpus, {"en": 7})
    write_manifests(corpus, "toy", "train", CutSet.from_cuts(list(cuts)[:5]))
    write_manifests(corpus, "toy", "dev", CutSet.from_cuts(list(cuts)[5:]))
    run(SharArgs(src=str(corpus), out=str(tmp_path / "shar"), shard_size=2))
    index = json.loads((tmp_path / "shar" / INDEX).read_text())
    assert index["corpus"] == "toy" and {k: v["shards"] for k, v in index["splits"].items()} == {"train": 3, "dev": 1}
    got = list(shar_cuts(split_shards(tmp_path / "shar", "train"), audio=True))
    assert sorted(c.id for c in got) == sorted(c.id for c in list(cuts)[:5])
    by_id = {c.id: c for c in cuts}
    for cut in got:  # FLAC: the samples come back exact
        torch.testing.assert_close(torch.from_numpy(cut.load_audio()), torch.from_numpy(by_id[cut.id].load_audio()))


def test_the_converter_names_an_unreadable_cut(tmp_path, build_corpus):
    cuts = build_corpus(tmp_path / "corpus", {"en": 3})
    (tmp_path / "corpus" / "audio" / f"{cuts[1].id}.wav").write_bytes(b"not audio")
    with pytest.raises(BadInputError, match=cuts[1].id):
        write_split(cuts, tmp_path / "shar" / "train", shard_size=2)
    assert not (tmp_path / "shar" / "train").exists()  # nothing half-written
    entry = write_split(cuts, tmp_path / "shar" / "train", shard_size=2, on_bad_input="skip")
    assert entry["cuts"] == 2 and "skipped 1 of 3" in entry["skipped"]


def test_every_cut_once_per_epoch_over_processes_and_workers(shards, build_config, tiny_tokenizer):
    """Two processes (ranks given) with two loader workers each: four streams over 8 shards. In each of
    two epochs the four streams together hold every cut exactly once, and the epochs differ in order."""
    all_ids = sorted(c.id for c in shar_cuts(split_shards(shards, "train"), audio=False))
    per_rank = [_epochs_of(_loader(shards, build_config, tiny_tokenizer, rank=r, world=2), 2) for r in (0, 1)]
    for epoch in (0, 1):
        ids = per_rank[0][epoch] + per_rank[1][epoch]
        assert sorted(ids) == all_ids, f"epoch {epoch}"
        assert not set(per_rank[0][epoch]) & set(per_rank[1][epoch])
    assert per_rank[0][0] != per_rank[0][1]  # shards and cuts reshuffled per epoch


@pytest.mark.parametrize("workers,consumed", [(0, 5), (2, 5), (2, 14)])
def test_resume_yields_the_batches_of_an_uninterrupted_loader(shards, build_config, tiny_tokenizer, workers, consumed):
    """After ``consumed`` batches (5: the next batch comes from worker 1, 14: one stream past the end of its
    epoch), a new loader given the state yields the same next batches, features included."""

    def take(loader, n) -> list[Batch]:
        out = []
        for batch in loader:
            out.append(batch)
            if len(out) == n:
                break
        return out

    straight = take(_loader(shards, build_config, tiny_tokenizer, workers=workers), consumed + 6)
    first = _loader(shards, build_config, tiny_tokenizer, workers=workers)
    take(first, consumed)
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint keeps
    first.close()
    resumed = _loader(shards, build_config, tiny_tokenizer, workers=workers)
    resumed.load_state_dict(state)
    again = take(resumed, 6)
    resumed.close()
    for want, got in zip(straight[consumed:], again, strict=True):
        assert got.cut_ids == want.cut_ids
        torch.testing.assert_close(got.features, want.features)


def test_over_long_transcripts_are_left_out_of_the_streams_and_counted(tmp_path, build_corpus, build_config,
                                                                      tiny_tokenizer, caplog):  # fmt: skip
    """A transcript of more tokens than its cut has feature frames trains from shards as it does from manifests:
    left out of every stream, and counted once when the loader is built."""
    from lhotse import CutSet
    from lhotse.utils import fastcopy

    cuts = list(build_corpus(tmp_path / "corpus", {"en": 12}))
    sup = cuts[0].supervisions[0]
    cuts[0] = fastcopy(cuts[0], supervisions=[fastcopy(sup, text=" ".join(["the cat"] * 1000))])
    write_split(CutSet.from_cuts(cuts), tmp_path / "shar" / "train", shard_size=3)
    with caplog.at_level(logging.WARNING, logger="usmkit.data.loader"):
        seen = _epochs_of(_loader(tmp_path / "shar", build_config, tiny_tokenizer), 1)[0]
    assert sorted(seen) == sorted(c.id for c in cuts[1:])
    assert "training leaves out 1 cuts whose transcripts have more tokens than max_text_tokens=1000" in caplog.text


def test_too_few_shards_for_the_streams_is_refused(shards, build_config, tiny_tokenizer):
    """A user error (one ``error:`` line), not a ``ValueError`` traceback."""
    with pytest.raises(SharError, match="holds 8 shards of split train, fewer than 4 processes x 4 loader streams"):
        _loader(shards, build_config, tiny_tokenizer, rank=0, world=4, workers=4)


# Each damages the shards and returns the files of which the error must name one.
def _truncate(train: Path) -> list[str]:
    tar = train / "recording.000003.tar"
    tar.write_bytes(tar.read_bytes()[: tar.stat().st_size // 2])
    return [str(tar)]


def _swap(train: Path) -> list[str]:
    a, b = train / "recording.000002.tar", train / "recording.000005.tar"
    a.rename(train / "tmp.tar")
    b.rename(a)
    (train / "tmp.tar").rename(b)
    return [str(a), str(b)]  # the stream that reads one of them first names it


def _remove(train: Path) -> list[str]:
    (train / "recording.000006.tar").unlink()
    return [str(train / "recording.000006.tar")]


@pytest.mark.parametrize("damage", [_truncate, _swap, _remove], ids=["truncated", "swapped", "missing"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_damaged_shard_is_one_error_naming_its_files(shards, build_config, tiny_tokenizer, damage, workers):
    """A tar cut short (``tarfile.ReadError``), two shards' audio swapped (``AssertionError: Mismatched IDs``), a
    missing tar: a ``SharError`` (one ``error:`` line) naming the files and what to do, also from a loader
    worker (whose own error reached the user as a traceback)."""
    named = damage(shards / "train")
    with pytest.raises(SharError) as err:
        loader = _loader(shards, build_config, tiny_tokenizer, workers=workers)
        _epochs_of(loader, 1)
    message = str(err.value)
    assert "\n" not in message and any(name in message for name in named), message
    assert "prepare shar" in message, message


def test_what_needs_the_whole_split_is_refused_with_shar():
    from usmkit.config import TrainConfig, from_dict
    from usmkit.data.config import DataConfig, FeatureConfig
    from usmkit.tasks import task_for

    most = from_dict(
        TrainConfig, {"task": {"kind": "most"}, "data": {"shar_dir": "x", "features": {"precomputed": False}}}
    )
    with pytest.raises(ValueError, match="MOST"):  # its task's check (usmkit.tasks), run before any data is read
        task_for(most.task).check(most, most.model.build_config(input_dim=80))
    with pytest.raises(ValueError, match="features.precomputed=true, language_temperature=2"):
        DataConfig(shar_dir="x", features=FeatureConfig(precomputed=True), language_temperature=2.0)


# ---------------------------------------------------------------- two processes
def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_process_worker(rank: int, port: int, shards: str, tokenizer_dir: str, out: str) -> None:
    """One process of two (gloo): its rank from torch.distributed; rank 0 gathers every process's epochs."""
    from usmkit.data.config import DataConfig, FeatureConfig
    from usmkit.data.tokenizer import Tokenizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cfg = DataConfig(shar_dir=shards, num_workers=2, max_duration=2.5, num_buckets=2,
                     features=FeatureConfig(precomputed=False))  # fmt: skip
    meta = shar_cuts(split_shards(shards, "train"), audio=False)
    loader = make_loader(meta, cfg, tokenizer=Tokenizer.load(Path(tokenizer_dir) / MODEL_FILE), stats=None,
                         train=True, rank=dist.get_rank(), world_size=dist.get_world_size())  # fmt: skip
    seen = _epochs_of(loader, 1)
    gathered: list = [None, None]
    dist.all_gather_object(gathered, seen[0])
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def test_two_processes_read_every_cut_once_per_epoch(shards, tiny_tokenizer, tmp_path):
    tokenizer_dir = tmp_path / "tok"
    tokenizer_dir.mkdir()
    (tokenizer_dir / MODEL_FILE).write_bytes(tiny_tokenizer.model_proto)
    out = tmp_path / "seen.json"
    mp.start_processes(_two_process_worker, args=(_port(), str(shards), str(tokenizer_dir), str(out)), nprocs=2,
                       start_method="fork")  # fmt: skip
    rank0, rank1 = json.loads(out.read_text())
    all_ids = sorted(c.id for c in shar_cuts(split_shards(shards, "train"), audio=False))
    assert sorted(rank0 + rank1) == all_ids and rank0 and rank1


# ---------------------------------------------------------------- training
def _train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "usmkit.cli.train", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


@pytest.mark.slow  # ~60 s
def test_training_on_shards_resumes_exactly(synth_corpus, tmp_path):
    """``data.shar_dir``: a run stopped at step 3 and resumed to 6 logs the losses of a run that was not."""
    run(SharArgs(src=str(synth_corpus), out=str(tmp_path / "shar"), splits=("train",), shard_size=5))
    args = [
        "recipe=stage3_ctc", f"data.manifest_dir={synth_corpus}", f"data.shar_dir={tmp_path / 'shar'}",
        "data.features.precomputed=false", "data.num_workers=2", "data.max_duration=20", "model=tiny",
        "model.overrides={d_model: 64, num_layers: 2, num_heads: 2}", "trainer.device=cpu", "trainer.log_every=1",
        "trainer.progress=false", "trainer.eval_every=0", "trainer.save_every=3", "optim.schedule=constant",
    ]  # fmt: skip

    def losses(exp: Path) -> dict[int, float]:
        rows = [json.loads(x) for x in (exp / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}

    for extra in (["trainer.max_steps=6"], ["trainer.max_steps=3"], ["trainer.max_steps=6", "resume=true"]):
        exp = tmp_path / ("straight" if extra == ["trainer.max_steps=6"] else "resumed")
        proc = _train(tmp_path, *args, f"trainer.exp_dir={exp}", *extra)
        assert proc.returncode == 0, proc.stderr[-4000:]
    assert losses(tmp_path / "resumed") == pytest.approx(losses(tmp_path / "straight"), rel=1e-6)


def _corpus_copy(synth_corpus: Path, to: Path) -> Path:
    """The embedded corpus's manifests and audio (``audio/<split>/*.flac``), copied: the test may lose them."""
    shutil.copytree(synth_corpus / "audio", to / "audio")
    for p in synth_corpus.glob("synth_*.jsonl.gz"):
        shutil.copy(p, to / p.name)
    return to


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_out_inside_src_is_refused_in_one_line_and_the_audio_is_kept(synth_corpus, tmp_path, capsys):
    """``prepare shar src=C out=C/audio`` replaced ``C/audio/train`` (the corpus's FLAC
    files) with shards, so C's manifests pointed at nothing."""
    from usmkit.cli.prepare import main

    corpus = _corpus_copy(synth_corpus, tmp_path / "C")
    before = _files(corpus)
    with pytest.raises(SystemExit) as e:
        main(["shar", f"src={corpus}", f"out={corpus / 'audio'}", "shard_size=10"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and f"out={corpus / 'audio'} lies inside src={corpus}" in err[0], err
    assert _files(corpus) == before


def test_a_folder_of_other_files_is_refused_and_an_earlier_conversion_is_replaced(tmp_path, build_corpus):
    """``out=D`` replaced ``D/train`` whole, and a user's ``D/train/notes.txt`` with it."""
    from lhotse import CutSet

    from usmkit.data.corpora.common import write_split as write_manifests

    corpus = tmp_path / "corpus"
    write_manifests(corpus, "toy", "train", CutSet.from_cuts(list(build_corpus(corpus, {"en": 3}))))
    notes = tmp_path / "D" / "train" / "notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("mine")
    with pytest.raises(UsageError, match=r"out=.*D exists and is not an earlier Shar conversion"):
        run(SharArgs(src=str(corpus), out=str(tmp_path / "D"), shard_size=2))
    assert notes.read_text() == "mine"
    args = SharArgs(src=str(corpus), out=str(tmp_path / "shar"), shard_size=2)
    run(args)
    run(args)  # its own earlier output: replaced, split by split
    assert json.loads((tmp_path / "shar" / INDEX).read_text())["splits"]["train"]["cuts"] == 3
