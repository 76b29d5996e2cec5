#!/bin/sh
# Overlap (muon_dist_config.prefetch / .async): every example given, at one world size, under
# prefetch 0, 1, 2 x async off, on, with small rounds (--round-bytes 8192, so that a step has many
# rounds to overlap), must print the bitwise check against one device and move exactly the bytes
# of the debug setting (prefetch 0, async off) with the same round size. The debug setting of every
# example at every size, with the default rounds, is tests/run_examples.sh.
# With --some, three settings that still cover each level of each: 0 off, 1 on, 2 off.
# EXTRA: more options for every run (e.g. EXTRA='--partial sum' for the Partial variants).
# usage: [EXTRA=...] tests/run_overlap.sh [--some] BUILD_DIR example...
settings_all="0:off 0:on 1:off 1:on 2:off 2:on"
settings=$settings_all
if [ "$1" = "--some" ]; then settings="0:off 1:on 2:off"; shift; fi
build=$1; shift
passed=0; failed=0
size_for() {
  case "$1" in
    full_4d) echo 8 ;;
    *) echo 4 ;;
  esac
}
for ex in "$@"; do
  n=$(size_for "$ex")
  ref=
  for s in $settings; do
    setting="${EXTRA:+$EXTRA }--prefetch ${s%%:*}"
    [ "${s#*:}" = on ] && setting="$setting --async"
    # shellcheck disable=SC2086
    out=$("$build/muonrun" -n "$n" --timeout 120 "$build/$ex" --steps 4 --quiet --round-bytes 8192 $setting 2>&1)
    rc=$?
    line=$(echo "$out" | grep "check: bitwise equal to single device (max |diff| = 0)")
    moved=$(echo "$line" | sed -n 's/.*; \(.*\)/\1/p')
    why=
    if [ $rc -ne 0 ] || [ -z "$line" ]; then why="exit $rc"
    elif [ -z "$ref" ]; then ref=$moved
    elif [ "$moved" != "$ref" ]; then why="moved '$moved', the debug setting '$ref'"
    fi
    if [ -z "$why" ]; then
      passed=$((passed + 1)); echo "ok   $ex -n $n $setting: $moved"
    else
      failed=$((failed + 1)); echo "FAIL $ex -n $n $setting ($why)"; echo "$out" | tail -n 5
    fi
  done
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
