#!/usr/bin/env bash
# Issue 6, part 5, second pass: DDP scaling with block timing (bench/ddp_scaling.py times blocks of
# back-to-back steps), the default buckets against the best earlier options, with and without the
# bf16 all-reduce, at the throughput benchmark's per-GPU batch and at twice it.
#   usage (device, nvidia-h200-x2): bash bench/sweeps/ddp_gpu2.sh OUT.json
set -u
J=$1
rm -f "$J"
nvidia-smi topo -m | head -4
BEST="--grad-view --static-graph --bucket-mb 200"
run() {  # world, then ddp_scaling.py options
  local n=$1; shift
  echo "== $n GPU(s) $*"
  timeout 110 torchrun --standalone --nproc-per-node "$n" bench/ddp_scaling.py --size base --steps 30 --json "$J" "$@" 2>&1 | tail -1 | cut -c1-200
}
run 1
run 2
run 2 $BEST
run 2 $BEST --bf16-hook
run 1 --batch 64
run 2 $BEST --batch 64
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: d[k] for k in ('runs', 'scaling')}, indent=1))" "$J"
