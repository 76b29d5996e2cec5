#!/bin/sh
# Runs each test command given as an argument, shows its output, and adds up the
# "N passed, M failed" lines into one closing line. A command that prints no such line
# but exits non-zero counts as one failure. A line may carry a label ("fsdp --gram: 1 passed, ...").
# An argument "::" starts a new lane: lanes run side by side (each its commands in order, each
# command's output shown whole when it ends), so the CPU-bound tests of one lane fill the time
# the other's ranks spend waiting on the network.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# run LANE CMD: the command, its output and time as one block on stdout; its counts added to
# the lane's file.
run() {
  t0=$(date +%s%N)
  sh -c "$2" </dev/null >"$dir/out.$1" 2>&1
  rc=$?
  t1=$(date +%s%N)
  {
    echo "== $2"
    cat "$dir/out.$1"
    echo "== $(( (t1 - t0) / 1000000 )) ms"
    line=$(grep -E '^(\[[0-9]+\] )?([^:]+: )?[0-9]+ passed, [0-9]+ failed' "$dir/out.$1" | tail -n 1 | sed -E 's/^\[[0-9]+\] //')
    p=0; f=0; s=0
    if [ -n "$line" ]; then
      p=$(echo "$line" | sed -E 's/^([^:]+: )?([0-9]+) passed.*/\2/')
      f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
      s=$(echo "$line" | sed -nE 's/.* ([0-9]+) skipped.*/\1/p')
      if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "!! '$2' exited $rc"; f=1; fi
    elif [ "$rc" -ne 0 ]; then
      echo "!! '$2' exited $rc without a summary line"; f=1
    fi
    echo "$p ${f:-0} ${s:-0}" >>"$dir/counts.$1"
  } >"$dir/block.$1"
  if command -v flock >/dev/null 2>&1; then flock "$dir/lock" cat "$dir/block.$1"; else cat "$dir/block.$1"; fi
}

lane=0
: >"$dir/counts.0"
pids=
for cmd in "$@" "::"; do
  if [ "$cmd" = "::" ]; then
    [ -n "$cmds_file" ] && { ( while IFS= read -r c; do run "$lane" "$c"; done <"$cmds_file" ) & pids="$pids $!"; }
    lane=$((lane + 1)); cmds_file=
    continue
  fi
  if [ -z "$cmds_file" ]; then cmds_file="$dir/cmds.$lane"; : >"$cmds_file"; : >"$dir/counts.$lane"; fi
  printf '%s\n' "$cmd" >>"$cmds_file"
done
for p in $pids; do wait "$p"; done

passed=0; failed=0; skipped=0
for c in "$dir"/counts.*; do
  while read -r p f s; do passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s)); done <"$c"
done
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"
else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
