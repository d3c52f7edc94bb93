#!/usr/bin/env bash
# The wheels a lent GPU machine lacks to build the synthetic corpus (`python -m usmkit.cli.prepare synth`), into
# .whl beside the others (device_round.sh ROUND=6):
#
#   bash experiments/an4/synth_wheels.sh
#
# espeakng-loader (espeak-ng and its voices), wordfreq and its needs (ftfy and its wcwidth, langcodes, locate).
# wordfreq's wheel is 57 MB of word lists in 40 languages; the corpus reads those of its five
# (usmkit.data.synth.text.LANGUAGES), so the copy keeps only theirs (about 10 MB): a device call carries 64 MiB at most.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
get() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$1" "$2"
}
for p in espeakng-loader==0.2.4 ftfy==6.3.1 wcwidth==0.9.4 langcodes==3.5.1 locate==1.1.1; do get .whl "$p"; done
tmp=$(mktemp -d)
get "$tmp" wordfreq==3.1.1
langs=$(python3 -c "from usmkit.data.synth.text import LANGUAGES; print(' '.join(LANGUAGES))")
(
  cd "$tmp" && mkdir w && cd w && unzip -q ../wordfreq-*.whl
  for f in wordfreq/data/*; do
    keep=0
    for l in $langs; do case "$(basename "$f")" in *_"$l".*) keep=1 ;; esac; done
    [ $keep = 1 ] || rm "$f"
  done
  # the wheel's RECORD lists the removed files: pip checks only the files that are there
  zip -q -r ../wordfreq-3.1.1-py3-none-any.whl.new . && mv ../wordfreq-3.1.1-py3-none-any.whl.new ../wordfreq-3.1.1-py3-none-any.whl
)
mv "$tmp"/wordfreq-3.1.1-py3-none-any.whl .whl/
rm -rf "$tmp"
du -sh .whl
