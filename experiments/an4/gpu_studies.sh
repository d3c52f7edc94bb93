#!/usr/bin/env bash
# The AN4 studies trained on one GPU, each a set of recipe folders (recipes/an4/run.py) run side by side.
#
#   AN4=DIR KATHLEEN=DIR bash experiments/an4/gpu_studies.sh STUDY [OUTDIR]     # from the repository root
#   SHORT=1 ...: 10 fine-tuning steps and 100 dev utterances, a quick check of the script
#
# AN4 and KATHLEEN name the corpora's folders (default: $USMKIT_CORPORA/an4 and /kathleen; only `pool17` and
# `pool17_more` read Kathleen). Each folder trains, then decodes (GPU forward, lexicon search on the CPU cores)
# and writes its report to exp/an4_gpu/STUDY/NAME/an4.json; a rerun skips what is recorded and resumes stopped
# runs, so a study may be cut into calls (`timeout SECONDS bash ...`). OUTDIR (default exp/an4_gpu/STUDY/out)
# receives the reports, the GPU's name and the tail of every log. 3 fine-tuning seeds in every folder. Studies,
# and the result files they feed (experiments/an4/README.md):
#
# pool17 (an4_gpu_pool17.json): BEST-RQ, 1 codebook, on AN4 train + Kathleen train/dev audio (1.7 h),
#   pre-training seeds 0 and 1, 3000 steps of 200-s batches, then
#   cb1   CTC on all AN4 train labels from both encoders
#   las   joint CTC/LAS (CTC weight 0.7) from the seed-0 encoder, all labels
#   l10   CTC on the 10% list (recipes/an4/lists/train_10.txt) from the seed-0 encoder
#   l10f  the same with the encoder frozen for the first 500 steps and at half the learning rate after
#   l30   CTC on the 30% list from the seed-0 encoder
# pool17_more (an4_gpu_pool17.json), from pool17's seed-0 encoder (run pool17 first):
#   s10   CTC from scratch on the 10% list
#   l10g  the 10% row frozen for 1000 steps, then at a quarter of the learning rate
#   lsp   the las row with 0.9/1.0/1.1 speed perturbation (features on the fly)
# narrowband (an4_narrowband_copies.json, an4_labels10_fp32_h200.json), AN4 only; every run of nb0, nb1, las0, lnb
# and lnb4 is also scored on test_tel (test through a telephone line: 3.4 kHz, mu-law):
#   nb0   CTC from scratch
#   nb1   the same on train and its 8 kHz-channel copy (--narrowband-copies)
#   s10f  CTC from scratch on the 10% list in fp32 (no bf16 autocast)
#   las0  joint CTC/LAS from a BEST-RQ encoder pre-trained here (1 codebook, 1000 x 100 s on AN4 train audio)
#   lnb   las0 with --narrowband-copies
#   lnb4  lnb trained 4000 steps (as many passes over the wideband half as las0's 2000 over train)
# narrowband4000 (an4_narrowband_copies.json), AN4 only, also on test_tel:
#   nb4   nb1 trained 4000 steps
#   s4    nb0 trained 4000 steps (the same budget without the copies)
# las4000 (an4_narrowband_copies.json), from narrowband's las0 encoder (run narrowband first):
#   las4  las0 trained 4000 steps (lnb4 without the copies)
# synth_pool (an4_synth_pool.json; builds the synthesizer's English corpus, 7.8 h), AN4 only; on the 10% list
# with the encoder frozen 500 steps, then at half the rate:
#   syn   BEST-RQ (1 codebook, 1000 x 100 s) on AN4 train audio + the synthetic corpus, pre-training seed 0
#   an    the same on AN4 train audio only
#   s10   CTC from scratch on the 10% list
#   syn100  syn's encoder fine-tuned on all the labels (the default schedule)
# synth_pool_seed1 (an4_synth_pool.json): syn1, an1: syn and an from pre-training seed 1
# masking_size (an4_masking_size.json), AN4 only, each on the 10% list with the frozen start:
#   an    as in synth_pool (masked spans start at 1% of the frames, task.bestrq.mask_prob=0.01)
#   mk2   an at 2%;  mk05  an at 0.5%
#   big   an with a d256 x 12 encoder (20M parameters against tiny's 1.65M), both stages at lr 5e-4
#   bigs  the d256 x 12 encoder from scratch on the 10% list, lr 5e-4
# masking_more (an4_masking_size.json): mk4 (an at 4%) and mk21 (mk2 from pre-training seed 1)
set -u
STUDIES="pool17 pool17_more narrowband narrowband4000 las4000 synth_pool synth_pool_seed1 masking_size masking_more"
STUDY=${1:-}
case " $STUDIES " in
  *" $STUDY "*) [ -n "$STUDY" ] ;;
  *) echo "error: unknown study '$STUDY': one of $STUDIES (listed at the top of $0)" >&2; exit 2 ;;
