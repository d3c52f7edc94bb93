import pytest

from usmkit.config import ConfigError, TrainConfig, from_dict, to_dict


def test_round_trip_defaults():
    cfg = TrainConfig()
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg


def test_nested_values_are_typed():
    cfg = from_dict(TrainConfig, {"optim": {"lr": 1, "betas": [0.8, 0.9]}, "model": {"chunk_size": None}})
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.betas == (0.8, 0.9)
    assert cfg.model.chunk_size is None


def test_unknown_key_names_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['max_step'\] in trainer; valid keys: .*max_steps"):
        from_dict(TrainConfig, {"trainer": {"max_step": 3}})


def test_wrong_type_and_literal_are_rejected():
    with pytest.raises(ConfigError, match="trainer.max_steps"):
        from_dict(TrainConfig, {"trainer": {"max_steps": "many"}})
    with pytest.raises(ConfigError, match="task.kind"):
        from_dict(TrainConfig, {"task": {"kind": "rnnt"}})


def test_tokenizer_path_follows_the_type_unless_given():
    from pathlib import Path

    from usmkit.config import tokenizer_path

    corpus = {"data": {"manifest_dir": "data/fsdd"}}
    assert tokenizer_path(from_dict(TrainConfig, corpus)) == Path("data/fsdd/tokenizer/tokenizer.model")
    bpe = from_dict(TrainConfig, {**corpus, "tokenizer_type": "bpe"})
    assert tokenizer_path(bpe) == Path("data/fsdd/tokenizer_bpe/tokenizer.model")  # beside, not over, the unigram one
    given = from_dict(TrainConfig, {**corpus, "tokenizer_type": "bpe", "tokenizer": "exp/tok/tokenizer.model"})
    assert tokenizer_path(given) == Path("exp/tok/tokenizer.model")
    with pytest.raises(ConfigError, match="tokenizer_type"):
        from_dict(TrainConfig, {"tokenizer_type": "word"})
