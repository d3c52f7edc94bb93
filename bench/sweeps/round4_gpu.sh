#!/usr/bin/env bash
# Issue 3, sweep round 4 on the lent GPU (fp32, so per-step curves are the CPU run's): 4 synthetic-corpus
# variants at the CPU budget's 2800 steps, selected on dev (seen voices) with lexicon decoding, and 4
# FSDD variants (speaker theo held out), among them fine-tuning from the synthetic-corpus model
# (58 espeak voices) instead of starting from scratch. All 8 train side by side on one GPU.
#   usage (device, carrying .whl and .carry): bash bench/sweeps/round4_gpu.sh OUTDIR
#   .carry/fsdd = a copy of ../shared/data/fsdd; .carry/synth_v2 = the committed synth baseline's
#   checkpoint (exp/synth_v2/checkpoints/step-002200: config.yaml + model.safetensors); rounds 21-23 carry
#   .carry/synth8_v1 (the CPU synth8 run's) and round 23 the two FSDD tokenizers (see there).
set -u
OUTDIR=${1:-/tmp/sweep_out}
mkdir -p "$OUTDIR"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
[[ ${ROUND:-4} != 5 ]] && rm -rf exp/sweep  # round 5 reused round 4's synth models (a warm machine)
[[ ${ROUND:-4} == 9 ]] && NEED_SYN=0 FS_DIRS="fsdd fsdd_sd100 fsdd_sd300"  # rounds 9-10: FSDD only
[[ ${ROUND:-4} -ge 10 && ${ROUND:-4} != 14 && ${ROUND:-4} -lt 18 ]] && NEED_SYN=0
[[ ${ROUND:-4} -ge 21 ]] && NEED_SYN=0  # rounds 21-23: fine-tuning only, from a carried encoder
rm -rf data/fsdd*
if [[ ${NEED_SYN:-1} == 1 ]]; then
  python3 -m usmkit.data.synth out=data/synth size=default workers=16 > "$OUTDIR/corpus.log" 2>&1
