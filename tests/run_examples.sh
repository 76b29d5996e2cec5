#!/bin/sh
# Runs every strategy example at the world sizes it supports, 10 steps each, and counts an
# example run as passed when it exits 0 and rank 0 prints the bitwise check line. Each check
# line is kept in BUILD_DIR/<example>.n<N>.check; with --same-bytes-as REF_DIR a run also fails
# unless it moved the same bytes in the same number of collectives as REF_DIR's run (another
# communicator, same plan). With --one-size each example runs at one size only, its first of at
# least 4 ranks (the CPU run covers every size; the stand-in backends need not repeat them all).
# With --mpi the examples are BUILD_DIR's MPI builds (-DEX_MPI), started by mpirun at the sizes
# up to 4, or the smallest of one that needs more (one skipped line without mpirun or the binaries).
# usage: tests/run_examples.sh [--mpi] [--one-size] [--same-bytes-as REF_DIR] BUILD_DIR example...
ref=
one=
mpi=
if [ "$1" = "--mpi" ]; then mpi=1; shift; fi
if [ "$1" = "--one-size" ]; then one=1; shift; fi
if [ "$1" = "--same-bytes-as" ]; then ref=$2; shift 2; fi
build=$1; shift
passed=0; failed=0
if [ -n "$mpi" ]; then
  for ex in "$@"; do
    if ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$build/$ex" ]; then
      echo "mpirun or $build/$ex not found (make deps installs libopenmpi-dev openmpi-bin): MPI examples skipped"
      echo "0 passed, 0 failed, 1 skipped"; exit 0
    fi
  done
fi
launch() {   # launch N PROGRAM ARGS...
  n=$1; shift
  if [ -n "$mpi" ]; then mpirun --allow-run-as-root --oversubscribe --timeout 120 -n "$n" "$@"
  else "$build/muonrun" -n "$n" --timeout 120 "$@"; fi
}
sizes_for() {
  case "$1" in
    full_4d) echo "8 16" ;;
    tp_hsdp) echo "4 8" ;;
    tp_fsdp|ep_tp|ep_fsdp) echo "2 4 8" ;;
    *) echo "2 3 4 8" ;;
  esac
}
sizes() {
  if [ -n "$mpi" ]; then   # up to 4 ranks, or the smallest size of an example that needs more
    small=$(for n in $(sizes_for "$1"); do [ "$n" -le 4 ] && echo "$n"; done)
    echo "${small:-$(sizes_for "$1" | cut -d' ' -f1)}"; return
  fi
  if [ -z "$one" ]; then sizes_for "$1"; return; fi
  for n in $(sizes_for "$1"); do [ "$n" -ge 4 ] && { echo "$n"; return; }; done
}
for ex in "$@"; do
  for n in $(sizes "$ex"); do
    out=$(launch "$n" "$build/$ex" --steps 10 --quiet 2>&1)
    rc=$?
    line=$(echo "$out" | grep "check: bitwise equal to single device (max |diff| = 0)")
    echo "$line" > "$build/$ex.n$n.check"
    why=
    if [ $rc -ne 0 ] || [ -z "$line" ]; then why="exit $rc"
    elif [ -n "$ref" ]; then
      want=$(sed -n 's/.*; \(.*\)/\1/p' "$ref/$ex.n$n.check" 2>/dev/null)
      got=$(echo "$line" | sed -n 's/.*; \(.*\)/\1/p')
      [ -n "$want" ] && [ "$want" = "$got" ] || why="moved '$got', $ref moved '$want'"
    fi
    if [ -z "$why" ]; then
      passed=$((passed + 1)); echo "ok   $ex -n $n"
    else
      failed=$((failed + 1)); echo "FAIL $ex -n $n ($why)"; echo "$out" | tail -n 5
    fi
  done
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
