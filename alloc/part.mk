# alloc/part.mk - the ledger (alloc/): the library, libtagalloc.so and
# libtagalloc.a (the ledger's objects and those of reports/, which
# reports/part.mk lists in REPORTS_OBJ), the ledger's tests (tests/unit,
# misuse, stress: make test-unit, test-asan, check-valgrind) and the example
# with bugs on purpose (examples/demo.c, make demo-bugs).
# Included by the top Makefile; everything builds under $(BUILD), so the
# ASan+UBSan build (BUILD=build/asan) gets its own copy.

# The library: the ledger plus the symbolizer and the renderers of reports/.
ALLOC_SRC = $(wildcard alloc/*.c)
ALLOC_OBJ = $(ALLOC_SRC:%.c=$(BUILD)/obj/%.o)
LIB_OBJ   = $(ALLOC_OBJ) $(REPORTS_OBJ)

UNIT_SRC = $(wildcard tests/unit/*.c) $(wildcard tests/misuse/*.c) $(wildcard tests/stress/*.c)
UNIT_BIN = $(UNIT_SRC:tests/%.c=$(BUILD)/tests/%)
# The static library: keep the text reporter, which registers itself.
LINKA    = -Wl,-u,report_text_write $(BUILD)/libtagalloc.a

PART_ALL += $(BUILD)/libtagalloc.so $(BUILD)/libtagalloc.a $(BUILD)/demo $(UNIT_BIN)

$(BUILD)/obj/alloc/%.o: alloc/%.c Makefile alloc/part.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) $(DEPFLAGS) -c $< -o $@

$(BUILD)/libtagalloc.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LIBS)

$(BUILD)/libtagalloc.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/demo: examples/demo.c $(BUILD)/libtagalloc.a
	$(CC) $(CFLAGS) $(COMMON) $< -o $@ $(LINKA) $(LIBS)

$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(BUILD)/libtagalloc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) -Itests $< -o $@ $(LINKA) $(TEST_LIBS) $(LIBS)

TEST_SERIAL += test-unit test-asan

# The ledger's tests (tests/unit, misuse, stress), one line each and a total.
test-unit: all
	@tests/run-tests.sh $(BUILD)

# The same tests, library and all, built with AddressSanitizer and UBSan.
test-asan:
	$(MAKE) $(ASAN_VARS) $(ASAN_BUILD)/libtagalloc.a asan-tests
	$(ASAN_RUN) tests/run-tests.sh $(ASAN_BUILD)

asan-tests: $(UNIT_BIN)

# The same tests under valgrind memcheck, then the integration programs.
check-valgrind: all
	VALGRIND=1 tests/run-tests.sh $(BUILD)
	tests/integration/run.sh $(BUILD) --valgrind

# The ledger catching three bugs on purpose (examples/demo.c), and the page
# of its trace.
demo-bugs: $(BUILD)/demo $(BUILD)/tagalloc
	TAGALLOC_TRACE=$(BUILD)/demo-bugs.trace $(BUILD)/demo
	$(BUILD)/tagalloc report -q $(BUILD)/demo-bugs.trace --html $(BUILD)/demo-bugs.html
	@echo "demo-bugs: the page of the run is $(BUILD)/demo-bugs.html"

.PHONY: test-unit test-asan asan-tests check-valgrind demo-bugs
