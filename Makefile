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
HEADERS  := muon.h muon_gloo.h muon_cuda.h muon_nccl.h
DEPS     := g++ pkg-config libopenblas-dev python3-numpy libgloo-dev redis-server

# One program per parallelism strategy (examples/<name>.c) and the world sizes each is tested at.
STRATEGIES := ddp cp fsdp fsdp_flat tp hsdp tp_fsdp tp_hsdp ep ep_tp ep_fsdp pp full_4d layout_2d custom_vtable
EXAMPLES   := single muonrun muoncmp $(STRATEGIES)

# CUDA: the toolkit's nvcc, headers and libraries (override CUDA_HOME). Without a GPU the CUDA
# backend still compiles with nvcc, links against cudart/cuBLAS, and runs on the stand-ins
# (tests/standin: our C implementation of the cudart/cuBLAS calls it makes, strict like a GPU).
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
HAVE_CUDA := $(shell test -x $(NVCC) && test -f $(CUDA_HOME)/include/cublas_v2.h && echo 1)
CUDA_INC  := -isystem $(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas
NVFLAGS   := -O2 -fmad=false -Xcompiler -Wall,-Wextra,-Werror
STANDIN   := $(CUDA_INC) -DMUON_CUDA_STANDIN -DMUON_CUDA_IMPLEMENTATION -D_GNU_SOURCE -Itests/standin

.PHONY: all test demo bench examples install uninstall clean deps check-headers test-cuda test-gpu bench-gpu fuzz coverage mutate

all: examples

deps:
	@tools/install-deps.sh $(DEPS)

$(BUILD):
	@mkdir -p $(BUILD)

# ---- every public header alone, as C99 and as C++17, declarations and implementation --------
check-headers: | $(BUILD)
	@for h in $(HEADERS); do \
	  printf '#include "%s"\n' $$h > $(BUILD)/hdr.c; \
	  $(CC) $(CWARN) -fsyntax-only -I. $(BUILD)/hdr.c && \
	  $(CXX) $(CXXWARN) -fsyntax-only -x c++ -I. $(BUILD)/hdr.c || exit 1; \
	done
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

# ---- building blocks ------------------------------------------------------------------------
$(BUILD)/muonrun: tools/muonrun.c | $(BUILD)
	$(CC) $(CWARN) $(O2) -D_POSIX_C_SOURCE=200809L $< -o $@
$(BUILD)/muoncmp: tools/muoncmp.c | $(BUILD)
	$(CC) $(CWARN) $(O2) $< -o $@
$(BUILD)/test_muoncmp: tests/test_muoncmp.c tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(O2) -D_POSIX_C_SOURCE=200809L -Itests $< -o $@
$(BUILD)/muon_gloo.o: examples/muon_gloo.cpp muon.h muon_gloo.h | $(BUILD)
	$(CXX) $(CXXWARN) $(O2) -I. -c $< -o $@
$(BUILD)/muon_gloo_san.o: examples/muon_gloo.cpp muon.h muon_gloo.h | $(BUILD)
	$(CXX) $(CXXWARN) $(SAN) -I. -c $< -o $@

# ---- examples -------------------------------------------------------------------------------
examples: deps $(addprefix $(BUILD)/,$(EXAMPLES))
$(BUILD)/single: examples/single.c muon.h | $(BUILD)
	$(CC) $(CWARN) $(OPT) -I. $< -o $@ -lm
$(addprefix $(BUILD)/,$(STRATEGIES)): $(BUILD)/%: examples/%.c examples/common.h muon.h muon_gloo.h $(BUILD)/muon_gloo.o
	$(CC) $(CWARN) $(OPT) $(INC) $< $(BUILD)/muon_gloo.o -o $@ $(GLOO_LIBS)

# The flagship: TP x FSDP (2 x 2) on 4 local Gloo processes, checked bitwise against one device.
demo: deps $(BUILD)/muonrun $(BUILD)/tp_fsdp
	$(BUILD)/muonrun -n 4 $(BUILD)/tp_fsdp --steps 10

# ---- CUDA: nvcc compile + link against the real libraries; the same code on the stand-ins ---
$(BUILD)/cuda: | $(BUILD)
	@mkdir -p $(BUILD)/cuda
$(BUILD)/cuda/muon_cuda.o: examples/muon_cuda.cu muon.h muon_cuda.h | $(BUILD)/cuda
	$(NVCC) $(NVFLAGS) -I. -c $< -o $@
# Linking proves every cudart/cuBLAS call exists with the signature used; it runs on a GPU only.
$(BUILD)/cuda/test_cuda_slots_gpu: tests/test_cuda_slots.c $(BUILD)/cuda/muon_cuda.o tests/test.h | $(BUILD)/cuda
	$(CC) $(CWARN) $(O2) $(CUDA_INC) -I. -Itests $< $(BUILD)/cuda/muon_cuda.o -o $@ $(CUDA_LIBS) -lstdc++ -lm
$(BUILD)/cuda/standin.o: tests/standin/cuda_standin.c tests/standin/standin.h | $(BUILD)/cuda
	$(CC) $(CWARN) $(O2) -D_GNU_SOURCE $(CUDA_INC) -c $< -o $@
$(BUILD)/cuda/standin_san.o: tests/standin/cuda_standin.c tests/standin/standin.h | $(BUILD)/cuda
	$(CC) $(CWARN) $(SAN) -D_GNU_SOURCE $(CUDA_INC) -c $< -o $@
$(BUILD)/cuda/test_standin: tests/standin/test_standin.c $(BUILD)/cuda/standin.o tests/test.h
	$(CC) $(CWARN) $(O2) -D_GNU_SOURCE $(CUDA_INC) -Itests -Itests/standin $< $(BUILD)/cuda/standin.o -o $@ -lm
$(BUILD)/cuda/test_cuda_slots: tests/test_cuda_slots.c muon.h muon_cuda.h $(BUILD)/cuda/standin.o tests/test.h
	$(CC) $(CWARN) $(O2) $(STANDIN) $(INC) $< $(BUILD)/cuda/standin.o -o $@ -lm
$(BUILD)/cuda/test_cuda: tests/test_cuda.c muon.h muon_cuda.h $(BUILD)/cuda/standin.o tests/test.h
	$(CC) $(CWARN) $(O2) $(STANDIN) $(INC) $< $(BUILD)/cuda/standin.o -o $@ -lm
$(BUILD)/cuda/test_cuda_slots_san: tests/test_cuda_slots.c muon.h muon_cuda.h $(BUILD)/cuda/standin_san.o tests/test.h
	$(CC) $(CWARN) $(SAN) $(STANDIN) $(INC) $< $(BUILD)/cuda/standin_san.o -o $@ -lm
$(BUILD)/cuda/muonrun: $(BUILD)/muonrun | $(BUILD)/cuda
	cp $< $@
# Every strategy example with CUDA compute (on the stand-ins) and Gloo communication.
$(addprefix $(BUILD)/cuda/,$(STRATEGIES)): $(BUILD)/cuda/%: examples/%.c examples/common.h muon.h muon_gloo.h muon_cuda.h $(BUILD)/muon_gloo.o $(BUILD)/cuda/standin.o
	$(CC) $(CWARN) $(O2) -DEX_CUDA $(STANDIN) $(INC) $< $(BUILD)/muon_gloo.o $(BUILD)/cuda/standin.o -o $@ $(GLOO_LIBS)

# ---- NCCL: muon_nccl.h compiled against the real nccl.h; linked against the real libnccl (to
# prove the calls exist), and run on the stand-ins: every strategy with CUDA compute + NCCL.
NCCL_LIBS := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib -lnccl
$(BUILD)/nccl: | $(BUILD)
	@mkdir -p $(BUILD)/nccl
$(BUILD)/nccl/muon_nccl.o: examples/muon_nccl.c muon.h muon_nccl.h | $(BUILD)/nccl
	$(CC) $(CWARN) $(O2) $(CUDA_INC) -I. -c $< -o $@
$(BUILD)/cuda/nccl_standin.o: tests/standin/nccl_standin.c tests/standin/standin.h | $(BUILD)/cuda
	$(CC) $(CWARN) $(O2) -D_GNU_SOURCE $(CUDA_INC) -Itests/standin -c $< -o $@
$(BUILD)/cuda/test_nccl_standin: tests/standin/test_nccl_standin.c $(BUILD)/cuda/nccl_standin.o $(BUILD)/cuda/standin.o tests/test.h
	$(CC) $(CWARN) $(O2) -D_GNU_SOURCE $(CUDA_INC) -Itests -Itests/standin $< $(BUILD)/cuda/nccl_standin.o $(BUILD)/cuda/standin.o -o $@ -lm -pthread
$(BUILD)/cuda/nccl_standin_san.o: tests/standin/nccl_standin.c tests/standin/standin.h | $(BUILD)/cuda
	$(CC) $(CWARN) $(SAN) -D_GNU_SOURCE $(CUDA_INC) -Itests/standin -c $< -o $@
NCCL_STANDIN := $(BUILD)/nccl/muon_nccl.o $(BUILD)/cuda/nccl_standin.o $(BUILD)/cuda/standin.o
# AddressSanitizer + UBSan over everything at once: muon.h, muon_cuda.h, muon_nccl.h, both stand-ins.
$(BUILD)/nccl/test_nccl_san: tests/test_nccl.c tests/tmat.h examples/common.h muon.h muon_cuda.h muon_nccl.h examples/muon_nccl.c $(BUILD)/cuda/nccl_standin_san.o $(BUILD)/cuda/standin_san.o tests/test.h
	$(CC) $(CWARN) $(SAN) $(STANDIN) $(INC) $< examples/muon_nccl.c $(BUILD)/cuda/nccl_standin_san.o $(BUILD)/cuda/standin_san.o -o $@ -lm -pthread
$(BUILD)/nccl/test_nccl: tests/test_nccl.c tests/tmat.h examples/common.h muon.h muon_cuda.h muon_nccl.h $(NCCL_STANDIN) tests/test.h
	$(CC) $(CWARN) $(O2) $(STANDIN) $(INC) $< $(NCCL_STANDIN) -o $@ -lm -pthread
# Links muon_nccl.o with the real libnccl / libcudart / libcublas: runs only on a GPU (test-gpu).
$(BUILD)/gpu/test_nccl: tests/test_nccl.c tests/tmat.h examples/common.h muon.h muon_cuda.h muon_nccl.h $(BUILD)/nccl/muon_nccl.o $(BUILD)/cuda/muon_cuda.o tests/test.h | $(BUILD)/gpu
	$(CC) $(CWARN) $(O2) $(CUDA_INC) $(INC) $< $(BUILD)/nccl/muon_nccl.o $(GPU_LINK) $(NCCL_LIBS) -o $@ -lm
$(BUILD)/nccl/bench_nccl: bench/bench_nccl.c muon.h muon_cuda.h muon_nccl.h $(NCCL_STANDIN)
	$(CC) $(CWARN) $(O2) $(STANDIN) -I. $< $(NCCL_STANDIN) -o $@ -lm -pthread
$(BUILD)/gpu/bench_nccl: bench/bench_nccl.c muon.h muon_cuda.h muon_nccl.h $(BUILD)/nccl/muon_nccl.o $(BUILD)/cuda/muon_cuda.o | $(BUILD)/gpu
	$(CC) $(CWARN) $(O2) $(CUDA_INC) -I. $< $(BUILD)/nccl/muon_nccl.o $(GPU_LINK) $(NCCL_LIBS) -o $@ -lm
$(BUILD)/nccl/muonrun: $(BUILD)/muonrun | $(BUILD)/nccl
	cp $< $@
$(addprefix $(BUILD)/nccl/,$(STRATEGIES)): $(BUILD)/nccl/%: examples/%.c examples/common.h muon.h muon_cuda.h muon_nccl.h $(NCCL_STANDIN)
	$(CC) $(CWARN) $(O2) -DEX_NCCL $(STANDIN) $(INC) $< $(NCCL_STANDIN) -o $@ -lm -pthread

# ---- on a real GPU: the same suites linked against nvcc's object and the real libraries -------
GPU_LINK := $(BUILD)/cuda/muon_cuda.o $(CUDA_LIBS) -lstdc++
$(BUILD)/gpu: | $(BUILD)
	@mkdir -p $(BUILD)/gpu
$(BUILD)/gpu/test_cuda_slots: tests/test_cuda_slots.c $(BUILD)/cuda/muon_cuda.o tests/test.h | $(BUILD)/gpu
	$(CC) $(CWARN) $(O2) $(CUDA_INC) $(INC) $< $(GPU_LINK) -o $@ -lm
$(BUILD)/gpu/test_cuda: tests/test_cuda.c $(BUILD)/cuda/muon_cuda.o tests/test.h | $(BUILD)/gpu
	$(CC) $(CWARN) $(O2) $(CUDA_INC) $(INC) $< $(GPU_LINK) -o $@ -lm
$(BUILD)/gpu/muonrun: $(BUILD)/muonrun | $(BUILD)/gpu
	cp $< $@
$(addprefix $(BUILD)/gpu/,$(STRATEGIES)): $(BUILD)/gpu/%: examples/%.c examples/common.h muon.h muon_gloo.h muon_cuda.h $(BUILD)/muon_gloo.o $(BUILD)/cuda/muon_cuda.o
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
TORCH_PYTHON ?= python3
$(BUILD)/gpu/bench_gpu: bench/bench_gpu.c bench/bench.h muon.h muon_cuda.h $(BUILD)/cuda/muon_cuda.o | $(BUILD)/gpu
	$(CC) $(CWARN) $(O2) $(CUDA_INC) -I. $< $(GPU_LINK) -o $@ -lm
$(BUILD)/cuda/bench_gpu_standin: bench/bench_gpu.c bench/bench.h muon.h muon_cuda.h $(BUILD)/cuda/standin.o
	$(CC) $(CWARN) $(O2) $(STANDIN) -I. $< $(BUILD)/cuda/standin.o -o $@ -lm
# The distributed step over NCCL on 1, 2, 4, 8 GPUs of this node (up to NGPU), each against the
# one-GPU time measured first in the same run.
NGPU ?= 1
bench-gpu: $(BUILD)/gpu/bench_gpu $(BUILD)/gpu/bench_nccl $(BUILD)/gpu/muonrun
	@$(TORCH_PYTHON) bench/bench_torch.py | tee $(BUILD)/gpu/bench_torch.txt
	@t=$$(sed -n 's/^torch\.optim\.Muon step: \([0-9.]*\) ms$$/\1/p' $(BUILD)/gpu/bench_torch.txt); \
	 $(BUILD)/gpu/bench_gpu $${t:+--torch-ms $$t}
	@for m in 124m 1.5b; do for n in 1 2 4 8; do [ $$n -le $(NGPU) ] || continue; \
	   $(BUILD)/gpu/muonrun -n $$n --timeout 600 $(BUILD)/gpu/bench_nccl --model $$m \
	     $$([ $$n -eq 1 ] && echo --save $(BUILD)/gpu/bench_nccl.$$m.txt || echo --base $(BUILD)/gpu/bench_nccl.$$m.txt) || exit 1; \
	 done; done

CUDA_BINS := $(addprefix $(BUILD)/cuda/,muon_cuda.o test_cuda_slots_gpu test_standin test_cuda_slots test_cuda_slots_san test_cuda bench_gpu_standin muonrun $(STRATEGIES)) $(BUILD)/gpu/bench_gpu \
             $(BUILD)/cuda/test_nccl_standin $(BUILD)/gpu/test_nccl $(BUILD)/gpu/bench_nccl \
             $(addprefix $(BUILD)/nccl/,test_nccl test_nccl_san bench_nccl muonrun $(STRATEGIES))
ifeq ($(HAVE_CUDA),1)
CUDA_TESTS := "$(BUILD)/cuda/test_standin" "$(BUILD)/cuda/test_cuda_slots" "$(BUILD)/cuda/test_cuda_slots_san" \
              "$(BUILD)/cuda/test_cuda" \
              "$(BUILD)/cuda/bench_gpu_standin --smoke >/dev/null && echo 'bench_gpu --smoke on the stand-ins: 1 passed, 0 failed'" \
              "tests/run_examples.sh --one-size $(BUILD)/cuda $(STRATEGIES)" \
              $(foreach n,1 2 3 4 8,"$(BUILD)/muonrun -n $(n) --timeout 120 $(BUILD)/cuda/test_nccl_standin") \
              $(foreach n,1 2 3 4,"$(BUILD)/muonrun -n $(n) --timeout 120 $(BUILD)/nccl/test_nccl") \
              "MUON_STANDIN_AHEAD=1 $(BUILD)/muonrun -n 3 --timeout 120 $(BUILD)/nccl/test_nccl_san" \
              "$(BUILD)/muonrun -n 2 $(BUILD)/nccl/bench_nccl --smoke >/dev/null && echo 'bench_nccl --smoke on the stand-ins: 1 passed, 0 failed'" \
              "tests/run_examples.sh --one-size --same-bytes-as $(BUILD)/cuda $(BUILD)/nccl $(STRATEGIES)" \
              "tests/run_wire.sh $(BUILD)/cuda 4 fsdp tp_fsdp" "tests/run_wire.sh $(BUILD)/nccl 4 fsdp tp_hsdp" \
              "tests/run_overlap.sh $(BUILD)/cuda fsdp" "MUON_STANDIN_AHEAD=1 tests/run_overlap.sh --some $(BUILD)/nccl fsdp tp_hsdp" \
              "tests/run_partial.sh $(BUILD)/cuda ddp hsdp" "tests/run_partial.sh $(BUILD)/nccl cp tp_hsdp" \
              "MUON_STANDIN_AHEAD=1 EXTRA='--partial sum' tests/run_overlap.sh --some $(BUILD)/nccl ddp" \
              $(foreach d,cuda nccl,"$(BUILD)/muonrun -n 4 --timeout 120 $(BUILD)/$(d)/fsdp --normuon larger --cautious --late --quiet && echo '$(d) fsdp --normuon larger --late: 1 passed, 0 failed'") \
              "$(BUILD)/muonrun -n 4 --timeout 120 $(BUILD)/cuda/tp_fsdp --normuon rows --gram --late --quiet && echo 'cuda tp_fsdp --normuon rows --gram --late: 1 passed, 0 failed'"
else
CUDA_BINS  :=
CUDA_TESTS := "echo 'CUDA toolkit not found at $(CUDA_HOME) (set CUDA_HOME): CUDA compile, link and stand-in tests skipped'; echo '0 passed, 0 failed, 1 skipped'"
endif

# ---- tests ----------------------------------------------------------------------------------
SINGLE := test_api test_golden test_ns test_trainer test_adamw test_gemm
$(addprefix $(BUILD)/,$(SINGLE)): $(BUILD)/%: tests/%.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(OPT) $(INC) $< -o $@ -lm
$(addprefix $(BUILD)/,$(addsuffix _cxx,$(SINGLE))): $(BUILD)/%_cxx: tests/%.c muon.h tests/test.h | $(BUILD)
	$(CXX) $(CXXWARN) $(OPT) $(INC) -x c++ $< -o $@
$(addprefix $(BUILD)/,$(addsuffix _san,$(SINGLE))): $(BUILD)/%_san: tests/%.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(SAN) $(INC) $< -o $@ -lm
# -Ofast -march=native, as trainers like llm.c build: the non-finite checks must survive it.
$(addprefix $(BUILD)/,$(addsuffix _fast,$(SINGLE))): $(BUILD)/%_fast: tests/%.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) -Ofast -march=native $(INC) $< -o $@ -lm
$(BUILD)/test_ns_cblas: tests/test_ns.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(OPT) -DMUON_USE_CBLAS $(BLAS_CFLAGS) $(INC) $< -o $@ $(BLAS_LIBS) -lm
$(BUILD)/test_threads: tests/test_threads.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(OPT) $(INC) $< -o $@ -lm -pthread
$(BUILD)/test_threads_fast: tests/test_threads.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) -Ofast -march=native $(INC) $< -o $@ -lm -pthread
$(BUILD)/test_threads_san: tests/test_threads.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(SAN) $(INC) $< -o $@ -lm -pthread
# ThreadSanitizer over the ranks-as-threads world, whose variants run the communication thread
$(BUILD)/test_threads_tsan: tests/test_threads.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) -O1 -g -fsanitize=thread $(INC) $< -o $@ -lm -pthread
# The compute backend failing at its N-th call (test_faults) and every API misuse (test_misuse).
$(BUILD)/test_faults $(BUILD)/test_misuse: $(BUILD)/%: tests/%.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(OPT) $(INC) $< -o $@ -lm -pthread
$(BUILD)/test_faults_san $(BUILD)/test_misuse_san: $(BUILD)/%_san: tests/%.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(SAN) $(INC) $< -o $@ -lm -pthread
# The CPU backend's threads: every variant must give the single-thread bits (ThreadSanitizer
# watches the pool; MUON_NO_THREADS builds without it; CBLAS runs side by side on muon's threads).
$(BUILD)/test_parallel: tests/test_parallel.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(OPT) $(INC) $< -o $@ -lm -pthread
$(BUILD)/test_parallel_cxx: tests/test_parallel.c muon.h tests/test.h | $(BUILD)
	$(CXX) $(CXXWARN) $(OPT) $(INC) -x c++ $< -o $@ -pthread
