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

# The library: the ledger plus the symbolizer and text emitter of reports/.
LIB_SRC  = $(wildcard alloc/*.c) $(wildcard reports/*.c)
LIB_OBJ  = $(LIB_SRC:%.c=$(BUILD)/obj/%.o)

UNIT_SRC = $(wildcard tests/unit/*.c) $(wildcard tests/misuse/*.c) $(wildcard tests/stress/*.c)
UNIT_BIN = $(UNIT_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_LIBS = -lcmocka
# The static library: keep the text reporter, which registers itself.
LINKA    = -Wl,-u,report_text_write $(BUILD)/libtagalloc.a

# The auditor: the LD_PRELOAD shim (the library plus tools/preload*.c) and
# the command-line tool (tools/tagalloc*.c).
PRELOAD_SRC = $(wildcard tools/preload*.c)
PRELOAD_OBJ = $(PRELOAD_SRC:%.c=$(BUILD)/obj/%.o)
CLI_SRC  = $(wildcard tools/tagalloc*.c)

# `make` builds everything: the parts' makefiles below bring rules of
# their own, and the first of those would otherwise be the default.
.DEFAULT_GOAL := all

# Each part of the project beyond the ledger and the auditor (tensor/,
# autograd/, ...) brings a PART/part.mk that adds its targets to these lists.
PART_ALL   :=
PART_TEST  :=
PART_BENCH :=
include $(wildcard */part.mk)

all: $(PART_ALL) $(BUILD)/libtagalloc.so $(BUILD)/libtagalloc.a $(BUILD)/demo $(UNIT_BIN) \
     $(if $(PRELOAD_SRC),$(BUILD)/libtagalloc-preload.so) $(if $(CLI_SRC),$(BUILD)/tagalloc)

$(BUILD)/obj/%.o: %.c $(wildcard alloc/*.h reports/*.h) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) -c $< -o $@

$(BUILD)/libtagalloc.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LIBS)

$(BUILD)/libtagalloc.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The preload links jemalloc statically (libjemalloc-dev's PIC archive)
# when it can: no libjemalloc.so in the audited process, nor the libstdc++
# that libjemalloc.so needs for its operator new (2-3 ms and 1.2 MB of RSS
# in every process), and no second, exported operator new in the global
# scope.  The archive's malloc, free, ... would clash with the shim's, so
# a copy has them made local; --exclude-libs hides the rest (mallocx,
# mallctl) from the program.  Without the archive: -ljemalloc as before.
JEMALLOC_PIC := $(shell $(CC) -print-file-name=libjemalloc_pic.a)
JEMALLOC_CLASH = malloc free calloc realloc memalign posix_memalign aligned_alloc valloc \
                 malloc_usable_size
ifneq ($(wildcard $(JEMALLOC_PIC)),)
PRELOAD_JEMALLOC = $(BUILD)/obj/jemalloc_local.a
PRELOAD_LIBS = -Wl,--exclude-libs,ALL $(PRELOAD_JEMALLOC) $(filter-out -ljemalloc,$(LIBS))
CLI_LIBS = $(JEMALLOC_PIC) $(filter-out -ljemalloc,$(LIBS))
else
PRELOAD_JEMALLOC =
PRELOAD_LIBS = $(LIBS)
CLI_LIBS = $(LIBS)
endif

$(BUILD)/obj/jemalloc_local.a: $(JEMALLOC_PIC) Makefile
	@mkdir -p $(dir $@)
	objcopy $(JEMALLOC_CLASH:%=--localize-symbol=%) $< $@

$(BUILD)/libtagalloc-preload.so: $(PRELOAD_OBJ) $(LIB_OBJ) $(PRELOAD_JEMALLOC)
	$(CC) -shared -Wl,-z,nodelete -Wl,-soname,libtagalloc-preload.so -o $@ $(PRELOAD_OBJ) $(LIB_OBJ) $(PRELOAD_LIBS)

# The command-line tool too: without libjemalloc.so and its libstdc++ it
# starts in a third of the time (their relocations were most of it).
$(BUILD)/tagalloc: $(CLI_SRC) $(BUILD)/libtagalloc.a $(wildcard tools/*.h)
	$(CC) $(CFLAGS) $(COMMON) -Itools $(CLI_SRC) -o $@ $(BUILD)/libtagalloc.a $(CLI_LIBS) -ljansson

$(BUILD)/demo: examples/demo.c $(BUILD)/libtagalloc.a
	$(CC) $(CFLAGS) $(COMMON) $< -o $@ $(LINKA) $(LIBS)

$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(BUILD)/libtagalloc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) -Itests $< -o $@ $(LINKA) $(TEST_LIBS) $(LIBS)

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
	$(MAKE) BUILD=build/asan OPT=-O1 \
	  CFLAGS="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	  LDFLAGS="-fsanitize=address,undefined" build/asan/libtagalloc.a asan-tests
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  tests/run-tests.sh build/asan

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
