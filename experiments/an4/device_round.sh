#!/usr/bin/env bash
# The AN4 studies of issue 44 on one lent GPU machine, in calls of at most 10 minutes that resume each other.
#
#   bash experiments/an4/device_round.sh SECONDS OUTDIR
#
# Reads .carry/an4 (AN4: train audio Opus 32 kbit/s, the dev speakers and test FLAC) and .carry/kathleen
# (Opus 24 kbit/s), installs the wheels in .whl, and runs five recipe folders under exp/g (kept on the machine
# while it stays warm; a rerun skips what is recorded and resumes stopped runs):
#   cb1   BEST-RQ, 1 codebook, on AN4 train + Kathleen train/dev audio (1.7 h), pre-training seeds 0 and 1,
#         3000 steps of 200-s batches; CTC on all AN4 train labels from both encoders, 3 seeds each
#   las   joint CTC/LAS (CTC weight 0.7) from the seed-0 encoder, all labels, 3 seeds
#   l10   CTC on the 10% list (recipes/an4/lists/train_10.txt) from the seed-0 encoder, 3 seeds
#   l10f  the same with the encoder frozen for the first 500 steps and at half the learning rate after
#   l30   CTC on the 30% list from the seed-0 encoder, 3 seeds (after cb1's fine-tuning)
# With ROUND=3 (AN4 only: .carry/an4), 3 seeds each:
#   nb0   CTC from scratch (the GPU twin of the default row)
#   nb1   the same on train and its 8 kHz-channel copy (--narrowband-copies)
#   s10f  CTC from scratch on the 10% list in fp32 (no bf16 autocast)
#   las0  joint CTC/LAS from a BEST-RQ encoder pre-trained here (1 codebook, 1000 x 100 s on AN4 train audio)
#   lnb   las0 with --narrowband-copies
#   lnb4  lnb trained 4000 steps (as many passes over the wideband half as las0's 2000 over train)
# and every run of nb0, nb1, las0, lnb and lnb4 also on test_tel (test through a telephone line: 3.4 kHz, mu-law).
# With ROUND=4 (AN4 only), 3 seeds each, also on test_tel:
#   nb4   nb1 trained 4000 steps
#   s4    nb0 trained 4000 steps (the same budget without the copies)
# With ROUND=6 (AN4 only, the synthetic corpus built there: .whl also needs experiments/an4/synth_wheels.sh's
# wheels), 3 seeds each, fine-tuned on the 10% list with the encoder frozen 500 steps, then at half the rate:
#   syn   BEST-RQ (1 codebook, 1000 x 100 s) on AN4 train audio + the synthesizer's English corpus (7.8 h)
#   an    the same on AN4 train audio only (the same machine's pool without the synthetic speech)
#   s10   CTC from scratch on the 10% list
#   syn100  syn's encoder fine-tuned on all the labels (the default schedule)
# With ROUND=7, syn and an from a second pre-training seed (syn1, an1; NAMES=syn1: only that one)
# With ROUND=8 (AN4 only), an again (its pre-training curves) and with its masking and model size varied, 3 seeds
# each on the 10% list, frozen start:
#   mk2   an with masked spans starting at 2% of the frames (task.bestrq.mask_prob=0.02; an: 0.01)
#   mk05  an at 0.5%
#   big   an with a d256 x 12 encoder (20M parameters against tiny's 1.65M), pre-training and fine-tuning
#         at lr 5e-4 (an4_d256x12.json's)
#   bigs  the d256 x 12 encoder from scratch on the 10% list, lr 5e-4
# With ROUND=9, the masking further (mk4: 4%) and mk2 from a second pre-training seed (mk21)
# With ROUND=5, on the machine of round 3 (its encoder in exp/g/las0):
#   las4  las0 trained 4000 steps (lnb4 without the copies); its runs come back as OUTDIR/las4_<run>.tar
# With ROUND=2, from the seed-0 encoder that round 1 returned (copied to .carry/encoder_p0), 3 seeds each:
#   s10   CTC from scratch on the 10% list (the GPU twin of the CPU rows)
#   l10g  the 10% row frozen for 1000 steps, then at a quarter of the learning rate
#   lsp   the las row with 0.9/1.0/1.1 speed perturbation (features on the fly); its runs also come back
#         as OUTDIR/lsp_<run>.tar (decodable elsewhere when the deadline comes first; so do las0's and lnb's)
# Each folder trains, then decodes (GPU forward, lexicon search on the CPU cores) and reports; after SECONDS
# everything still running is stopped. OUTDIR receives the reports, the seed-0 encoder and a tail of the logs.
set -u
SECONDS_LEFT=${1:?seconds}
OUTDIR=${2:?outdir}
T0=$(date +%s)
mkdir -p "$OUTDIR"
if [ -z "${NO_INSTALL:-}" ]; then  # NO_INSTALL=1: the packages are there (a local try of the script)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
    exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUTDIR/gpu.txt"