fi
for d in ${FS_DIRS:-fsdd}; do  # fsdd_sdN: N synthetic takes of every digit added to train
  takes=${d#fsdd_sd}; [[ $d == fsdd ]] && takes=0
  python3 -m usmkit.data.recipes.fsdd out=data/$d corpus_dir=.carry/fsdd synth_takes=$takes workers=8 >> "$OUTDIR/corpus.log" 2>&1 || { tail -20 "$OUTDIR/corpus.log"; exit 1; }
done
SYN=(recipe=stage3_ctc model=tiny data=synth data.manifest_dir=data/synth optim.warmup_steps=100
  trainer.precision=fp32 trainer.save_every=700 trainer.dev_max_batches=0 trainer.progress=false data.num_workers=1
  data.max_duration=50 trainer.max_steps=2800 trainer.eval_every=700 vocab_size=320
  tokenizer=exp/sweep/tok320/tokenizer.model optim.lr=2.5e-3 'model.overrides={subsampling_channels: 32}'
  data.spec_augment.time_masks=2 data.spec_augment.freq_width=15 model.dropout=0.1)
FS=(recipe=stage3_ctc model=tiny data=fsdd data.manifest_dir=data/fsdd trainer.precision=fp32
  data.max_duration=60 data.spec_augment.time_masks=2 data.spec_augment.freq_width=15 trainer.progress=false
  trainer.eval_every=200 trainer.save_every=200 data.num_workers=1 optim.warmup_steps=60)
if [[ ${ROUND:-4} -ge 18 ]]; then  # rounds 18 on: narrowband features (8 kHz, FSDD's own rate) for both stages
  SYN+=(data.features.sample_rate=8000); FS+=(data.features.sample_rate=8000)
  PRE_RUN="Q8"  # a synth encoder trained first, on the corpus resampled to 8 kHz: it learns the cues below 4 kHz, all FSDD has
  PRE_SPEC="SYN task.inter_ctc_weight=0.3"
  FT="trainer.max_steps=1200 optim.lr=5e-4 data.speaker_mean_norm=true init_from=exp/sweep/Q8 'model.overrides={subsampling_channels: 32}'"
  if [[ ${ROUND:-4} -ge 21 ]]; then  # rounds 21-23 start from the CPU run's 8 kHz encoder (bench/baseline_wer.py synth8),
    # carried as .carry/synth8_v1/checkpoints/step-002200 (its config.yaml and model.safetensors), not from a Q8 of their own
    unset PRE_RUN
    FT=${FT/init_from=exp\/sweep\/Q8/init_from=.carry/synth8_v1/checkpoints/step-002200}
  fi
fi
# Features (train, dev and test), stats and tokenizers once: parallel runs would race on the caches.
prep_fs() {  # manifest directory under data/
  python3 -m usmkit.train "${FS[@]}" data.manifest_dir=data/$1 trainer.max_steps=1 trainer.eval_every=1 trainer.exp_dir=exp/sweep/prep_$1 &&
  python3 -m usmkit.evaluate checkpoint=exp/sweep/prep_$1 test_sets=[test] output=exp/sweep/prep_$1/eval.json
}
{ if [[ ${NEED_SYN:-1} == 1 ]]; then
    python3 -m usmkit.train "${SYN[@]}" trainer.max_steps=1 trainer.eval_every=1 trainer.exp_dir=exp/sweep/prep_syn &&
    python3 -m usmkit.evaluate checkpoint=exp/sweep/prep_syn test_sets=[test] output=exp/sweep/prep_syn/eval.json || exit 1
  fi
  pids=(); for d in ${FS_DIRS:-fsdd}; do prep_fs $d & pids+=($!); done
  for p in "${pids[@]}"; do wait $p || exit 1; done; } > "$OUTDIR/prep.log" 2>&1 || { tail -30 "$OUTDIR/prep.log"; exit 1; }
echo "prepared at $(date +%T)"
INIT="init_from=.carry/synth_v2/checkpoints/step-002200 'model.overrides={subsampling_channels: 32}'"
if [[ ${ROUND:-4} == 23 ]]; then  # round 23: the FSDD tokenizer: characters (sentencepiece 0.2.3's unigram) vs words (BPE)
# The GPU sweeps trained FSDD's tokenizer with the device's sentencepiece 0.2.2, whose unigram model spells 9 of the 10
# digits as one piece each; this CPU's 0.2.3 spells them in characters (the CPU baselines). Both carried, 8 seeds each.
declare -A RUNS=()
for i in 0 1 2 3 4 5 6 7; do
  RUNS[F8chr_s$i]="FS $FT tokenizer=.carry/tok_fsdd_char/tokenizer.model trainer.seed=$i"
  RUNS[F8bpe_s$i]="FS $FT tokenizer=.carry/tok_fsdd_bpe/tokenizer.model trainer.seed=$i"
done
ENSEMBLES="3 5 8"
ENSEMBLE_PREFIXES="F8chr_s F8bpe_s"
elif [[ ${ROUND:-4} == 22 ]]; then  # round 22: round 21's seeds 0-7 again, their last checkpoints sent back (members_*.tgz)
declare -A RUNS=()
for i in 0 1 2 3 4 5 6 7; do RUNS[F8g_s$i]="FS $FT trainer.seed=$i"; done
ENSEMBLES="5 8"
ENSEMBLE_PREFIXES="F8g_s"
EXPORT_MEMBERS="F8g_s"  # to score these GPU-trained members on another machine (the CPU), as on the GPU
elif [[ ${ROUND:-4} == 21 ]]; then  # round 21: the CPU baseline's own 8 kHz encoder, seeds 0-7 (as on the CPU) and 8-15; last vs best-by-dev
declare -A RUNS=()
for i in 0 1 2 3 4 5 6 7; do RUNS[F8cpu_s$i]="FS $FT trainer.seed=$i"; RUNS[F8cpub_s$i]="FS $FT trainer.seed=$((8 + i))"; done
ENSEMBLES="3 5 8"
ENSEMBLE_PREFIXES="F8cpu_s F8cpub_s"
BEST_TOO=1  # also each run's best checkpoint by dev WER (what an experiment directory resolves to), alone and ensembled
elif [[ ${ROUND:-4} == 20 ]]; then  # round 20: 8 more narrowband seeds; ensembles of the 3 best on dev (seen speakers)
declare -A RUNS=()
for i in 0 1 2 3 4 5 6 7; do RUNS[F8e_s$i]="FS $FT trainer.seed=$((20 + i))"; done
ENSEMBLES="3 8"
ENSEMBLE_PREFIXES="F8e_s"
DEV_SELECT="3"  # also: the ensemble of the 3 seeds with the lowest dev WER (ties: lower seed)
elif [[ ${ROUND:-4} == 19 ]]; then  # round 19: round 18 again (a new Q8) with 9 other seeds, as three ensembles of 3
declare -A RUNS=()
for i in 0 1 2; do
  RUNS[F8b_s$i]="FS $FT trainer.seed=$((8 + i))"; RUNS[F8c_s$i]="FS $FT trainer.seed=$((11 + i))"
  RUNS[F8d_s$i]="FS $FT trainer.seed=$((14 + i))"
done
ENSEMBLES="3"
ENSEMBLE_PREFIXES="F8b_s F8c_s F8d_s"
elif [[ ${ROUND:-4} == 18 ]]; then  # round 18: a synth encoder trained on 8 kHz features, then FSDD seeds from it
declare -A RUNS=()
for seed in 0 1 2 3 4 5 6 7; do RUNS[F8_s$seed]="FS $FT trainer.seed=$seed"; done
ENSEMBLES="3 5 8"
ENSEMBLE_PREFIXES="F8_s"
elif [[ ${ROUND:-4} == 17 ]]; then  # round 17: per-speaker mean and variance normalization (CMVN), 8 seeds, ensembles
FT="trainer.max_steps=1200 optim.lr=5e-4 $INIT data.speaker_mean_norm=true data.speaker_var_norm=true"
declare -A RUNS=()
for seed in 0 1 2 3 4 5 6 7; do RUNS[F_cmvn_s$seed]="FS $FT trainer.seed=$seed"; done
ENSEMBLES="3 5 8"
ENSEMBLE_PREFIXES="F_cmvn_s"
elif [[ ${ROUND:-4} == 16 ]]; then  # round 16: the encoder frozen for the first 200 steps / at 0.3 x lr, 3 seeds each
FT="trainer.max_steps=1200 optim.lr=5e-4 $INIT data.speaker_mean_norm=true"
declare -A RUNS=()
for seed in 0 1 2; do
  RUNS[F_fz_s$seed]="FS $FT optim.freeze_encoder_steps=200 trainer.seed=$seed"
  RUNS[F_els_s$seed]="FS $FT optim.encoder_lr_scale=0.3 trainer.seed=$seed"
done
for seed in 0 1; do RUNS[F_fzels_s$seed]="FS $FT optim.freeze_encoder_steps=200 optim.encoder_lr_scale=0.3 trainer.seed=$seed"; done
ENSEMBLES="3"
ENSEMBLE_PREFIXES="F_fz_s F_els_s"
elif [[ ${ROUND:-4} == 15 ]]; then  # round 15: FSDD from the CPU synth_v2 vs synth_v7 encoders, 4 seeds each, ensembles
FT="trainer.max_steps=1200 optim.lr=5e-4 data.speaker_mean_norm=true 'model.overrides={subsampling_channels: 32}'"
declare -A RUNS=()
for seed in 0 1 2 3; do
  RUNS[F_v2_s$seed]="FS $FT init_from=.carry/synth_v2/checkpoints/step-002200 trainer.seed=$seed"
  RUNS[F_v7_s$seed]="FS $FT init_from=.carry/synth_v7/checkpoints/step-002200 trainer.seed=$seed"
done
ENSEMBLES="4"
ENSEMBLE_PREFIXES="F_v2_s F_v7_s"
elif [[ ${ROUND:-4} == 14 ]]; then  # round 14: a synth encoder trained with per-speaker CMN first, then FSDD seeds from it
PRE_RUN="Q_spk"  # trained (and evaluated) before the others, which start from it
PRE_SPEC="SYN task.inter_ctc_weight=0.3 data.speaker_mean_norm=true"
FT="trainer.max_steps=1200 optim.lr=5e-4 data.speaker_mean_norm=true init_from=exp/sweep/Q_spk 'model.overrides={subsampling_channels: 32}'"
declare -A RUNS=()
for seed in 0 1 2 3 4 5; do RUNS[F_spk_s$seed]="FS $FT trainer.seed=$seed"; done
ENSEMBLES="3 6"
elif [[ ${ROUND:-4} == 13 ]]; then  # round 13: round 12 with each seed's last 5 checkpoints averaged, ensembles of those
FT="trainer.max_steps=1200 optim.lr=5e-4 $INIT data.speaker_mean_norm=true trainer.save_every=100 trainer.keep_last=12"
declare -A RUNS=()
for seed in 0 1 2 3 4 5 6 7; do RUNS[F_spk_s$seed]="FS $FT trainer.seed=$seed"; done
AVG="5"
ENSEMBLES="3 5 8"
ENSEMBLE_MEMBER="avg-last5"
elif [[ ${ROUND:-4} == 12 ]]; then  # round 12: 8 seeds of per-speaker CMN fine-tuning, and their CTC ensembles
FT="trainer.max_steps=1200 optim.lr=5e-4 $INIT data.speaker_mean_norm=true"
declare -A RUNS=()
for seed in 0 1 2 3 4 5 6 7; do RUNS[F_spk_s$seed]="FS $FT trainer.seed=$seed"; done
ENSEMBLES="3 5 8"  # members: the first N seeds
elif [[ ${ROUND:-4} == 11 ]]; then  # round 11: per-speaker mean normalization (data.speaker_mean_norm) on FSDD
FT="trainer.max_steps=1200 optim.lr=5e-4 $INIT"
SPK="data.speaker_mean_norm=true"
declare -A RUNS=(
  [F_s2]="FS $FT trainer.seed=2"
  [F_spk_s0]="FS $FT $SPK trainer.seed=0"
  [F_spk_s1]="FS $FT $SPK trainer.seed=1"
  [F_spk_s2]="FS $FT $SPK trainer.seed=2"
  [F_spk_ng_s0]="FS $FT $SPK data.gain_db=0 trainer.seed=0"
  [F_spk_ng_s1]="FS $FT $SPK data.gain_db=0 trainer.seed=1"
  [F_spk_n_s0]="FS $FT $SPK 'data.noise_snr_db=[5,30]' trainer.seed=0"
  [F_spk_scratch]="FS trainer.max_steps=1200 optim.lr=2e-3 $SPK"
)
elif [[ ${ROUND:-4} == 10 ]]; then  # round 10: background noise (data.noise_snr_db) in FSDD fine-tuning
FT="trainer.max_steps=1200 optim.lr=5e-4 $INIT"
N="'data.noise_snr_db=[5,30]'"
declare -A RUNS=(
  [F_s0]="FS $FT trainer.seed=0"
  [F_s1]="FS $FT trainer.seed=1"
  [F_n_s0]="FS $FT $N trainer.seed=0"
  [F_n_s1]="FS $FT $N trainer.seed=1"
  [F_n_s2]="FS $FT $N trainer.seed=2"
  [F_n0_s0]="FS $FT 'data.noise_snr_db=[0,20]' data.noise_prob=0.7 trainer.seed=0"
  [F_n0_s1]="FS $FT 'data.noise_snr_db=[0,20]' data.noise_prob=0.7 trainer.seed=1"
  [F_n_cmn_s0]="FS $FT $N data.utterance_mean_norm=true trainer.seed=0"
)
elif [[ ${ROUND:-4} == 9 ]]; then  # round 9: synthetic digit takes (espeak voices) mixed into FSDD fine-tuning
FT="trainer.max_steps=1200 optim.lr=5e-4 $INIT"
declare -A RUNS=(
  [F_s0]="FS $FT trainer.seed=0"
  [F_s1]="FS $FT trainer.seed=1"
  [F_sd100_s0]="FS $FT data.manifest_dir=data/fsdd_sd100 trainer.seed=0"
  [F_sd100_s1]="FS $FT data.manifest_dir=data/fsdd_sd100 trainer.seed=1"
  [F_sd100_s2]="FS $FT data.manifest_dir=data/fsdd_sd100 trainer.seed=2"
  [F_sd300_s0]="FS $FT data.manifest_dir=data/fsdd_sd300 trainer.seed=0"
  [F_sd300_s1]="FS $FT data.manifest_dir=data/fsdd_sd300 trainer.seed=1"
  [F_sd300_scratch]="FS trainer.max_steps=1200 optim.lr=2e-3 data.manifest_dir=data/fsdd_sd300"
)
elif [[ ${ROUND:-4} == 8 ]]; then  # round 8: intermediate CTC (task.inter_ctc_weight) on both corpora, 3 seeds each
IC="task.inter_ctc_weight=0.3"
declare -A RUNS=(
  [Q_ic_s0]="SYN $IC trainer.seed=0"
  [Q_ic_s1]="SYN $IC trainer.seed=1"
  [Q_ic_s2]="SYN $IC trainer.seed=2"
  [Q_ic5_s0]="SYN task.inter_ctc_weight=0.5 trainer.seed=0"
  [F_ic_s0]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT $IC"
  [F_ic_s1]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT $IC trainer.seed=1"
  [F_ic_s2]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT $IC trainer.seed=2"
  [F_ic5_s0]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT task.inter_ctc_weight=0.5"
)
elif [[ ${ROUND:-4} == 7 ]]; then  # round 7: checkpoint averaging (usmkit.average) over seeds; FSDD speed perturbation
AVG="5 10"
SAVE_SYN="trainer.save_every=200 trainer.keep_last=14"
SAVE_FS="trainer.save_every=100 trainer.keep_last=12"
SPEED="'data.speed_perturb=[0.85,0.9,1.0,1.1,1.15]' data.features.precomputed=false"
declare -A RUNS=(
  [Q_s0]="SYN trainer.seed=0 $SAVE_SYN"
  [Q_s1]="SYN trainer.seed=1 $SAVE_SYN"
  [Q_s2]="SYN trainer.seed=2 $SAVE_SYN"
  [F_s0]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT $SAVE_FS"
  [F_s1]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT $SAVE_FS trainer.seed=1"
  [F_sp_s0]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT $SAVE_FS $SPEED"
  [F_sp_s1]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT $SAVE_FS $SPEED trainer.seed=1"
  [F_sp_s2]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT $SAVE_FS $SPEED trainer.seed=2"
)
elif [[ ${ROUND:-4} == 6 ]]; then  # round 6: seed variance and the conv kernel (synth); FSDD fine-tuning lr, length, SpecAugment, seed
declare -A RUNS=(
  [Q_s1]="SYN trainer.seed=1"
  [Q_k15]="SYN +model.overrides.conv_kernel=15"
  [Q_s2]="SYN trainer.seed=2"
  [F_lr5_2000]="FS trainer.max_steps=2000 optim.lr=5e-4 $INIT"
  [F_lr3_1200]="FS trainer.max_steps=1200 optim.lr=3e-4 $INIT"
  [F_lr5_sa]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT data.spec_augment.time_masks=5 data.spec_augment.freq_width=27"
  [F_lr5_s1]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT trainer.seed=1"
  [F_lr5_s2]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT trainer.seed=2"
)
elif [[ ${ROUND:-4} == 5 ]]; then  # round 5: the three synth runs that failed in round 4, and FSDD fine-tuning variants
declare -A RUNS=(
  [Q_s0]="SYN trainer.seed=0"
  [Q_s1]="SYN trainer.seed=1"
  [Q_k15]="SYN 'model.overrides={subsampling_channels: 32, conv_kernel: 15}'"
  [F_init1200_sa]="FS trainer.max_steps=1200 optim.lr=1e-3 $INIT data.spec_augment.time_masks=5 data.spec_augment.freq_width=27"
  [F_init2000]="FS trainer.max_steps=2000 optim.lr=1e-3 $INIT"
  [F_init1200_lr5]="FS trainer.max_steps=1200 optim.lr=5e-4 $INIT"
  [F_initQ1200]="FS trainer.max_steps=1200 optim.lr=1e-3 init_from=exp/sweep/Q_lr35 'model.overrides={subsampling_channels: 32}'"
)
else
declare -A RUNS=(
  [Q_s0]="SYN trainer.seed=0"
  [Q_s1]="SYN trainer.seed=1"
  [Q_k15]="SYN 'model.overrides={subsampling_channels: 32, conv_kernel: 15}'"
  [Q_lr35]="SYN optim.lr=3.5e-3"
  [F_scratch400]="FS trainer.max_steps=400 optim.lr=2e-3"
  [F_scratch1200]="FS trainer.max_steps=1200 optim.lr=2e-3"
  [F_init400]="FS trainer.max_steps=400 optim.lr=1e-3 $INIT"
  [F_init1200]="FS trainer.max_steps=1200 optim.lr=1e-3 $INIT"
)
fi
# Per run, in the background: train, then evaluate its last checkpoint and (round 7) the averages of its
# last N checkpoints, side by side; a run's evaluation starts as soon as it has trained.
summarize() {
python3 - "$OUTDIR" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for m in sorted(out.glob("*.metrics.jsonl")):
    name = m.name.split(".")[0]
    steps = [json.loads(l).get("step") for l in m.open() if "train/loss" in l]
    evals = [*out.glob(f"{name}.eval.json"), *out.glob(f"{name}.best.eval.json"), *sorted(out.glob(f"{name}.avg*.eval.json"))]
    if not evals:
        print(f"{name:14s} no eval ({steps[-1:]})"); continue
    for ev in evals:
        sets = json.loads(ev.read_text())["sets"]
        en = lambda s: sets[s].get("per_language", {}).get("en", sets[s])
        label = ev.name[: -len(".eval.json")]
        print(f"{label:14s} steps={steps[-1] if steps else '-'} dev wer={sets['dev']['wer']:.3f} dev_en={en('dev')['wer']:.3f} "
              f"test wer={sets['test']['wer']:.3f} test_en={en('test')['wer']:.3f}")
for ev in sorted(out.glob("ens*.eval.json")):  # ensembles: no metrics of their own
    sets = json.loads(ev.read_text())["sets"]
    print(f"{ev.name[:-len('.eval.json')]:14s} dev wer={sets['dev']['wer']:.3f} test wer={sets['test']['wer']:.3f}")
PY
for ens in "$OUTDIR"/ens*.eval.log; do [[ -e $ens && ! -e ${ens%.log}.json ]] && { echo "== $ens:"; tail -3 "$ens"; }; done
for name in "${!RUNS[@]}"; do grep -q "done:" "$OUTDIR/$name.log" 2>/dev/null || { echo "== $name failed:"; tail -4 "$OUTDIR/$name.log"; }; done
}
finish() {  # the summary and the tarball, also when the call's time limit stops the sweep
  trap - EXIT TERM
  for name in "${!RUNS[@]}"; do cp exp/sweep/$name/metrics.jsonl "$OUTDIR/$name.metrics.jsonl" 2>/dev/null; done
  cp exp/sweep/eval/*.eval.json "$OUTDIR/" 2>/dev/null
  summarize
  tar czf /tmp/sweep.tgz -C "$OUTDIR" . && rm -rf "${OUTDIR:?}"/* && mv /tmp/sweep.tgz "$OUTDIR/"
  if [[ -n ${EXPORT_MEMBERS:-} ]]; then  # two members per file: files come back at up to 16 MB each
    for pair in 0 2 4 6; do
      tar czf "$OUTDIR/members_$pair.tgz" exp/sweep/$EXPORT_MEMBERS$pair/checkpoints/step-001200/{config.yaml,model.safetensors} \
        exp/sweep/$EXPORT_MEMBERS$((pair + 1))/checkpoints/step-001200/{config.yaml,model.safetensors} \
        exp/sweep/$EXPORT_MEMBERS{$pair,$((pair + 1))}/feature_stats.safetensors
    done
  fi
}
run_one() {  # name base-array-name overrides...
  local name=$1 base=$2; shift 2
  eval "timeout 420 python3 -m usmkit.train \"\${$base[@]}\" $* trainer.exp_dir=exp/sweep/$name" > "$OUTDIR/$name.log" 2>&1
  local evals=("$name $(ls -d exp/sweep/$name/checkpoints/step-* 2>/dev/null | tail -1)")
  [[ -n ${BEST_TOO:-} && -e exp/sweep/$name/checkpoints/best.json ]] && evals+=("$name.best exp/sweep/$name")
  for n in ${AVG:-}; do
    python3 -m usmkit.average exp/sweep/$name --last $n >> "$OUTDIR/$name.avg.log" 2>&1 && evals+=("$name.avg$n exp/sweep/$name/checkpoints/avg-last$n")
  done
  for e in "${evals[@]}"; do
    set -- $e
    [[ -n ${2:-} ]] && timeout 240 python3 -m usmkit.evaluate checkpoint=$2 test_sets=[test,dev] decode=ctc_lexicon \
      output=exp/sweep/eval/$1.eval.json > "$OUTDIR/$1.eval.log" 2>&1 &
  done
  wait
}
trap finish EXIT TERM
if [[ -n ${PRE_RUN:-} ]]; then
  RUNS[$PRE_RUN]=$PRE_SPEC  # listed for the summary; trained here, before the runs that start from it
  run_one "$PRE_RUN" SYN "${PRE_SPEC#* }"
  echo "$PRE_RUN trained at $(date +%T)"
fi
for name in "${!RUNS[@]}"; do
  [[ $name == "${PRE_RUN:-}" ]] && continue
  spec=${RUNS[$name]}
  if [[ ${spec%% *} == SYN ]]; then base=SYN; else base=FS; fi
  run_one "$name" "$base" "${spec#* }" &
done
wait
for prefix in ${ENSEMBLE_PREFIXES:-F_spk_s}; do
for n in ${ENSEMBLES:-}; do  # ensembles (usmkit/models/ensemble.py) of the first n seeds' last checkpoints
  members=(); for ((seed = 0; seed < n; seed++)); do
    members+=("$(ls -d exp/sweep/$prefix$seed/checkpoints/${ENSEMBLE_MEMBER:-step-*} | tail -1)"); done
  rest=$(IFS=,; echo "${members[*]:1}")
  label=ens$n; [[ -n ${ENSEMBLE_PREFIXES:-} ]] && label=ens${n}_${prefix%_s}
  timeout 240 python3 -m usmkit.evaluate checkpoint=${members[0]} "ensemble=[$rest]" test_sets=[test,dev] decode=ctc_lexicon \
    output=exp/sweep/eval/$label.eval.json > "$OUTDIR/$label.eval.log" 2>&1 &
  if [[ -n ${BEST_TOO:-} ]]; then  # the same seeds' best checkpoints by dev WER
    best=(); for ((seed = 0; seed < n; seed++)); do best+=("exp/sweep/$prefix$seed"); done
    rest=$(IFS=,; echo "${best[*]:1}")
    timeout 240 python3 -m usmkit.evaluate checkpoint=${best[0]} "ensemble=[$rest]" test_sets=[test,dev] decode=ctc_lexicon \
      output=exp/sweep/eval/${label}_best.eval.json > "$OUTDIR/${label}_best.eval.log" 2>&1 &
  fi
done
done
for n in ${DEV_SELECT:-}; do  # members chosen by dev WER alone: no held-out speaker's data
  members=($(python3 - "$n" ${ENSEMBLE_PREFIXES%% *} <<'PY'
import json, sys
from pathlib import Path
n, prefix = int(sys.argv[1]), sys.argv[2]
evals = sorted(Path("exp/sweep/eval").glob(f"{prefix}*.eval.json"), key=lambda p: int(p.name[len(prefix):].split(".")[0]))
ranked = sorted(evals, key=lambda p: json.loads(p.read_text())["sets"]["dev"]["wer"])  # stable: ties keep seed order
for p in ranked[:n]:
    name = p.name[: -len(".eval.json")]
    print(sorted(Path(f"exp/sweep/{name}/checkpoints").glob("step-*"))[-1])
PY
))
  rest=$(IFS=,; echo "${members[*]:1}")
  echo "dev-selected members: ${members[*]}"
  timeout 240 python3 -m usmkit.evaluate checkpoint=${members[0]} "ensemble=[$rest]" test_sets=[test,dev] decode=ctc_lexicon \
    output=exp/sweep/eval/ensdev$n.eval.json > "$OUTDIR/ensdev$n.eval.log" 2>&1 &
done
wait
echo "trained and evaluated at $(date +%T)"
