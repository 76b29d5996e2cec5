#!/bin/sh
# A trainer's nvcc flags must not change muon's bits (there is no GPU here to run on, so this
# reads what nvcc makes of the kernels). Compiles examples/muon_cuda.cu with --use_fast_math
# -fmad=true (it must build: the object is kept as OUT_DIR/muon_cuda_fast.o) and to PTX, then
# fails on any float instruction those flags would make differ from the CPU: a fused multiply-
# add, an approximate operation, or arithmetic or a conversion that flushes subnormals (.ftz).
# Comparisons, max and min may carry .ftz: their thresholds are normal numbers, so flushing a
# subnormal operand to zero chooses the same side.
# usage: tests/run_fast_math.sh NVCC OUT_DIR
nvcc=$1; out=$2
flags="-O2 --use_fast_math -fmad=true"
passed=0; failed=0
if $nvcc $flags -Xcompiler -Wall,-Wextra,-Werror -I. -c examples/muon_cuda.cu -o "$out/muon_cuda_fast.o"; then
  passed=$((passed + 1)); echo "ok   nvcc $flags compiles muon_cuda.cu"
else
  failed=$((failed + 1)); echo "FAIL nvcc $flags does not compile muon_cuda.cu"
fi
if $nvcc $flags -ptx -I. examples/muon_cuda.cu -o "$out/muon_cuda_fast.ptx"; then
  fused='^[[:space:]]*(fma|mad)\.[a-z0-9.]*f(32|64)'
  flushed='^[[:space:]]*(add|sub|mul|div|sqrt|rcp|rsqrt|cvt)[a-z0-9.]*\.ftz'
  bad=$(grep -E "$fused|\.approx\.|$flushed" "$out/muon_cuda_fast.ptx" | sed 's/^[[:space:]]*//' | sort | uniq -c)
  if [ -z "$bad" ]; then
    passed=$((passed + 1)); echo "ok   no fused, approximate or flushing float arithmetic in the kernels under $flags"
  else
    failed=$((failed + 1)); echo "FAIL float instructions that change bits under $flags:"; echo "$bad" | head -n 20
  fi
else
  failed=$((failed + 1)); echo "FAIL nvcc $flags -ptx failed"
fi
echo "fast-math: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
