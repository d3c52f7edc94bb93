"""The user-facing commands, end to end on a tiny synthesized corpus, one scenario per test: train, resume,
evaluate (greedy, lexicon, averaged checkpoints, ensembles), the pinned losses of the recipe, DDP."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

FAST = [
    "model=tiny",
    "model.overrides={d_model: 64, num_layers: 2, num_heads: 2}",
    "data.max_duration=20",
    "data.num_workers=0",
    "trainer.log_every=1",
    "trainer.progress=false",
    "optim.warmup_steps=2",
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(
    args: list[str], cwd: Path, check: bool = True, module: str = "usmkit.cli.train"
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{module} {args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


@pytest.fixture(scope="module")
def corpus(synth_corpus) -> Path:
    return synth_corpus  # tests/conftest.py: python -m usmkit.cli.prepare synth size=tiny seed=0


def _losses(exp: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (exp / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def _train_args(corpus: Path, exp: Path, *extra: str) -> list[str]:
    return [
        "recipe=stage3_ctc",
        f"data.manifest_dir={corpus}",
        f"trainer.exp_dir={exp}",
        "optim.schedule=constant",
        *FAST,
        *extra,
    ]


def _evaluate(tmp_path: Path, checkpoint: str, out: Path, *extra: str) -> dict:
    _run(
        [f"checkpoint={checkpoint}", "test_sets=[test]", f"output={out}", *extra],
        tmp_path,
        module="usmkit.cli.evaluate",
    )
    return json.loads(out.read_text())


# Scenario fixtures: one 6-step run stopped after step 3 and resumed, one uninterrupted, both built once.


@pytest.fixture(scope="module")
def resumed_run(corpus, tmp_path_factory) -> Path:
    """Trained 3 steps (dev eval and a checkpoint at step 3), then resumed to step 6 with ``resume=true``."""
    cwd = tmp_path_factory.mktemp("resumed")
    exp = cwd / "exp"
    _run(_train_args(corpus, exp, "trainer.max_steps=3", "trainer.eval_every=3", "trainer.save_every=3"), cwd)
    assert (exp / "checkpoints" / "step-000003" / "model.safetensors").is_file()
    _run(
        _train_args(corpus, exp, "trainer.max_steps=6", "trainer.eval_every=0", "trainer.save_every=3", "resume=true"),
        cwd,
    )
    return exp


@pytest.fixture(scope="module")
def uninterrupted_run(corpus, tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("uninterrupted")
    exp = cwd / "exp"
    _run(_train_args(corpus, exp, "trainer.max_steps=6", "trainer.eval_every=0", "trainer.save_every=3"), cwd)
    return exp


@pytest.fixture(scope="module")
def greedy_eval(resumed_run, tmp_path_factory) -> dict:
    cwd = tmp_path_factory.mktemp("eval")
    proc = _run(
        [f"checkpoint={resumed_run}", "test_sets=[test]", f"output={cwd / 'eval.json'}"],
        cwd,
        module="usmkit.cli.evaluate",
    )
    assert "WER" in proc.stdout
    return json.loads((cwd / "eval.json").read_text())["sets"]["test"]


# The recipe's losses, pinned (as torchtune's recipe tests pin theirs): a change to the model, the data
# pipeline, the tokenizer or the optimizer that moves them shows here. Regenerate them, when the change
# is intended, from the failure message (it prints the new values). Produced by
#   python -m usmkit.cli.prepare synth out=data/synth_tiny size=tiny seed=0 external_engines=false
#   OMP_NUM_THREADS=1 python -m usmkit.cli.train recipe=stage3_ctc data.manifest_dir=data/synth_tiny optim.schedule=constant \
#       <FAST> trainer.max_steps=6 trainer.eval_every=0 trainer.save_every=3
PINNED_LOSSES = {
    1: 760.61669921875,
    2: 411.7982177734375,
    3: 115.7652359008789,
    4: 138.81446838378906,
    5: 169.41629028320312,
    6: 242.4856719970703,
}


def test_stage3_ctc_losses_match_pinned_values(uninterrupted_run):
    losses = _losses(uninterrupted_run)
    assert losses == pytest.approx(PINNED_LOSSES, rel=1e-4), f"losses now {losses}"


def test_checkpoints_every_save_every_steps(resumed_run):
    for step in (3, 6):
        assert (resumed_run / "checkpoints" / f"step-{step:06d}" / "model.safetensors").is_file()


def test_rerun_without_resume_refuses_to_overwrite(corpus, resumed_run, tmp_path):
    again = _run(_train_args(corpus, resumed_run, "trainer.max_steps=6"), tmp_path, check=False)
    assert again.returncode != 0 and "resume=true" in again.stderr + again.stdout


def test_resumed_run_matches_uninterrupted_run(resumed_run, uninterrupted_run):
    """Steps 4..6 after a resume equal an uninterrupted run's (sampler, RNG and optimizer restored)."""
    resumed, uninterrupted = _losses(resumed_run), _losses(uninterrupted_run)
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(uninterrupted[step], rel=1e-5), step


