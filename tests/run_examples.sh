#!/bin/sh
# Runs every strategy example at the world sizes it supports, 10 steps each, and counts an
# example run as passed when it exits 0 and rank 0 prints the bitwise check line.
# usage: tests/run_examples.sh BUILD_DIR example...
build=$1; shift
passed=0; failed=0
sizes_for() {
  case "$1" in
    full_4d) echo "8 16" ;;
    tp_hsdp) echo "4 8" ;;
    tp_fsdp|ep_tp|ep_fsdp) echo "2 4 8" ;;
    *) echo "2 3 4 8" ;;
  esac
}
for ex in "$@"; do
  for n in $(sizes_for "$ex"); do
    out=$("$build/muonrun" -n "$n" --timeout 120 "$build/$ex" --steps 10 --quiet 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -q "check: bitwise equal to single device (max |diff| = 0)"; then
      passed=$((passed + 1)); echo "ok   $ex -n $n"
    else
      failed=$((failed + 1)); echo "FAIL $ex -n $n (exit $rc)"; echo "$out" | tail -n 5
    fi
  done
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
