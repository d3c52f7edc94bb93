#!/usr/bin/env bash
# Issue 6, part 5, third pass: does NCCL's share of the SMs cost the overlapped backward its time? The
# best DDP options of the second pass (200 MB buckets, gradients as bucket views, static graph) with
# NCCL_MAX_NCHANNELS capped, against the uncapped default (block timing, side by side with no-sync
# steps: bench/ddp_scaling.py). Each run writes its own JSON (OUT.N.json), merged into OUT.json.
#   usage (device, nvidia-h200-x2): NCCL_NVLS_ENABLE=0 bash bench/sweeps/ddp_gpu3.sh OUT.json [CH ...]
#   CH: a channel cap per run, in order; "default" = uncapped. First call: default 4 8 4/bucket25;
#   second call (repeats, interleaved): default 8 16 8 default 8.
set -u
J=$1; shift
BEST="--grad-view --static-graph --bucket-mb 200"
i=0
[[ $# -eq 0 ]] && set -- default 4 8
for ch in "$@"; do
  i=$((i + 1))
  opts=$BEST; [[ $ch == */bucket25 ]] && opts="--grad-view --static-graph --bucket-mb 25"
  echo "== run $i: 2 GPUs, NCCL_MAX_NCHANNELS=${ch%/*} $opts"
  if [[ ${ch%/*} == default ]]; then env -u NCCL_MAX_NCHANNELS timeout 100 torchrun --standalone --nproc-per-node 2 bench/ddp_scaling.py --size base --steps 30 --json "$J.$i.json" $opts
  else NCCL_MAX_NCHANNELS=${ch%/*} timeout 100 torchrun --standalone --nproc-per-node 2 bench/ddp_scaling.py --size base --steps 30 --json "$J.$i.json" $opts
  fi 2>&1 | tail -1 | cut -c1-120
done
python3 - "$J" "$i" <<'PY'
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
runs = []
for i in range(1, n + 1):
    try:
        d = json.load(open(f"{out}.{i}.json"))
    except FileNotFoundError:
        continue
    (key, r), = d["runs"].items()
    runs.append({"order": i, "key": key, **r})
    print(f"{i}: {key:55s} sync {r['step_ms']:.1f} ms  no-sync {r['no_sync_step_ms']:.1f} ms  scaling {r['scaling_vs_no_sync']:.3f}")
meta = {k: d[k] for k in ("device", "date", "size", "per_gpu_batch", "timing")}
json.dump({**meta, "runs_in_order": runs}, open(out, "w"), indent=1)
PY