$(BUILD)/test_parallel_tsan: tests/test_parallel.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) -O1 -g -fsanitize=thread -DTEST_SMALL -DMUON__SPLIT_MACS=1000 -DMUON__SPLIT_ELEMENTS=256 $(INC) $< -o $@ -lm -pthread
$(BUILD)/test_parallel_nothreads: tests/test_parallel.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(OPT) -DMUON_NO_THREADS $(INC) $< -o $@ -lm -pthread
$(BUILD)/test_parallel_cblas: tests/test_parallel.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(OPT) -DMUON_USE_CBLAS $(BLAS_CFLAGS) $(INC) $< -o $@ $(BLAS_LIBS) -lm -pthread
# The fuzz targets' corpora replayed without libFuzzer (any compiler), under the sanitizers; make
# coverage builds them plain (REPLAY_SAN=-O0), so that their counters merge with the other builds'.
REPLAY_SAN ?= $(SAN)
$(BUILD)/fuzz_%_replay: tests/fuzz/fuzz_%.c tests/fuzz/replay.c tests/fuzz/fuzz_models.h tests/fuzz/fuzz_world.h muon.h | $(BUILD)
	$(CC) $(CWARN) $(REPLAY_SAN) -I. $< tests/fuzz/replay.c -o $@ -lm -pthread
