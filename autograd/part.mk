# autograd/part.mk - autograd (autograd/), its tests and the training
# programs (tools/train_*.c).  Included by the top Makefile; everything builds
# under $(BUILD), so the ASan+UBSan build (BUILD=build/asan) gets its own copy.

AG_SRC   = $(wildcard autograd/*.c)
AG_OBJ   = $(AG_SRC:%.c=$(BUILD)/obj/%.o)
AG_OPT   = $(if $(findstring sanitize,$(CFLAGS)),,-O3) -fno-math-errno
AG_LINK  = $(BUILD)/libtagalloc-autograd.a $(TENSOR_LINK) -lz
AG_DEPS  = $(BUILD)/libtagalloc-autograd.a $(BUILD)/libtagalloc-tensor.a $(BUILD)/libtagalloc.a
AG_TESTS = $(patsubst tests/autograd/%.c,$(BUILD)/tests/autograd/%,$(wildcard tests/autograd/test_*.c))
AG_TOOLS = $(foreach f,$(wildcard tools/train_*.c),$(BUILD)/$(subst _,-,$(basename $(notdir $(f)))))

PART_ALL   += $(BUILD)/libtagalloc-autograd.a $(AG_TESTS) $(AG_TOOLS)
PART_TEST  += test-autograd

$(BUILD)/obj/autograd/%.o: autograd/%.c autograd/part.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AG_OPT) $(COMMON) $(DEPFLAGS) -Itensor -Iautograd -c $< -o $@

$(BUILD)/libtagalloc-autograd.a: $(AG_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tests/autograd/%: tests/autograd/%.c $(wildcard tests/*.h tests/autograd/*.h) $(AG_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) -Itests -Itensor -Iautograd -Igpu $< -o $@ $(AG_LINK) $(TEST_LIBS) $(LIBS)

# tools/train_lenet.c -> $(BUILD)/train-lenet (with tools/train_common.h)
$(BUILD)/train-%: tools/train_%.c $(wildcard tools/train_*.h) $(AG_DEPS)
	$(CC) $(CFLAGS) $(COMMON) -Itensor -Iautograd -Itools $< -o $@ $(AG_LINK) $(LIBS)

autograd-tests: $(AG_TESTS) $(AG_TOOLS)

# The tests, then the same built with AddressSanitizer and UBSan (the CLI,
# which renders tape-no-shrink's trace, too).
test-autograd: $(BUILD)/libtagalloc.a autograd-tests $(BUILD)/tagalloc
	@tests/autograd/run.sh $(BUILD)
	$(MAKE) $(ASAN_VARS) $(ASAN_BUILD)/libtagalloc.a autograd-tests $(ASAN_BUILD)/tagalloc
	$(ASAN_RUN) tests/autograd/run.sh $(ASAN_BUILD)

.PHONY: test-autograd autograd-tests

# make demo, the main job: LeNet-5 trained on Fashion-MNIST for one epoch
# with the ledger on and a trace kept, and the report of the trace as an
# HTML page: a mark per training step, live bytes by tag over time, what was
# live at the peak, the findings (none).  DEMO_ARGS shortens it (the browser
# test's).
DEMO_ARGS ?= --epochs 1
demo: $(BUILD)/train-lenet $(BUILD)/tagalloc
	TAGALLOC_TRACE=$(BUILD)/lenet.trace $(BUILD)/train-lenet $(DEMO_ARGS)
	$(BUILD)/tagalloc report -q $(BUILD)/lenet.trace --html $(BUILD)/lenet-report.html
	@echo "demo: the ledger's report of the run is $(BUILD)/lenet-report.html (trace: $(BUILD)/lenet.trace)"

.PHONY: demo

# make bench-autograd: train-lenet and train-charlm against PyTorch at 1 and 2
# threads, and the ledger's own cost (bench/autograd/README.md).
PART_BENCH += bench-autograd
bench-autograd: $(BUILD)/train-lenet $(BUILD)/train-charlm
	/usr/bin/python3 bench/autograd/run.py --build $(BUILD)

# make demo-faults: one page per seeded bug (tensor.h: tensor_fault_set),
# build/faults/NAME.html, each the page of the trace of 10 steps of
# train-lenet with --fault NAME (optimizer-state-leak: resumed from a
# checkpoint of 3 steps), rendered by tagalloc report, so that it has the
# run's timeline and duration; NAME.txt is the run's own exit report.  Each
# run exits 1: the ledger found the bug.  tape-no-shrink is growth: 40
# steps (a mark per step; exit 0: growth is a warning).
FAULTS = reshape-dummy slice-dummy view-underflow tape-stack-inputs arena-early-reset params-in-arena \
         scope-escape pool-double-release
demo-faults: $(BUILD)/train-lenet $(BUILD)/tagalloc
	@mkdir -p $(BUILD)/faults
	@for f in $(FAULTS); do \
	  rm -f $(BUILD)/faults/$$f.trace; \
	  TAGALLOC_TRACE=$(BUILD)/faults/$$f.trace $(BUILD)/train-lenet --epochs 1 --steps 10 --test 100 \
	    --fault $$f >/dev/null 2>$(BUILD)/faults/$$f.txt; \
	  $(BUILD)/tagalloc report -q $(BUILD)/faults/$$f.trace --html $(BUILD)/faults/$$f.html; \
	  test -s $(BUILD)/faults/$$f.html || { echo "demo-faults: no page for $$f"; exit 1; }; \
	  echo "demo-faults: $(BUILD)/faults/$$f.html"; \
	done
	@$(BUILD)/train-lenet --epochs 1 --steps 6 --test 100 --checkpoint $(BUILD)/faults/osl.ck --stop-after 3 >/dev/null 2>&1
	@rm -f $(BUILD)/faults/optimizer-state-leak.trace
	@TAGALLOC_TRACE=$(BUILD)/faults/optimizer-state-leak.trace $(BUILD)/train-lenet --epochs 1 --steps 6 \
	  --test 100 --resume $(BUILD)/faults/osl.ck --fault optimizer-state-leak \
	  >/dev/null 2>$(BUILD)/faults/optimizer-state-leak.txt; \
	$(BUILD)/tagalloc report -q $(BUILD)/faults/optimizer-state-leak.trace \
	  --html $(BUILD)/faults/optimizer-state-leak.html; \
	test -s $(BUILD)/faults/optimizer-state-leak.html && echo "demo-faults: $(BUILD)/faults/optimizer-state-leak.html"
	@rm -f $(BUILD)/faults/tape-no-shrink.trace
	@TAGALLOC_TRACE=$(BUILD)/faults/tape-no-shrink.trace $(BUILD)/train-lenet --epochs 1 --steps 40 --test 100 \
	  --fault tape-no-shrink >/dev/null 2>&1
	@$(BUILD)/tagalloc report $(BUILD)/faults/tape-no-shrink.trace --html $(BUILD)/faults/tape-no-shrink.html \
	  >$(BUILD)/faults/tape-no-shrink.txt 2>&1
	@test -s $(BUILD)/faults/tape-no-shrink.html && echo "demo-faults: $(BUILD)/faults/tape-no-shrink.html"

# make bench-checks: what the argument checks cost on training: train-lenet
# against itself built with -DTAGALLOC_NO_ARG_CHECKS, in alternating pairs.
bench-checks: $(BUILD)/train-lenet
	$(MAKE) BUILD=build/nochecks CFLAGS="-O2 -g -DTAGALLOC_NO_ARG_CHECKS" build/nochecks/train-lenet
	/usr/bin/python3 bench/autograd/checks.py --build $(BUILD) --nochecks build/nochecks

# build/gemm-shapes: charlm's products on OpenBLAS, tensor/gemm_small.c and,
# where libxsmm-dev is installed, libxsmm's JIT (bench/autograd/README.md).
XSMM_FLAGS = $(if $(wildcard /usr/include/libxsmm.h),-DHAVE_LIBXSMM)
XSMM_LIBS  = $(if $(wildcard /usr/include/libxsmm.h),-L/usr/lib -lxsmm -lrt)
$(BUILD)/gemm-shapes: bench/autograd/gemm_shapes.c $(BUILD)/libtagalloc-tensor.a $(BUILD)/libtagalloc.a
	$(CC) -O2 -g $(COMMON) $(XSMM_FLAGS) -Itensor $< -o $@ $(TENSOR_LINK) $(XSMM_LIBS) $(LIBS)

.PHONY: bench-autograd bench-checks demo-faults
