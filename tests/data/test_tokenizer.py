"""The sentencepiece wrapper: fixed special ids, round trip, byte fallback, save/load, vocab-size rules."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import pytest

from usmkit.data.tokenizer import BLANK_ID, BOS_ID, EOS_ID, UNK_ID, Tokenizer, TokenizerFileError, minimum_vocab_size

WORDS = {
    "en": "the cat sat on a mat and the dog ran to the park with a red ball three seven one".split(),
    "de": "der hund lief in den park und die katze sass auf der grünen matte".split(),
    "fr": "le chat est sur le tapis et le chien court dans le parc à côté".split(),
}
TEXTS = [" ".join(random.Random(i).choices(words, k=8)) for words in WORDS.values() for i in range(60)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Tokenizer.train(TEXTS, tmp_path_factory.mktemp("tok"), vocab_size=320)


def test_files_and_special_ids(tokenizer: Tokenizer) -> None:
    assert tokenizer.path is not None and tokenizer.path.name == "tokenizer.model"
    assert tokenizer.path.with_suffix(".vocab").is_file()
    assert (tokenizer.blank_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    pieces = [tokenizer.id_to_piece(i) for i in (BLANK_ID, UNK_ID, BOS_ID, EOS_ID)]
    assert pieces == ["<blank>", "<unk>", "<s>", "</s>"]
    assert minimum_vocab_size(TEXTS) <= tokenizer.vocab_size <= 320


def test_round_trip_and_no_special_ids_emitted(tokenizer: Tokenizer) -> None:
    for text in TEXTS[::7]:
        ids = tokenizer.encode(text)
        assert ids and not {BLANK_ID, BOS_ID, EOS_ID, UNK_ID} & set(ids)
        assert all(0 <= i < tokenizer.vocab_size for i in ids)
        assert tokenizer.decode(ids) == text
    assert tokenizer.encode_batch(TEXTS[:3]) == [tokenizer.encode(t) for t in TEXTS[:3]]
    ids = tokenizer.encode(TEXTS[0])
    assert tokenizer.decode([BOS_ID, *ids, BLANK_ID, EOS_ID, -1, -1]) == TEXTS[0]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([tokenizer.vocab_size + 5])


def test_byte_fallback_spells_unseen_characters(tokenizer: Tokenizer) -> None:
    for text in ("straße", "the cat 🙂", "ελληνικά"):
        ids = tokenizer.encode(text)
        assert UNK_ID not in ids
        assert any(tokenizer.id_to_piece(i).startswith("<0x") for i in ids)  # byte pieces
        assert tokenizer.decode(ids) == text


def test_save_load_gives_same_ids(tokenizer: Tokenizer) -> None:
    for path in (tokenizer.path, tokenizer.path.parent):
        again = Tokenizer.load(path)
        assert again.vocab_size == tokenizer.vocab_size
        assert again.encode_batch(TEXTS[:20]) == tokenizer.encode_batch(TEXTS[:20])


def test_vocab_size_rules(tmp_path: Path) -> None:
    minimum = minimum_vocab_size(TEXTS)
    with pytest.raises(ValueError, match=f"pass vocab_size >= {minimum}"):
        Tokenizer.train(TEXTS, tmp_path / "small", vocab_size=256)
    with pytest.warns(UserWarning, match="fewer than the requested 5000"):
        big = Tokenizer.train(TEXTS, tmp_path / "big", vocab_size=5000)
    assert minimum <= big.vocab_size < 5000
    with pytest.raises(ValueError, match="no non-empty texts"):
        Tokenizer.train(["", "  "], tmp_path / "empty")
    with pytest.raises(ValueError, match="model_type"):
        Tokenizer.train(TEXTS, tmp_path / "x", model_type="word")


def test_bpe_and_missing_model(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bpe = Tokenizer.train(TEXTS, tmp_path / "bpe", vocab_size=300, model_type="bpe")
    assert bpe.decode(bpe.encode(TEXTS[1])) == TEXTS[1]
    with pytest.raises(FileNotFoundError, match="python -m usmkit.cli.prepare synth"):
        Tokenizer.load(tmp_path / "nowhere")


def test_bpe_gives_a_few_word_corpus_one_piece_per_word(tmp_path: Path) -> None:
    """FSDD's transcripts are ten words, each alone: BPE merges each into one piece (what the FSDD
    baseline trains on), where unigram's pieces for the same texts depend on the sentencepiece version."""
    digits = "zero one two three four five six seven eight nine".split()
    texts = [d for d in digits for _ in range(180)]  # FSDD's train split: 1800 utterances of one word
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fewer pieces than asked: expected for ten words
        bpe = Tokenizer.train(texts, tmp_path / "bpe", vocab_size=512, model_type="bpe")
    assert all(len(bpe.encode(d)) == 1 for d in digits)
    assert len(bpe.encode("ten")) > 1  # an unseen word is still spelled, from the pieces BPE kept


def test_a_vocabulary_too_small_for_the_texts_is_a_user_error(tmp_path):
    from usmkit.data.tokenizer import VocabularyError
    from usmkit.errors import UsageError

    with pytest.raises(VocabularyError, match=r"vocab_size=100 is too small .* pass vocab_size >= \d+") as err:
        Tokenizer.train(["hello world", "grüße"], tmp_path, vocab_size=100)
    assert isinstance(err.value, UsageError)  # the entry points print it as one error line, exit 2


def test_a_file_that_is_not_a_sentencepiece_model_is_named(tmp_path) -> None:
    """``tokenizer=`` a junk file: one line naming it (sentencepiece's ``RuntimeError`` was a traceback)."""
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model at all\n")
    with pytest.raises(TokenizerFileError, match=rf"^{junk} is not a sentencepiece model \(RuntimeError: .*ModelProto"):
        Tokenizer.load(junk)
