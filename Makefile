# muon - build, test, bench. `make test` and `make demo` install what they need (apt-get).
CC       ?= gcc
CXX      ?= g++
PYTHON   ?= /usr/bin/python3
PREFIX   ?= /usr/local
BUILD    := build
CWARN    := -std=c99 -Wall -Wextra -Wpedantic -Werror
CXXWARN  := -std=c++17 -Wall -Wextra -Werror
OPT      ?= -O2 -march=native
SAN      := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
INC      := -I. -Itests

DEPS_CORE := libopenblas-dev python3-numpy
HEADERS   := muon.h

.PHONY: all test demo bench examples install uninstall clean deps-core check-headers

all: examples

deps-core:
	@tools/install-deps.sh $(DEPS_CORE)

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
	@echo "headers: C99 and C++17 clean"

# ---- tests ----------------------------------------------------------------------------------
TESTS_C := test_api test_golden test_ns
$(BUILD)/%: tests/%.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(OPT) $(INC) $< -o $@ -lm
$(BUILD)/%_cxx: tests/%.c muon.h tests/test.h | $(BUILD)
	$(CXX) $(CXXWARN) $(OPT) $(INC) -x c++ $< -o $@
$(BUILD)/%_san: tests/%.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(SAN) $(INC) $< -o $@ -lm
$(BUILD)/test_ns_cblas: tests/test_ns.c muon.h tests/test.h | $(BUILD)
	$(CC) $(CWARN) $(OPT) -DMUON_USE_CBLAS $(BLAS_CFLAGS) $(INC) $< -o $@ $(BLAS_LIBS) -lm

$(BUILD)/golden/.done: tests/ref_muon.py | $(BUILD)
	$(PYTHON) tests/ref_muon.py $(BUILD)/golden
	@touch $@

TEST_BINS := $(addprefix $(BUILD)/,$(TESTS_C) $(addsuffix _cxx,$(TESTS_C)) $(addsuffix _san,$(TESTS_C)) test_ns_cblas)

test: deps-core check-headers $(TEST_BINS) $(BUILD)/golden/.done
	@tests/run.sh \
	  "$(BUILD)/test_api" "$(BUILD)/test_api_cxx" "$(BUILD)/test_api_san" \
	  "$(BUILD)/test_golden $(BUILD)/golden" "$(BUILD)/test_golden_cxx $(BUILD)/golden" \
	  "$(BUILD)/test_golden_san $(BUILD)/golden" \
	  "$(BUILD)/test_ns $(BUILD)/golden" "$(BUILD)/test_ns_san $(BUILD)/golden" \
	  "$(BUILD)/test_ns_cxx $(BUILD)/golden" "OPENBLAS_NUM_THREADS=1 $(BUILD)/test_ns_cblas $(BUILD)/golden"

# ---- examples and demo ----------------------------------------------------------------------
EXAMPLES := single
examples: $(addprefix $(BUILD)/,$(EXAMPLES))
$(BUILD)/single: examples/single.c muon.h | $(BUILD)
	$(CC) $(CWARN) $(OPT) -I. $< -o $@ -lm

demo: deps-core $(BUILD)/single
	$(BUILD)/single

# ---- bench ----------------------------------------------------------------------------------
$(BUILD)/bench_ns: bench/bench_ns.c muon.h | $(BUILD)
	$(CC) $(CWARN) -O3 -march=native -DMUON_USE_CBLAS $(BLAS_CFLAGS) -I. $< -o $@ $(BLAS_LIBS) -lm

bench: deps-core $(BUILD)/bench_ns
	OPENBLAS_NUM_THREADS=1 $(BUILD)/bench_ns
	OPENBLAS_NUM_THREADS=1 $(PYTHON) bench/bench_numpy.py

# ---- install --------------------------------------------------------------------------------
install:
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 $(HEADERS) $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|' tools/muon.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/muon.pc

uninstall:
	cd $(DESTDIR)$(PREFIX)/include && rm -f $(HEADERS)
	rm -f $(DESTDIR)$(PREFIX)/lib/pkgconfig/muon.pc

clean:
	rm -rf $(BUILD)
