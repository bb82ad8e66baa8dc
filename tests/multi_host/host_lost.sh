#!/usr/bin/env bash
# A host lost in the middle of a job, and the job resumed by the driver on the host that
# survives. Runs under scripts/multi_host.sh run (2 hosts): XSHARD_MULTI_HOST_DIR names them.
#
#   host_lost.sh TRAINER TEXT WORKDIR
#
# TRAINER is train_transformer in a mode the driver runs (recursive_programming: the search
# lays out its program for each mesh), on TEXT.
# 1. The reference: an uninterrupted run of 300 steps on one rank.
# 2. The job: 4 ranks over both hosts (dp 2 x tp 2), saving a checkpoint every 4 steps. Once it
#    has saved one, every process of host 2 is killed. The job must end on every rank of host 1
#    within the bound (no rank left waiting for the lost ones) and report the failure.
# 3. The driver resumes from the job's newest checkpoint (which the kill may have caught in
#    the middle of a save: the previous one then stays) on host 1 alone, 2 ranks of another
#    mesh (dp 2 x tp 1), and trains to step 300: every loss equals the reference's at its step.
set -euo pipefail
trainer=$1 text=$2 work=$3
dir=${XSHARD_MULTI_HOST_DIR:?run under scripts/multi_host.sh run}
mpiexec="$dir/mpiexec"
bound=60 steps=300
train=("$trainer" --mode recursive_programming --text "$text" --steps "$steps")
rm -rf "$work"
mkdir -p "$work"

"$mpiexec" --on 1 -n 1 "${train[@]}" --tp 1 >"$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; echo "host_lost: the reference run failed"; exit 1; }

"$mpiexec" -n 4 "${train[@]}" --tp 2 --checkpoint-every 4 --checkpoint-dir "$work/ckpt" \
  >"$work/lost.log" 2>&1 &
job=$!
for _ in $(seq 1200); do
  grep -q "^saved" "$work/lost.log" && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.05
done
grep -q "^saved" "$work/lost.log" ||
  { cat "$work/lost.log"; echo "host_lost: the job saved no checkpoint"; exit 1; }
"$dir/pids" 2 | xargs -r kill -9
lost=$(date +%s.%N)
if grep -q "done:" "$work/lost.log"; then
  cat "$work/lost.log"
  echo "host_lost: the job trained all its steps before host 2 was lost"
  exit 1
fi
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

saved=$(grep "^saved" "$work/lost.log" | tail -n 1 | awk '{print $NF}')
"$mpiexec" --on 1 -n 2 "${train[@]}" --tp 1 --resume "$work/ckpt/train_transformer.safetensors" \
  >"$work/resume.log" 2>&1 ||
  { cat "$work/resume.log"; echo "host_lost: the resumed run failed"; exit 1; }
resumed=$(sed -n 's/^resumed from .* at step \([0-9]*\)$/\1/p' "$work/resume.log")
if [ -z "$resumed" ] || [ "$resumed" -lt "$saved" ] || [ "$resumed" -ge "$steps" ]; then
  cat "$work/resume.log"
  echo "host_lost: resumed at step '${resumed}'; the job had saved step $saved of $steps"
  exit 1
fi
# Step k's loss: the reference's k-th, the resumed run's (k - resumed)-th.
losses() { grep -oE "step [0-9]+/[0-9]+ loss [-+0-9.eE]+" "$1" | awk '{print $4}'; }
if ! paste <(losses "$work/reference.log" | tail -n +$((resumed + 1))) \
  <(losses "$work/resume.log") | awk -v want=$((steps - resumed)) '
    NF != 2 { bad = 1 }
    NF == 2 { d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
              if (d > 1e-9 * a) { bad = 1; print "step " NR ": " $2 " against " $1 } n++ }
    END { if (n != want) print n " losses, expected " want; exit bad || n != want }'; then
  echo "host_lost: the resumed losses differ from the uninterrupted run's"
  exit 1
fi
echo "host_lost: the driver resumed the job's checkpoint of step $resumed (4 ranks over 2" \
  "hosts) on host 1 alone (2 ranks, another mesh); its $((steps - resumed)) losses equal the" \
  "uninterrupted run's to 1e-9"