def test_evaluate_reports_wer_and_error_counts(greedy_eval):
    assert greedy_eval["utterances"] > 0 and 0 <= greedy_eval["cer"] and greedy_eval["rtf"] > 0
    assert {"wer", "substitutions", "deletions", "insertions"} <= set(greedy_eval)


def test_lexicon_decoding_spells_only_training_words(corpus, resumed_run, greedy_eval, tmp_path):
    from usmkit.data.manifests import load_cuts

    lex = _evaluate(tmp_path, str(resumed_run), tmp_path / "eval_lexicon.json", "decode=ctc_lexicon")
    assert lex["lexicon"]["order"] == 1 and lex["sets"]["test"]["utterances"] == greedy_eval["utterances"]
    train_words = {w for c in load_cuts(corpus, "train") for s in c.supervisions for w in s.text.split()}
    for example in lex["sets"]["test"]["examples"]:
        assert set(example["hyp"].split()) <= train_words


def test_a_run_carries_its_lexicon_and_lm(corpus, resumed_run):
    """``exp/lexicon/``: the tokens, lexicon and unigram LM of the training transcripts, what ``--lexicon``
    decodes with from any folder (``usmkit.training.run_lexicon``)."""
    from usmkit.data.manifests import load_cuts

    folder = resumed_run / "lexicon"
    assert {p.name for p in folder.iterdir()} == {"tokens.txt", "lexicon.txt", "lm.arpa"}
    words = {line.split("\t")[0] for line in (folder / "lexicon.txt").read_text().splitlines() if line}
    train_words = {w for c in load_cuts(corpus, "train") for s in c.supervisions for w in s.text.split()}
    assert words == train_words


def test_averaged_checkpoint_is_a_checkpoint(resumed_run, greedy_eval, tmp_path):
    """The average of the last two checkpoints (steps 3 and 6) is a checkpoint evaluate takes."""
    avg = _run([str(resumed_run), "--last", "2"], tmp_path, module="usmkit.cli.average")
    assert "averaged steps 3,6" in avg.stdout
    res = _evaluate(tmp_path, f"{resumed_run}/checkpoints/avg-last2", tmp_path / "eval_avg.json")
    assert res["sets"]["test"]["utterances"] == greedy_eval["utterances"]


def test_ensemble_of_checkpoints(resumed_run, greedy_eval, tmp_path):
    ckpts = resumed_run / "checkpoints"
    ens = _evaluate(
        tmp_path, str(ckpts / "step-000003"), tmp_path / "eval_ensemble.json", f"ensemble=[{ckpts / 'step-000006'}]"
    )
    assert [Path(p).name for p in ens["ensemble"]] == ["step-000003", "step-000006"]
    assert ens["sets"]["test"]["utterances"] == greedy_eval["utterances"]


