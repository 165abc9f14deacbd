# gpu/part.mk - device memory (gpu/): the backend table, the host backend, the
# CUDA backend's loader, the caching pool; its tests and its benchmark.
# Included by the top Makefile; everything builds under $(BUILD), so the
# ASan+UBSan build (BUILD=build/asan) gets its own copy.  The CUDA backend's
# shared object (gpu/cuda/) brings its own rules in gpu/cuda/*.mk.

GPU_SRC   = $(wildcard gpu/*.c)
GPU_OBJ   = $(GPU_SRC:%.c=$(BUILD)/obj/%.o)
# Kernels at -O3 (loop vectorization) except in sanitizer builds.
GPU_OPT   = $(if $(findstring sanitize,$(CFLAGS)),,-O3) -fno-math-errno
GPU_LIBS  = -lopenblas -ldl
GPU_LINK  = $(BUILD)/libtagalloc-gpu.a $(LINKA) $(GPU_LIBS)
GPU_TRAIN = $(BUILD)/train-lenet $(BUILD)/train-charlm   # with --device (below)
GPU_TESTS = $(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(wildcard tests/gpu/test_*.c))

PART_ALL   += $(BUILD)/libtagalloc-gpu.a $(GPU_TESTS) $(BUILD)/tests/gpu/libstandin-cuda.so
PART_TEST  += test-gpu

$(BUILD)/obj/gpu/%.o: gpu/%.c gpu/part.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(GPU_OPT) $(COMMON) $(DEPFLAGS) -Igpu -c $< -o $@

$(BUILD)/libtagalloc-gpu.a: $(GPU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tests/gpu/%: tests/gpu/%.c $(wildcard tests/*.h tests/gpu/*.h) $(BUILD)/libtagalloc-gpu.a $(BUILD)/libtagalloc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) -Itests -Igpu $< -o $@ $(GPU_LINK) $(TEST_LIBS) $(LIBS)

# The stand-in for the CUDA backend's shared object that test_gpu_select loads.
$(BUILD)/tests/gpu/libstandin-cuda.so: tests/gpu/standin_cuda.c gpu/gpu.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) -Igpu -shared $< -o $@

gpu-tests: $(GPU_TESTS) $(BUILD)/tests/gpu/libstandin-cuda.so

# The tests, then the same built with AddressSanitizer and UBSan.
test-gpu: $(BUILD)/libtagalloc.a gpu-tests $(GPU_TRAIN)
	@tests/gpu/run.sh $(BUILD)
	$(MAKE) $(ASAN_VARS) $(ASAN_BUILD)/libtagalloc.a gpu-tests
	$(ASAN_RUN) tests/gpu/run.sh $(ASAN_BUILD) --programs-only

.PHONY: test-gpu gpu-tests

include $(wildcard gpu/cuda/*.mk)

# make bench-gpu: a cached allocation against the backend's raw one, and the
# pool's hit rate in a training-like steady state (bench/gpu/README.md); then
# bench/gpu/cuda.sh: cudaMalloc and cudaMallocAsync pairs
# ($(BUILD)/bench-gpu-cuda-alloc, built where nvcc is found), LeNet-5 images/s
# against PyTorch (bench/gpu/vs_torch.py, PYTHON=... picks the interpreter),
# and the audit's cost on a CUDA program (bench/gpu/audit_cost.sh); each
# prints SKIP with the reason where it cannot run (no GPU, no PyTorch).
PART_BENCH += bench-gpu
BENCH_GPU_CUDA_ALLOC = $(if $(NVCC),$(BUILD)/bench-gpu-cuda-alloc)

$(BUILD)/bench-gpu: bench/gpu/bench_gpu.c $(BUILD)/libtagalloc-gpu.a $(BUILD)/libtagalloc.a
	$(CC) -O2 -g $(COMMON) -Igpu $< -o $@ $(GPU_LINK) $(LIBS)

ifneq ($(NVCC),)
$(BUILD)/bench-gpu-cuda-alloc: bench/gpu/cuda_alloc.cu
	@mkdir -p $(dir $@)
	$(NVCC) -O2 $(CUDA_GENCODE) $< -o $@
endif

# The scripts' paths that run without a GPU, with stand-ins (bench/gpu/test_scripts.sh).
PART_TEST += test-bench-gpu-scripts
test-bench-gpu-scripts: $(BUILD)/tagalloc $(BUILD)/libtagalloc-cuda.so
	@bench/gpu/test_scripts.sh $(BUILD)

bench-gpu: $(BUILD)/bench-gpu $(BENCH_GPU_CUDA_ALLOC) $(BUILD)/train-lenet $(BUILD)/tagalloc $(BUILD)/libtagalloc-cuda.so
	$(BUILD)/bench-gpu
	bench/gpu/cuda.sh $(BUILD)

.PHONY: bench-gpu test-bench-gpu-scripts

# train-lenet and train-charlm --device run on gpu/ (tools/train_common.h
# picks the backend): the header path, and the library before the ledger's,
# which it needs.
$(GPU_TRAIN): $(BUILD)/libtagalloc-gpu.a
$(GPU_TRAIN): COMMON += -Igpu
$(GPU_TRAIN): LIBS := $(BUILD)/libtagalloc-gpu.a $(LINKA) $(GPU_LIBS) $(LIBS)
