"""``python -m usmkit.cli.prepare subset``: a split restricted to whole speakers, drawn by a seeded fraction
(its list written to commit) or read from such a list, which gives the same split back."""

from __future__ import annotations

from pathlib import Path

import pytest

from usmkit.cli.prepare import main as prepare
from usmkit.data.corpora.common import write_split
from usmkit.data.manifests import load_cuts


@pytest.fixture
def corpus_dir(tmp_path, build_corpus) -> Path:
    """A corpus ``mini`` whose ``train`` split has 12 cuts of 4 speakers (3 each)."""
    out = tmp_path / "mini"
    write_split(out, "mini", "train", build_corpus(tmp_path / "audio_src", {"en": 6, "de": 6}))
    return out


def speakers(cuts) -> set[str]:
    return {c.supervisions[0].speaker for c in cuts}


def test_a_fraction_takes_whole_speakers_and_its_list_gives_the_same_split_back(corpus_dir, tmp_path):
    assert prepare(["subset", f"src={corpus_dir}", "fraction=0.4", "seed=3", "name=train_40"]) == 0
    full = load_cuts(corpus_dir, "train", corpus="mini")
    part = load_cuts(corpus_dir, "train_40", corpus="mini")
    assert len(part) == 6  # two speakers of three cuts: the first draw that reaches 40% of 12
    chosen = speakers(part)
    assert [c.id for c in full if c.supervisions[0].speaker in chosen] == [c.id for c in part]  # whole speakers
    listing = corpus_dir / "mini_train_40_speakers.txt"
    lines = [line for line in listing.read_text().splitlines() if not line.startswith("#")]
    assert set(lines) == chosen
    again = tmp_path / "again"
    assert prepare(["subset", f"src={corpus_dir}", f"speakers={listing}", "name=train_40", f"out={again}"]) == 0
    assert [c.id for c in load_cuts(again, "train_40", corpus="mini")] == [c.id for c in part]
    other = tmp_path / "other"
    assert prepare(["subset", f"src={corpus_dir}", "fraction=0.4", "seed=4", "name=train_40", f"out={other}"]) == 0
    assert (other / "mini_train_40_speakers.txt").is_file()


@pytest.mark.parametrize(
    "args, words",
    [
        (["fraction=0.5"], "name=NAME"),
        (["name=t"], "one of fraction=F"),
        (["name=t", "fraction=0.5", "speakers=x.txt"], "one of fraction=F"),
        (["name=t", "fraction=1.5"], "fraction must be in"),
        (["name=train", "fraction=0.5"], "would replace the split"),
        (["name=t", "speakers=LIST"], "not in mini train"),
        (["name=t", "split=test", "fraction=0.5"], "no split 'test'"),
    ],
)
def test_bad_arguments_get_one_line(corpus_dir, tmp_path, capsys, args, words):
    listing = tmp_path / "list.txt"
    listing.write_text("# a list of another corpus\nnobody\n")
    args = [a.replace("LIST", str(listing)) for a in args]
    with pytest.raises(SystemExit) as stop:
        prepare(["subset", f"src={corpus_dir}", *args])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and words in err[0]
