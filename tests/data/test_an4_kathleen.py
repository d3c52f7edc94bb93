"""AN4 and Kathleen recipes, NIST SPHERE reading and the transport copy, on tiny corpora in tmp_path
(one slow test runs both recipes on the shared copies)."""

from __future__ import annotations

import gzip
import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from usmkit.cli.prepare import main as prepare_main
from usmkit.data.corpora.an4 import choose_dev_speakers, default_an4_dir, normalize_an4, prepare_an4
from usmkit.data.corpora.common import RecipeDrops
from usmkit.data.corpora.kathleen import default_kathleen_dir, normalize_kathleen, prepare_kathleen, prompt_split
from usmkit.data.corpora.pack import PackSettings, opus_compression_level, pack_corpus
from usmkit.data.corpora.sphere import SphereError, parse_sphere_header, read_sphere
from usmkit.data.manifests import available_splits, load_cuts
from usmkit.data.validate import BadInputError

SR = 16000
# AN4-like: (speaker, utterances) of the training part; the test part has two speakers of two.
TRAIN_SPEAKERS = {"fash": 3, "fbbh": 3, "mcel": 2, "mjgk": 2, "fkai": 1, "mtos": 1}
TEST_SPEAKERS = {"fcaw": 2, "menk": 2}
TEXTS = ("G M E F THREE NINE", "RUBOUT T W O", "ENTER SIX", "YES", "ERASE C Q Q F SEVEN")


def samples(seconds: float, seed: int) -> np.ndarray:
    """int16 voiced-ish audio: a few harmonics under a 4 Hz envelope plus noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    x = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 6)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))
    x = 0.2 * x + 0.01 * rng.standard_normal(t.size)
    return (np.clip(x, -1, 1) * 32767).astype(np.int16)


def write_sphere(path: Path, x: np.ndarray) -> Path:
    """A SPHERE file with AN4's header fields (sample_count, sample_checksum), written by hand."""
    fields = [
        f"sample_count -i {x.size}",
        "sample_rate -i 16000",
        "sample_n_bytes -i 2",
        "sample_byte_format -s2 01",
        "channel_count -i 1",
        "sample_coding -s3 pcm",
        f"sample_checksum -i {int(x.astype(np.int64).sum()) % 65536}",
        "end_head",
    ]
    header = ("NIST_1A\n   1024\n" + "\n".join(fields) + "\n").encode().ljust(1024, b" ")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + x.astype("<i2").tobytes())
    return path


def make_an4(root: Path) -> dict[str, np.ndarray]:
    """A tiny AN4 in the real layout; returns the samples by utterance id."""
    audio = {}
    for part, folder, speakers in (("train", "an4_clstk", TRAIN_SPEAKERS), ("test", "an4test_clstk", TEST_SPEAKERS)):
        fileids, lines = [], []
        for s, (speaker, n) in enumerate(speakers.items()):
            for i in range(n):
                utt = f"an{100 * s + i}-{speaker}-b"
                audio[utt] = samples(0.25 + 0.05 * i, seed=len(audio))
                write_sphere(root / "wav" / folder / speaker / f"{utt}.sph", audio[utt])
                fileids.append(f"{folder}/{speaker}/{utt}")
                text = TEXTS[len(audio) % len(TEXTS)]
                lines.append(f"<s> {text} </s> ({utt})" if part == "train" else f"{text} ({utt})")
        (root / "etc").mkdir(parents=True, exist_ok=True)
        (root / "etc" / f"an4_{part}.fileids").write_text("\n".join(fileids) + "\n")
        (root / "etc" / f"an4_{part}.transcription").write_text("\n".join(lines) + "\n")
    return audio


def texts_of(cuts) -> dict[str, str]:
    return {c.id: c.supervisions[0].text for c in cuts}


def speakers_of(cuts) -> set[str]:
    return {c.supervisions[0].speaker for c in cuts}


# ---- NIST SPHERE ---------------------------------------------------------------------------------


def test_read_sphere_exact_and_checked(tmp_path: Path) -> None:
    x = samples(0.3, seed=1)
    path = write_sphere(tmp_path / "a.sph", x)
    y, rate = read_sphere(path)
    assert rate == SR and y.dtype == np.int16 and np.array_equal(x, y)
    assert parse_sphere_header(path.read_bytes()[:1024])["sample_checksum"] == int(x.astype(np.int64).sum()) % 65536
    # soundfile's own NIST writer (no checksum field) reads too
    sf.write(tmp_path / "b.sph", x, SR, format="NIST", subtype="PCM_16")
    assert np.array_equal(read_sphere(tmp_path / "b.sph")[0], x)

    raw = path.read_bytes()
    (tmp_path / "cut.sph").write_bytes(raw[: 1024 + x.size])  # half the samples
    with pytest.raises(SphereError, match="truncated"):
        read_sphere(tmp_path / "cut.sph")
    flipped = bytearray(raw)
    flipped[1024 + 100] ^= 0x40
    (tmp_path / "flip.sph").write_bytes(bytes(flipped))
    with pytest.raises(SphereError, match="checksum"):
        read_sphere(tmp_path / "flip.sph")
    (tmp_path / "junk.sph").write_bytes(b"RIFF" + bytes(2000))
    with pytest.raises(SphereError, match="not a NIST SPHERE"):
        read_sphere(tmp_path / "junk.sph")