$(BUILD)/test_gloo: tests/test_gloo.c muon.h muon_gloo.h tests/test.h $(BUILD)/muon_gloo.o
	$(CC) $(CWARN) $(OPT) $(INC) $< $(BUILD)/muon_gloo.o -o $@ $(GLOO_LIBS)
$(BUILD)/test_dist: tests/test_dist.c tests/tmat.h examples/common.h muon.h muon_gloo.h tests/test.h $(BUILD)/muon_gloo.o
	$(CC) $(CWARN) $(OPT) -D_POSIX_C_SOURCE=200809L $(INC) $< $(BUILD)/muon_gloo.o -o $@ $(GLOO_LIBS)
$(BUILD)/test_agree: tests/test_agree.c tests/tmat.h muon.h muon_gloo.h tests/test.h $(BUILD)/muon_gloo.o
	$(CC) $(CWARN) $(OPT) -D_POSIX_C_SOURCE=200809L $(INC) $< $(BUILD)/muon_gloo.o -o $@ $(GLOO_LIBS)
$(BUILD)/test_verify: tests/test_verify.c examples/common.h muon.h muon_gloo.h tests/test.h $(BUILD)/muon_gloo.o
	$(CC) $(CWARN) $(OPT) -D_POSIX_C_SOURCE=200809L $(INC) $< $(BUILD)/muon_gloo.o -o $@ $(GLOO_LIBS)
