#!/bin/sh
# Lab 02's step copies one number back to the host, its loss (the step line prints it); the
# gradient norm of clipping stays on the device. In a --trace, each "train_step" span holds
# exactly one "host read" event (tools/trace_reads --expect 1). Planted: a trace with a second
# read inside a step (a norm read back) must be refused. Extra arguments go to the program
# (--device sim: the GPU's way, the loss and the norm as device tensors, on the CPU).
# usage: trace_reads_test.sh PROGRAM TEXT_FILE REPO_ROOT [PROGRAM ARGS...]
set -eu
prog=$1
text=$2
tool=$3/tools/trace_reads
shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$prog" --model tiny --data "$text" --batch 4 --steps 3 --warmup 1 --clip 1.0 --log-every 1 \
  --eval-every 0 --sample 0 --checkpoint-every 0 --checkpoint "$dir/c.ckpt" \
  --trace "$dir/t.json" "$@" > "$dir/out.txt"
python3 "$tool" "$dir/t.json" --expect 1
[ "$(python3 "$tool" "$dir/t.json" | grep -c ' Scalar$')" -eq 3 ] ||
  { echo "each of the 3 steps should read its loss (a Scalar)"; exit 1; }
cat > "$dir/planted.json" <<'JSON'
{"displayTimeUnit":"ms","traceEvents":[
{"name":"train_step","cat":"compute","ph":"X","pid":0,"tid":0,"ts":0,"dur":100},
{"name":"host read","cat":"sync","ph":"X","pid":0,"tid":0,"ts":40,"dur":5,"args":{"what":"gradient norm"}},
{"name":"host read","cat":"sync","ph":"X","pid":0,"tid":0,"ts":90,"dur":9,"args":{"what":"Scalar"}}
]}
JSON
if python3 "$tool" "$dir/planted.json" --expect 1; then
  echo "planted: a step with two host reads passed the check"; exit 1
fi
echo "each step reads its loss once; the planted second read is caught"