# ---- AN4 -----------------------------------------------------------------------------------------


def test_normalize_an4_keeps_spelled_letters() -> None:
    assert normalize_an4("<s> RUBOUT G M E F THREE NINE </s>") == "rubout g m e f three nine"
    assert normalize_an4("<sil> ENTER ++BREATH++ C Q ") == "enter c q"
    assert normalize_an4("<s> </s>") == ""


def test_choose_dev_speakers_exact_deterministic_and_never_all() -> None:
    # AN4's training speakers: 2 with 9 utterances, 8 with 12, 62 with 13, 2 with 14 (948)
    counts = {f"s{i:02d}": n for i, n in enumerate([9] * 2 + [12] * 8 + [13] * 62 + [14] * 2)}
    chosen = choose_dev_speakers(counts, 100, seed=0)
    assert sum(counts[s] for s in chosen) == 100
    assert chosen == choose_dev_speakers(counts, 100, seed=0)
    assert chosen != choose_dev_speakers(counts, 100, seed=1)
    small = {"a": 4, "b": 6, "c": 9}
    assert sum(small[s] for s in choose_dev_speakers(small, 5)) == 4  # closest (4 or 6), smaller on a tie
    assert sum(small[s] for s in choose_dev_speakers(small, 12)) == 13  # 4 + 9
    assert len(choose_dev_speakers({"a": 5, "b": 5}, 100)) == 1  # never every speaker
    with pytest.raises(ValueError, match="at least 2"):
        choose_dev_speakers({"a": 5}, 5)


def test_an4_splits_text_speakers_and_lossless_flac(tmp_path: Path) -> None:
    audio = make_an4(tmp_path / "an4")
    cut_sets = prepare_an4(tmp_path / "an4", tmp_path / "out", dev_utterances=4)
    assert [len(cut_sets[s]) for s in ("train", "dev", "test", "unlabeled")] == [8, 4, 4, 8]
    assert not speakers_of(cut_sets["train"]) & speakers_of(cut_sets["dev"])
    assert speakers_of(cut_sets["train"]) | speakers_of(cut_sets["dev"]) == set(TRAIN_SPEAKERS)
    assert speakers_of(cut_sets["test"]) == set(TEST_SPEAKERS)
    texts = texts_of(cut_sets["test"]) | texts_of(cut_sets["train"]) | texts_of(cut_sets["dev"])
    assert set(texts.values()) <= {normalize_an4(t) for t in TEXTS} and "g m e f three nine" in texts.values()
    unlabeled = cut_sets["unlabeled"]
    assert [c.id for c in unlabeled] == [c.id for c in cut_sets["train"]]
    assert all(not c.supervisions and c.custom["speaker"] in TRAIN_SPEAKERS for c in unlabeled)
    assert available_splits(tmp_path / "out", "an4") == ["dev", "test", "train", "unlabeled"]
    for cut in load_cuts(tmp_path / "out", "dev", corpus="an4"):  # relative paths, FLAC equal to the SPHERE samples
        assert cut.recording.sources[0].source.endswith(".flac")
        np.testing.assert_array_equal(np.round(cut.load_audio()[0] * 32768).astype(np.int16), audio[cut.id])
    manifest = (tmp_path / "out" / "an4_recordings_test.jsonl.gz").read_bytes()
    assert str(tmp_path).encode() not in gzip.decompress(manifest)


def _break_an4(root: Path) -> None:
    """One of each: a corrupt .sph, a transcript line without id, a fileid without audio, audio without transcript."""
    (root / "wav/an4_clstk/fash/an0-fash-b.sph").write_bytes(b"NIST_1A\n   1024\ngarbage")
    trans = root / "etc/an4_train.transcription"
    lines = trans.read_text().splitlines()
    assert "(an100-fbbh-b)" in lines[3]
    lines[3] = "<s> ENTER SIX </s>"  # an100-fbbh-b loses its id: that line and that audio are both dropped
    trans.write_text("\n".join(lines) + "\n")
    (root / "wav/an4_clstk/mcel/an200-mcel-b.sph").unlink()


