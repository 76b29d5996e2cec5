#!/bin/sh
# Partial gradients (muon_auto_desc.partial, PARTIAL levels): each example given, at 2, 3 and 4
# ranks (even sizes only where the mesh needs them), with every rank's gradient only its part,
# summed (--partial sum) and averaged (--partial mean). Each run must be bitwise equal to one
# device given the parts summed in order, and print its exchange's bytes per rank; where every
# rank's piece is its own part (no REPLICATE level) the example itself fails unless they are
# exactly 2 x (held - owned), which is 2(P-1)/P S where every rank holds every matrix whole.
# Then --late (owners of Partial matrices stay with their momentum) and bf16 Newton-Schulz (the
# automatic wire stays fp32: the parts are summed before any rounding), and
# with hsdp given, full_4d on 16 ranks (replicate groups of 2 inside pipeline stages). The
# examples' norm is a Partial AdamW param too, summed and updated ZeRO-1 style.
# usage: tests/run_partial.sh BUILD_DIR example...
build=$1; shift
passed=0; failed=0
run() {   # example ranks args...
  ex=$1; n=$2; shift 2
  out=$("$build/muonrun" -n "$n" --timeout 120 "$build/$ex" --steps 4 --quiet "$@" 2>&1)
  rc=$?
  bytes=$(echo "$out" | sed -n 's/.*partial: \(.* B\).*/\1/p')
  if [ $rc -eq 0 ] && echo "$out" | grep -q "check: bitwise equal to single device" && [ -n "$bytes" ]; then
    passed=$((passed + 1)); echo "ok   $ex -n $n $*: bitwise equal to one device; $bytes"
  else
    failed=$((failed + 1)); echo "FAIL $ex -n $n $* (exit $rc)"; echo "$out" | tail -n 4
  fi
}
for ex in "$@"; do
  case "$ex" in hsdp) sizes="2 4" ;; tp_hsdp) sizes="4 8" ;; *) sizes="2 3 4" ;; esac
  for n in $sizes; do
    run "$ex" "$n" --partial sum
    run "$ex" "$n" --partial mean
  done
done
run "$1" 4 --partial sum --late --normuon larger
run "$1" 3 --partial mean --bf16
case " $* " in *" hsdp "*) [ -x "$build/full_4d" ] && run full_4d 16 --partial mean ;; esac
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
