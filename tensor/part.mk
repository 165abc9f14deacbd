# tensor/part.mk - the tensor library (tensor/), its tests and its benchmark.
# Included by the top Makefile; everything builds under $(BUILD), so the
# ASan+UBSan build (BUILD=build/asan) gets its own copy.

TENSOR_SRC   = $(wildcard tensor/*.c)
TENSOR_OBJ   = $(TENSOR_SRC:%.c=$(BUILD)/obj/%.o)
# Kernels at -O3 (loop vectorization) except in sanitizer builds.
# -fno-trapping-math: without it gcc 12 does not if-convert the clamps and
# NaN selects of vmath.h for AVX2 (x86-64-v3), so exp, tanh and sigmoid ran
# scalar on CPUs without AVX-512; the values are the same either way (the
# project never reads the floating-point exception flags).
TENSOR_OPT   = $(if $(findstring sanitize,$(CFLAGS)),,-O3 -fno-trapping-math)
TENSOR_LIBS  = -lopenblas -ldl
# The optimizer updates (optim.c): sqrtf sets no errno, so their loops vectorize.
$(BUILD)/obj/tensor/optim.o: TENSOR_OPT += -fno-math-errno
# Device tensors (tensor/device.c) run on gpu/: its archive comes after the
# tensor one, and is only pulled in by a program that calls tensor_to.
TENSOR_LINK  = $(BUILD)/libtagalloc-tensor.a $(BUILD)/libtagalloc-gpu.a $(LINKA) $(TENSOR_LIBS)
TENSOR_TESTS = $(patsubst tests/tensor/%.c,$(BUILD)/tests/tensor/%,$(wildcard tests/tensor/test_*.c))

PART_ALL   += $(BUILD)/libtagalloc-tensor.a $(TENSOR_TESTS)
PART_TEST  += test-tensor
PART_BENCH += bench-tensor

$(BUILD)/obj/tensor/%.o: tensor/%.c tensor/part.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TENSOR_OPT) $(COMMON) $(DEPFLAGS) -Itensor -Igpu -c $< -o $@

$(BUILD)/libtagalloc-tensor.a: $(TENSOR_OBJ) | $(BUILD)/libtagalloc-gpu.a
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tests/tensor/%: tests/tensor/%.c $(wildcard tests/*.h tests/tensor/*.h) $(BUILD)/libtagalloc-tensor.a $(BUILD)/libtagalloc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) -Itests -Itensor -Igpu $< -o $@ $(TENSOR_LINK) $(TEST_LIBS) $(LIBS)

tensor-tests: $(TENSOR_TESTS)

# The tests, then the same built with AddressSanitizer and UBSan.
test-tensor: $(BUILD)/libtagalloc.a tensor-tests
	@tests/tensor/run.sh $(BUILD)
	$(MAKE) $(ASAN_VARS) $(ASAN_BUILD)/libtagalloc.a tensor-tests
	$(ASAN_RUN) tests/tensor/run.sh $(ASAN_BUILD)

$(BUILD)/bench-tensor: bench/tensor/bench_tensor.c $(BUILD)/libtagalloc-tensor.a $(BUILD)/libtagalloc.a
	$(CC) -O2 -g $(COMMON) -Itensor $< -o $@ $(TENSOR_LINK) $(LIBS)

bench-tensor: $(BUILD)/bench-tensor
	$(BUILD)/bench-tensor

.PHONY: test-tensor tensor-tests bench-tensor
