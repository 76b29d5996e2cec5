# muon - build, test, bench. `make demo` and `make test` install what they need (apt-get).
CC       ?= gcc
CXX      ?= g++
PYTHON   ?= /usr/bin/python3
PREFIX   ?= /usr/local
BUILD    := build
CWARN    := -std=c99 -Wall -Wextra -Wpedantic -Werror
CXXWARN  := -std=c++17 -Wall -Wextra -Werror
OPT      ?= -O2 -march=native
O2       ?= -O2            # the fixed level of the tools, stand-ins and backend objects (coverage: -O0)
SAN      := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
BLAS_CFLAGS = $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   = $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
GLOO_LIBS   := -lgloo -lstdc++ -pthread -lm
INC      := -I. -Itests -Iexamples
HEADERS  := muon.h muon_gloo.h muon_cuda.h muon_nccl.h muon_mpi.h
DEPS     := g++ pkg-config libopenblas-dev python3-numpy libgloo-dev redis-server libopenmpi-dev openmpi-bin

# One program per parallelism strategy (examples/<name>.c) and the world sizes each is tested at.
STRATEGIES := ddp cp fsdp fsdp_flat tp hsdp tp_fsdp tp_hsdp ep ep_tp ep_fsdp pp full_4d layout_2d custom_vtable
EXAMPLES   := single distributed muonrun muoncmp $(STRATEGIES)
# The strategies make test also runs over MPI (mpirun, 2-4 ranks, full_4d at 8: tests/run_examples.sh
# --mpi), each moving the bytes its Gloo run moved.
MPI_EXAMPLES := fsdp tp_fsdp hsdp pp full_4d

