#!/bin/sh
# A hyperparameter appended to the state's group records (muon.h's rule for a new field): a
# scratch copy of muon.h gets one more field in muon_hparams and in muon_adamw_hparams,
# `grow_test` (defaults 0.25 and 0.125): the field, its default, and one line at the end of its
# settings list (>>impl-settings), as a future muon.h would add them.
# tests/test_state_grow.c is built against muon.h and against the copy; each build's state then
# loads in the other and itself, and the run resumes bitwise. Usage: tests/run_state_grow.sh BUILD
set -u
B=$1/state_grow
CC=${CC:-cc}
FLAGS="-std=c99 -Wall -Wextra -Wpedantic -Werror ${OPT:--O2}"   # OPT: the Makefile's (make coverage: -O0)
rm -rf "$B" && mkdir -p "$B/scratch" "$B/old" "$B/new" || exit 1
fail() { echo "state_grow: $*"; echo "0 passed, 1 failed"; exit 1; }

# The scratch muon.h: each edit must find its anchor exactly once, or the test fails (muon.h
# moved on: update the anchors here).
python3 - muon.h "$B/scratch/muon.h" <<'PY' || fail "patching a scratch muon.h failed"
import sys
s = open(sys.argv[1]).read()
def after(anchor, text):
    global s
    if s.count(anchor) != 1: sys.exit("anchor found %d times: %r" % (s.count(anchor), anchor))
    s = s.replace(anchor, anchor + text)
def line_after(last, line):   # a list's last line (then a newline) gets its continuation
    global s
    if s.count(last + "\n") != 1: sys.exit("anchor found %d times: %r" % (s.count(last + "\n"), last))
    s = s.replace(last + "\n", last + " \\\n" + line + "\n")
after("  muon_momentum_format momentum_format;", "\n  float grow_test;")
after("  hp.momentum_format = MUON_MOMENTUM_FP32;", "\n  hp.grow_test = 0.25f;")
line_after("  X(momentum_format, muon_momentum_format, U, MUON_MOMENTUM_BF16)", "  X(grow_test, float, F, 0.5f)")
after("m_hat / (sqrt(v_hat) + eps) have the same sign (zero agrees) */", "\n  float grow_test;")
after("  hp.weight_decay = 1e-2f;", "\n  hp.grow_test = 0.125f;")
line_after("  X(cautious_wd, int, U, 1)", "  X(grow_test, float, F, 0.5f)")
open(sys.argv[2], "w").write(s)
PY
$CC $FLAGS -I. -Itests tests/test_state_grow.c -o "$B/old_prog" -lm || fail "building against muon.h failed"
$CC $FLAGS -DGROW_TEST -I"$B/scratch" -Itests tests/test_state_grow.c -o "$B/new_prog" -lm || fail "building against the scratch muon.h failed"

passed=0; failed=0
run() {   # what, then the command
  what=$1; shift
  if out=$("$@" 2>&1) && echo "$out" | grep -q '^[0-9]* passed, 0 failed$'; then passed=$((passed + 1))
  else failed=$((failed + 1)); echo "FAIL $what"; echo "$out" | sed 's/^/  /'; fi
}
run "muon.h saves" "$B/old_prog" save "$B/old"
run "the scratch build saves" "$B/new_prog" save "$B/new"
run "muon.h loads its own state" "$B/old_prog" load "$B/old"
run "the scratch build loads its own state (grow_test as saved)" env GROW_SAVED=1 "$B/new_prog" load "$B/new"
run "the scratch build loads muon.h's state (grow_test defaulted)" env GROW_SAVED=0 "$B/new_prog" load "$B/old"
run "muon.h loads the scratch build's state (grow_test skipped)" "$B/old_prog" load "$B/new"
cmp -s "$B/old/reference" "$B/new/reference" || { failed=$((failed + 1)); echo "FAIL the two builds' references differ"; }
echo "state_grow: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
