#!/usr/bin/env bash
# A host lost in the middle of a job, and the job resumed on the hosts that survive. Runs
# under scripts/multi_host.sh run (2 hosts): XSHARD_MULTI_HOST_DIR names them.
#
#   host_lost.sh TRAINER CHECKPOINT_RESHARD TEXT WORKDIR
#
# 1. CHECKPOINT_RESHARD trains 5 steps on 4 ranks over both hosts and saves its checkpoint.
# 2. TRAINER (train_transformer on TEXT) trains on 4 ranks over both hosts; once it has printed
#    a loss, every process of host 2 is killed. The job must end on every rank of host 1
#    within the bound (no rank left waiting for the lost ones) and report the failure.
# 3. CHECKPOINT_RESHARD resumes from step 1's checkpoint on host 1 alone (2 ranks, another
#    mesh) for 5 more steps, each loss equal to that of an uninterrupted serial run.
set -euo pipefail
trainer=$1 reshard=$2 text=$3 work=$4
dir=${XSHARD_MULTI_HOST_DIR:?run under scripts/multi_host.sh run}
mpiexec="$dir/mpiexec"
bound=60
rm -rf "$work"
mkdir -p "$work"

"$mpiexec" -n 4 "$reshard" train "$work" >"$work/train.log" 2>&1 ||
  { cat "$work/train.log"; echo "host_lost: the training before the loss failed"; exit 1; }
grep -q "saved .*model.safetensors (step 5)" "$work/train.log" ||
  { cat "$work/train.log"; echo "host_lost: no checkpoint saved"; exit 1; }

"$mpiexec" -n 4 "$trainer" --tp 2 --text "$text" --steps 100000 >"$work/lost.log" 2>&1 &
job=$!
for _ in $(seq 600); do
  grep -q "loss" "$work/lost.log" && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.2
done
grep -q "loss" "$work/lost.log" ||
  { cat "$work/lost.log"; echo "host_lost: the job printed no loss"; exit 1; }
"$dir/pids" 2 | xargs -r kill -9
lost=$(date +%s.%N)
ended=""
for _ in $(seq $((bound * 10))); do
  if ! kill -0 "$job" 2>/dev/null; then
    ended=$(date +%s.%N)
    break
  fi
  sleep 0.1
done
if [ -z "$ended" ]; then
  kill -9 "$job" 2>/dev/null || true
  "$dir/pids" 1 | xargs -r kill -9
  echo "host_lost: the job still ran ${bound} s after host 2 was lost"
  exit 1
fi
status=0
wait "$job" || status=$?
left=$("$dir/pids" 1 | wc -l)
after=$(awk -v a="$lost" -v b="$ended" 'BEGIN { printf "%.1f", b - a }')
if [ "$status" = 0 ] || [ "$left" != 0 ]; then
  tail -20 "$work/lost.log"
  echo "host_lost: exit status $status, $left processes left on host 1"
  exit 1
fi
echo "host_lost: the job ended on every rank ${after} s after host 2 was lost (exit status $status)"

"$mpiexec" --on 1 -n 2 "$reshard" resume "$work" >"$work/resume.log" 2>&1 ||
  { cat "$work/resume.log"; echo "host_lost: the resumed run failed"; exit 1; }
cat "$work/resume.log"
grep -q "match the uninterrupted serial run: ok" "$work/resume.log" ||
  { echo "host_lost: the resumed losses differ"; exit 1; }
echo "host_lost: resumed on host 1 alone (2 ranks) from the checkpoint of the 4 ranks over 2 hosts"
