#!/bin/sh
# Runs each test command given as an argument, shows its output, and adds up the
# "N passed, M failed" lines into one closing line. A command that prints no such line
# but exits non-zero counts as one failure. A line may carry a label ("fsdp --gram: 1 passed, ...").
passed=0; failed=0; skipped=0
log=$(mktemp)
for cmd in "$@"; do
  echo "== $cmd"
  t0=$(date +%s%N)
  sh -c "$cmd" >"$log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  cat "$log"
  echo "== $(( (t1 - t0) / 1000000 )) ms"
  line=$(grep -E '^(\[[0-9]+\] )?([^:]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 | sed -E 's/^\[[0-9]+\] //')
  if [ -n "$line" ]; then
    p=$(echo "$line" | sed -E 's/^([^:]+: )?([0-9]+) passed.*/\2/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    s=$(echo "$line" | sed -nE 's/.* ([0-9]+) skipped.*/\1/p')
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + ${s:-0}))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "!! '$cmd' exited $rc"; failed=$((failed + 1)); fi
  elif [ "$rc" -ne 0 ]; then
    echo "!! '$cmd' exited $rc without a summary line"; failed=$((failed + 1))
  fi
done
rm -f "$log"
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"
else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