$(BUILD)/test_reshard: tests/test_reshard.c examples/common.h muon.h muon_gloo.h tests/test.h $(BUILD)/muon_gloo.o
	$(CC) $(CWARN) $(OPT) -D_POSIX_C_SOURCE=200809L $(INC) $< $(BUILD)/muon_gloo.o -o $@ $(GLOO_LIBS)
$(BUILD)/test_agree_san: tests/test_agree.c tests/tmat.h muon.h muon_gloo.h tests/test.h $(BUILD)/muon_gloo_san.o
	$(CC) $(CWARN) $(SAN) -D_POSIX_C_SOURCE=200809L $(INC) $< $(BUILD)/muon_gloo_san.o -o $@ $(GLOO_LIBS)
$(BUILD)/test_partial: tests/test_partial.c examples/common.h muon.h muon_gloo.h tests/test.h $(BUILD)/muon_gloo.o
	$(CC) $(CWARN) $(OPT) -D_POSIX_C_SOURCE=200809L $(INC) $< $(BUILD)/muon_gloo.o -o $@ $(GLOO_LIBS)
$(BUILD)/test_partial_san: tests/test_partial.c examples/common.h muon.h muon_gloo.h tests/test.h $(BUILD)/muon_gloo_san.o
	$(CC) $(CWARN) $(SAN) -D_POSIX_C_SOURCE=200809L $(INC) $< $(BUILD)/muon_gloo_san.o -o $@ $(GLOO_LIBS)