# CUDA: the toolkit's nvcc, headers and libraries (override CUDA_HOME). Without a GPU the CUDA
# backend still compiles with nvcc, links against cudart/cuBLAS, and runs on the stand-ins
# (tests/standin: our C implementation of the cudart/cuBLAS calls it makes, strict like a GPU).
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
HAVE_CUDA := $(shell test -x $(NVCC) && test -f $(CUDA_HOME)/include/cublas_v2.h && echo 1)
CUDA_INC  := -isystem $(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas
NCCL_LIBS := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib -lnccl
# nvcc alone targets sm_75 (PTX, JIT-compiled on newer cards): name the card, e.g. NVARCH=-arch=sm_90
NVARCH    ?=
NVFLAGS   := -O2 -fmad=false $(NVARCH) -Xcompiler -Wall,-Wextra,-Werror
STANDIN   := $(CUDA_INC) -DMUON_CUDA_STANDIN -DMUON_CUDA_IMPLEMENTATION -D_GNU_SOURCE -Itests/standin
NCCL_STANDIN := $(BUILD)/nccl/muon_nccl.o $(BUILD)/cuda/nccl_standin.o $(BUILD)/cuda/standin.o
GPU_LINK  := $(BUILD)/cuda/muon_cuda.o $(CUDA_LIBS) -lstdc++

.PHONY: all test test-unit test-dist test-examples test-cuda print-tests demo bench examples install \
        uninstall clean deps check-headers test-gpu bench-gpu fuzz coverage mutate

all: examples

deps:
	@tools/install-deps.sh $(DEPS)

$(BUILD) $(BUILD)/cuda $(BUILD)/nccl $(BUILD)/gpu $(BUILD)/mpi:
	@mkdir -p $@

# ---- every public header alone, as C99 and as C++17, declarations and implementation --------
check-headers: | $(BUILD)
	@for h in $(HEADERS); do \
	  printf '#include "%s"\n' $$h > $(BUILD)/hdr.c; \
	  $(CC) $(CWARN) -fsyntax-only -I. $(MPI_CFLAGS) $(BUILD)/hdr.c && \
	  $(CXX) $(CXXWARN) -fsyntax-only -x c++ -I. $(MPI_CFLAGS) $(BUILD)/hdr.c || exit 1; \
	done
	@printf '#define MUON_IMPLEMENTATION\n#include "muon.h"\n#define MUON_MPI_IMPLEMENTATION\n#include "muon_mpi.h"\n' > $(BUILD)/impl_mpi.c
	@$(CC) $(CWARN) -fsyntax-only -I. $(MPI_CFLAGS) $(BUILD)/impl_mpi.c
	@$(CXX) $(CXXWARN) -fsyntax-only -x c++ -I. $(MPI_CFLAGS) $(BUILD)/impl_mpi.c
	@printf '#define MUON_IMPLEMENTATION\n#include "muon.h"\n' > $(BUILD)/impl.c
	@$(CC) $(CWARN) -fsyntax-only -I. $(BUILD)/impl.c
	@$(CXX) $(CXXWARN) -fsyntax-only -x c++ -I. $(BUILD)/impl.c
	@$(CC) $(CWARN) -fsyntax-only -DMUON_USE_CBLAS $(BLAS_CFLAGS) -I. $(BUILD)/impl.c
ifeq ($(HAVE_CUDA),1)
	@printf '#define MUON_IMPLEMENTATION\n#include "muon.h"\n#include "muon_cuda.h"\n' > $(BUILD)/impl_cuda.c
	@$(CC) $(CWARN) -fsyntax-only $(STANDIN) -I. $(BUILD)/impl_cuda.c
	@$(CXX) $(CXXWARN) -fsyntax-only $(STANDIN) -x c++ -I. $(BUILD)/impl_cuda.c
	@printf '#define MUON_IMPLEMENTATION\n#include "muon.h"\n#define MUON_NCCL_IMPLEMENTATION\n#include "muon_nccl.h"\n' > $(BUILD)/impl_nccl.c
	@$(CC) $(CWARN) -fsyntax-only $(CUDA_INC) -I. $(BUILD)/impl_nccl.c
	@$(CXX) $(CXXWARN) -fsyntax-only $(CUDA_INC) -x c++ -I. $(BUILD)/impl_nccl.c
endif
	@echo "headers: C99 and C++17 clean"

# ==== build families: a binary's directory and name say how it is built ======================
#   tools/X.c             $(BUILD)/X          the tools, at $(O2)
#   examples/X.c          $(BUILD)/X          $(OPT), linked with the Gloo shim (single.c: alone)
#   tests/X.c             $(BUILD)/X          C99 at $(OPT)
#                         $(BUILD)/X_cxx      the same source as C++17
#                         $(BUILD)/X_san      AddressSanitizer + UBSan ($(SAN))
#                         $(BUILD)/X_fast     -Ofast -march=native, as trainers like llm.c build:
#                                             the non-finite checks must survive it
#                         $(BUILD)/X_tsan     ThreadSanitizer
#                         $(BUILD)/X_nothreads  without the thread pool (MUON_NO_THREADS)
#                         $(BUILD)/X_cblas    Newton-Schulz's GEMMs through OpenBLAS
#   tests/fuzz/fuzz_X.c   $(BUILD)/fuzz_X_replay  the corpus replayer, without libFuzzer
#   bench/X.c             $(BUILD)/X          -O3 -march=native with CBLAS
#   and the CUDA families below: $(BUILD)/cuda/ (the stand-ins), nccl/ (stand-ins and NCCL),
#   gpu/ (the real libraries). What a program needs beyond its family and -lm: its name in
#   WITH_PTHREAD (links -pthread), WITH_POSIX (-D_POSIX_C_SOURCE=200809L), WITH_GLOO (the Gloo
#   shim: muon_gloo.o, muon_gloo_san.o in _san builds, and GLOO_LIBS instead of -lm), WITH_NCCL
#   (gpu/: muon_nccl.o and libnccl; the stand-ins' self-tests: nccl_standin.o).
WITH_PTHREAD := test_threads test_faults test_misuse test_parallel test_nccl_standin
WITH_POSIX   := muonrun test_clip test_netns test_dist test_agree test_verify test_reshard test_partial
WITH_GLOO    := test_gloo test_clip test_netns test_dist test_agree test_verify test_reshard test_partial test_llmc bench_dist bench_partial sim_plan
WITH_NCCL    := test_nccl bench_nccl test_nccl_standin
# ThreadSanitizer is slow: test_parallel's small problems, with the pool's split thresholds lowered.
TSAN.test_parallel  := -DTEST_SMALL -DMUON__SPLIT_MACS=1000 -DMUON__SPLIT_ELEMENTS=256

need      = $(filter $*,$(WITH_$1))
posix     = $(if $(call need,POSIX),-D_POSIX_C_SOURCE=200809L)
test_libs = $(if $(call need,GLOO),$(GLOO_LIBS),-lm$(if $(call need,PTHREAD), -pthread))
# $(call ctest,FLAGS[,OBJECT SUFFIX[,LIBS FIRST]]): a tests/ family's C compile and link.
ctest     = $(CC) $(CWARN) $1 $(posix) $(INC) $< $(if $(call need,GLOO),$(BUILD)/muon_gloo$2.o) -o $@ $3 $(test_libs)
gloo_deps = $(if $(call need,GLOO),muon_gloo.h examples/common.h $(BUILD)/muon_gloo$1.o)
TEST_DEPS := muon.h tests/test.h tests/tmat.h

.SECONDEXPANSION:
$(BUILD)/%: tools/%.c | $(BUILD)
	$(CC) $(CWARN) $(O2) $(posix) $< -o $@
$(BUILD)/test_muoncmp: tests/test_muoncmp.c tests/test.h | $(BUILD)    # built as the tool it tests
	$(CC) $(CWARN) $(O2) -D_POSIX_C_SOURCE=200809L -Itests $< -o $@
$(BUILD)/muon_gloo.o: examples/muon_gloo.cpp muon.h muon_gloo.h | $(BUILD)
	$(CXX) $(CXXWARN) $(O2) -I. -c $< -o $@
$(BUILD)/muon_gloo_san.o: examples/muon_gloo.cpp muon.h muon_gloo.h | $(BUILD)
	$(CXX) $(CXXWARN) $(SAN) -I. -c $< -o $@

$(BUILD)/%: tests/%.c $(TEST_DEPS) $$(call gloo_deps) | $(BUILD)
	$(call ctest,$(OPT))
$(BUILD)/%_cxx: tests/%.c $(TEST_DEPS) | $(BUILD)
	$(CXX) $(CXXWARN) $(OPT) $(posix) $(INC) -x c++ $< -o $@ $(filter-out -lm,$(test_libs))
$(BUILD)/%_san: tests/%.c $(TEST_DEPS) $$(call gloo_deps,_san) | $(BUILD)
	$(call ctest,$(SAN),_san)
$(BUILD)/%_fast: tests/%.c $(TEST_DEPS) $$(call gloo_deps) | $(BUILD)
	$(call ctest,-Ofast -march=native)
$(BUILD)/%_tsan: tests/%.c $(TEST_DEPS) $$(call gloo_deps) | $(BUILD)
	$(call ctest,-O1 -g -fsanitize=thread $(TSAN.$*))
$(BUILD)/%_nothreads: tests/%.c $(TEST_DEPS) $$(call gloo_deps) | $(BUILD)
	$(call ctest,$(OPT) -DMUON_NO_THREADS)
$(BUILD)/%_cblas: tests/%.c $(TEST_DEPS) $$(call gloo_deps) | $(BUILD)
	$(call ctest,$(OPT) -DMUON_USE_CBLAS $(BLAS_CFLAGS),,$(BLAS_LIBS))
# make coverage builds the replays plain (REPLAY_SAN=-O0), so that their counters merge.
REPLAY_SAN ?= $(SAN)
$(BUILD)/fuzz_%_replay: tests/fuzz/fuzz_%.c tests/fuzz/replay.c tests/fuzz/fuzz_models.h tests/fuzz/fuzz_world.h muon.h | $(BUILD)
	$(CC) $(CWARN) $(REPLAY_SAN) -I. $< tests/fuzz/replay.c -o $@ -lm -pthread
$(BUILD)/golden/.done: tests/ref_muon.py | $(BUILD)
	$(PYTHON) tests/ref_muon.py $(BUILD)/golden
	@touch $@
$(BUILD)/golden/qk_clip.bin: tests/ref_qk_clip.py | $(BUILD)
	@mkdir -p $(BUILD)/golden
	$(PYTHON) tests/ref_qk_clip.py $@

# ---- examples -------------------------------------------------------------------------------
examples: deps $(addprefix $(BUILD)/,$(EXAMPLES))
$(BUILD)/single: examples/single.c muon.h | $(BUILD)
	$(CC) $(CWARN) $(OPT) -I. $< -o $@ -lm
$(BUILD)/%: examples/%.c examples/common.h muon.h muon_gloo.h $(BUILD)/muon_gloo.o | $(BUILD)
	$(CC) $(CWARN) $(OPT) $(INC) $< $(BUILD)/muon_gloo.o -o $@ $(GLOO_LIBS)

# The flagship: TP x FSDP (2 x 2) on 4 local Gloo processes, checked bitwise against one device.
demo: deps $(BUILD)/muonrun $(BUILD)/tp_fsdp
	$(BUILD)/muonrun -n 4 $(BUILD)/tp_fsdp --steps 10

# ---- CUDA: nvcc's object, and the same code on the stand-ins (cuda/) -------------------------
$(BUILD)/cuda/muon_cuda.o: examples/muon_cuda.cu muon.h muon_cuda.h | $(BUILD)/cuda
	$(NVCC) $(NVFLAGS) -I. -c $< -o $@
# Linking proves every cudart/cuBLAS call exists with the signature used; it runs on a GPU only.
$(BUILD)/cuda/test_cuda_slots_gpu: tests/test_cuda_slots.c $(BUILD)/cuda/muon_cuda.o tests/test.h | $(BUILD)/cuda
	$(CC) $(CWARN) $(O2) $(CUDA_INC) -I. -Itests $< $(BUILD)/cuda/muon_cuda.o -o $@ $(CUDA_LIBS) -lstdc++ -lm
$(BUILD)/cuda/standin.o: tests/standin/cuda_standin.c tests/standin/standin.h | $(BUILD)/cuda
	$(CC) $(CWARN) $(O2) -D_GNU_SOURCE $(CUDA_INC) -c $< -o $@
$(BUILD)/cuda/standin_san.o: tests/standin/cuda_standin.c tests/standin/standin.h | $(BUILD)/cuda
	$(CC) $(CWARN) $(SAN) -D_GNU_SOURCE $(CUDA_INC) -c $< -o $@
$(BUILD)/cuda/nccl_standin.o: tests/standin/nccl_standin.c tests/standin/standin.h | $(BUILD)/cuda
	$(CC) $(CWARN) $(O2) -D_GNU_SOURCE $(CUDA_INC) -Itests/standin -c $< -o $@
$(BUILD)/cuda/nccl_standin_san.o: tests/standin/nccl_standin.c tests/standin/standin.h | $(BUILD)/cuda
	$(CC) $(CWARN) $(SAN) -D_GNU_SOURCE $(CUDA_INC) -Itests/standin -c $< -o $@
$(BUILD)/nccl/muon_nccl.o: examples/muon_nccl.c muon.h muon_nccl.h | $(BUILD)/nccl
	$(CC) $(CWARN) $(O2) $(CUDA_INC) -I. -c $< -o $@
$(BUILD)/cuda/muonrun $(BUILD)/nccl/muonrun $(BUILD)/gpu/muonrun: $(BUILD)/%/muonrun: $(BUILD)/muonrun | $(BUILD)/%
	cp $< $@
CUDA_DEPS := muon.h muon_cuda.h tests/test.h tests/tmat.h examples/common.h
# The stand-ins' own tests (tests/standin/X.c).
$(BUILD)/cuda/%: tests/standin/%.c tests/test.h $(BUILD)/cuda/standin.o $$(if $$(call need,NCCL),$(BUILD)/cuda/nccl_standin.o)
	$(CC) $(CWARN) $(O2) -D_GNU_SOURCE $(CUDA_INC) -Itests -Itests/standin $< $(if $(call need,NCCL),$(BUILD)/cuda/nccl_standin.o) $(BUILD)/cuda/standin.o -o $@ $(test_libs)
# The CUDA backend on the stand-ins: tests, the GPU bench's smoke run, and every strategy
# example with CUDA compute and Gloo communication.
$(BUILD)/cuda/%: tests/%.c $(CUDA_DEPS) $(BUILD)/cuda/standin.o
	$(CC) $(CWARN) $(O2) $(STANDIN) $(INC) $< $(BUILD)/cuda/standin.o -o $@ -lm
$(BUILD)/cuda/%_san: tests/%.c $(CUDA_DEPS) $(BUILD)/cuda/standin_san.o
	$(CC) $(CWARN) $(SAN) $(STANDIN) $(INC) $< $(BUILD)/cuda/standin_san.o -o $@ -lm
# -Ofast: gcc's analogue of a trainer's --use_fast_math over the same kernel source (gcc 12 sees
# a buffer of test_cuda_slots' as maybe-uninitialised only at -Ofast: a false positive).
$(BUILD)/cuda/%_fast: tests/%.c $(CUDA_DEPS) $(BUILD)/cuda/standin.o
	$(CC) $(CWARN) -Wno-maybe-uninitialized -Ofast -march=native $(STANDIN) $(INC) $< $(BUILD)/cuda/standin.o -o $@ -lm
$(BUILD)/cuda/%_standin: bench/%.c bench/bench.h muon.h muon_cuda.h $(BUILD)/cuda/standin.o
	$(CC) $(CWARN) $(O2) $(STANDIN) -I. $< $(BUILD)/cuda/standin.o -o $@ -lm
$(BUILD)/cuda/%: examples/%.c examples/common.h muon.h muon_gloo.h muon_cuda.h $(BUILD)/muon_gloo.o $(BUILD)/cuda/standin.o
	$(CC) $(CWARN) $(O2) -DEX_CUDA $(STANDIN) $(INC) $< $(BUILD)/muon_gloo.o $(BUILD)/cuda/standin.o -o $@ $(GLOO_LIBS)

# ---- NCCL: muon_nccl.h compiled against the real nccl.h and run on the stand-ins (nccl/): the
# tests, the bench's smoke run, every strategy with CUDA compute + NCCL; the _san build puts
# AddressSanitizer + UBSan over everything at once (muon.h, muon_cuda.h, muon_nccl.h, stand-ins).
$(BUILD)/nccl/%: tests/%.c $(CUDA_DEPS) muon_nccl.h $(NCCL_STANDIN)
	$(CC) $(CWARN) $(O2) $(STANDIN) $(INC) $< $(NCCL_STANDIN) -o $@ -lm -pthread
$(BUILD)/nccl/%_san: tests/%.c $(CUDA_DEPS) muon_nccl.h examples/muon_nccl.c $(BUILD)/cuda/nccl_standin_san.o $(BUILD)/cuda/standin_san.o | $(BUILD)/nccl
	$(CC) $(CWARN) $(SAN) $(STANDIN) $(INC) $< examples/muon_nccl.c $(BUILD)/cuda/nccl_standin_san.o $(BUILD)/cuda/standin_san.o -o $@ -lm -pthread
$(BUILD)/nccl/%: bench/%.c muon.h muon_cuda.h muon_nccl.h $(NCCL_STANDIN)
	$(CC) $(CWARN) $(O2) $(STANDIN) -I. $< $(NCCL_STANDIN) -o $@ -lm -pthread
$(BUILD)/nccl/%: examples/%.c examples/common.h muon.h muon_cuda.h muon_nccl.h $(NCCL_STANDIN)
	$(CC) $(CWARN) $(O2) -DEX_NCCL $(STANDIN) $(INC) $< $(NCCL_STANDIN) -o $@ -lm -pthread

# ---- MPI (mpi/): muon_mpi.h over Open MPI, run under mpirun (tests/run_mpi.sh, run_examples.sh
# --mpi): tests/test_mpi.c, test_dist and the strategy examples with -DEX_MPI (common.h's world is
# muon_mpi_create). The flags are read when a recipe runs, after `deps` installed Open MPI; where
# it is still missing the binary is not built and the scripts print a skipped line.
MPI_CFLAGS = $(shell pkg-config --cflags ompi-c 2>/dev/null | sed 's/-I/-isystem /g')
MPI_LIBS   = $(shell pkg-config --libs ompi-c 2>/dev/null)
mpi_build  = @if pkg-config --exists ompi-c; then \
	  echo "$(CC) ... -DEX_MPI $< -o $@"; $(CC) $(CWARN) $1 $(posix) -DEX_MPI $(MPI_CFLAGS) $(INC) $< -o $@ $(MPI_LIBS) -lm; \
	else echo "Open MPI (libopenmpi-dev) not installed: $@ not built"; fi
$(BUILD)/mpi/%_san: tests/%.c $(TEST_DEPS) muon_mpi.h examples/common.h | $(BUILD)/mpi
	$(call mpi_build,$(SAN))
$(BUILD)/mpi/%: tests/%.c $(TEST_DEPS) muon_mpi.h examples/common.h | $(BUILD)/mpi
	$(call mpi_build,$(OPT))
$(BUILD)/mpi/%: examples/%.c examples/common.h muon.h muon_mpi.h | $(BUILD)/mpi
	$(call mpi_build,$(OPT))

# ---- on a real GPU (gpu/): the same suites and benches linked against nvcc's object and the
# real libraries (and libnccl); built by make test to prove the calls link, run by test-gpu.
gpu_link = $(if $(call need,NCCL),$(BUILD)/nccl/muon_nccl.o) $(GPU_LINK)$(if $(call need,NCCL), $(NCCL_LIBS))
gpu_deps = $(BUILD)/cuda/muon_cuda.o $(if $(call need,NCCL),$(BUILD)/nccl/muon_nccl.o)
$(BUILD)/gpu/%: tests/%.c $(CUDA_DEPS) muon_nccl.h $$(gpu_deps) | $(BUILD)/gpu
	$(CC) $(CWARN) $(O2) $(CUDA_INC) $(INC) $< $(gpu_link) -o $@ -lm
$(BUILD)/gpu/%: bench/%.c bench/bench.h muon.h muon_cuda.h muon_nccl.h $$(gpu_deps) | $(BUILD)/gpu
	$(CC) $(CWARN) $(O2) $(CUDA_INC) -I. $< $(gpu_link) -o $@ -lm
$(BUILD)/gpu/%: examples/%.c examples/common.h muon.h muon_gloo.h muon_cuda.h $(BUILD)/muon_gloo.o $(BUILD)/cuda/muon_cuda.o | $(BUILD)/gpu
	$(CC) $(CWARN) $(O2) -DEX_CUDA $(CUDA_INC) $(INC) $< $(BUILD)/muon_gloo.o $(GPU_LINK) -o $@ $(GLOO_LIBS)

# World size 1, and several Gloo ranks sharing the one GPU; compute-sanitizer where installed.
SANITIZER ?= $(CUDA_HOME)/bin/compute-sanitizer
test-gpu: $(addprefix $(BUILD)/gpu/,test_cuda_slots test_cuda test_nccl muonrun $(STRATEGIES))
	@tests/run.sh "$(BUILD)/gpu/test_cuda_slots" "$(BUILD)/gpu/test_cuda" "$(BUILD)/gpu/muonrun -n 1 $(BUILD)/gpu/test_nccl" \
	  "tests/run_examples.sh $(BUILD)/gpu $(STRATEGIES)" \
	  "if [ -x $(SANITIZER) ]; then $(SANITIZER) --tool memcheck --error-exitcode 1 $(BUILD)/gpu/test_cuda_slots && \
	     $(SANITIZER) --tool racecheck --error-exitcode 1 $(BUILD)/gpu/test_cuda_slots; \
	   else echo 'compute-sanitizer not found: skipped'; echo '0 passed, 0 failed, 1 skipped'; fi"

# NS vs the cuBLAS GEMM ceiling, a GPT-2 124M step vs a torch-style C baseline and (where PyTorch
# is importable by TORCH_PYTHON) torch.optim.Muon, memory held: see bench/README.md.
# The distributed step over NCCL on 1, 2, 4, 8 GPUs of this node (up to NGPU), each against the
# one-GPU time measured first in the same run.
TORCH_PYTHON ?= python3
NGPU ?= 1
bench-gpu: $(BUILD)/gpu/bench_gpu $(BUILD)/gpu/bench_nccl $(BUILD)/gpu/muonrun
	@$(TORCH_PYTHON) bench/bench_torch.py | tee $(BUILD)/gpu/bench_torch.txt
	@t=$$(sed -n 's/^torch\.optim\.Muon step: \([0-9.]*\) ms$$/\1/p' $(BUILD)/gpu/bench_torch.txt); \
	 $(BUILD)/gpu/bench_gpu $${t:+--torch-ms $$t}
	@for m in 124m 1.5b; do for n in 1 2 4 8; do [ $$n -le $(NGPU) ] || continue; \
	   $(BUILD)/gpu/muonrun -n $$n --timeout 600 $(BUILD)/gpu/bench_nccl --model $$m \
	     $$([ $$n -eq 1 ] && echo --save $(BUILD)/gpu/bench_nccl.$$m.txt || echo --base $(BUILD)/gpu/bench_nccl.$$m.txt) || exit 1; \
	 done; done

# ==== the tests: four tables of commands for tests/run.sh ====================================
# Each entry is one quoted shell command; tests/run.sh runs them one at a time and adds up their
# "N passed, M failed" lines. What a table builds is found in its commands: every word
# $(BUILD)/[DIR/]NAME whose NAME, less a family suffix, names a source (SRC_DIRS); NEEDS_<table>
# adds what scripts run by themselves. So a new test is one line in one table (and its name in a
# WITH_ list above when it needs more than C99 and -lm). `make print-tests [TABLE=unit]` lists them.
RUN := $(BUILD)/muonrun --timeout 120
# $(call each,NAME,BUILDS[,ARGS]): tests/NAME.c's builds (. = the plain one, else the suffix)
each  = $(foreach f,$2,"$(BUILD)/$1$(patsubst _.,,_$f)$(if $3, $3)")
# $(call ranks,SIZES,PROGRAM ARGS): the program under muonrun at each world size
ranks = $(foreach n,$1,"$(RUN) -n $(n) $2")

# Single-process: muon.h's API, the numpy reference data, every build flavour, threads, faults.
TESTS_unit := \
  $(call each,test_api,. cxx san fast) \
  $(call each,test_trainer,. cxx san fast) \
  $(call each,test_adamw,. cxx san fast) \
  $(call each,test_gemm,. cxx san fast) \
  $(call each,test_golden,. cxx san fast,$(BUILD)/golden) \
  $(call each,test_ns,. cxx san fast,$(BUILD)/golden) "OPENBLAS_NUM_THREADS=1 $(BUILD)/test_ns_cblas $(BUILD)/golden" \
  $(call each,test_threads,. fast san) "$(BUILD)/test_threads_tsan 60" \
  $(call each,test_parallel,. cxx tsan nothreads) "OPENBLAS_NUM_THREADS=1 $(BUILD)/test_parallel_cblas" \
  $(call each,test_faults,. san,$(BUILD)/faults) \
  $(call each,test_misuse,. san,$(BUILD)/misuse) \
  "$(BUILD)/test_muoncmp $(BUILD)/muoncmp_test $(BUILD)/muoncmp" \
  "tests/run_fuzz.sh $(BUILD) replay" \
  "CC='$(CC)' OPT='$(OPT)' tests/run_state_grow.sh $(BUILD)" "tests/run_version.sh" \
  "$(BUILD)/fuzz_state_replay tests/fuzz/corpus/state" "$(BUILD)/fuzz_layout_replay tests/fuzz/corpus/layout" \
  "$(BUILD)/sim_plan --check"
NEEDS_unit := $(BUILD)/golden/.done

# Checkpoints across world sizes and layouts: one save, then loads at other sizes and layouts.
RS := $(BUILD)/test_reshard
RESHARD_TESTS := "rm -rf $(BUILD)/reshard && mkdir -p $(BUILD)/reshard && echo 'reshard: 1 passed, 0 failed'" \
  "$(RUN) -n 4 $(RS) --layout fsdp --save $(BUILD)/reshard/a" \
  "$(RUN) -n 4 $(RS) --layout tp_fsdp --load $(BUILD)/reshard/a --from 4" \
  "$(RUN) -n 1 $(RS) --layout single --load $(BUILD)/reshard/a --from 4" \
  "$(RUN) -n 3 $(RS) --layout fsdp_flat --load $(BUILD)/reshard/a --from 4" \
  "$(RUN) -n 4 $(RS) --layout tp_fsdp --save $(BUILD)/reshard/b" \
  "$(RUN) -n 4 $(RS) --layout hsdp --load $(BUILD)/reshard/b --from 4" \
  "$(RUN) -n 2 $(RS) --layout tp --load $(BUILD)/reshard/b --from 4" \
  "$(RUN) -n 1 $(RS) --layout single --save $(BUILD)/reshard/c" \
  "$(RUN) -n 2 $(RS) --layout fsdp_flat --load $(BUILD)/reshard/c --from 1" \
  "$(RUN) -n 3 $(RS) --layout ddp --load $(BUILD)/reshard/c --from 1" \
  "$(RUN) -n 4 $(RS) --layout hsdp --save $(BUILD)/reshard/d" \
  "$(RUN) -n 2 $(RS) --layout fsdp --load $(BUILD)/reshard/d --from 4" \
  "$(RUN) -n 4 $(RS) --layout tp_fsdp --normuon larger --save $(BUILD)/reshard/e" \
  "$(RUN) -n 3 $(RS) --layout fsdp --normuon larger --load $(BUILD)/reshard/e --from 4" \
  "$(RUN) -n 1 $(RS) --layout single --normuon rows --save $(BUILD)/reshard/f" \
  "$(RUN) -n 4 $(RS) --layout hsdp --normuon rows --load $(BUILD)/reshard/f --from 1" \
  "$(RUN) -n 4 $(RS) --layout fsdp_flat --momentum bf16 --save $(BUILD)/reshard/g" \
  "$(RUN) -n 2 $(RS) --layout tp_fsdp --momentum bf16 --load $(BUILD)/reshard/g --from 4" \
  "$(RUN) -n 3 $(RS) --layout tp --momentum bf16 --load $(BUILD)/reshard/g --from 4" \
  "$(RUN) -n 4 $(RS) --layout fsdp_flat --momentum int8 --save $(BUILD)/reshard/h" \
  "$(RUN) -n 2 $(RS) --layout tp_fsdp --momentum int8 --load $(BUILD)/reshard/h --from 4" \
  "$(RUN) -n 1 $(RS) --layout single --momentum int8 --load $(BUILD)/reshard/h --from 4" \
  "$(RUN) -n 3 $(RS) --layout ddp --momentum int8 --load $(BUILD)/reshard/h --from 4"

# Gloo, several processes: the communicator, the distributed step, agreement, dead and stalled
# peers, Partial gradients, checkpoints, the verification workflow, the planner simulator against
# a real run (sim_plan --real); MPI; several hosts in network namespaces (tests/run_netns.sh, root
# only, else one skipped line).
TESTS_dist := \
  $(call ranks,1 2 3 4 8,$(BUILD)/test_gloo) \
  "$(RUN) -n 4 $(BUILD)/test_gloo --die" "$(RUN) -n 3 $(BUILD)/test_gloo --die-started" "$(RUN) -n 3 $(BUILD)/test_gloo --stall" \
  "tests/run_redis.sh $(BUILD)" \
  $(call ranks,1 2 3 4 8,$(BUILD)/test_dist) "$(RUN) -n 3 $(BUILD)/test_dist_san" \
  "MUON_GLOO_BLOCKING=1 $(RUN) -n 3 $(BUILD)/test_dist" \
  "$(BUILD)/test_dist --fault kill 3" "$(BUILD)/test_dist --fault stall 3" \
  "$(BUILD)/test_dist --fault kill 3 overlap" "$(BUILD)/test_dist --fault stall 3 overlap" \
  "MUON_GLOO_BLOCKING=1 $(BUILD)/test_dist --fault kill 3 overlap" \
  $(call ranks,1 2 3 4,$(BUILD)/test_agree) "$(RUN) -n 3 $(BUILD)/test_agree_san" \
  $(call ranks,1 2 3 4,$(BUILD)/test_partial $(BUILD)/partial) "$(RUN) -n 3 $(BUILD)/test_partial_san $(BUILD)/partial" \
  $(call ranks,1 2 3 4,$(BUILD)/test_llmc) \
  $(call ranks,1 2 3 4,$(BUILD)/test_clip $(BUILD)/golden/qk_clip.bin) "$(RUN) -n 3 $(BUILD)/test_clip_san $(BUILD)/golden/qk_clip.bin" \
  $(RESHARD_TESTS) \
  $(call ranks,1 2 3 4,$(BUILD)/test_verify $(BUILD)/muoncmp $(BUILD)/verify) \
  "tests/run_wrong_dim.sh $(BUILD)" \
  "$(RUN) -n 8 $(BUILD)/sim_plan --real tiny fsdp 2" "$(RUN) -n 4 $(BUILD)/sim_plan --real tiny-moe ep 2" \
  "tests/run_mpi.sh $(BUILD)" "timeout -k 10 300 tests/run_netns.sh $(BUILD)" \
  "CC='$(CC)' CXX='$(CXX)' OPT='$(OPT)' CUDA_HOME='$(CUDA_HOME)' tests/run_snippets.sh $(BUILD)"
NEEDS_dist := $(BUILD)/golden/qk_clip.bin $(BUILD)/tp_fsdp $(BUILD)/sim_plan $(BUILD)/muon_gloo.o $(BUILD)/muonrun $(addprefix $(BUILD)/mpi/,test_mpi test_dist test_dist_san test_netns fsdp tp_fsdp) \
  $(BUILD)/netrelay $(BUILD)/test_netns $(BUILD)/fsdp

# Stochastic rounding (--sr: bf16 mirrors of every matrix and AdamW param, checked too): a ZeRO
# piece and a pipeline stage draw one device's random bits. $(call sr_runs,DIR,EXAMPLES,SIZES)
sr_runs = $(foreach e,$2,$(foreach n,$3,\
  "$(RUN) -n $(n) $1/$(e) --sr --quiet && echo 'sr-$(notdir $1)-$(e): 1 passed, 0 failed'"))

# bf16 / 8-bit momentum (muon_hparams.momentum_format): flat, row and column cuts, bitwise against
# one device that keeps its momentum so too. $(call mom_runs,DIR,EXAMPLES,SIZES,FORMAT)
mom_runs = $(foreach e,$2,$(foreach n,$3,\
  "$(RUN) -n $(n) $1/$(e) --momentum $4 --quiet && echo 'momentum-$4-$(notdir $1)-$(e)-n$(n): 1 passed, 0 failed'"))

# The examples: every strategy at its world sizes, the option variants, bf16 on the wire,
# overlap, Partial gradients; each bitwise against one device.
TESTS_examples := \
  "tests/run_examples.sh $(BUILD) $(STRATEGIES)" \
  "tests/run_examples.sh --mpi --same-bytes-as $(BUILD) $(BUILD)/mpi $(MPI_EXAMPLES)" \
  $(call ranks,1 2 3 4,$(BUILD)/distributed) \
  $(foreach e,fsdp tp_fsdp hsdp,"$(RUN) -n 4 $(BUILD)/$(e) --cautious --gram --quiet && echo '$(e) --cautious --gram: 1 passed, 0 failed'") \
  $(foreach e,fsdp tp_fsdp hsdp,"$(RUN) -n 4 $(BUILD)/$(e) --normuon larger --cautious --late --quiet && echo '$(e) --normuon larger --cautious --late: 1 passed, 0 failed'") \
  "$(RUN) -n 4 $(BUILD)/tp_fsdp --normuon rows --gram --quiet && echo 'tp_fsdp --normuon rows --gram: 1 passed, 0 failed'" \
  $(foreach e,ddp fsdp tp_fsdp,"MUON_THREADS=3 $(RUN) -n 2 $(BUILD)/$(e) --normuon larger --quiet && echo '$(e) MUON_THREADS=3: 1 passed, 0 failed'") \
  "tests/run_wire.sh $(BUILD) 4 ddp fsdp tp_fsdp hsdp ep_fsdp tp_hsdp" \
  "MUON_THREADS=2 tests/run_overlap.sh $(BUILD) fsdp tp_fsdp hsdp ep_fsdp full_4d" \
  "MUON_THREADS=2 MUON_GLOO_BLOCKING=1 tests/run_overlap.sh --some $(BUILD) ddp cp fsdp_flat tp tp_hsdp ep ep_tp pp layout_2d custom_vtable" \
  "tests/run_partial.sh $(BUILD) ddp cp hsdp tp_hsdp" \
  "EXTRA='--partial sum' tests/run_overlap.sh $(BUILD) ddp hsdp" \
  "EXTRA='--partial mean' tests/run_overlap.sh --some $(BUILD) cp tp_hsdp" \
  "MUON_THREADS=3 $(RUN) -n 3 $(BUILD)/cp --partial sum --quiet && echo 'cp --partial sum MUON_THREADS=3: 1 passed, 0 failed'" \
  $(call sr_runs,$(BUILD),fsdp fsdp_flat,1 2 4) $(call sr_runs,$(BUILD),pp tp_fsdp,4) \
  $(call mom_runs,$(BUILD),fsdp_flat,2 3,bf16) $(call mom_runs,$(BUILD),tp_fsdp,2 4,bf16) \
  $(call mom_runs,$(BUILD),fsdp_flat,2 3,int8) $(call mom_runs,$(BUILD),tp_fsdp,2 4,int8) \
  "$(RUN) -n 3 $(BUILD)/ddp --momentum int8 --partial sum --quiet && echo 'ddp --momentum int8 --partial sum: 1 passed, 0 failed'" \
  "$(RUN) -n 4 $(BUILD)/hsdp --momentum int8 --late --normuon larger --quiet && echo 'hsdp --momentum int8 --late: 1 passed, 0 failed'" \
  "$(RUN) -n 3 $(BUILD)/ddp --momentum bf16 --partial sum --quiet && echo 'ddp --momentum bf16 --partial sum: 1 passed, 0 failed'" \
  "$(RUN) -n 4 $(BUILD)/hsdp --momentum bf16 --late --normuon larger --quiet && echo 'hsdp --momentum bf16 --late: 1 passed, 0 failed'" \
  "EXTRA='--momentum bf16' MUON_THREADS=2 tests/run_overlap.sh --some $(BUILD) fsdp_flat"
NEEDS_examples := $(addprefix $(BUILD)/,$(STRATEGIES)) $(addprefix $(BUILD)/mpi/,$(MPI_EXAMPLES))

# CUDA: nvcc compiles the backend and it links against cudart/cuBLAS/NCCL (gpu/ and
# cuda/test_cuda_slots_gpu are built, not run); the same code runs on the stand-ins.
ifeq ($(HAVE_CUDA),1)
TESTS_cuda := \
  "$(BUILD)/cuda/test_standin" "$(BUILD)/cuda/test_cuda_slots" "$(BUILD)/cuda/test_cuda_slots_san" "$(BUILD)/cuda/test_cuda" \
  "$(BUILD)/cuda/test_cuda_slots_fast" "$(BUILD)/cuda/test_cuda_fast" "tests/run_fast_math.sh $(NVCC) $(BUILD)/cuda" \
  "$(BUILD)/cuda/bench_gpu_standin --smoke >/dev/null && echo 'bench_gpu --smoke on the stand-ins: 1 passed, 0 failed'" \
  "tests/run_examples.sh --one-size $(BUILD)/cuda $(STRATEGIES)" \
  $(foreach n,1 2 3 4 8,"$(BUILD)/muonrun -n $(n) --timeout 120 $(BUILD)/cuda/test_nccl_standin") \
  $(foreach n,1 2 3 4,"$(BUILD)/muonrun -n $(n) --timeout 120 $(BUILD)/nccl/test_nccl") \
  $(foreach n,1 2 4,"$(BUILD)/muonrun -n $(n) --timeout 120 $(BUILD)/nccl/test_llmc") \
  "MUON_STANDIN_AHEAD=1 $(BUILD)/muonrun -n 3 --timeout 120 $(BUILD)/nccl/test_nccl_san" \
  "$(BUILD)/muonrun -n 2 $(BUILD)/nccl/bench_nccl --smoke >/dev/null && echo 'bench_nccl --smoke on the stand-ins: 1 passed, 0 failed'" \
  "tests/run_examples.sh --one-size --same-bytes-as $(BUILD)/cuda $(BUILD)/nccl $(STRATEGIES)" \
  "tests/run_wire.sh $(BUILD)/cuda 4 fsdp tp_fsdp" "tests/run_wire.sh $(BUILD)/nccl 4 fsdp tp_hsdp" \
  "tests/run_overlap.sh $(BUILD)/cuda fsdp" "MUON_STANDIN_AHEAD=1 tests/run_overlap.sh --some $(BUILD)/nccl fsdp tp_hsdp" \
  "tests/run_partial.sh $(BUILD)/cuda ddp hsdp" "tests/run_partial.sh $(BUILD)/nccl cp tp_hsdp" \
  "MUON_STANDIN_AHEAD=1 EXTRA='--partial sum' tests/run_overlap.sh --some $(BUILD)/nccl ddp" \
  $(foreach d,cuda nccl,"$(BUILD)/muonrun -n 4 --timeout 120 $(BUILD)/$(d)/fsdp --normuon larger --cautious --late --quiet && echo '$(d) fsdp --normuon larger --late: 1 passed, 0 failed'") \
  "$(BUILD)/muonrun -n 4 --timeout 120 $(BUILD)/cuda/tp_fsdp --normuon rows --gram --late --quiet && echo 'cuda tp_fsdp --normuon rows --gram --late: 1 passed, 0 failed'" \
  $(call sr_runs,$(BUILD)/cuda,fsdp,1 2 4) $(call sr_runs,$(BUILD)/nccl,fsdp,1 2 4) $(call sr_runs,$(BUILD)/nccl,pp,4) \
  $(call mom_runs,$(BUILD)/cuda,tp_fsdp,4,bf16) $(call mom_runs,$(BUILD)/nccl,fsdp_flat,2,bf16) \
  $(call mom_runs,$(BUILD)/cuda,tp_fsdp,4,int8) $(call mom_runs,$(BUILD)/nccl,fsdp_flat,3,int8)
NEEDS_cuda := $(addprefix $(BUILD)/cuda/,muonrun $(STRATEGIES)) $(addprefix $(BUILD)/nccl/,muonrun $(STRATEGIES)) \
  $(BUILD)/cuda/muon_cuda.o $(BUILD)/cuda/test_cuda_slots_gpu $(addprefix $(BUILD)/gpu/,bench_gpu test_nccl bench_nccl)
else
TESTS_cuda := "echo 'CUDA toolkit not found at $(CUDA_HOME) (set CUDA_HOME): CUDA compile, link and stand-in tests skipped'; echo '0 passed, 0 failed, 1 skipped'"
endif

SRC_DIRS := tests tests/standin tests/fuzz tools examples bench
SUFFIXES := _cxx _san _fast _tsan _nothreads _cblas _replay _standin _gpu
unsuffix  = $(or $(firstword $(foreach s,$(SUFFIXES),$(patsubst %$s,%,$(filter %$s,$1)))),$1)
is_binary = $(wildcard $(foreach d,$(SRC_DIRS),$d/$1.c $d/$(call unsuffix,$1).c))
binaries  = $(foreach w,$(filter $(BUILD)/%,$(subst ",,$1)),$(if $(call is_binary,$(notdir $w)),$w))
# the first of each word, in order (a goal made earlier as another's prerequisite: 'up to date')
uniq      = $(if $1,$(firstword $1) $(call uniq,$(filter-out $(firstword $1),$1)))
TABLES    := unit dist examples cuda
$(foreach t,$(TABLES),$(eval BINS_$t := $$(strip $$(call uniq,$$(call binaries,$$(TESTS_$t)) $$(NEEDS_$t)))))
TEST_BINS := $(call uniq,$(foreach t,$(TABLES),$(BINS_$t)))

# The binaries build in parallel (JOBS, default: every core); the tests then run in two lanes
# side by side, each one command at a time (tests/run.sh's "::"), with one closing line: the
# single-process and stand-in tables beside the multi-process ones, whose ranks mostly wait on
# the network. test-<table> builds and runs one table alone.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test: deps check-headers
	@$(MAKE) --no-print-directory -j$(JOBS) $(TEST_BINS)
	@tests/run.sh $(TESTS_unit) $(TESTS_cuda) :: $(TESTS_dist) $(TESTS_examples)
$(addprefix test-,$(TABLES)): test-%: deps
	$(if $(BINS_$*),@$(MAKE) --no-print-directory -j$(JOBS) $(BINS_$*))
	@tests/run.sh $(TESTS_$*)
print-tests:
	@printf '%s\n' $(foreach t,$(or $(TABLE),$(TABLES)),$(TESTS_$t))

# libFuzzer (clang): each target for FUZZ_SECONDS (default 60); make test replays the corpora.
FUZZ_SECONDS ?= 60
fuzz:
	@FUZZ_SECONDS=$(FUZZ_SECONDS) tests/run_fuzz.sh $(BUILD) fuzz

# ---- coverage: the whole `make test` suite built with gcov in its own build directory -------
# Every compile gets --coverage and MUON_COVERAGE, under which ranks that _exit write their
# counters first (test.h); OPT and O2 become -O0 so every build has the same line tables (sim_plan,
# a bench built at -O3 whatever OPT says, is left out with the sanitizer builds), and the
# fuzz corpora's replays are built without sanitizers. The sanitizer and -Ofast builds run too,
# but their counters are left out of the report: their line tables differ and UBSan's checks add
# branches no input takes. tools/coverage.sh counts lines over every build, branches over the C
# builds (see there). gcovr then reports each public
# header; the HTML is $(COV_BUILD)/html/index.html.
COV_BUILD := $(BUILD)/cov
coverage: deps
	@tools/install-deps.sh gcovr
	@rm -rf $(COV_BUILD) && mkdir -p $(COV_BUILD)
	@$(MAKE) --no-print-directory BUILD=$(COV_BUILD) OPT="-O0 -march=native" O2=-O0 REPLAY_SAN=-O0 \
	  CC="$(CC) --coverage -DMUON_COVERAGE" CXX="$(CXX) --coverage -DMUON_COVERAGE" test \
	  | tee $(COV_BUILD)/test.log; echo "suite: $$(tail -n 1 $(COV_BUILD)/test.log)"
	@rm -f a-*.gcno   # check-headers' syntax-only compiles leave their notes in the working directory
	@find $(COV_BUILD) \( -name '*_san*.gc*' -o -name '*_tsan*.gc*' -o -name '*_fast*.gc*' -o -name '*_nothreads*.gc*' \
	  -o -name '*sim_plan*.gc*' \) -delete
	@tools/coverage.sh $(COV_BUILD) $(HEADERS)
	@tail -n 1 $(COV_BUILD)/test.log | grep -Eq '^[0-9]+ passed, 0 failed' || \
	  { echo "coverage: the suite did not pass ($$(tail -n 1 $(COV_BUILD)/test.log)): the figures count only what ran"; exit 1; }

# ---- mutation: does the suite notice realistic one-line bugs (tests/mutants.txt)? ----------
# Each mutant alone on a scratch copy of the tree ($(BUILD)/mutate/tree*), the mutation suite of
# tools/mutate.py until a step fails; ends with "mutation: K killed, S survived of T". Long (hours
# on 2 cores the first time; a mutant's last killer runs first after that); MUTANTS=id,id runs only
# those, MUTATE_WORKERS mutants at once.
MUTATE_WORKERS ?= 2
mutate: deps
	@$(PYTHON) tools/mutate.py --dir $(BUILD)/mutate --workers $(MUTATE_WORKERS) $(if $(MUTANTS),--only $(MUTANTS))

# ---- bench ----------------------------------------------------------------------------------
# Ratios measured side by side in one run: GEMM and Newton-Schulz vs the OpenBLAS ceiling and
# numpy (single-threaded), then 1 vs P ranks, batched vs per-matrix, zero-redundancy vs Moonlight;
# then 4 ranks in network namespaces over 1 Gbit/s and 10 ms RTT (root; else a skipped line); last,
# the planner on 8 to 16,384 virtual ranks (sim_plan: a few minutes of one core).
$(BUILD)/%: bench/%.c bench/bench.h muon.h $$(call gloo_deps) | $(BUILD)
	$(CC) $(CWARN) -O3 -march=native -DMUON_USE_CBLAS $(BLAS_CFLAGS) -I. $< $(if $(call need,GLOO),$(BUILD)/muon_gloo.o -o $@ $(GLOO_LIBS) $(BLAS_LIBS),-o $@ $(BLAS_LIBS) -lm)

BENCH_RUN := OPENBLAS_NUM_THREADS=1 $(BUILD)/muonrun --timeout 300
bench: deps $(BUILD)/bench_ns $(BUILD)/bench_dist $(BUILD)/bench_partial $(BUILD)/bench_momentum $(BUILD)/muonrun $(BUILD)/netrelay $(BUILD)/sim_plan
	OPENBLAS_NUM_THREADS=1 $(BUILD)/bench_ns
	OPENBLAS_NUM_THREADS=1 $(PYTHON) bench/bench_numpy.py
	$(BENCH_RUN) -n 1 $(BUILD)/bench_dist --configs batched
	$(BENCH_RUN) -n 2 $(BUILD)/bench_dist
	$(BENCH_RUN) -n 2 $(BUILD)/bench_dist --layers 12 --configs single,batched --steps 2
	$(BENCH_RUN) -n 4 $(BUILD)/bench_dist --layers 1
	$(BENCH_RUN) -n 4 $(BUILD)/bench_dist --overlap --small 256 --dim 32 --round-bytes 4096 --steps 3
	MUON_GLOO_BLOCKING=1 $(BENCH_RUN) -n 4 $(BUILD)/bench_dist --overlap --small 256 --dim 32 --round-bytes 4096 --steps 3
	$(BENCH_RUN) -n 2 $(BUILD)/bench_dist --overlap --small 256 --steps 5
	$(BENCH_RUN) -n 2 $(BUILD)/bench_dist --overlap
	$(BENCH_RUN) -n 2 $(BUILD)/bench_partial
	$(BENCH_RUN) -n 4 $(BUILD)/bench_partial --layers 1
	OPENBLAS_NUM_THREADS=1 $(BUILD)/bench_momentum
	timeout -k 10 1800 tests/run_netns.sh --bench $(BUILD)
	$(BUILD)/sim_plan

# ---- install --------------------------------------------------------------------------------
install: $(BUILD)/muoncmp
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(HEADERS) $(DESTDIR)$(PREFIX)/include/
	install -m 755 $(BUILD)/muoncmp $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' tools/muon.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/muon.pc

uninstall:
	cd $(DESTDIR)$(PREFIX)/include && rm -f $(HEADERS)
	rm -f $(DESTDIR)$(PREFIX)/bin/muoncmp
	rm -f $(DESTDIR)$(PREFIX)/lib/pkgconfig/muon.pc

clean:
	rm -rf $(BUILD)
