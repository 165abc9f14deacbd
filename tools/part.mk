# tools/part.mk - the auditor's CUDA driver shim (tools/cuda_shim.c, see
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