$(BUILD)/test_dist_san: tests/test_dist.c tests/tmat.h examples/common.h muon.h muon_gloo.h tests/test.h $(BUILD)/muon_gloo_san.o
	$(CC) $(CWARN) $(SAN) -D_POSIX_C_SOURCE=200809L $(INC) $< $(BUILD)/muon_gloo_san.o -o $@ $(GLOO_LIBS)
$(BUILD)/golden/.done: tests/ref_muon.py | $(BUILD)
	$(PYTHON) tests/ref_muon.py $(BUILD)/golden
	@touch $@

TEST_BINS := $(addprefix $(BUILD)/,$(SINGLE) $(addsuffix _cxx,$(SINGLE)) $(addsuffix _san,$(SINGLE)) $(addsuffix _fast,$(SINGLE)) \
             test_ns_cblas test_threads test_threads_fast test_threads_san test_threads_tsan \
             test_parallel test_parallel_cxx test_parallel_tsan test_parallel_nothreads test_parallel_cblas \
             fuzz_state_replay fuzz_layout_replay test_faults test_faults_san test_misuse test_misuse_san test_gloo test_dist test_dist_san test_partial test_partial_san test_agree test_agree_san test_reshard test_verify test_muoncmp muoncmp \
             muonrun $(STRATEGIES)) $(CUDA_BINS)
