"""Prepare the two multilingual prompt corpora from Debian's packages and record their counts.

    apt-get download asterisk-core-sounds-{en,es,fr,it,ru}-wav asterisk-core-sounds-{en,es,fr,it,ru} \
        fillets-ng-data-cs fillets-ng-data-nl fillets-ng-data      # in DEBS
    PYTHONPATH=. python experiments/multilingual/corpora.py --debs DEBS --out data

runs ``python -m usmkit.cli.prepare asterisk`` and ``... fillets`` into ``--out`` and writes
``results/corpora.json``: each corpus's ``corpus.json`` (per language: audio files, used, hours, left out by
kind, unreadable, per split utterances, hours and distinct texts; the packages and their versions) under the run
header, the packages named by file, not by local path. Counts only: no audio, no text.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench.common import result_path, run_header, write_result

CORPORA = ("asterisk", "fillets")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debs", type=Path, required=True, help="the folder `apt-get download ...` wrote to")
    parser.add_argument("--out", type=Path, default=Path("data"), help="corpus folders go to OUT/asterisk, OUT/fillets")
    parser.add_argument("--num-jobs", type=int, default=2)
    args = parser.parse_args()
    corpora = {}
    for corpus in CORPORA:
        folder = args.out / corpus
        cmd = [sys.executable, "-m", "usmkit.cli.prepare", corpus, f"out={folder}", f"debs={args.debs}"]
        subprocess.run([*cmd, f"num_jobs={args.num_jobs}"], check=True)
        summary = json.loads((folder / "corpus.json").read_text(encoding="utf-8"))
        for package in summary["packages"]:
            package["source"] = Path(package["source"]).name
        corpora[corpus] = summary
    path = write_result(result_path(__file__), {**run_header(), "corpora": corpora})
    for corpus, summary in corpora.items():
        for language, row in summary["languages"].items():
            splits = ", ".join(f"{s} {v['utterances']}" for s, v in row["splits"].items())
            print(
                f"{corpus} {language}: {row['audio_files']} files, {row['used']} used, {row['hours']:.3f} h ({splits})"
            )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
