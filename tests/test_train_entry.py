"""The user-facing commands, end to end on a tiny synthesized corpus: train, resume, evaluate, DDP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

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


def _run(args: list[str], cwd: Path, check: bool = True, module: str = "usmkit.train") -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{module} {args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    _run([f"out={out}", "size=tiny", "seed=0"], cwd=REPO, module="usmkit.data.synth")
    return out


def _losses(exp: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (exp / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def test_train_resume_evaluate(corpus, tmp_path):
    exp = tmp_path / "exp"
    common = [f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", "optim.schedule=constant", *FAST]
    _run(
        ["recipe=stage3_ctc", "trainer.max_steps=3", "trainer.eval_every=3", "trainer.save_every=3", *common], tmp_path
    )
    assert (exp / "checkpoints" / "step-000003" / "model.safetensors").is_file()

    # The same command again refuses to overwrite the run; resume=true continues it.
    again = _run(["recipe=stage3_ctc", "trainer.max_steps=6", *common], tmp_path, check=False)
    assert again.returncode != 0 and "resume=true" in again.stderr + again.stdout
    _run(
        [
            "recipe=stage3_ctc",
            "trainer.max_steps=6",
            "trainer.eval_every=0",
            "trainer.save_every=3",
            "resume=true",
            *common,
        ],
        tmp_path,
    )
    resumed = _losses(exp)

    # An uninterrupted run reaches the same losses at steps 4..6 (sampler, RNG and optimizer restored).
    ref = tmp_path / "ref"
    common_ref = [x if not x.startswith("trainer.exp_dir=") else f"trainer.exp_dir={ref}" for x in common]
    _run(
        ["recipe=stage3_ctc", "trainer.max_steps=6", "trainer.eval_every=0", "trainer.save_every=3", *common_ref],
        tmp_path,
    )
    uninterrupted = _losses(ref)
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(uninterrupted[step], rel=1e-5), step

    out_json = tmp_path / "eval.json"
    proc = _run([f"checkpoint={exp}", "test_sets=[test]", f"output={out_json}"], tmp_path, module="usmkit.evaluate")
    assert "WER" in proc.stdout
    res = json.loads(out_json.read_text())["sets"]["test"]
    assert res["utterances"] > 0 and 0 <= res["cer"] and res["rtf"] > 0
    assert {"wer", "substitutions", "deletions", "insertions"} <= set(res)

    # Lexicon + word-LM decoding: every word it prints is a word of the training transcripts.
    lex_json = tmp_path / "eval_lexicon.json"
    _run(
        [f"checkpoint={exp}", "test_sets=[test]", "decode=ctc_lexicon", f"output={lex_json}"],
        tmp_path,
        module="usmkit.evaluate",
    )
    lex = json.loads(lex_json.read_text())
    assert lex["lexicon"]["order"] == 1 and lex["sets"]["test"]["utterances"] == res["utterances"]
    from usmkit.data.manifests import load_cuts

    train_words = {w for c in load_cuts(corpus, "train") for s in c.supervisions for w in s.text.split()}
    for example in lex["sets"]["test"]["examples"]:
        assert set(example["hyp"].split()) <= train_words

    # The average of the last two checkpoints (steps 3 and 6) is a checkpoint evaluate takes.
    avg = _run([str(exp), "--last", "2"], tmp_path, module="usmkit.average")
    assert "averaged steps 3,6" in avg.stdout
    avg_json = tmp_path / "eval_avg.json"
    _run(
        [f"checkpoint={exp}/checkpoints/avg-last2", "test_sets=[test]", f"output={avg_json}"],
        tmp_path,
        module="usmkit.evaluate",
    )
    assert json.loads(avg_json.read_text())["sets"]["test"]["utterances"] == res["utterances"]

    # An ensemble of the step-3 and step-6 checkpoints: their CTC posteriors averaged.
    ens_json = tmp_path / "eval_ensemble.json"
    _run(
        [
            f"checkpoint={exp}/checkpoints/step-000003",
            f"ensemble=[{exp}/checkpoints/step-000006]",
            "test_sets=[test]",
            f"output={ens_json}",
        ],
        tmp_path,
        module="usmkit.evaluate",
    )
    ens = json.loads(ens_json.read_text())
    assert [Path(p).name for p in ens["ensemble"]] == ["step-000003", "step-000006"]
    assert ens["sets"]["test"]["utterances"] == res["utterances"]


def test_bpe_tokenizer_travels_with_the_run(corpus, tmp_path):
    """tokenizer_type=bpe trains the corpus's BPE model beside its unigram one; the run keeps a copy,
    which evaluate uses: the corpus's tokenizer may be retrained (another sentencepiece version) later."""
    exp = tmp_path / "bpe"
    args = ["recipe=stage3_ctc", f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", "tokenizer_type=bpe"]
    _run([*args, "trainer.max_steps=1", "trainer.eval_every=0", "trainer.save_every=1", *FAST], tmp_path)
    corpus_bpe = corpus / "tokenizer_bpe" / "tokenizer.model"
    assert corpus_bpe.is_file() and (exp / "tokenizer.model").read_bytes() == corpus_bpe.read_bytes()
    assert corpus_bpe.read_bytes() != (corpus / "tokenizer" / "tokenizer.model").read_bytes()
    corpus_bpe.unlink()  # gone from the corpus: evaluate finds the run's copy
    out_json = tmp_path / "eval.json"
    _run([f"checkpoint={exp}", "test_sets=[test]", f"output={out_json}"], tmp_path, module="usmkit.evaluate")
    assert json.loads(out_json.read_text())["sets"]["test"]["utterances"] > 0


def test_bad_override_is_a_clear_error(corpus, tmp_path):
    proc = _run(["recipe=stage3_ctc", f"data.manifest_dir={corpus}", "+trainer.max_step=3"], tmp_path, check=False)
    assert proc.returncode != 0
    assert "max_step" in proc.stderr and "valid keys" in proc.stderr


def test_torchrun_two_processes(corpus, tmp_path):
    exp = tmp_path / "ddp"
    args = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "usmkit.train", "recipe=stage3_ctc", f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}",
        "trainer.max_steps=2", "trainer.eval_every=0", "trainer.save_every=2", "trainer.device=cpu", *FAST,
    ]  # fmt: skip
    proc = subprocess.run(args, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert (exp / "checkpoints" / "step-000002" / "model.safetensors").is_file()
    assert len(_losses(exp)) == 2  # only rank 0 logs


def test_compiled_lengths_count_padded_lengths_and_refuse_unpadded_batches():
    from usmkit.config import TrainConfig, from_dict
    from usmkit.errors import UsageError
    from usmkit.train import compiled_lengths

    def cfg(**data):
        return from_dict(TrainConfig, {"trainer": {"compile": True}, "data": data})

    assert compiled_lengths(cfg(pad_to_frames=256, max_cut_duration=30.0)) == 12  # 3000 frames
    # speed perturbation at 0.9 stretches a 30 s cut to 33.3 s: 3334 frames
    assert (
        compiled_lengths(cfg(pad_to_frames=256, speed_perturb=[0.9, 1.0, 1.1], features={"precomputed": False})) == 14
    )
    with pytest.raises(UsageError, match="data.pad_to_frames"):
        compiled_lengths(cfg(pad_to_frames=0))