RUN := $(BUILD)/muonrun --timeout 120

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
  "$(RUN) -n 4 $(RS) --layout hsdp --normuon rows --load $(BUILD)/reshard/f --from 1"

# The binaries build in parallel (JOBS, default: every core); the tests then run one at a time.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test: deps check-headers
	@$(MAKE) --no-print-directory -j$(JOBS) $(TEST_BINS) $(BUILD)/golden/.done
	@tests/run.sh \
	  "$(BUILD)/test_api" "$(BUILD)/test_api_cxx" "$(BUILD)/test_api_san" \
	  "$(BUILD)/test_trainer" "$(BUILD)/test_trainer_cxx" "$(BUILD)/test_trainer_san" \
	  "$(BUILD)/test_adamw" "$(BUILD)/test_adamw_cxx" "$(BUILD)/test_adamw_san" "$(BUILD)/test_adamw_fast" \
	  "$(BUILD)/test_faults $(BUILD)/faults" "$(BUILD)/test_faults_san $(BUILD)/faults" "$(BUILD)/test_misuse $(BUILD)/misuse" "$(BUILD)/test_misuse_san $(BUILD)/misuse" \
	  "$(BUILD)/test_gemm" "$(BUILD)/test_gemm_cxx" "$(BUILD)/test_gemm_san" "$(BUILD)/test_gemm_fast" \
	  "$(BUILD)/test_api_fast" "$(BUILD)/test_trainer_fast" "$(BUILD)/test_golden_fast $(BUILD)/golden" \
	  "$(BUILD)/test_ns_fast $(BUILD)/golden" \
	  "$(BUILD)/test_golden $(BUILD)/golden" "$(BUILD)/test_golden_cxx $(BUILD)/golden" \
	  "$(BUILD)/test_golden_san $(BUILD)/golden" \
	  "$(BUILD)/test_ns $(BUILD)/golden" "$(BUILD)/test_ns_cxx $(BUILD)/golden" \
	  "$(BUILD)/test_ns_san $(BUILD)/golden" "OPENBLAS_NUM_THREADS=1 $(BUILD)/test_ns_cblas $(BUILD)/golden" \
	  "$(BUILD)/test_threads" "$(BUILD)/test_threads_fast" "$(BUILD)/test_threads_san" "$(BUILD)/test_threads_tsan 60" \
	  "$(BUILD)/test_parallel" "$(BUILD)/test_parallel_cxx" "$(BUILD)/test_parallel_tsan" \
	  "$(BUILD)/test_parallel_nothreads" "OPENBLAS_NUM_THREADS=1 $(BUILD)/test_parallel_cblas" \
	  "$(RUN) -n 1 $(BUILD)/test_gloo" "$(RUN) -n 2 $(BUILD)/test_gloo" "$(RUN) -n 3 $(BUILD)/test_gloo" \
	  "$(RUN) -n 4 $(BUILD)/test_gloo" "$(RUN) -n 8 $(BUILD)/test_gloo" \
	  "$(RUN) -n 4 $(BUILD)/test_gloo --die" "$(RUN) -n 3 $(BUILD)/test_gloo --die-started" "$(RUN) -n 3 $(BUILD)/test_gloo --stall" \
	  "tests/run_redis.sh $(BUILD)" \
	  "$(RUN) -n 1 $(BUILD)/test_dist" "$(RUN) -n 2 $(BUILD)/test_dist" "$(RUN) -n 3 $(BUILD)/test_dist" \
	  "$(RUN) -n 4 $(BUILD)/test_dist" "$(RUN) -n 8 $(BUILD)/test_dist" "$(RUN) -n 3 $(BUILD)/test_dist_san" \
	  "$(BUILD)/test_dist --fault kill 3" "$(BUILD)/test_dist --fault stall 3" \
	  "$(RUN) -n 1 $(BUILD)/test_agree" "$(RUN) -n 2 $(BUILD)/test_agree" "$(RUN) -n 3 $(BUILD)/test_agree" \
	  "$(RUN) -n 4 $(BUILD)/test_agree" "$(RUN) -n 3 $(BUILD)/test_agree_san" \
	  $(RESHARD_TESTS) \
	  "$(BUILD)/test_muoncmp $(BUILD)/muoncmp_test $(BUILD)/muoncmp" \
	  "$(RUN) -n 1 $(BUILD)/test_verify $(BUILD)/muoncmp $(BUILD)/verify" "$(RUN) -n 2 $(BUILD)/test_verify $(BUILD)/muoncmp $(BUILD)/verify" \
	  "$(RUN) -n 3 $(BUILD)/test_verify $(BUILD)/muoncmp $(BUILD)/verify" "$(RUN) -n 4 $(BUILD)/test_verify $(BUILD)/muoncmp $(BUILD)/verify" \
	  "tests/run_wrong_dim.sh $(BUILD)" \
	  $(foreach e,fsdp tp_fsdp hsdp,"$(RUN) -n 4 $(BUILD)/$(e) --cautious --gram --quiet && echo '$(e) --cautious --gram: 1 passed, 0 failed'") \
	  $(foreach e,fsdp tp_fsdp hsdp,"$(RUN) -n 4 $(BUILD)/$(e) --normuon larger --cautious --late --quiet && echo '$(e) --normuon larger --cautious --late: 1 passed, 0 failed'") \
	  "$(RUN) -n 4 $(BUILD)/tp_fsdp --normuon rows --gram --quiet && echo 'tp_fsdp --normuon rows --gram: 1 passed, 0 failed'" \
	  $(foreach e,ddp fsdp tp_fsdp,"MUON_THREADS=3 $(RUN) -n 2 $(BUILD)/$(e) --normuon larger --quiet && echo '$(e) MUON_THREADS=3: 1 passed, 0 failed'") \
	  "tests/run_examples.sh $(BUILD) $(STRATEGIES)" \
	  "tests/run_wire.sh $(BUILD) 4 ddp fsdp tp_fsdp hsdp ep_fsdp tp_hsdp" \
	  "MUON_THREADS=2 tests/run_overlap.sh $(BUILD) fsdp tp_fsdp hsdp ep_fsdp full_4d" \
	  "MUON_THREADS=2 MUON_GLOO_BLOCKING=1 tests/run_overlap.sh --some $(BUILD) ddp cp fsdp_flat tp tp_hsdp ep ep_tp pp layout_2d custom_vtable" \
	  "tests/run_partial.sh $(BUILD) ddp cp hsdp tp_hsdp" \
	  $(foreach n,1 2 3 4,"$(RUN) -n $(n) $(BUILD)/test_partial $(BUILD)/partial") "$(RUN) -n 3 $(BUILD)/test_partial_san $(BUILD)/partial" \
	  "EXTRA='--partial sum' tests/run_overlap.sh $(BUILD) ddp hsdp" \
	  "EXTRA='--partial mean' tests/run_overlap.sh --some $(BUILD) cp tp_hsdp" \
	  "MUON_THREADS=3 $(RUN) -n 3 $(BUILD)/cp --partial sum --quiet && echo 'cp --partial sum MUON_THREADS=3: 1 passed, 0 failed'" \
	  "$(BUILD)/test_dist --fault kill 3 overlap" "$(BUILD)/test_dist --fault stall 3 overlap" \
	  "MUON_GLOO_BLOCKING=1 $(BUILD)/test_dist --fault kill 3 overlap" "MUON_GLOO_BLOCKING=1 $(RUN) -n 3 $(BUILD)/test_dist" \
	  "tests/run_fuzz.sh $(BUILD) replay" \
	  "$(BUILD)/fuzz_state_replay tests/fuzz/corpus/state" "$(BUILD)/fuzz_layout_replay tests/fuzz/corpus/layout" \
	  $(CUDA_TESTS)

