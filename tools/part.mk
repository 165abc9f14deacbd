# tools/part.mk - the auditor: the LD_PRELOAD shim (the library plus
# tools/preload*.c) and the command-line tool (tools/tagalloc*.c); then its
# CUDA driver shim (below).  The training programs (tools/train_*.c) are
# built by autograd/part.mk.

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

# The ledger and, of reports/, what its stderr report needs
# (REPORTS_PRELOAD_OBJ); -z defs: nothing else may be missing.  Those
# report_* functions stay inside (tools/preload.map).
$(BUILD)/libtagalloc-preload.so: $(PRELOAD_OBJ) $(ALLOC_OBJ) $(REPORTS_PRELOAD_OBJ) $(PRELOAD_JEMALLOC) tools/preload.map
	$(CC) -shared -Wl,-z,nodelete -Wl,-z,defs -Wl,--version-script=tools/preload.map \
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