def test_an4_bad_input_fails_naming_the_file_or_is_skipped_and_counted(tmp_path: Path, capsys) -> None:
    make_an4(tmp_path / "an4")
    _break_an4(tmp_path / "an4")
    with pytest.raises(BadInputError, match=r"transcript line without id: .*an4_train.transcription:4"):
        prepare_an4(tmp_path / "an4", tmp_path / "out", dev_utterances=3)
    with pytest.raises(SystemExit) as exit_info:
        prepare_main(["an4", f"corpus_dir={tmp_path / 'an4'}", f"out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: transcript line without id") and "on_error=skip" in err[0]

    drops = RecipeDrops("skip")
    cut_sets = prepare_an4(tmp_path / "an4", tmp_path / "out", dev_utterances=3, drops=drops)
    assert drops.counts() == {
        "transcript line without id": 1,
        "corrupt audio": 1,
        "missing audio": 1,
        "audio without transcript": 1,
    }
    assert sum(len(cut_sets[s]) for s in ("train", "dev")) == 12 - 3
    assert (
        prepare_main(
            ["an4", f"corpus_dir={tmp_path / 'an4'}", f"out={tmp_path / 'out2'}", "dev_utterances=3", "on_error=skip"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "skipped 4 of" in out and "1 corrupt audio (an0-fash-b.sph)" in out


def test_an4_truncated_sphere_is_corrupt_audio(tmp_path: Path) -> None:
    make_an4(tmp_path / "an4")
    path = tmp_path / "an4/wav/an4test_clstk/fcaw/an0-fcaw-b.sph"
    path.write_bytes(path.read_bytes()[:1500])
    with pytest.raises(BadInputError, match=r"corrupt audio: .*an0-fcaw-b.sph: .*truncated"):
        prepare_an4(tmp_path / "an4", tmp_path / "out", dev_utterances=3)


# ---- Kathleen ------------------------------------------------------------------------------------


def make_kathleen(root: Path, prompts: int = 30) -> None:
    """``prompts`` ARCTIC prompts with 1-3 takes each, 0.1 s FLAC + .txt in data/."""
    data = root / "data"
    data.mkdir(parents=True)
    for p in range(1, prompts + 1):
        for take in range(1 + p % 3):
            stem = f"arctic_{'ab'[p % 2]}{p:04d}_{1592748000 + 10 * take}"
            sf.write(data / f"{stem}.flac", samples(0.1, seed=p), SR, subtype="PCM_16")
            (data / f"{stem}.txt").write_text("Mr Pike's take? No-sir-ee, etc.\n")


def test_normalize_kathleen() -> None:
    assert (
        normalize_kathleen("Mrs McFee's jaws -- it's the wolf-dog, etc.")
        == "missus mcfee's jaws it's the wolf dog et cetera"
    )
    assert normalize_kathleen("That came before my A B C's.") == "that came before my a b c's"
    assert normalize_kathleen("'Tis Mr Young's.") == "tis mister young's"


def test_kathleen_splits_are_disjoint_by_prompt(tmp_path: Path) -> None:
    make_kathleen(tmp_path / "k")
    cut_sets = prepare_kathleen(tmp_path / "k", tmp_path / "out")
    prompts = {
        split: {c.supervisions[0].custom["prompt"] for c in cut_sets[split]} for split in ("train", "dev", "test")
    }
    assert all(prompts.values()) and not (
        prompts["train"] & prompts["dev"] or prompts["train"] & prompts["test"] or prompts["dev"] & prompts["test"]
    )
    for split, names in prompts.items():
        assert all(prompt_split(p) == split for p in names)
    assert sum(len(prompts[s]) for s in prompts) == 30 and sum(len(cut_sets[s]) for s in prompts) == 60
    assert [c.id for c in cut_sets["unlabeled"]] == [c.id for c in cut_sets["train"]]
    assert cut_sets["unlabeled"][0].custom == {"language": "en", "speaker": "kathleen"}
    assert cut_sets["dev"][0].supervisions[0].text == "mister pike's take no sir ee et cetera"
    # the split of a prompt is its hash's, whatever else is in the corpus
    bucket = int.from_bytes(hashlib.sha256(b"kathleen:arctic_a0002").digest()[:8], "big") % 100
    assert prompt_split("arctic_a0002") == ("train" if bucket < 80 else "dev" if bucket < 90 else "test")


def test_kathleen_bad_input_skip_counts(tmp_path: Path) -> None:
    make_kathleen(tmp_path / "k")
    data = tmp_path / "k" / "data"
    (data / "arctic_a0002_1592748000.flac").write_bytes(b"fLaC" + bytes(100))  # corrupt
    (data / "arctic_b0003_1592748000.txt").unlink()  # audio without transcript
    (data / "arctic_b0005_1592748000.flac").unlink()  # transcript without audio
    (data / "arctic_a0004_1592748000.txt").write_text("He paid 12 dollars.")  # digits
    (data / "notes.txt").write_text("x")  # not an ARCTIC id
    with pytest.raises(BadInputError, match=r"digits in transcript: .*arctic_a0004_1592748000.txt"):
        prepare_kathleen(tmp_path / "k", tmp_path / "out")
    drops = RecipeDrops("skip")
    cut_sets = prepare_kathleen(tmp_path / "k", tmp_path / "out", drops=drops)
    assert drops.counts() == {
        "corrupt audio": 1,
        "audio without transcript": 1,
        "missing audio": 1,
        "digits in transcript": 1,
        "unexpected file name": 1,
    }
    assert sum(len(cut_sets[s]) for s in ("train", "dev", "test")) == 60 - 4


# ---- transport copy ------------------------------------------------------------------------------


def test_opus_compression_level_inverts_libsndfile_map() -> None:
    assert opus_compression_level(256.0) == 0.0 and opus_compression_level(6.0) == 1.0
    with pytest.raises(ValueError, match="bitrate_kbps"):
        opus_compression_level(3.0)


def test_packed_copies_are_read_by_the_recipes(tmp_path: Path) -> None:
    audio = make_an4(tmp_path / "an4")
    reference = prepare_an4(tmp_path / "an4", tmp_path / "ref", dev_utterances=4)
    flac = pack_corpus(tmp_path / "an4", tmp_path / "an4_flac", PackSettings("flac"))
    opus = pack_corpus(tmp_path / "an4", tmp_path / "an4_opus", PackSettings("opus", 24.0))
    assert flac.audio_files == opus.audio_files == 16 and flac.other_files == 4
    assert opus.out_audio_bytes < flac.out_audio_bytes < flac.src_audio_bytes
    assert not list((tmp_path / "an4_opus").rglob("*.sph"))
    for copy, suffix in (("an4_flac", ".flac"), ("an4_opus", ".opus")):
        cut_sets = prepare_an4(tmp_path / copy, tmp_path / f"out_{copy}", dev_utterances=4)
        for split in ("train", "dev", "test", "unlabeled"):
            assert [(c.id, c.duration) for c in cut_sets[split]] == [(c.id, c.duration) for c in reference[split]]
        assert texts_of(cut_sets["test"]) == texts_of(reference["test"])
        cut = cut_sets["test"][0]
        assert cut.recording.sources[0].source.endswith(suffix)
        decoded = cut.load_audio()[0] * 32768
        if suffix == ".flac":
            np.testing.assert_array_equal(decoded.round().astype(np.int16), audio[cut.id])
        else:  # lossy, but the same signal: correlation near 1
            assert np.corrcoef(decoded, audio[cut.id])[0, 1] > 0.9
    make_kathleen(tmp_path / "k")
    pack_corpus(tmp_path / "k", tmp_path / "k_opus", PackSettings("opus", 24.0))
    packed = prepare_kathleen(tmp_path / "k_opus", tmp_path / "k_out")
    assert sum(len(packed[s]) for s in ("train", "dev", "test")) == 60
    assert packed["train"][0].recording.sources[0].source.endswith(".opus")


def test_pack_refuses_a_foreign_nonempty_out(tmp_path: Path) -> None:
    make_kathleen(tmp_path / "k", prompts=2)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        pack_corpus(tmp_path / "k", tmp_path / "busy", PackSettings("flac"))
    pack_corpus(tmp_path / "k", tmp_path / "copy", PackSettings("flac"))
    pack_corpus(tmp_path / "k", tmp_path / "copy", PackSettings("opus"))  # our own earlier copy: replaced whole
    assert not list((tmp_path / "copy").rglob("*.flac")) and list((tmp_path / "copy").rglob("*.opus"))


# ---- the shared corpora --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(
    not (default_an4_dir() / "etc").is_dir() or not (default_kathleen_dir() / "data").is_dir(),
    reason="no shared AN4 / Kathleen copy",
)
def test_real_an4_and_kathleen(tmp_path: Path) -> None:
    an4 = prepare_an4(out_dir=tmp_path / "an4", num_jobs=2)
    assert [len(an4[s]) for s in ("train", "dev", "test", "unlabeled")] == [848, 100, 130, 848]
    assert not speakers_of(an4["train"]) & speakers_of(an4["dev"])
    assert len(speakers_of(an4["test"])) == 10
    assert texts_of(an4["test"])["an406-fcaw-b"] == "rubout g m e f three nine"
    kathleen = prepare_kathleen(out_dir=tmp_path / "kathleen", num_jobs=2)
    assert sum(len(kathleen[s]) for s in ("train", "dev", "test")) == 1620
    by_split = {s: Counter(c.supervisions[0].custom["prompt"] for c in kathleen[s]) for s in ("train", "dev", "test")}
    assert sum(len(p) for p in by_split.values()) == 1132
    assert not set(by_split["train"]) & (set(by_split["dev"]) | set(by_split["test"]))
