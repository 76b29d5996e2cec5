#!/bin/sh
# Fuzzing with libFuzzer (issue #14): the targets of tests/fuzz/, built with clang's
# -fsanitize=fuzzer,address,undefined.
#
#   tests/run_fuzz.sh BUILD_DIR replay   builds the targets (when a source is newer than the
#                                        binary) and replays the committed seed corpora
#                                        (tests/fuzz/corpus/<target>/, each file once): seconds
#   tests/run_fuzz.sh BUILD_DIR fuzz     runs each target for ${FUZZ_SECONDS:-60} seconds, one
#                                        after the other; new interesting inputs go to
#                                        BUILD_DIR/fuzz/corpus/<target>/ (never the committed
#                                        corpus), crashes to BUILD_DIR/fuzz/artifacts/
#
# Prints "<target> corpus replay: 1 passed, 0 failed" (or the executions, coverage and whether a
# crash was found, when fuzzing) per target, then a total line for tests/run.sh. Without clang,
# or a clang whose -fsanitize=fuzzer does not link, it says why and counts one skipped. A crash
# found while fuzzing: see tests/fuzz/README.md (the input goes to tests/fuzz/crashes/ until it
# is fixed, then into the corpus). FUZZ_CFLAGS adds compiler flags (e.g. -I of another muon.h);
# CLANG names the compiler.
B=${1:-build}
MODE=${2:-replay}
CLANG=${CLANG:-clang}
SECONDS_EACH=${FUZZ_SECONDS:-60}
# Replay builds at -O0 (5x faster to compile, and the corpora take well under a second to run);
# fuzzing builds at -O1 -g for speed and stack traces.
if [ "$MODE" = fuzz ]; then OPTFLAGS="-g -O1"; else OPTFLAGS="-O0"; fi
CFLAGS="-std=c99 $OPTFLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all ${FUZZ_CFLAGS:-} -I."
LIBS="-lm -pthread"
TARGETS="fuzz_state fuzz_layout"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

case $MODE in replay|fuzz) ;; *) echo "usage: $0 BUILD_DIR replay|fuzz" >&2; exit 2 ;; esac
case $B in /*) ;; *) B=$(pwd)/$B ;; esac
D=$B/fuzz
cd "$(dirname "$0")/.." || exit 1

skip() {
  echo "fuzz targets skipped: $1"
  echo "0 passed, 0 failed, 1 skipped"
  exit 0
}

# ---- can this clang build a fuzzer? -------------------------------------------------------------
command -v "$CLANG" >/dev/null 2>&1 || skip "$CLANG not found (install clang, or set CLANG)"
mkdir -p "$D" || exit 1
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' > "$D/probe.c"
"$CLANG" $CFLAGS "$D/probe.c" -o "$D/probe" >"$D/probe.log" 2>&1 ||
  skip "$CLANG cannot build with -fsanitize=fuzzer,address,undefined ($(head -n 1 "$D/probe.log"))"

# target -> its corpus directory name
corpus_of() { echo "$1" | sed 's/^fuzz_//'; }

# ---- build (in parallel; each only if muon.h or a fuzz source is newer) -------------------------
build() {
  t=$1
  if [ -x "$D/$t" ] && [ "$(cat "$D/$t.flags" 2>/dev/null)" = "$CLANG $CFLAGS" ]; then
    stale=0
    for f in muon.h tests/fuzz/$t.c tests/fuzz/fuzz_world.h tests/fuzz/fuzz_models.h; do
      [ "$f" -nt "$D/$t" ] && stale=1
    done
    [ $stale = 0 ] && return 0
  fi
  "$CLANG" $CFLAGS "tests/fuzz/$t.c" -o "$D/$t.tmp" $LIBS >"$D/$t.build.log" 2>&1 &&
    mv "$D/$t.tmp" "$D/$t" && echo "$CLANG $CFLAGS" > "$D/$t.flags"
}
pids=""
for t in $TARGETS; do build "$t" & pids="$pids $!"; done
built_ok=1
for p in $pids; do wait "$p" || built_ok=0; done
if [ $built_ok = 0 ]; then
  for t in $TARGETS; do [ -s "$D/$t.build.log" ] && { echo "building $t:"; cat "$D/$t.build.log"; }; done
  echo "fuzz targets failed to build"
  echo "fuzz-build: 0 passed, 1 failed"
  exit 1
fi

passed=0; failed=0
mkdir -p "$D/artifacts"

# ---- replay: every committed seed once ----------------------------------------------------------
if [ "$MODE" = replay ]; then
  for t in $TARGETS; do
    c=tests/fuzz/corpus/$(corpus_of "$t")
    n=$(ls "$c" | wc -l)
    start=$(date +%s)
    "$D/$t" "$c" -runs=0 -timeout=60 -artifact_prefix="$D/artifacts/$t-replay-" >"$D/$t.replay.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    if [ $rc = 0 ] && grep -q 'INITED' "$D/$t.replay.log"; then
      echo "$t: $n inputs of $c replayed in ${secs}s"
      echo "$t corpus replay: 1 passed, 0 failed"
      passed=$((passed + 1))
    else
      echo "$t: replaying $c failed (exit $rc):"
      grep -v '^INFO:' "$D/$t.replay.log" | tail -n 40 | sed 's/^/  | /'
      echo "$t corpus replay: 0 passed, 1 failed"
      failed=$((failed + 1))
    fi
  done
  echo "fuzz-replay: $passed passed, $failed failed"
  [ $failed = 0 ]
  exit
fi

# ---- fuzz: each target for SECONDS_EACH seconds, one after the other ----------------------------
for t in $TARGETS; do
  seeds=tests/fuzz/corpus/$(corpus_of "$t")
  new=$D/corpus/$(corpus_of "$t")
  mkdir -p "$new"
  before=$(ls "$new" | wc -l)
  max_len=4096
  [ "$t" = fuzz_layout ] && max_len=128
  rm -f "$D/artifacts/$t-"*
  "$D/$t" "$new" "$seeds" -max_total_time="$SECONDS_EACH" -timeout=30 -max_len=$max_len -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$D/artifacts/$t-" >"$D/$t.fuzz.log" 2>&1
  rc=$?
  runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 executions in \2 s/p' "$D/$t.fuzz.log" | tail -n 1)
  [ -n "$runs" ] || runs="$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\)/\1/p' "$D/$t.fuzz.log" | tail -n 1) executions"
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$D/$t.fuzz.log" | tail -n 1)
  after=$(ls "$new" | wc -l)
  crash=$(ls "$D/artifacts/$t-"* 2>/dev/null | head -n 1)
  if [ $rc = 0 ] && [ -z "$crash" ]; then
    echo "$t: $runs, $cov, $((after - before)) new inputs in $new; no crash"
    passed=$((passed + 1))
  else
    echo "$t: CRASH found (exit $rc) after $runs, $cov; input: ${crash:-none written}"
    grep -v '^INFO:\|^#' "$D/$t.fuzz.log" | tail -n 40 | sed 's/^/  | /'
    failed=$((failed + 1))
  fi
done
echo "fuzz: $passed passed, $failed failed"
[ $failed = 0 ]