G=exp/g
ENC=$G/cb1/runs/bestrq_cb1_p0
COMMON=(--an4 .carry/an4 --kathleen .carry/kathleen --pool an4,kathleen --device auto --workers 1
        --ensembles "" --save-encoder "" ${SHORT:+--finetune-steps 10 --dev-utterances 100})  # SHORT=1: a local try
recipe() {  # recipe NAME ARGS...: train, then decode and report, into exp/g/NAME
  local name=$1; shift
  python3 recipes/an4/run.py --train-only --out $G/$name "${COMMON[@]}" "$@" > $G/$name.train.log 2>&1 &&
    python3 recipes/an4/run.py --decode-only --out $G/$name "${COMMON[@]}" "$@" --report $G/$name/an4.json \
      > $G/$name.decode.log 2>&1
}
mkdir -p $G
ARGS_cb1=(--variants cb1 --pretrain-seeds 0,1 --pretrain-steps ${PRETRAIN_STEPS:-3000} --pretrain-max-duration 200 --jobs 8)
ARGS_las=(--stage1 cb1=$ENC --variants las --las-from cb1 --jobs 3)
ARGS_l10=(--stage1 cb1=$ENC --variants cb1 --labels 10 --jobs 3)
ARGS_l10f=("${ARGS_l10[@]}" --extra optim.freeze_encoder_steps=500 optim.encoder_lr_scale=0.5)
ARGS_l30=(--stage1 cb1=$ENC --variants cb1 --labels 30 --jobs 3)
args() { local v="ARGS_$1[@]"; printf '%s\0' "${!v}"; }
run_recipe() { local name=$1; local -a a; mapfile -d '' a < <(args "$name"); recipe "$name" "${a[@]}"; }

