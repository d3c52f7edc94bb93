#!/usr/bin/env bash
# The BEST-RQ low-label study on the lent GPU: builds the embedded corpus there, prepares features,
# then runs bench/bestrq_study.py with the paper's codebooks (16 x 8192) and a longer pre-training
# than the CPU allows. usage (device): bash bench/sweeps/bestrq_gpu.sh OUTDIR [study args...]
set -eu
OUTDIR=$1; shift
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
python3 -m usmkit.data.synth out=data/synth size=default workers=16 > "$OUTDIR/corpus.log" 2>&1
rm -rf exp/prep_ctc exp/prep_ssl
M=(model=tiny "model.overrides={subsampling_channels: 32}" trainer.max_steps=1 trainer.progress=false)
python3 -m usmkit.train recipe=stage3_ctc "${M[@]}" trainer.eval_every=1 trainer.exp_dir=exp/prep_ctc > "$OUTDIR/prep.log" 2>&1
if [[ " $* " != *" --pretrain-split train "* ]]; then
  python3 -m usmkit.train recipe=stage1 "${M[@]}" trainer.eval_every=0 trainer.exp_dir=exp/prep_ssl >> "$OUTDIR/prep.log" 2>&1
fi
echo "prepared at $(date +%T)"
rm -rf exp/study
timeout ${STUDY_TIMEOUT:-500} python3 bench/bestrq_study.py "$@" > "$OUTDIR/study.log" 2>&1 || echo "study exit $?"
tail -8 "$OUTDIR/study.log"
cp bench/results/bestrq_study.json "$OUTDIR/" || true
