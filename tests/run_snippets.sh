#!/bin/sh
# The C blocks of README.md and docs/*.md compile as written, and README's run: each ```c block
# must follow a line <!-- snippet: CONTEXT --> naming its context in tests/snippets.h (an
# unmarked block fails). one_device runs against llm.c's tensor shapes; gloo runs on 4 Gloo ranks;
# the rest compile (cuda and nccl only where the CUDA toolkit is, mpi where Open MPI is).
# Errors point at the markdown line (#line). Usage: tests/run_snippets.sh BUILD (needs BUILD/muonrun and BUILD/muon_gloo.o)
set -u
B=$1
OUT=$B/snippets
CC=${CC:-cc}
CXX=${CXX:-c++}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
FLAGS="-std=c99 -Wall -Wextra -Wpedantic -Werror -O0"   # small runs: compile time is what counts
rm -rf "$OUT" && mkdir -p "$OUT" || exit 1

# One C file per block, named after its file and line; the list: "file line context path".
for md in README.md docs/*.md; do
  awk -v md="$md" -v out="$OUT" '
    /^```c[ \t]*$/ {
      ctx = "unmarked"
      if (match(prev, /<!-- snippet: [a-z_]+ -->/)) ctx = substr(prev, RSTART + 14, RLENGTH - 18)
      base = md; gsub(/[\/.]/, "_", base)
      path = out "/" base "_" NR ".c"
      print md, NR + 1, ctx, path >> (out "/list")
      n = 0; inblock = 1; next
    }
    inblock && /^```/ {
      printf "/* %s:%d, context %s (tests/snippets.h) */\n", md, start, ctx > path
      for (i = 1; i <= n; i++) if (line[i] ~ /^#(include|define)[ \t]/) printf "#line %d \"%s\"\n%s\n", start + i - 1, md, line[i] > path
      printf "#define SNIPPET_%s\n#include \"snippets.h\"\nSNIPPET_BEGIN\n", ctx > path
      for (i = 1; i <= n; i++) {
        if (line[i] ~ /^#(include|define)[ \t]/) continue
        printf "#line %d \"%s\"\n%s\n", start + i - 1, md, line[i] > path
      }
      printf "SNIPPET_END\n#define SNIPPET_PART_2\n#include \"snippets.h\"\n" > path
      close(path); inblock = 0; next
    }
    inblock { if (n == 0) start = NR; line[++n] = $0; next }
    NF { prev = $0 }
  ' "$md"
done

passed=0; failed=0; skipped=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL $1"; [ -f "$2" ] && sed 's/^/  /' "$2" | head -n 30; }
cuda_ok=0
[ -f "$CUDA_HOME/include/cublas_v2.h" ] && [ -f "$CUDA_HOME/include/nccl.h" ] && cuda_ok=1
while read -r md line ctx c; do
  what="$md:$line ($ctx)"
  exe=${c%.c}
  log=$exe.log
  case $ctx in
    one_device|llmc_cpu)
      if $CC $FLAGS -Itests -I. "$c" -o "$exe" -lm >"$log" 2>&1 && "$exe" >>"$log" 2>&1; then ok; else bad "$what" "$log"; fi ;;
    gloo)
      if $CC $FLAGS -Itests -I. "$c" "$B/muon_gloo.o" -o "$exe" -lgloo -lstdc++ -pthread -lm >"$log" 2>&1 &&
         "$B/muonrun" -n 4 --timeout 60 "$exe" >>"$log" 2>&1; then ok; else bad "$what" "$log"; fi ;;
    llmc_threads)
      if $CC $FLAGS -fopenmp -fsyntax-only -Itests -I. "$c" >"$log" 2>&1; then ok; else bad "$what" "$log"; fi ;;
    llmc_gpu|llmc_gpu_main)   # nvcc's front end with llm.c's flags: host and device code parsed and
      # type-checked as CUDA C++ (--cuda stops before code generation, which takes seconds more)
      if [ $cuda_ok = 0 ] || [ ! -x "$CUDA_HOME/bin/nvcc" ]; then skipped=$((skipped + 1)); echo "$what: no nvcc at $CUDA_HOME: skipped"
      elif "$CUDA_HOME/bin/nvcc" --use_fast_math -std=c++17 -O3 -Itests -I. -x cu --cuda "$c" -o "$exe.ii" >"$log" 2>&1 &&
           ! grep -q warning "$log"; then ok
      else bad "$what" "$log"; fi ;;
    cuda|nccl)
      if [ $cuda_ok = 0 ]; then skipped=$((skipped + 1)); echo "$what: no CUDA toolkit at $CUDA_HOME: skipped"
      elif $CC $FLAGS -fsyntax-only -isystem "$CUDA_HOME/include" -Itests -I. "$c" >"$log" 2>&1; then ok
      else bad "$what" "$log"; fi ;;
    mpi)
      if ! pkg-config --exists ompi-c; then skipped=$((skipped + 1)); echo "$what: no Open MPI (libopenmpi-dev): skipped"
      elif $CC $FLAGS -fsyntax-only $(pkg-config --cflags ompi-c | sed 's/-I/-isystem /g') -Itests -I. "$c" >"$log" 2>&1; then ok
      else bad "$what" "$log"; fi ;;
    unmarked)
      bad "$what: no <!-- snippet: CONTEXT --> line before the block" /dev/null ;;
    *)
      if $CC $FLAGS -fsyntax-only -Itests -I. "$c" >"$log" 2>&1; then ok; else bad "$what" "$log"; fi ;;
  esac
done < "$OUT/list"
echo "snippets: $passed blocks compiled or ran as written"
if [ $skipped -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"; else echo "$passed passed, $failed failed"; fi
[ $failed -eq 0 ]
