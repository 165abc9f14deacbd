# tagalloc - top-level build.  `make` builds into build/; `make test` runs the
# tests (unit, misuse, stress, and the same under ASan+UBSan).
CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
WARN     = -Wall -Wextra
COMMON   = $(WARN) -std=gnu11 -pthread -fPIC -fno-omit-frame-pointer -D_GNU_SOURCE \
           -Ialloc -Ireports
LIBS     = -ljemalloc -lunwind -ldw -lelf -lpthread -ldl -lm
TEST_LIBS = -lcmocka
# Every object's header dependencies come from the compiler: each rule that
# compiles an object adds $(DEPFLAGS), and the .d files are included below.
DEPFLAGS = -MMD -MP

# The ASan+UBSan build, for every part's tests: `$(MAKE) $(ASAN_VARS)
# TARGETS` builds TARGETS into $(ASAN_BUILD) with the sanitizers (the recipe
# names $(MAKE) itself, so that make -n and -j treat it as recursive), and
# `$(ASAN_RUN) CMD` runs CMD with their options.
ASAN_BUILD = build/asan
ASAN_VARS  = BUILD=$(ASAN_BUILD) OPT=-O1 \
             CFLAGS="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
             LDFLAGS="-fsanitize=address,undefined"
ASAN_RUN   = ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1

# `make` builds everything: the parts' makefiles below bring rules of
# their own, and the first of those would otherwise be the default.
.DEFAULT_GOAL := all

# Each part of the project (alloc/, reports/, tools/, tensor/, autograd/,
# ...) brings a PART/part.mk with its rules, which adds its targets to these
# lists.  reports/part.mk comes first and alloc/part.mk second: the
# library's rules in alloc/part.mk take the objects reports/part.mk lists
# (REPORTS_OBJ), and the other parts link the library (LINKA).
PART_ALL   :=
PART_TEST  :=
PART_BENCH :=
PARTS_FIRST = reports/part.mk alloc/part.mk
include $(PARTS_FIRST) $(filter-out $(PARTS_FIRST),$(wildcard */part.mk))

