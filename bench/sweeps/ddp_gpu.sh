#!/usr/bin/env bash
# Issue 6, part 5: DDP scaling of the compiled step on 2 GPUs, one DDP variant per torchrun (each
# adds its entry and scaling factor to the JSON). usage (device, nvidia-h200-x2): bash bench/sweeps/ddp_gpu.sh OUT.json
set -u
J=$1
rm -f "$J"
nvidia-smi topo -m
torchrun --standalone --nproc-per-node 1 bench/ddp_scaling.py --size base --steps 30 --json "$J" 2>&1 | tail -1
for v in "" "--bucket-mb 100" "--grad-view --static-graph" "--grad-view --static-graph --bucket-mb 100" "--grad-view --static-graph --bucket-mb 200"; do
  echo "== 2 GPUs $v"
  timeout 150 torchrun --standalone --nproc-per-node 2 bench/ddp_scaling.py --size base --steps 30 --json "$J" $v 2>&1 | tail -1
done
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['runs'], indent=1))" "$J"
