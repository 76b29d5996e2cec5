#!/bin/sh
# The README's verification workflow on tp_fsdp (4 ranks), end to end:
#   1. right layouts: the layout check passes and the distributed dump equals the single device's;
#   2. --wrong-dim (muon is told the other TP dim than the one the pieces are cut by): the layout
#      check names the matrix and both positions, and muoncmp shows whole matrices differing.
# usage: tests/run_wrong_dim.sh BUILD
B=${1:-build}
D=$B/wrong_dim
rm -rf "$D" && mkdir -p "$D"
passed=0; failed=0
ok() { if [ "$1" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL $2"; sed 's/^/  | /' "$3"; fi; }

"$B/muonrun" --timeout 120 -n 4 "$B/tp_fsdp" --dump "$D/right" >"$D/right.out" 2>&1
rc=$?
grep -q "layout check: every rank's pieces are where its layout says" "$D/right.out" && [ $rc = 0 ]
ok $? "tp_fsdp with the right layouts: layout check passes, bitwise equal (exit $rc)" "$D/right.out"
"$B/muoncmp" "$D/right" "$D/right.ref" >"$D/right.cmp" 2>&1
rc=$?
grep -q "muoncmp: 8 of 8 tensors bitwise equal" "$D/right.cmp" && [ $rc = 0 ]
ok $? "muoncmp of the right run's dumps: 8 of 8 equal, exit 0 (exit $rc)" "$D/right.cmp"

"$B/muonrun" --timeout 120 -n 4 "$B/tp_fsdp" --wrong-dim --dump "$D/wrong" >"$D/wrong.out" 2>&1
rc=$?
grep -q "layout check FAILED: MUON_ERR_SHAPE: invalid shape: muon_check_layouts: matrix 'attn.qkv' (96 x 32): rank 0 described its piece as \[shard dim 1, 0 of 2 > shard dim 0, 0 of 2\], which puts its local element 16 at (row 1, col 0); the framework has it at (row 0, col 16)" "$D/wrong.out" && [ $rc != 0 ]
ok $? "tp_fsdp --wrong-dim: the layout check names attn.qkv and both positions, the run fails (exit $rc)" "$D/wrong.out"
"$B/muoncmp" "$D/wrong" "$D/wrong.ref" >"$D/wrong.cmp" 2>&1
rc=$?
grep -q "DIFFERS param attn.qkv (96 x 32): 3072 differing elements of 3072" "$D/wrong.cmp" && grep -q "whole matrix" "$D/wrong.cmp" && grep -q "muoncmp: 0 of 8 tensors bitwise equal" "$D/wrong.cmp" && [ $rc = 1 ]
ok $? "muoncmp of the wrong run's dumps: whole matrices differ, exit 1 (exit $rc)" "$D/wrong.cmp"

echo "wrong-dim workflow: $passed passed, $failed failed"
[ $failed = 0 ]