# libFuzzer (clang): each target for FUZZ_SECONDS (default 60); make test replays the corpora.
FUZZ_SECONDS ?= 60
fuzz:
	@FUZZ_SECONDS=$(FUZZ_SECONDS) tests/run_fuzz.sh $(BUILD) fuzz

# ---- coverage: the whole `make test` suite built with gcov in its own build directory -------
# Every compile gets --coverage and MUON_COVERAGE, under which ranks that _exit write their
# counters first (test.h); OPT and O2 become -O0 so every build has the same line tables, and the
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
	@find $(COV_BUILD) \( -name '*_san*.gc*' -o -name '*_tsan*.gc*' -o -name '*_fast*.gc*' -o -name '*_nothreads*.gc*' \) -delete
	@tools/coverage.sh $(COV_BUILD) $(HEADERS)
	@tail -n 1 $(COV_BUILD)/test.log | grep -Eq '^[0-9]+ passed, 0 failed' || \
	  { echo "coverage: the suite did not pass ($$(tail -n 1 $(COV_BUILD)/test.log)): the figures count only what ran"; exit 1; }

# ---- mutation: does the suite notice realistic one-line bugs (tests/mutants.txt)? ----------
# Each mutant alone on a scratch copy of the tree ($(BUILD)/mutate/tree), the mutation suite of
# tools/mutate.py until a step fails; ends with "mutation: K killed, S survived of T". Long (about
# an hour on 2 cores); MUTANTS=id,id runs only those.
mutate: deps
	@$(PYTHON) tools/mutate.py --dir $(BUILD)/mutate $(if $(MUTANTS),--only $(MUTANTS))