esac
ROOT=exp/an4_gpu
G=$ROOT/$STUDY
OUTDIR=$(realpath -m "${2:-$G/out}")
AN4=${AN4:-${USMKIT_CORPORA:?set AN4 and KATHLEEN, or USMKIT_CORPORA}/an4}
KATHLEEN=${KATHLEEN:-${USMKIT_CORPORA:-.}/kathleen}
mkdir -p "$G" "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUTDIR/gpu.txt" 2>/dev/null

SHORT_ARGS=(${SHORT:+--finetune-steps 10 --dev-utterances 100})
COMMON=(--an4 "$AN4" --pool an4 --device auto --workers 1 --ensembles "" --save-encoder "" "${SHORT_ARGS[@]}")
recipe() {  # recipe NAME ARGS...: train, then decode and report, into $G/NAME
  local name=$1; shift
  python3 recipes/an4/run.py --train-only --out $G/$name "${COMMON[@]}" "$@" > $G/$name.train.log 2>&1 &&
    python3 recipes/an4/run.py --decode-only --out $G/$name "${COMMON[@]}" "$@" --report $G/$name/an4.json \
      > $G/$name.decode.log 2>&1
}
args() { local v="ARGS_$1[@]"; printf '%s\0' "${!v}"; }
run_recipe() { local name=$1; local -a a; mapfile -d '' a < <(args "$name"); recipe "$name" "${a[@]}"; }
after_encoder() {  # after_encoder NAME RECORD: prepare NAME's data, wait for RECORD (an encoder's step record), run it
  local name=$1 record=$2; local -a a; mapfile -d '' a < <(args "$name")
  python3 recipes/an4/run.py prepare --out $G/$name "${COMMON[@]}" "${a[@]}" > $G/$name.prepare.log 2>&1
  until [ -f "$record" ]; do sleep 5; done
  run_recipe "$name"
}
tel_eval() {  # tel_eval NAME: every run of $G/NAME also on test_tel, once
  local name=$1 run settings
  [ -f $G/$name/data/an4/an4_cuts_test_tel.jsonl.gz ] ||
    python3 -m usmkit.cli.prepare bandlimit src=$G/$name/data/an4 split=test channel=telephone > $G/$name.tel.log 2>&1
  for d in $G/$name/decode/*/lexicon_tuning_dev.json; do
    run=$(basename "$(dirname "$d")")
    [ -f $G/$name/decode/$run/ctc_lexicon_tel.json ] && continue  # already scored
    settings=$(python3 -c "import sys; sys.path.insert(0, 'recipes/an4'); from pathlib import Path; from run import chosen_lexicon; print(*(f'{k}={v}' for k, v in chosen_lexicon(Path(sys.argv[1])).items()))" "$d")
    for decode in ctc_greedy ctc_lexicon; do
      # shellcheck disable=SC2086
      python3 -m usmkit.cli.evaluate checkpoint=$G/$name/runs/$run device=auto 'test_sets=[test_tel]' decode=$decode \
        $([ $decode = ctc_lexicon ] && echo $settings) output=$G/$name/decode/$run/${decode}_tel.json >> $G/$name.tel.log 2>&1
    done
  done
}

# The recipe folders' arguments.
POOL17=(--an4 "$AN4" --kathleen "$KATHLEEN" --pool an4,kathleen --device auto --workers 1 --ensembles "" --save-encoder ""
        "${SHORT_ARGS[@]}")
ENC17=$ROOT/pool17/cb1/runs/bestrq_cb1_p0
ARGS_cb1=(--variants cb1 --pretrain-seeds 0,1 --pretrain-steps 3000 --pretrain-max-duration 200 --jobs 8)
ARGS_las=(--stage1 cb1=$ENC17 --variants las --las-from cb1 --jobs 3)
ARGS_l10=(--stage1 cb1=$ENC17 --variants cb1 --labels 10 --jobs 3)
ARGS_l10f=("${ARGS_l10[@]}" --extra optim.freeze_encoder_steps=500 optim.encoder_lr_scale=0.5)
ARGS_l30=(--stage1 cb1=$ENC17 --variants cb1 --labels 30 --jobs 3)
ARGS_l10g=(--stage1 cb1=$ENC17 --variants cb1 --labels 10 --jobs 3
           --extra optim.freeze_encoder_steps=1000 optim.encoder_lr_scale=0.25)
ARGS_lsp=(--stage1 cb1=$ENC17 --variants las --las-from cb1 --speed-perturb --workers 2 --jobs 6)
ARGS_s10=(--variants scratch --labels 10 --jobs 3)
ENC_LAS0=$ROOT/narrowband/las0/runs/bestrq_cb1_p0
ARGS_nb0=(--variants scratch --jobs 3)
ARGS_nb1=(--variants scratch --narrowband-copies --jobs 3)
ARGS_s10f=(--variants scratch --labels 10 --jobs 3 --extra trainer.precision=fp32)
ARGS_las0=(--variants las --las-from cb1 --pretrain-seeds 0 --pretrain-steps 1000 --jobs 3)
ARGS_lnb=(--stage1 cb1=$ENC_LAS0 --variants las --las-from cb1 --narrowband-copies --jobs 3)
ARGS_lnb4=("${ARGS_lnb[@]}" --finetune-steps 4000)
ARGS_nb4=(--variants scratch --narrowband-copies --jobs 3 --finetune-steps 4000)
ARGS_s4=(--variants scratch --jobs 3 --finetune-steps 4000)
ARGS_las4=(--stage1 cb1=$ENC_LAS0 --variants las --las-from cb1 --jobs 3 --finetune-steps 4000)
PRE=(--labels 10 --pretrain-steps 1000 --freeze-encoder-steps 500 --encoder-lr-scale 0.5 --jobs 3)
SYN=(--pool an4,synth --synth-size english --variants cb1 "${PRE[@]}")
AN=(--pool an4 --variants cb1 "${PRE[@]}")
ARGS_syn=("${SYN[@]}" --pretrain-seeds 0)
ARGS_an=("${AN[@]}" --pretrain-seeds 0)
ARGS_syn100=(--stage1 cb1=$G/syn/runs/bestrq_cb1_p0 --variants cb1 --jobs 3)
ARGS_syn1=("${SYN[@]}" --pretrain-seeds 1)
ARGS_an1=("${AN[@]}" --pretrain-seeds 1)
ARGS_mk2=("${ARGS_an[@]}" --pretrain-extra task.bestrq.mask_prob=0.02)
ARGS_mk05=("${ARGS_an[@]}" --pretrain-extra task.bestrq.mask_prob=0.005)
ARGS_mk4=("${ARGS_an[@]}" --pretrain-extra task.bestrq.mask_prob=0.04)
ARGS_mk21=("${ARGS_an1[@]}" --pretrain-extra task.bestrq.mask_prob=0.02)
BIG=(--model small --model-overrides "{num_layers: 12}" --finetune-lr 5e-4)
ARGS_big=("${ARGS_an[@]}" "${BIG[@]}" --pretrain-lr 5e-4)
ARGS_bigs=(--variants scratch --labels 10 --jobs 3 "${BIG[@]}")

case $STUDY in
  pool17)
    COMMON=("${POOL17[@]}")
    (run_recipe cb1 && run_recipe l30) &
    for name in las l10 l10f; do after_encoder $name $ROOT/pool17/cb1/steps/bestrq_cb1_p0.json & done ;;
  pool17_more)
    COMMON=("${POOL17[@]}")
    for name in s10 l10g lsp; do run_recipe $name & done ;;
  narrowband)
    for name in nb0 nb1 las0; do (run_recipe $name && tel_eval $name) & done
    run_recipe s10f &
    for name in lnb lnb4; do (after_encoder $name $G/las0/steps/bestrq_cb1_p0.json && tel_eval $name) & done ;;
  narrowband4000)
    for name in nb4 s4; do (run_recipe $name && tel_eval $name) & done ;;
  las4000) run_recipe las4 & ;;
  synth_pool)
    for name in syn an s10; do run_recipe $name & done
    after_encoder syn100 $G/syn/steps/bestrq_cb1_p0.json & ;;
  synth_pool_seed1) for name in syn1 an1; do run_recipe $name & done ;;
  masking_size) for name in an mk2 mk05 big bigs; do run_recipe $name & done ;;
  masking_more) for name in mk4 mk21; do run_recipe $name & done ;;
esac
wait

cd $G && tar czf "$OUTDIR/reports.tgz" --ignore-failed-read */an4.json */steps *.log */logs */runs/*/metrics.jsonl \
  */decode/*/*_tel.json 2>/dev/null
for f in *.log; do echo "== $f"; tail -n 4 "$f"; done