def test_bpe_tokenizer_travels_with_the_run(corpus, tmp_path):
    """tokenizer_type=bpe trains the corpus's BPE model beside its unigram one; the run keeps a copy,
    which evaluate uses: the corpus's tokenizer may be retrained (another sentencepiece version) later."""
    corpus = Path(shutil.copytree(corpus, tmp_path / "corpus"))  # this test changes its corpus
    exp = tmp_path / "bpe"
    args = ["recipe=stage3_ctc", f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", "tokenizer_type=bpe"]
    _run([*args, "trainer.max_steps=1", "trainer.eval_every=0", "trainer.save_every=1", *FAST], tmp_path)
    corpus_bpe = corpus / "tokenizer_bpe" / "tokenizer.model"
    assert corpus_bpe.is_file() and (exp / "tokenizer.model").read_bytes() == corpus_bpe.read_bytes()
    assert corpus_bpe.read_bytes() != (corpus / "tokenizer" / "tokenizer.model").read_bytes()
    corpus_bpe.unlink()  # gone from the corpus: evaluate finds the run's copy
    out_json = tmp_path / "eval.json"
    _run([f"checkpoint={exp}", "test_sets=[test]", f"output={out_json}"], tmp_path, module="usmkit.cli.evaluate")
    assert json.loads(out_json.read_text())["sets"]["test"]["utterances"] > 0


def test_bad_override_is_a_clear_error(corpus, tmp_path):
    proc = _run(["recipe=stage3_ctc", f"data.manifest_dir={corpus}", "+trainer.max_step=3"], tmp_path, check=False)
    assert proc.returncode != 0
    assert "max_step" in proc.stderr and "valid keys" in proc.stderr


def test_a_junk_tokenizer_file_is_one_line_naming_it(corpus, tmp_path):
    junk = tmp_path / "junk.model"
    junk.write_text("junk\n")
    proc = _run(_train_args(corpus, tmp_path / "exp", f"tokenizer={junk}"), tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"error: {junk} is not a sentencepiece model" in proc.stderr and "Traceback" not in proc.stderr


def test_a_ctc_run_whose_frame_rate_cannot_align_its_transcripts_is_refused(corpus, tmp_path):
    """Characters at 8x subsampling: most transcripts need more frames than 12.5 a second, and CTC would
    ignore them; the run stops before training and says what to change (usmkit.training.frame_budget)."""
    chars = ("vocab_size=300", f"tokenizer={tmp_path}/tok/tokenizer.model")  # letters, specials and bytes only
    proc = _run(_train_args(corpus, tmp_path / "exp", "model.subsampling_factor=8", *chars), tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "model.subsampling_factor=8 gives 12.5 encoder frames a second" in proc.stderr
    assert "Use model.subsampling_factor=4" in proc.stderr and "Traceback" not in proc.stderr


def test_torchrun_two_processes(corpus, tmp_path):
    exp = tmp_path / "ddp"
    args = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "usmkit.cli.train", "recipe=stage3_ctc", f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}",
        "trainer.max_steps=2", "trainer.eval_every=0", "trainer.save_every=2", "trainer.device=cpu", *FAST,
    ]  # fmt: skip
    proc = subprocess.run(args, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert (exp / "checkpoints" / "step-000002" / "model.safetensors").is_file()
    assert len(_losses(exp)) == 2  # only rank 0 logs


def test_ddp_is_released_before_the_process_group_is_destroyed(corpus, tmp_path, monkeypatch):
    """At the end of a DDP run nothing holds DDP's reducer when the process group is destroyed: were the
    reducer the group's last owner, the group's destructor would run holding the GIL and could hang the
    exit (gloo's threads take the GIL to release a finished collective's tensors)."""
    import gc

    import torch.distributed as dist
    from composed_config import train_config
    from torch.nn.parallel import DistributedDataParallel

    from usmkit.training.recipe import run

    cfg, yaml_text = train_config(
        *_train_args(corpus, tmp_path / "exp", "trainer.max_steps=2", "trainer.eval_every=0", "trainer.device=cpu")
    )
    alive_at_destroy = []
    destroy = dist.destroy_process_group

    def checked_destroy(*args, **kwargs):
        gc.collect()
        alive_at_destroy.append(sum(type(o) is DistributedDataParallel for o in gc.get_objects()))
        destroy(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", checked_destroy)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        summary = run(cfg, yaml_text)
    finally:
        if dist.is_initialized():
            destroy()
    assert summary["step"] == 2
    assert alive_at_destroy == [0]


def test_compiled_lengths_count_padded_lengths_and_refuse_unpadded_batches():
    from usmkit.config import TrainConfig, from_dict
    from usmkit.errors import UsageError
    from usmkit.training.recipe import compiled_lengths

    def cfg(**data):
        return from_dict(TrainConfig, {"trainer": {"compile": True}, "data": data})

    assert compiled_lengths(cfg(pad_to_frames=256, max_cut_duration=30.0)) == 12  # 3000 frames
    # speed perturbation at 0.9 stretches a 30 s cut to 33.3 s: 3334 frames
    assert (
        compiled_lengths(cfg(pad_to_frames=256, speed_perturb=[0.9, 1.0, 1.1], features={"precomputed": False})) == 14
    )
    with pytest.raises(UsageError, match="data.pad_to_frames"):
        compiled_lengths(cfg(pad_to_frames=0))
    # MOST's text lengths (its task refuses unpadded text: tests/test_tasks.py) compile as many graphs again
    most = {"trainer": {"compile": True}, "data": {"pad_to_frames": 256}, "task": {"kind": "most"}}
    most["task"]["most"] = {"pad_text_to": 64}
    assert compiled_lengths(from_dict(TrainConfig, most)) == 12  # as for audio alone


def test_init_ctc_head_only_from_a_run_with_the_same_tokenizer(tmp_path):
    from safetensors.torch import save_file

    from usmkit.config import TaskConfig
    from usmkit.data.tokenizer import Tokenizer, minimum_vocab_size
    from usmkit.models.presets import tiny
    from usmkit.tasks import build_task
    from usmkit.training.recipe import init_ctc_head

    texts = ["one two three", "four five six", "seven eight nine zero"]
    ours = Tokenizer.train(texts, tmp_path / "ours", vocab_size=minimum_vocab_size(texts))
    other = Tokenizer.train([t.upper() for t in texts], tmp_path / "other", vocab_size=minimum_vocab_size(texts))
    assert ours.vocab_size == other.vocab_size and ours.model_proto != other.model_proto

    def model(seed):
        torch.manual_seed(seed)
        return build_task(TaskConfig(kind="ctc"), tiny(input_dim=80), ours.vocab_size)

    src = tmp_path / "run" / "checkpoints" / "step-000001"
    src.mkdir(parents=True)
    save_file(model(1).state_dict(), str(src / "model.safetensors"))
    (tmp_path / "run" / "tokenizer.model").write_bytes(other.model_proto)
    target = model(2)
    assert init_ctc_head(target, src, ours) == []  # another tokenizer: its ids mean other pieces
    (tmp_path / "run" / "tokenizer.model").write_bytes(ours.model_proto)
    assert init_ctc_head(target, src, ours) == ["ctc.proj.bias", "ctc.proj.weight"]
    torch.testing.assert_close(target.ctc.proj.weight, model(1).ctc.proj.weight)


def test_exp_dir_holding_a_users_config_and_metrics_is_refused_in_one_line(corpus, tmp_path, capsys):
    """``trainer.exp_dir`` an existing folder that is not a usmkit experiment (its own
    config.yaml and metrics.jsonl) had its config replaced and its metrics rewritten; now one line, nothing
    written (no train.log either)."""
    from usmkit.cli.train import main

    user = tmp_path / "U"
    user.mkdir()
    (user / "config.yaml").write_text("batch: 32\nlr: 0.1\n")
    (user / "metrics.jsonl").write_text('{"epoch": 1, "accuracy": 0.91}\n{"epoch": 2, "accuracy": 0.93}\n')
    before = {p.name: p.read_bytes() for p in user.iterdir()}
    with pytest.raises(SystemExit) as e:
        main(
            [
                "recipe=stage3_ctc",
                *FAST,
                "trainer.max_steps=1",
                f"data.manifest_dir={corpus}",
                f"trainer.exp_dir={user}",
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert f"trainer.exp_dir={user} is a folder whose config.yaml or metrics.jsonl is not a training run's" in err[0]
    assert {p.name: p.read_bytes() for p in user.iterdir()} == before
