"""The AN4 recipe's report: each run's dev and test scores, read back from the decode stage's files, their mean
+- sample standard deviation per variant and decoding, the ensembles apart."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from settings import NARROWBAND, Settings, decodes_of, ensembles_of, runs_of  # recipes/an4/settings.py

from usmkit.recipes.steps import now

# lexicon_rescore (``las`` runs): the lexicon decoder's n-best, with the lexicon settings chosen on dev, rescored by the
# attention decoder; the lexicon score's share of the combined score is chosen on dev among these.
RESCORE_WEIGHTS = (0.3, 0.5, 0.7, 0.9)


def chosen_rescore(out: Path) -> tuple[float, float]:
    """The rescoring weight with the lowest dev WER (the first of equals) and that WER, from the dev files in ``out``."""
    dev = {
        w: json.loads((out / f"lexicon_rescore_dev_w{w}.json").read_text())["sets"]["dev"]["wer"]
        for w in RESCORE_WEIGHTS
    }
    best = min(RESCORE_WEIGHTS, key=dev.__getitem__)
    return best, dev[best]


def chosen_lexicon(tuning_json: Path) -> dict[str, Any]:
    best = json.loads(tuning_json.read_text())["best"]
    return {f"lexicon.{k}": best[k] for k in ("order", "lm_weight", "word_score")}


# ---------------------------------------------------------------- report
def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def scores(s: Settings, name: str, decode: str) -> dict[str, Any] | None:
    """dev and test WER (test CER) of one model and decoding from the decode stage's files; None if missing."""
    folder = s.out / "decode" / name
    if decode == "ctc_lexicon":
        tuning, test = _read(folder / "lexicon_tuning_dev.json"), _read(folder / "ctc_lexicon.json")
        if tuning is None or test is None:
            return None
        lexicon = {k: tuning["best"][k] for k in ("order", "lm_weight", "word_score")}
        return {"dev_wer": tuning["best"]["wer"], **_test(test), "lexicon": lexicon}
    if decode == "lexicon_rescore":
        test = _read(folder / "lexicon_rescore.json")
        if test is None:
            return None
        weight, dev_wer = chosen_rescore(folder)
        return {"dev_wer": dev_wer, **_test(test), "rescore_ctc_weight": weight}
    result = _read(folder / f"{decode}.json")
    return None if result is None else {"dev_wer": result["sets"]["dev"]["wer"], **_test(result)}


def _test(result: dict) -> dict[str, float]:
    """test WER and CER, and test_8k's WER where it was scored."""
    sets = result["sets"]
    narrowband = {"test_8k_wer": sets[NARROWBAND]["wer"]} if NARROWBAND in sets else {}
    return {"test_wer": sets["test"]["wer"], "test_cer": sets["test"]["cer"], **narrowband}


def mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1; None for one value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def build_report(s: Settings, command: str = "") -> dict[str, Any]:
    """Rows per run and decoding, their mean +- sd per variant and decoding, ensembles apart."""
    rows, ensembles, missing = [], [], []
    for run in runs_of(s):
        for decode in decodes_of(run.variant):
            found = scores(s, run.name, decode)
            if found is None:
                missing.append(f"{run.name} {decode}")
                continue
            rows.append(
                {"variant": run.variant, "seed": run.seed, "pretrain_seed": run.pretrain_seed, "run": run.name,
                 "decode": decode, **found, "finetune_steps": _last_step(s.runs_dir / run.name)}
            )  # fmt: skip
    for name, members in ensembles_of(s).items():
        for decode in ("ctc_greedy", "ctc_lexicon"):
            found = scores(s, name, decode)
            if found is None:
                missing.append(f"{name} {decode}")
                continue
            variant = members[0].variant
            ensembles.append({"variant": variant, "members": [r.name for r in members], "decode": decode, **found})
    summary = []
    for variant in s.variants:
        for decode in decodes_of(variant):
            group = [r for r in rows if r["variant"] == variant and r["decode"] == decode]
            if not group:
                continue
            dev, dev_sd = mean_sd([r["dev_wer"] for r in group])
            test, test_sd = mean_sd([r["test_wer"] for r in group])
            row = {"variant": variant, "decode": decode, "runs": len(group), "dev_wer_mean": dev,
                   "dev_wer_sd": dev_sd, "test_wer_mean": test, "test_wer_sd": test_sd}  # fmt: skip
            if all("test_8k_wer" in r for r in group):
                row["test_8k_wer_mean"], row["test_8k_wer_sd"] = mean_sd([r["test_8k_wer"] for r in group])
            summary.append(row)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(s).items()}
    return {
        "recipe": "recipes/an4/run.py",
        "command": command,
        "date": now(),
        "settings": settings,
        "test_configurations": len(rows) + len(ensembles),
        "summary": summary,
        "rows": rows,
        "ensembles": ensembles,
        "missing": missing,
    }


def _last_step(exp: Path) -> int | None:
    """The last step a run logged in its ``metrics.jsonl`` (below trainer.max_steps when max_minutes stopped it)."""
    metrics = exp / "metrics.jsonl"
    if not metrics.is_file():
        return None
    return max(
        (json.loads(line).get("step", 0) for line in metrics.read_text().splitlines() if line.strip()), default=0
    )


def print_report(report: dict[str, Any]) -> None:
    def pm(mean: float, sd: float | None) -> str:
        return f"{100 * mean:6.2f} +- {100 * sd:5.2f}" if sd is not None else f"{100 * mean:6.2f}         "

    print(f"\n{'variant':<8} {'decode':<12} {'runs':>4}  {'dev WER %':<15} {'test WER %':<15} {'test_8k WER %':<15}")
    for r in report["summary"]:
        dev, test = pm(r["dev_wer_mean"], r["dev_wer_sd"]), pm(r["test_wer_mean"], r["test_wer_sd"])
        narrowband = pm(r["test_8k_wer_mean"], r["test_8k_wer_sd"]) if "test_8k_wer_mean" in r else ""
        print(f"{r['variant']:<8} {r['decode']:<12} {r['runs']:>4}  {dev} {test} {narrowband}")
    if report["ensembles"]:
        print("\nensembles (all runs of a variant as one model):")
        for e in report["ensembles"]:
            print(
                f"{e['variant']:<8} {e['decode']:<12} {len(e['members']):>4}  {pm(e['dev_wer'], None)} {pm(e['test_wer'], None)}"
            )
    if report["missing"]:
        print(f"\nnot decoded yet: {', '.join(report['missing'])}")
    print(f"\n{report['test_configurations']} configurations scored on test, once each")
