# reports/part.mk - the report model's renderers, their tests, fuzzing and
# benchmark (issue 4).  Included by the top Makefile.
#
# reports/*.c, and the HTML page's assets embedded into
# $(BUILD)/gen/html_assets.c (generated at build time, not kept in git), are
# compiled here into REPORTS_OBJ, which alloc/part.mk links into the
# library.  This file also brings the golden-file and
# browser tests (make test-reports), the trace reader's fuzzer (make fuzz)
# and the rendering benchmark (make bench-reports).

REPORTS_ASSETS := reports/html/report.css reports/html/body.html reports/html/report.js

REPORTS_SRC  = $(wildcard reports/*.c)
REPORTS_GEN := $(BUILD)/gen/html_assets.c
REPORTS_OBJ  = $(REPORTS_SRC:%.c=$(BUILD)/obj/%.o) $(REPORTS_GEN:$(BUILD)/gen/%.c=$(BUILD)/obj/gen/%.o)
# What the LD_PRELOAD shim links of reports/: its own stderr report (the
# text renderer, the process model, the symbolizer, suppressions, the
# allocator wrappers' list).  The trace reader, the model of traces, JSON,
# HTML and folded stacks are the command-line tool's (and libtagalloc's, for
# programs that render their own pages); the shim writes its findings into
# its trace, which the tool renders.
REPORTS_PRELOAD = text process symbolize suppress wrappers
REPORTS_PRELOAD_OBJ = $(REPORTS_PRELOAD:%=$(BUILD)/obj/reports/%.o)

$(BUILD)/obj/reports/%.o: reports/%.c Makefile reports/part.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) $(DEPFLAGS) -c $< -o $@

$(BUILD)/gen/html_assets.c: $(REPORTS_ASSETS) reports/html/embed.sh
	@mkdir -p $(dir $@)
	sh reports/html/embed.sh $@

# Generated sources: built from $(BUILD)/gen/, their headers in reports/.
$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c Makefile reports/part.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) $(DEPFLAGS) -c $< -o $@

# Synthetic traces for the golden tests (the stored ones are in git).
$(BUILD)/tests/reports/mktrace: tests/reports/mktrace.c alloc/trace_format.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) -std=gnu11 -Ialloc $< -o $@

PART_ALL  += $(BUILD)/tests/reports/mktrace
PART_TEST += test-reports
PART_BENCH += bench-reports

# Golden files, escaping, diff, then the page in Chromium.
test-reports: all
	tests/reports/run.sh $(BUILD)
	tests/browser/run.sh $(BUILD)

# Rewrites the expected outputs from the stored traces (review the diff!).
reports-golden: all
	tests/reports/run.sh $(BUILD) --update

# libFuzzer on the trace reader, FUZZ_SECONDS (default 600) seconds.
FUZZ_SECONDS ?= 600
$(BUILD)/fuzz/fuzz_trace: tests/reports/fuzz_trace.c reports/trace_read.c reports/trace_read.h alloc/trace_format.h
	@mkdir -p $(dir $@)
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -D_GNU_SOURCE \
	  -Ialloc -Ireports tests/reports/fuzz_trace.c reports/trace_read.c -o $@

fuzz: $(BUILD)/fuzz/fuzz_trace
	@mkdir -p $(BUILD)/fuzz/corpus
	$(BUILD)/fuzz/fuzz_trace -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
	  -max_len=65536 -artifact_prefix=$(BUILD)/fuzz/ $(BUILD)/fuzz/corpus tests/reports/fuzz-corpus

# Rendering a 10-million-event trace, against heaptrack_print.
bench-reports: all
	bench/reports/run.sh $(BUILD)

.PHONY: test-reports reports-golden fuzz bench-reports
