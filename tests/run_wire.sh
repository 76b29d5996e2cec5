#!/bin/sh
# bf16 on the wire (muon_dist_config.wire): each example with bf16 Newton-Schulz (--bf16), where
# the default (AUTO) exchange carries bf16, and again with --wire fp32. Both must be bitwise
# equal to one device, and the bf16 run must move half the payload bytes of the fp32 one, plus at
# most the padding (each message rounds its value count up to whole floats: < 4 B per message,
# at most (ranks - 1) messages each way per collective). Then, with NorMuon, the automatic wire
# must stay fp32 (bitwise equal to one device again).
# usage: tests/run_wire.sh BUILD_DIR RANKS example...
build=$1; n=$2; shift 2
passed=0; failed=0
for ex in "$@"; do
  a=$("$build/muonrun" -n "$n" --timeout 120 "$build/$ex" --steps 4 --quiet --bf16 2>&1)
  ra=$?
  b=$("$build/muonrun" -n "$n" --timeout 120 "$build/$ex" --steps 4 --quiet --bf16 --wire fp32 2>&1)
  rb=$?
  why=
  for out in "$a" "$b"; do
    echo "$out" | grep -q "check: bitwise equal to single device" || why="not bitwise equal to one device"
  done
  [ $ra -eq 0 ] && [ $rb -eq 0 ] || why="exit $ra / $rb"
  p16=$(echo "$a" | sed -n 's/.*wire: rank 0 moved \([0-9]*\) payload bytes.* in \([0-9]*\) collectives.*/\1/p')
  p32=$(echo "$b" | sed -n 's/.*wire: rank 0 moved \([0-9]*\) payload bytes.* in \([0-9]*\) collectives.*/\1/p')
  coll=$(echo "$a" | sed -n 's/.*wire: rank 0 moved [0-9]* payload bytes.* in \([0-9]*\) collectives.*/\1/p')
  if [ -z "$why" ]; then
    if [ -z "$p16" ] || [ -z "$p32" ] || [ "$p32" -eq 0 ]; then why="no payload line"
    elif [ $((2 * p16)) -lt "$p32" ] || [ $((2 * p16)) -gt $((p32 + 16 * coll * (n - 1))) ]; then
      why="bf16 moved $p16 B, fp32 $p32 B: not half"
    fi
  fi
  if [ -z "$why" ]; then
    passed=$((passed + 1)); echo "ok   $ex -n $n: bf16 wire $p16 B, fp32 wire $p32 B, both bitwise equal to one device"
  else
    failed=$((failed + 1)); echo "FAIL $ex -n $n ($why)"; echo "$a" | tail -n 3; echo "$b" | tail -n 3
  fi
done
# With NorMuon, which rescales O after the bf16 Newton-Schulz, the automatic wire must stay fp32.
ex=$1
out=$("$build/muonrun" -n "$n" --timeout 120 "$build/$ex" --steps 4 --quiet --bf16 --normuon larger 2>&1)
if echo "$out" | grep -q "check: bitwise equal to single device"; then
  passed=$((passed + 1)); echo "ok   $ex -n $n --bf16 --normuon larger: bitwise equal to one device (the wire stays fp32)"
else
  failed=$((failed + 1)); echo "FAIL $ex -n $n --bf16 --normuon larger"; echo "$out" | tail -n 3
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
