# tools/part.mk - the auditor: the LD_PRELOAD shim (the library plus
# tools/preload*.c) and the command-line tool (tools/tagalloc*.c); then its
# CUDA driver shim, its tests (make test-cli, test-integration,
# test-install, compare-memcheck), make install and make deps (below).  The
# training programs (tools/train_*.c) are built by autograd/part.mk.

PRELOAD_SRC = $(wildcard tools/preload*.c)
PRELOAD_OBJ = $(PRELOAD_SRC:%.c=$(BUILD)/obj/%.o)
CLI_SRC  = $(wildcard tools/tagalloc*.c)

PART_ALL += $(if $(PRELOAD_SRC),$(BUILD)/libtagalloc-preload.so) $(if $(CLI_SRC),$(BUILD)/tagalloc)

$(BUILD)/obj/tools/%.o: tools/%.c Makefile tools/part.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) $(DEPFLAGS) -c $< -o $@

# The preload links jemalloc statically (libjemalloc-dev's PIC archive)
# when it can: no libjemalloc.so in the audited process, nor the libstdc++
# that libjemalloc.so needs for its operator new (2-3 ms and 1.2 MB of RSS
# in every process), and no second, exported operator new in the global
# scope.  The archive's malloc, free, ... would clash with the shim's, so
# a copy has them made local; --exclude-libs hides the rest (mallocx,
# mallctl) from the program.  Its malloc is renamed _ta_je_malloc, not
# made local: the ledger allocates a plain block with it (alloc/block.h:
# raw_alloc), jemalloc's fast path, where mallocx takes its general one.
# Without the archive: -ljemalloc as before.
JEMALLOC_PIC := $(shell $(CC) -print-file-name=libjemalloc_pic.a)
JEMALLOC_CLASH = free calloc realloc memalign posix_memalign aligned_alloc valloc \
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

# A sanitizer build's CLI links libjemalloc.so instead: the archive's
# malloc would replace the sanitizer's in the executable, and the dynamic
# loader's first malloc, made while libasan starts, reached jemalloc before
# anything was set up (a segfault before main, even for --version).
ifneq ($(findstring sanitize,$(CFLAGS)),)
CLI_LIBS = $(LIBS)
endif

$(BUILD)/obj/jemalloc_local.a: $(JEMALLOC_PIC) Makefile tools/part.mk
	@mkdir -p $(dir $@)
	objcopy $(JEMALLOC_CLASH:%=--localize-symbol=%) --redefine-sym malloc=_ta_je_malloc $< $@

# The ledger and, of reports/, what its stderr report needs
# (REPORTS_PRELOAD_OBJ); -z defs: nothing else may be missing.  Those
# report_* functions stay inside (tools/preload.map).  --dynamic-list:
# only the interposed C library, C++ and CUDA API stays preemptible
# (tools/preload.dyn); the ledger's calls to its own _ta_*, _pl_* and ta_*
# functions are bound at link time, direct calls instead of a PLT stub's
# indirect jump on every malloc and free.
$(BUILD)/libtagalloc-preload.so: $(PRELOAD_OBJ) $(ALLOC_OBJ) $(REPORTS_PRELOAD_OBJ) $(PRELOAD_JEMALLOC) \
  tools/preload.map tools/preload.dyn
	$(CC) -shared -Wl,-z,nodelete -Wl,-z,defs -Wl,--version-script=tools/preload.map \
	  -Wl,--dynamic-list=tools/preload.dyn \
	  -Wl,-soname,libtagalloc-preload.so -o $@ $(PRELOAD_OBJ) \
	  $(ALLOC_OBJ) $(REPORTS_PRELOAD_OBJ) $(PRELOAD_LIBS)

# The command-line tool too: without libjemalloc.so and its libstdc++ it
# starts in a third of the time (their relocations were most of it).
$(BUILD)/tagalloc: $(CLI_SRC) $(BUILD)/libtagalloc.a $(wildcard tools/*.h)
	$(CC) $(CFLAGS) $(COMMON) -Itools $(CLI_SRC) -o $@ $(BUILD)/libtagalloc.a $(CLI_LIBS) -ljansson

# The auditor's CUDA driver shim (tools/cuda_shim.c, see
# tools/preload_cuda.c) and the tests of `tagalloc run` on CUDA programs,
# which run against a stand-in driver (tests/cuda/): no GPU, no Toolkit.

CUDA_SHIM = $(BUILD)/libtagalloc-cuda.so
PART_ALL  += $(CUDA_SHIM)
PART_TEST += test-cuda-audit

# A driver to link against: only its soname (libcuda.so.1) counts, the
# real one is found at run time.
$(BUILD)/obj/cuda_link/libcuda.so: Makefile tools/part.mk
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libcuda.so.1 -o $@ -x c /dev/null

# --no-as-needed: both dependencies stay, though nothing refers to them.
$(CUDA_SHIM): tools/cuda_shim.c $(BUILD)/libtagalloc-preload.so $(BUILD)/obj/cuda_link/libcuda.so
	$(CC) $(CFLAGS) $(WARN) -fPIC -shared -o $@ $< -Wl,--no-as-needed \
	  $(BUILD)/libtagalloc-preload.so $(BUILD)/obj/cuda_link/libcuda.so -Wl,--as-needed

test-cuda-audit: all
	tests/cuda/run.sh $(BUILD)

.PHONY: test-cuda-audit

# ---- the auditor's tests -------------------------------------------------------

TEST_SERIAL += test-cli test-install test-integration

# The command line's conventions: --help, - for stdout, --quiet, colour,
# unknown variables, --skip, the roll-up, diff's callsite keys.
test-cli: all
	tests/cli/run.sh $(BUILD)

# Programs run under `tagalloc run`, their numbers checked exactly, and real
# programs (python3, perl, git, gcc, node, make, sort) under the auditor.
test-integration: all
	tests/integration/run.sh $(BUILD)
	tests/integration/real.sh $(BUILD)

# The real programs under tagalloc run and under memcheck, side by side (a
# measurement: see tests/integration/README.md).
compare-memcheck: all
	/usr/bin/python3 tests/integration/real_vs_memcheck.py $(BUILD)

# Installs into a temporary prefix (and a DESTDIR), runs the installed tool,
# builds a program with pkg-config, renders each man page, uninstalls.
test-install: all
	tests/install/run.sh $(BUILD)

.PHONY: test-cli test-integration compare-memcheck test-install

# ---- install -------------------------------------------------------------------
# make install PREFIX=/usr/local DESTDIR=: the tool, the preload (in
# LIBDIR/tagalloc/, where an installed `tagalloc run` looks for it: beside
# itself, then ../lib/tagalloc/) and the CUDA shim beside it, the libraries,
# the public headers (in INCLUDEDIR/tagalloc/), a pkg-config file and the
# man pages (man/).
PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR     ?= $(PREFIX)/share/man
INSTALL    ?= install
TA_VERSION := $(shell sed -n 's/^\#define TA_VERSION "\(.*\)"/\1/p' alloc/tagalloc.h)
INSTALL_LIBS = libtagalloc.so libtagalloc.a libtagalloc-tensor.a libtagalloc-autograd.a libtagalloc-gpu.a
INSTALL_HEADERS = alloc/tagalloc.h tensor/tensor.h autograd/autograd.h gpu/gpu.h
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

# The packages the build, the tests and the benchmarks need (tools/deps/*.txt).
deps:
	@tools/install-deps.sh

bench-deps:
	@tools/install-deps.sh bench

.PHONY: install uninstall deps bench-deps
