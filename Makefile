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
# ...) brings a PART/part.mk with its rules and recipes, which adds its
# targets to these lists: PART_ALL what `make` builds; TEST_SERIAL the tests
# `make test` runs first, one after the other (the ledger's, then the
# auditor's), PART_TEST the parts' suites after them; PART_BENCH what `make
# bench` runs.  reports/part.mk comes first and alloc/part.mk second: the
# library's rules in alloc/part.mk take the objects reports/part.mk lists
# (REPORTS_OBJ), and the other parts link the library (LINKA).
PART_ALL    :=
TEST_SERIAL :=
PART_TEST   :=
PART_BENCH  :=
PARTS_FIRST = reports/part.mk alloc/part.mk
include $(PARTS_FIRST) $(filter-out $(PARTS_FIRST),$(wildcard */part.mk))

# The objects' header dependencies (written by $(DEPFLAGS) at their last build).
-include $(wildcard $(BUILD)/obj/*/*.d $(BUILD)/obj/*/*/*.d)

all: $(PART_ALL)

# Unit, misuse and stress tests, the same under ASan+UBSan, the command
# line, install and integration (TEST_SERIAL), then every part's suite.
test: all
	@set -e; for t in $(TEST_SERIAL); do $(MAKE) $$t; done
	$(if $(PART_TEST),$(MAKE) $(PART_TEST))

bench: bench-deps $(PART_BENCH)

clean:
	rm -rf build

.PHONY: all test bench clean
.SECONDARY:
