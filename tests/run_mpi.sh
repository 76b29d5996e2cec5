#!/bin/sh
# The MPI communicator (muon_mpi.h) under Open MPI's mpirun: test_mpi at 1-4 ranks, a stalled
# peer (MUON_ERR_TIMEOUT within the timeout), a killed peer (mpirun must end the job, non-zero,
# within 30 s), test_dist over MPI at 1-4 ranks and under ASan + UBSan at 3, and the overlap
# settings on both tables (queued: tickets in flight; MUON_MPI_BLOCKING=1: muon's communication
# thread), bitwise against one device.
# Without mpirun or the mpi/ binaries (make deps installs Open MPI) one skipped line.
# usage: tests/run_mpi.sh BUILD_DIR
build=$1
# root needs --allow-run-as-root; more ranks than cores need --oversubscribe; --timeout ends a
# hung job (mpirun's own bound, see muon_mpi.h FAILURES)
mpirun="mpirun --allow-run-as-root --oversubscribe --timeout 120"
if ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$build/mpi/test_mpi" ] || [ ! -x "$build/mpi/test_dist" ]; then
  echo "mpirun or $build/mpi/test_mpi not found (make deps installs libopenmpi-dev openmpi-bin): MPI tests skipped"
  echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
passed=0; failed=0
# run NAME CMD...: passes when CMD exits 0 and its last summary line has 0 failed
run() {
  name=$1; shift
  out=$("$@" 2>&1); rc=$?
  line=$(echo "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -n 1)
  if [ $rc -eq 0 ] && echo "$line" | grep -q ' 0 failed'; then
    passed=$((passed + 1)); echo "ok   $name ($line)"
  else
    failed=$((failed + 1)); echo "FAIL $name (exit $rc)"; echo "$out" | tail -n 15
  fi
}
for n in 1 2 3 4; do run "test_mpi -n $n" $mpirun -n $n "$build/mpi/test_mpi"; done
run "test_mpi -n 3 --stall" $mpirun -n 3 "$build/mpi/test_mpi" --stall
t0=$(date +%s)
out=$($mpirun -n 3 "$build/mpi/test_mpi" --die 2>&1); rc=$?
took=$(( $(date +%s) - t0 ))
if [ $rc -ne 0 ] && [ $took -lt 30 ]; then passed=$((passed + 1)); echo "ok   test_mpi -n 3 --die (mpirun ended the job: exit $rc after ${took} s)"
else failed=$((failed + 1)); echo "FAIL test_mpi -n 3 --die (exit $rc after ${took} s)"; echo "$out" | tail -n 15; fi
for n in 1 2 3 4; do run "test_dist -n $n" $mpirun -n $n "$build/mpi/test_dist"; done
# ASan + UBSan over MPI. Leak checking is off: Open MPI leaves allocations of its dlclosed
# plugins that no suppression can name; the Gloo _san builds check muon's own leaks.
if [ -x "$build/mpi/test_dist_san" ]; then
  run "test_dist_san -n 3" env ASAN_OPTIONS=detect_leaks=0 $mpirun -x ASAN_OPTIONS -n 3 "$build/mpi/test_dist_san"
fi
for b in 0 1; do
  for e in fsdp tp_fsdp; do
    out=$(MUON_MPI_BLOCKING=$b MUON_THREADS=2 $mpirun -n 4 "$build/mpi/$e" --steps 10 --quiet --prefetch 2 --async --round-bytes 8192 2>&1); rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -q "check: bitwise equal to single device (max |diff| = 0)"; then
      passed=$((passed + 1)); echo "ok   $e -n 4 --prefetch 2 --async MUON_MPI_BLOCKING=$b"
    else failed=$((failed + 1)); echo "FAIL $e -n 4 --prefetch 2 --async MUON_MPI_BLOCKING=$b (exit $rc)"; echo "$out" | tail -n 5; fi
  done
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
