#!/bin/sh
# Seeds for fuzz_safetensors from a checkpoint xshard wrote (io.save_2x2), each prefixed with
# the byte that selects how the fuzzer reads it: 0 an integrated file, 1 a strategy file, 3 a
# per-rank directory (checkpoint.json, strategy.json and a rank file, separated by "\n--\n").
#
#   fuzz_seeds.sh SAVED_DIR OUT_DIR
set -eu
saved=$1 out=$2
mkdir -p "$out"
{ printf '\000'; cat "$saved/model.safetensors"; } >"$out/integrated"
{ printf '\001'; cat "$saved/model/strategy.json"; } >"$out/strategy"
{
  printf '\003'
  cat "$saved/model/checkpoint.json"; printf '\n--\n'
  cat "$saved/model/strategy.json"; printf '\n--\n'
  cat "$saved/model/rank_0.safetensors"
} >"$out/per_rank"