tel_eval() {  # tel_eval NAME: every run of exp/g/NAME also on test_tel (another narrowband channel), once
  local name=$1 run settings
  [ -f $G/$name/data/an4/an4_cuts_test_tel.jsonl.gz ] ||
    python3 -m usmkit.cli.prepare bandlimit src=$G/$name/data/an4 split=test channel=telephone > $G/$name.tel.log 2>&1
  for d in $G/$name/decode/*/lexicon_tuning_dev.json; do
    run=$(basename "$(dirname "$d")")
    [ -f $G/$name/decode/$run/ctc_lexicon_tel.json ] && continue  # scored before this call
    settings=$(python3 -c "import sys; sys.path.insert(0, 'recipes/an4'); from pathlib import Path; from run import chosen_lexicon; print(*(f'{k}={v}' for k, v in chosen_lexicon(Path(sys.argv[1])).items()))" "$d")
    for decode in ctc_greedy ctc_lexicon; do
      # shellcheck disable=SC2086
      python3 -m usmkit.cli.evaluate checkpoint=$G/$name/runs/$run device=auto 'test_sets=[test_tel]' decode=$decode \
        $([ $decode = ctc_lexicon ] && echo $settings) output=$G/$name/decode/$run/${decode}_tel.json >> $G/$name.tel.log 2>&1
    done
  done
}

if [ "${ROUND:-1}" -ge 3 ]; then
  # AN4 audio only (.carry/an4); a BEST-RQ encoder of the first kind (1000 x 100 s on AN4 train audio)
  COMMON=(--an4 .carry/an4 --pool an4 --device auto --workers 1 --ensembles "" --save-encoder ""
          ${SHORT:+--finetune-steps 10 --dev-utterances 100})
  ENC=$G/las0/runs/bestrq_cb1_p0
  ARGS_nb0=(--variants scratch --jobs 3)
  ARGS_nb1=(--variants scratch --narrowband-copies --jobs 3)
  ARGS_s10f=(--variants scratch --labels 10 --jobs 3 --extra trainer.precision=fp32)
  ARGS_las0=(--variants las --las-from cb1 --pretrain-seeds 0 --pretrain-steps ${PRETRAIN_STEPS:-1000} --jobs 3)
  ARGS_lnb=(--stage1 cb1=$ENC --variants las --las-from cb1 --narrowband-copies --jobs 3)
  ARGS_lnb4=("${ARGS_lnb[@]}" --finetune-steps ${LNB4_STEPS:-4000})
  ARGS_nb4=(--variants scratch --narrowband-copies --jobs 3 --finetune-steps ${NB4_STEPS:-4000})
  ARGS_s4=(--variants scratch --jobs 3 --finetune-steps ${NB4_STEPS:-4000})
  ARGS_las4=(--stage1 cb1=$ENC --variants las --las-from cb1 --jobs 3 --finetune-steps ${NB4_STEPS:-4000})
fi
if [ "${ROUND:-1}" -ge 6 ]; then  # .whl also holds experiments/an4/synth_wheels.sh's wheels
  PRE=(--labels 10 --pretrain-steps ${PRETRAIN_STEPS:-1000} --freeze-encoder-steps 500 --encoder-lr-scale 0.5 --jobs 3)
  SYN=(--pool an4,synth --synth-size ${SYNTH_SIZE:-english} --variants cb1 "${PRE[@]}")
  AN=(--pool an4 --variants cb1 "${PRE[@]}")
  ARGS_syn=("${SYN[@]}" --pretrain-seeds 0)
  ARGS_an=("${AN[@]}" --pretrain-seeds 0)
  ARGS_s10=(--variants scratch --labels 10 --jobs 3)
  ARGS_syn100=(--stage1 cb1=$G/syn/runs/bestrq_cb1_p0 --variants cb1 --jobs 3)
  ARGS_syn1=("${SYN[@]}" --pretrain-seeds 1)
  ARGS_an1=("${AN[@]}" --pretrain-seeds 1)
  ARGS_mk2=("${ARGS_an[@]}" --pretrain-extra task.bestrq.mask_prob=0.02)
  ARGS_mk05=("${ARGS_an[@]}" --pretrain-extra task.bestrq.mask_prob=0.005)
  BIG=(--model small --model-overrides "{num_layers: 12}" --finetune-lr 5e-4)
  ARGS_big=("${ARGS_an[@]}" "${BIG[@]}" --pretrain-lr 5e-4)
  ARGS_bigs=(--variants scratch --labels 10 --jobs 3 "${BIG[@]}")
  ARGS_mk4=("${ARGS_an[@]}" --pretrain-extra task.bestrq.mask_prob=0.04)
  ARGS_mk21=("${ARGS_an1[@]}" --pretrain-extra task.bestrq.mask_prob=0.02)
fi
if [ "${ROUND:-1}" = 9 ]; then
  for name in mk4 mk21; do run_recipe $name & done
elif [ "${ROUND:-1}" = 8 ]; then
  for name in an mk2 mk05 big bigs; do run_recipe $name & done
elif [ "${ROUND:-1}" = 7 ]; then
  for name in ${NAMES:-syn1 an1}; do run_recipe $name & done
elif [ "${ROUND:-1}" = 6 ]; then
  for name in syn an s10; do run_recipe $name & done
  (
    mapfile -d '' a < <(args syn100)
    python3 recipes/an4/run.py prepare --out $G/syn100 "${COMMON[@]}" "${a[@]}" > $G/syn100.prepare.log 2>&1
    until [ -f $G/syn/steps/bestrq_cb1_p0.json ]; do sleep 5; done
    run_recipe syn100
  ) &
elif [ "${ROUND:-1}" = 5 ]; then  # on the machine that ran round 3 (its encoder in exp/g/las0)
  for name in las4; do run_recipe $name & done
elif [ "${ROUND:-1}" = 4 ]; then
  for name in nb4 s4; do (run_recipe $name && tel_eval $name) & done
elif [ "${ROUND:-1}" = 3 ]; then
  for name in nb0 nb1 las0; do (run_recipe $name && tel_eval $name) & done
  run_recipe s10f &
  for name in lnb lnb4; do
    (
      mapfile -d '' a < <(args $name)
      python3 recipes/an4/run.py prepare --out $G/$name "${COMMON[@]}" "${a[@]}" > $G/$name.prepare.log 2>&1
      until [ -f $G/las0/steps/bestrq_cb1_p0.json ]; do sleep 5; done
      run_recipe $name && tel_eval $name
    ) &
  done
elif [ "${ROUND:-1}" = 2 ]; then
  ENC=.carry/encoder_p0
  ARGS_s10=(--variants scratch --labels 10 --jobs 3)
  ARGS_l10g=(--stage1 cb1=$ENC --variants cb1 --labels 10 --jobs 3
             --extra optim.freeze_encoder_steps=1000 optim.encoder_lr_scale=0.25)
  ARGS_lsp=(--stage1 cb1=$ENC --variants las --las-from cb1 --speed-perturb --workers 2 --jobs 6)
  for name in s10 l10g lsp; do run_recipe $name & done
else
(
  run_recipe cb1
  run_recipe l30
) &
(
  # the others start from the seed-0 encoder once its record is written; their data is prepared meanwhile
  for name in las l10 l10f l30; do
    mapfile -d '' a < <(args $name)
    python3 recipes/an4/run.py prepare --out $G/$name "${COMMON[@]}" "${a[@]}" > $G/$name.prepare.log 2>&1 &
  done
  wait
  until [ -f $G/cb1/steps/bestrq_cb1_p0.json ]; do sleep 5; done
  python3 -c "import sys; sys.path.insert(0, 'recipes/an4'); from run import save_encoder; from pathlib import Path; save_encoder(Path('$ENC'), Path('$G/encoder_p0'))"
  for name in las l10 l10f; do run_recipe $name & done
  wait
) &
fi

while [ $(( $(date +%s) - T0 )) -lt "$SECONDS_LEFT" ] && [ -n "$(jobs -r)" ]; do sleep 5; done
pkill -TERM -f "recipes/an4/run.py" ; pkill -TERM -f "usmkit.cli" ; sleep 8
pkill -KILL -f "usmkit.cli" ; true

# what comes back: the reports, the seed-0 encoder, where each run stands
cd $G && tar czf "$OUTDIR/reports.tgz" --ignore-failed-read */an4.json */steps *.log */logs */runs/*/metrics.jsonl \
  */decode/*/*_tel.json 2>/dev/null
[ -d encoder_p0 ] && tar cf "$OUTDIR/encoder_p0.tar" encoder_p0
exported=0
for f in lsp/steps/las_s*.json las4/steps/las_s*.json lnb4/steps/las_s*.json lnb/steps/las_s*.json las0/steps/las_p*_s*.json; do
  [ -f "$f" ] && [ $exported -lt 5 ] || continue  # what comes back: at most 8 files, 64 MiB
  dir=$(dirname "$(dirname "$f")")
  [ -f "$dir/an4.json" ] && continue  # decoded here: its report came back
  run=$(basename "$f" .json)
  (cd ../.. && python3 -c "import sys; sys.path.insert(0, 'recipes/an4'); from run import export_run; from pathlib import Path; export_run(Path('$G/$dir/runs/$run'), Path('$G/export/$dir/$run'))") &&
    tar cf "$OUTDIR/${dir}_$run.tar" -C "export/$dir" "$run" && exported=$((exported + 1))
done
for f in *.log; do echo "== $f"; tail -n 4 "$f"; done
echo "elapsed $(( $(date +%s) - T0 )) s"