# ---- bench ----------------------------------------------------------------------------------
# Ratios measured side by side in one run: GEMM and Newton-Schulz vs the OpenBLAS ceiling and
# numpy (single-threaded), then 1 vs P ranks, batched vs per-matrix, zero-redundancy vs Moonlight.
$(BUILD)/bench_ns: bench/bench_ns.c bench/bench.h muon.h | $(BUILD)
	$(CC) $(CWARN) -O3 -march=native -DMUON_USE_CBLAS $(BLAS_CFLAGS) -I. $< -o $@ $(BLAS_LIBS) -lm
$(BUILD)/bench_dist: bench/bench_dist.c bench/bench.h muon.h muon_gloo.h $(BUILD)/muon_gloo.o | $(BUILD)
	$(CC) $(CWARN) -O3 -march=native -DMUON_USE_CBLAS $(BLAS_CFLAGS) -I. $< $(BUILD)/muon_gloo.o -o $@ $(GLOO_LIBS) $(BLAS_LIBS)
$(BUILD)/bench_partial: bench/bench_partial.c bench/bench.h muon.h muon_gloo.h $(BUILD)/muon_gloo.o | $(BUILD)
	$(CC) $(CWARN) -O3 -march=native -DMUON_USE_CBLAS $(BLAS_CFLAGS) -I. $< $(BUILD)/muon_gloo.o -o $@ $(GLOO_LIBS) $(BLAS_LIBS)

BENCH_RUN := OPENBLAS_NUM_THREADS=1 $(BUILD)/muonrun --timeout 300
bench: deps $(BUILD)/bench_ns $(BUILD)/bench_dist $(BUILD)/bench_partial $(BUILD)/muonrun
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
