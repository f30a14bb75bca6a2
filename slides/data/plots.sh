#!/usr/bin/env bash
# Redraws every plot in slides/img/ from the program outputs in slides/data/ (see README.md here for
# how each output was made). Run from anywhere: slides/data/plots.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
plot=tools/plot
d=slides/data
o=slides/img

$plot latency $d/01_latency_n1.txt $d/01_latency_n2.txt $d/01_latency_n4.txt -o $o/00_allreduce_latency.svg \
  --command "./scalelab run 01 --solution -n R -- --bench --max-bytes 1K   (R = 1, 2, 4)"
$plot bench $d/01_bench_n2.txt $d/01_bench_n4.txt -o $o/01_busbw.svg \
  --command "./scalelab run 01 --solution -n 2 -- --bench;  ./scalelab run 01 --solution -n 4 -- --bench"
$plot loss $d/02_small.txt --label "small, batch 16" -o $o/02_loss.svg \
  --title "lab 02: small (0.83M parameters) on one CPU, 300 steps" \
  --command "./scalelab run 02 --solution -- --steps 300 --eval-every 50"
$plot loss $d/03_ddp_n4.txt --label "DDP, 4 ranks" -o $o/03_loss_vs_single.svg \
  --title "DDP on 4 ranks vs the single-device twin (small, global batch 16)" \
  --command "./scalelab run 03 --solution -n 4 -- --verify-steps 50"
$plot overlap --runs $d/04_overlap_n2_run*.txt -o $o/04_overlap.svg \
  --title "lab 04 on 2 ranks, 6 runs: bar = median, whisker = min..max" \
  --command "./scalelab run 04 --solution -n 2 -- --steps 5 --reps 15   (6 times, load average 6-11 on 2 cores)"
$plot accum $d/05_accum_n4.txt -o $o/05_accum_memory.svg --command "./scalelab run 05 --solution -n 4"
$plot checkpoint $d/06_policies_cpu_readme.txt $d/06_policies_h100.txt -o $o/06_memory_vs_time.svg \
  --label "small, 4 rows x 64 tokens, 2-core CPU" --label "gpt-85m, 8 rows x 1024 tokens, one H100" \
  --command "./scalelab run 06 --solution -n 4 -- --reps 5  (CPU);  -n 1 -- --device cuda --model gpt-85m --batch 8 --steps 3 --reps 3  (H100)"
$plot tp $d/07_tp_n4.txt -o $o/07_tp.svg --command "./scalelab run 07 --solution -n 4 -- --reps 3"
$plot pipeline $d/08_pp_n4.txt -o $o/08_pipeline.svg --command "./scalelab run 08 --solution -n 4 -- --reps 3"
$plot zero $d/09_zero_n4.txt -o $o/09_zero_memory.svg --command "./scalelab run 09 --solution -n 4 -- --stage 1"
$plot grid $d/10_3d_n*.txt -o $o/10_grids.svg \
  --command "./scalelab run 10 --solution -n R -- --dp DP --tp TP --pp PP --steps 10 --twin-steps 10"
$plot cp $d/11_cp_n4_ring.txt $d/11_cp_n4_all_to_all.txt -o $o/11_cp.svg \
  --command "./scalelab run 11 --solution -n 4 -- --cp 4 --attention ring|all-to-all"
$plot moe $d/12_ep_n4_ep4.txt $d/12_ep_n4_ep2.txt -o $o/12_moe.svg \
  --command "./scalelab run 12 --solution -n 4 [-- --ep 2]"
