# The data-parallel GPT against the single-device one; only built with the
# CUDA kernels, and without a device it reports itself skipped (exit 77).
# Its multi-GPU part needs two devices and NCCL, and says so when it skips.
if(VOLLEY_HAVE_CUDA AND TARGET volley_model_cuda)
  volley_unit_test(test_model_cuda_dp volley_model_cuda volley_model volley_kernels_cuda
                   volley_kernels volley_common)
endif()
