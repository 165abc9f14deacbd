# gpu/cuda/cuda.mk - the CUDA backend (gpu/cuda/), built only where the
# CUDA Toolkit's nvcc is found: /usr/local/cuda/bin/nvcc, or nvcc on PATH,
# or NVCC=... on the command line.  Included from gpu/part.mk.
#
#   build/libtagalloc-gpu-cuda.so   the backend, loaded at run time (dlopen);
#                                   exports gpu_cuda_backend alone
#   make test-gpu-cuda              loads it here: on a machine with no driver
#                                   init must say "no usable CUDA driver", on
#                                   one with a GPU it must open device 0
#   make gpu-check                  the checks that need a GPU (gpu/cuda/gpu-check.sh)
#
# The CUDA runtime is linked statically (cudart_static, as nvcc links
# programs by default): the object then needs no libcudart.so at run time,
# which machines with PyTorch keep in Python's site-packages, off the
# loader's path.  cuBLAS (shared) is opened by the backend's init, once a
# device is found (gpu/cuda/backend.c says where it looks): loading the
# object on a machine without a driver costs no cuBLAS.  Kernels for sm_80 and sm_90, and PTX for newer cards.  nvcc is
# slow: objects depend only on the .cu files and their two headers, and
# nothing is rebuilt unless those change.

NVCC ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_GENCODE = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
# --fmad=false: no contraction into fused multiply-adds, so elementwise
# arithmetic rounds as the host backend's does (gpu/cuda/optim.cu).
CUDA_NVFLAGS = -O3 -std=c++17 --fmad=false $(CUDA_GENCODE) \
               -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra -Igpu -Igpu/cuda
CUDA_CU   = $(wildcard gpu/cuda/*.cu)
CUDA_KOBJ = $(CUDA_CU:%.cu=$(BUILD)/obj/%.o)
CUDA_LIB  = $(BUILD)/libtagalloc-gpu-cuda.so
# The tests: test_cuda_load needs the object (and nothing of the project's
# libraries: it runs on a GPU machine as built here); test_cuda_compare
# needs gpu/ and the ledger, and no CUDA at all to build: its --self-test
# runs everywhere.  Neither uses cmocka (GPU machines may lack it).
CUDA_LOAD_TEST = $(BUILD)/tests/gpu/cuda/test_cuda_load
CUDA_CMP_TEST  = $(BUILD)/tests/gpu/cuda/test_cuda_compare
CUDA_TEST_HDR  = tests/gpu/cuda/cuda_test.h gpu/gpu.h

# Not in sanitizer builds (BUILD=build/asan): the object is loaded by
# uninstrumented and instrumented programs alike, and is built once, in build/.
ifeq ($(findstring sanitize,$(CFLAGS)),)
PART_ALL  += $(CUDA_CMP_TEST) $(if $(NVCC),$(CUDA_LIB) $(CUDA_LOAD_TEST))
PART_TEST += test-gpu-cuda
endif

$(CUDA_CMP_TEST): tests/gpu/cuda/test_cuda_compare.c $(CUDA_TEST_HDR) $(BUILD)/libtagalloc-gpu.a $(BUILD)/libtagalloc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) -Itests/gpu/cuda -Igpu $< -o $@ $(GPU_LINK) $(LIBS)

# The comparison's self-test again, built with AddressSanitizer and UBSan.
define CUDA_ASAN_SELF_TEST
	$(MAKE) $(ASAN_VARS) $(ASAN_BUILD)/tests/gpu/cuda/test_cuda_compare
	$(ASAN_RUN) $(ASAN_BUILD)/tests/gpu/cuda/test_cuda_compare --self-test >$(ASAN_BUILD)/test_cuda_compare.log 2>&1 || \
	  { tail -n 40 $(ASAN_BUILD)/test_cuda_compare.log; exit 1; }
	@echo "PASS $(ASAN_BUILD)/tests/gpu/cuda/test_cuda_compare --self-test"
endef

ifneq ($(NVCC),)
$(BUILD)/obj/gpu/cuda/%.o: gpu/cuda/%.cu gpu/cuda/kernels.h gpu/cuda/common.cuh gpu/cuda/cuda.mk
	@mkdir -p $(dir $@)
	$(NVCC) $(CUDA_NVFLAGS) -c $< -o $@

$(BUILD)/obj/gpu/cuda/backend.o: gpu/cuda/backend.c gpu/cuda/kernels.h gpu/gpu.h gpu/cuda/cuda.mk
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -fsanitize%,$(CFLAGS)) $(COMMON) -fvisibility=hidden -Igpu -Igpu/cuda \
	  -isystem $(CUDA_HOME)/include -DGCU_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"' -c $< -o $@

$(CUDA_LIB): $(CUDA_KOBJ) $(BUILD)/obj/gpu/cuda/backend.o gpu/cuda/exports.map
	$(NVCC) -shared -cudart static -o $@ $(CUDA_KOBJ) $(BUILD)/obj/gpu/cuda/backend.o \
	  -ldl -Xlinker --version-script=gpu/cuda/exports.map -Xlinker -z,nodelete

$(CUDA_LOAD_TEST): tests/gpu/cuda/test_cuda_load.c $(CUDA_TEST_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON) -Itests/gpu/cuda -Igpu $< -o $@ -ldl

test-gpu-cuda: $(CUDA_LIB) $(CUDA_LOAD_TEST) $(CUDA_CMP_TEST)
	@tests/gpu/cuda/run.sh $(BUILD) cuda
	$(CUDA_ASAN_SELF_TEST)
else
ifeq ($(MAKELEVEL),0)
$(info no nvcc (/usr/local/cuda/bin/nvcc, or on PATH): the CUDA backend, $(CUDA_LIB), is not built)
endif
test-gpu-cuda: $(CUDA_CMP_TEST)
	@tests/gpu/cuda/run.sh $(BUILD) nocuda
	$(CUDA_ASAN_SELF_TEST)
endif

# The GPU checks (gpu/cuda/gpu-check.sh): on a machine with a GPU, from a
# build made here.  Nothing is built first: such a machine may lack the
# packages a build needs; the script builds what is missing where it can.
gpu-check:
	@gpu/cuda/gpu-check.sh $(BUILD)

# What a machine without this project's packages needs to run gpu-check:
# the shared libraries of the programs it runs, in $(BUILD)/gpu-libs.
# Other parts add their GPU programs to GPU_BUNDLE.
GPU_BUNDLE += $(CUDA_CMP_TEST) $(if $(NVCC),$(CUDA_LIB) $(CUDA_LOAD_TEST)) \
              $(if $(filter bench-gpu,$(PART_BENCH)),$(BUILD)/bench-gpu $(BENCH_GPU_CUDA_ALLOC)) \
              $(filter $(BUILD)/train-lenet $(BUILD)/train-charlm,$(AG_TOOLS)) \
              $(if $(wildcard tests/cuda/gpu-audit.sh),$(wildcard $(BUILD)/tagalloc $(BUILD)/libtagalloc-*.so))
gpu-bundle: $(GPU_BUNDLE)
	@gpu/cuda/gpu-check.sh --bundle $(BUILD) $(GPU_BUNDLE)

.PHONY: test-gpu-cuda gpu-check gpu-bundle
