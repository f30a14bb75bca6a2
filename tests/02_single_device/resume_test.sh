#!/bin/sh
# The lab 02 program, interrupted (--stop-at) and resumed (--resume), prints the same step lines
# (loss and learning rate; times differ) as one uninterrupted run.
# usage: resume_test.sh PROGRAM TEXT_FILE [EXTRA OPTIONS...] (e.g. --precision bf16)
set -eu
prog=$1
text=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args="--model tiny --data $text --batch 4 --steps 8 --warmup 2 --log-every 1 --eval-every 0 --sample 0 --checkpoint-every 0 $*"
lines() { grep '^step=[0-9]* loss=' | sed 's/ dt=.*//'; }
"$prog" $args --checkpoint "$dir/a.ckpt" | lines > "$dir/straight.txt"
"$prog" $args --checkpoint "$dir/b.ckpt" --stop-at 5 | lines > "$dir/first.txt"
"$prog" $args --checkpoint "$dir/b.ckpt" --resume | lines > "$dir/second.txt"
cat "$dir/first.txt" "$dir/second.txt" > "$dir/resumed.txt"
cat "$dir/resumed.txt"
[ "$(wc -l < "$dir/straight.txt")" -eq 8 ] || { echo "expected 8 step lines"; exit 1; }
[ "$(wc -l < "$dir/first.txt")" -eq 5 ] || { echo "--stop-at 5 should run steps 0-4"; exit 1; }
diff "$dir/straight.txt" "$dir/resumed.txt" && echo "resume reproduces the uninterrupted run"