# The objects' header dependencies (written by $(DEPFLAGS) at their last build).
-include $(wildcard $(BUILD)/obj/*/*.d $(BUILD)/obj/*/*/*.d)

all: $(PART_ALL)

# ---- tests --------------------------------------------------------------
test: all
	@tests/run-tests.sh $(BUILD)
	$(MAKE) test-asan
	$(MAKE) test-cli
	$(MAKE) test-install
	$(MAKE) test-integration
	$(if $(PART_TEST),$(MAKE) $(PART_TEST))

# The command line's conventions: --help, - for stdout, --quiet, colour,
# unknown variables, --skip, the roll-up, diff's callsite keys.
test-cli: all
	tests/cli/run.sh $(BUILD)

# Programs run under `tagalloc run`, their numbers checked exactly, and real
# programs (python3, perl, git, gcc, node, make, sort) under the auditor.
test-integration: all
	tests/integration/run.sh $(BUILD)
	tests/integration/real.sh $(BUILD)

# The same tests, library and all, built with AddressSanitizer and UBSan.
test-asan:
	$(MAKE) $(ASAN_VARS) $(ASAN_BUILD)/libtagalloc.a asan-tests
	$(ASAN_RUN) tests/run-tests.sh $(ASAN_BUILD)

asan-tests: $(UNIT_BIN)

check-valgrind: all
	VALGRIND=1 tests/run-tests.sh $(BUILD)
	tests/integration/run.sh $(BUILD) --valgrind

# The real programs under tagalloc run and under memcheck, side by side (a
# measurement: see tests/integration/README.md).
compare-memcheck: all
	/usr/bin/python3 tests/integration/real_vs_memcheck.py $(BUILD)

# ---- demo and benchmarks -------------------------------------------------
# The main job: LeNet-5 trained on Fashion-MNIST for one epoch with the
# ledger on and a trace kept, and the report of the trace as an HTML page:
# a mark per training step, live bytes by tag over time, what was live at the
# peak, the findings (none).  DEMO_ARGS shortens it (the browser test's).
DEMO_ARGS ?= --epochs 1
demo: $(BUILD)/train-lenet $(BUILD)/tagalloc
	TAGALLOC_TRACE=$(BUILD)/lenet.trace $(BUILD)/train-lenet $(DEMO_ARGS)
	$(BUILD)/tagalloc report -q $(BUILD)/lenet.trace --html $(BUILD)/lenet-report.html
	@echo "demo: the ledger's report of the run is $(BUILD)/lenet-report.html (trace: $(BUILD)/lenet.trace)"

# The ledger catching three bugs on purpose (examples/demo.c), and the page
# of its trace.
demo-bugs: $(BUILD)/demo $(BUILD)/tagalloc
	TAGALLOC_TRACE=$(BUILD)/demo-bugs.trace $(BUILD)/demo
	$(BUILD)/tagalloc report -q $(BUILD)/demo-bugs.trace --html $(BUILD)/demo-bugs.html
	@echo "demo-bugs: the page of the run is $(BUILD)/demo-bugs.html"

$(BUILD)/bench-alloc: bench/bench_alloc.c $(BUILD)/libtagalloc.a
	$(CC) -O2 -g $(COMMON) $< -o $@ $(LINKA) $(LIBS)

bench-alloc: $(BUILD)/bench-alloc
	$(BUILD)/bench-alloc

bench: bench-deps bench-alloc $(PART_BENCH)

# ---- install -------------------------------------------------------------
# make install PREFIX=/usr/local DESTDIR=: the tool, the preload (in
# LIBDIR/tagalloc/, where an installed `tagalloc run` looks for it: beside
# itself, then ../lib/tagalloc/) and the CUDA shim beside it, the libraries, the public headers (in
# INCLUDEDIR/tagalloc/), a pkg-config file and the man pages.
PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR     ?= $(PREFIX)/share/man
INSTALL    ?= install
TA_VERSION := $(shell sed -n 's/^\#define TA_VERSION "\(.*\)"/\1/p' alloc/tagalloc.h)
INSTALL_LIBS = libtagalloc.so libtagalloc.a libtagalloc-tensor.a libtagalloc-autograd.a
INSTALL_HEADERS = alloc/tagalloc.h tensor/tensor.h autograd/autograd.h
MAN1 = man/tagalloc.1 man/tagalloc-run.1 man/tagalloc-report.1 man/tagalloc-diff.1
MAN7 = man/tagalloc.7

install: $(BUILD)/tagalloc $(BUILD)/libtagalloc-preload.so $(CUDA_SHIM) $(INSTALL_LIBS:%=$(BUILD)/%)
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/tagalloc $(DESTDIR)$(LIBDIR)/pkgconfig \
	  $(DESTDIR)$(INCLUDEDIR)/tagalloc $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man7
	$(INSTALL) -m 755 $(BUILD)/tagalloc $(DESTDIR)$(BINDIR)/tagalloc
	$(INSTALL) -m 755 $(BUILD)/libtagalloc-preload.so $(DESTDIR)$(LIBDIR)/tagalloc/libtagalloc-preload.so
	$(INSTALL) -m 755 $(CUDA_SHIM) $(DESTDIR)$(LIBDIR)/tagalloc/libtagalloc-cuda.so
	$(INSTALL) -m 755 $(BUILD)/libtagalloc.so $(DESTDIR)$(LIBDIR)/libtagalloc.so
	$(INSTALL) -m 644 $(filter %.a,$(INSTALL_LIBS:%=$(BUILD)/%)) $(DESTDIR)$(LIBDIR)/
	$(INSTALL) -m 644 $(INSTALL_HEADERS) $(DESTDIR)$(INCLUDEDIR)/tagalloc/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	  -e 's|@VERSION@|$(TA_VERSION)|' tools/tagalloc.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/tagalloc.pc
	$(INSTALL) -m 644 $(MAN1) $(DESTDIR)$(MANDIR)/man1/
	$(INSTALL) -m 644 $(MAN7) $(DESTDIR)$(MANDIR)/man7/

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/tagalloc $(DESTDIR)$(LIBDIR)/tagalloc/libtagalloc-preload.so \
	  $(DESTDIR)$(LIBDIR)/tagalloc/libtagalloc-cuda.so \
	  $(INSTALL_LIBS:%=$(DESTDIR)$(LIBDIR)/%) $(DESTDIR)$(LIBDIR)/pkgconfig/tagalloc.pc \
	  $(addprefix $(DESTDIR)$(INCLUDEDIR)/tagalloc/,$(notdir $(INSTALL_HEADERS))) \
	  $(MAN1:man/%=$(DESTDIR)$(MANDIR)/man1/%) $(MAN7:man/%=$(DESTDIR)$(MANDIR)/man7/%)
	-rmdir $(DESTDIR)$(LIBDIR)/tagalloc $(DESTDIR)$(INCLUDEDIR)/tagalloc 2>/dev/null

# Installs into a temporary prefix (and a DESTDIR), runs the installed tool,
# builds a program with pkg-config, renders each man page, uninstalls.
test-install: all
	tests/install/run.sh $(BUILD)

deps:
	@tools/install-deps.sh

bench-deps:
	@tools/install-deps.sh bench

clean:
	rm -rf build

.PHONY: all test test-asan test-cli test-install install uninstall test-integration asan-tests check-valgrind compare-memcheck demo demo-bugs bench bench-alloc deps bench-deps clean
.SECONDARY:
