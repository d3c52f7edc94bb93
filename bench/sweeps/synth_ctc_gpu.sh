#!/usr/bin/env bash
# Hyper-parameter sweep for issue 3's CPU budget, run on the lent GPU (fp32, so the per-step curves
# are those of the CPU run): builds the embedded corpus there, then trains 8 tiny CTC variants side by
# side on one GPU and evaluates each on the held-out-voice test set. Steps, not seconds, are what
# transfers to the 2-core CPU; the CPU cost per step of each variant is measured there separately.
#   usage (device): bash bench/sweeps/synth_ctc_gpu.sh OUTDIR
set -u
OUTDIR=${1:-/tmp/sweep_out}
mkdir -p "$OUTDIR"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
rm -rf exp/sweep
python3 -m usmkit.data.synth out=data/synth size=default workers=16 > "$OUTDIR/corpus.log" 2>&1
tail -3 "$OUTDIR/corpus.log"
COMMON=(recipe=stage3_ctc model=tiny data=synth data.manifest_dir=data/synth
  optim.warmup_steps=100 trainer.precision=fp32 trainer.eval_every=250 trainer.save_every=500
  trainer.dev_max_batches=0 trainer.progress=false data.num_workers=1)
# Prepare features and stats once (the parallel runs would race on them).
python3 -m usmkit.train "${COMMON[@]}" 'model.overrides={subsampling_channels: 32}' trainer.max_steps=1 trainer.eval_every=1 trainer.exp_dir=exp/sweep/prep > "$OUTDIR/prep.log" 2>&1 || { tail -30 "$OUTDIR/prep.log"; exit 1; }
python3 -m usmkit.evaluate checkpoint=exp/sweep/prep test_sets=[test] output=exp/sweep/prep/eval.json >> "$OUTDIR/prep.log" 2>&1 || { tail -30 "$OUTDIR/prep.log"; exit 1; }
if [[ "${ROUND:-2}" == 3 ]]; then  # the shared 320-piece tokenizer, trained once before the parallel runs
  python3 -m usmkit.train "${COMMON[@]}" trainer.max_steps=1 trainer.eval_every=0 vocab_size=320 tokenizer=exp/sweep/tok320/tokenizer.model trainer.exp_dir=exp/sweep/prep320 >> "$OUTDIR/prep.log" 2>&1
fi
echo "prepared at $(date +%T)"
# Round 3 (ROUND=3): the CPU budget's steps (2800 x 50 s batches, vocab 320) with and without regularization.
if [[ "${ROUND:-2}" == 3 ]]; then
R3="data.max_duration=50 trainer.max_steps=2800 trainer.eval_every=700 vocab_size=320 tokenizer=exp/sweep/tok320/tokenizer.model optim.lr=2.5e-3 'model.overrides={subsampling_channels: 32}'"
declare -A RUNS=(
  [P_noreg]="$R3 data.spec_augment.enabled=false model.dropout=0.0"
  [Q_light]="$R3 data.spec_augment.time_masks=2 data.spec_augment.freq_width=15 model.dropout=0.1"
  [R_strong]="$R3 data.spec_augment.time_masks=5 data.spec_augment.freq_width=27 model.dropout=0.1"
  [S_drop]="$R3 data.spec_augment.enabled=false model.dropout=0.1"
  [T_light_wd]="$R3 data.spec_augment.time_masks=2 data.spec_augment.freq_width=15 model.dropout=0.1 optim.weight_decay=0.1"
)
else
declare -A RUNS=(
  [A_baseline]="'model.overrides={subsampling_channels: 32}' optim.lr=2.5e-3 data.max_duration=100 trainer.max_steps=1500 data.spec_augment.time_masks=2 data.spec_augment.freq_width=15"
  [D_batch50]="optim.lr=2.5e-3 data.max_duration=50 trainer.max_steps=3000 trainer.eval_every=500 data.spec_augment.enabled=false 'model.overrides={subsampling_channels: 32}' model.dropout=0.0"
  [E_vocab320]="optim.lr=2.5e-3 data.max_duration=100 trainer.max_steps=1500 data.spec_augment.enabled=false 'model.overrides={subsampling_channels: 32}' model.dropout=0.0 vocab_size=320 tokenizer=exp/sweep/tok320/tokenizer.model"
  [F_vocab1024]="optim.lr=2.5e-3 data.max_duration=100 trainer.max_steps=1500 data.spec_augment.enabled=false 'model.overrides={subsampling_channels: 32}' model.dropout=0.0 vocab_size=1024 tokenizer=exp/sweep/tok1024/tokenizer.model"
  [H_nogain]="optim.lr=2.5e-3 data.max_duration=100 trainer.max_steps=1500 data.spec_augment.enabled=false 'model.overrides={subsampling_channels: 32}' model.dropout=0.0 data.gain_db=0"
  [I_lr1e-3]="optim.lr=1e-3 data.max_duration=100 trainer.max_steps=1500 data.spec_augment.enabled=false 'model.overrides={subsampling_channels: 32}' model.dropout=0.0"
  [J_steps1100]="optim.lr=2.5e-3 data.max_duration=100 trainer.max_steps=1100 data.spec_augment.enabled=false 'model.overrides={subsampling_channels: 32}' model.dropout=0.0"
  [K_ch64]="optim.lr=2.5e-3 data.max_duration=100 trainer.max_steps=1500 data.spec_augment.enabled=false model.dropout=0.0"
)
fi
for name in "${!RUNS[@]}"; do
  eval "timeout 400 python3 -m usmkit.train \"\${COMMON[@]}\" ${RUNS[$name]} trainer.exp_dir=exp/sweep/$name" > "$OUTDIR/$name.log" 2>&1 &
done
wait
echo "trained at $(date +%T)"
for name in "${!RUNS[@]}"; do
  python3 -m usmkit.evaluate checkpoint=exp/sweep/$name test_sets=[test] decode=${DECODE:-ctc_greedy} output=exp/sweep/$name/eval_test.json > "$OUTDIR/$name.eval.log" 2>&1 &
done
wait
for name in "${!RUNS[@]}"; do cp exp/sweep/$name/metrics.jsonl "$OUTDIR/$name.metrics.jsonl" 2>/dev/null; cp exp/sweep/$name/eval_test.json "$OUTDIR/$name.eval.json" 2>/dev/null; done
python3 - "$OUTDIR" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for m in sorted(out.glob("*.metrics.jsonl")):
    name = m.name.split(".")[0]
    devs = [json.loads(l) for l in m.open() if "dev/dev_wer" in l]
    last = [json.loads(l) for l in m.open() if "train/loss" in l][-1:]
    ev = out / f"{name}.eval.json"
    en = json.loads(ev.read_text())["sets"]["test"].get("per_language", {}).get("en", {}) if ev.exists() else {}
    curve = " ".join(f"{d['step']}:{100*d['dev/dev_wer']:.0f}/{100*d['dev/dev_cer']:.0f}" for d in devs)
    print(f"{name:12s} steps={last[0]['step'] if last else '-'} test_en_wer={en.get('wer', float('nan')):.3f} dev(wer/cer): {curve}")
PY
tar czf "$OUTDIR/sweep.tgz" -C "$OUTDIR" --exclude sweep.tgz . && find "$OUTDIR" -type f ! -name sweep.tgz -delete
