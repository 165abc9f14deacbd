# bench/part.mk - the auditor's benchmark: `make bench-auditor`, run by
# `make bench`.  bench/auditor/run.py times the workloads bare, under
# `tagalloc run` (each checking mode, exact and fast stacks), heaptrack,
# valgrind memcheck and LeakSanitizer, judges issue 22's targets, and writes
# bench/RESULTS.md.  BENCH_QUICK=1: a quick check.
PART_BENCH += bench-auditor

# The own workloads: -O2 -g with frame pointers (for --unwind fast), and the
# same built with -fsanitize=leak for the LSan rows.
BENCH_AUDITOR_CFLAGS = -O2 -g -fno-omit-frame-pointer -Wall -Wextra -std=gnu11 -pthread
BENCH_AUDITOR_BIN = $(BUILD)/bench/churn $(BUILD)/bench/tree $(BUILD)/bench/mixchurn $(BUILD)/bench/churn-lsan \
                    $(BUILD)/bench/tree-lsan $(BUILD)/bench/mixchurn-lsan $(BUILD)/bench/pagefault

$(BUILD)/bench/%: bench/auditor/%.c bench/part.mk
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_AUDITOR_CFLAGS) $< -o $@

$(BUILD)/bench/%-lsan: bench/auditor/%.c bench/part.mk
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_AUDITOR_CFLAGS) -fsanitize=leak $< -o $@

bench-auditor: $(BUILD)/tagalloc $(BUILD)/libtagalloc-preload.so $(BENCH_AUDITOR_BIN)
	/usr/bin/python3 bench/auditor/run.py --build $(BUILD)

# The comparison scripts' own logic, on constructed data (no tool runs, a
# second): real_vs_memcheck.py's pairing of process entries, run.py's judging
# of issue 22's targets and its reading of heaptrack's failure.
PART_TEST += test-bench-scripts
test-bench-scripts:
	/usr/bin/python3 tests/integration/test_real_vs_memcheck.py
	/usr/bin/python3 bench/auditor/test_run.py

.PHONY: bench-auditor test-bench-scripts

# make bench-alloc: what one alloc+free pair costs under the ledger, next
# to jemalloc and glibc (bench/bench_alloc.c; bench/README.md).
PART_BENCH += bench-alloc

$(BUILD)/bench-alloc: bench/bench_alloc.c $(BUILD)/libtagalloc.a
	$(CC) -O2 -g $(COMMON) $< -o $@ $(LINKA) $(LIBS)

bench-alloc: $(BUILD)/bench-alloc
	$(BUILD)/bench-alloc

.PHONY: bench-alloc
