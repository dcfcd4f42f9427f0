# The data-parallel GPT against the single-device one; only built with the
# CUDA kernels, and without a device it reports itself skipped (exit 77).
# Training on two devices is a program of its own, which also skips itself
# whole (exit 77) with fewer than two devices or a build without NCCL.
if(VOLLEY_HAVE_CUDA AND TARGET volley_model_cuda)
  volley_unit_test(test_model_cuda_dp volley_model_cuda volley_model volley_kernels_cuda
                   volley_kernels volley_common)
  volley_unit_test(test_model_cuda_multi volley_model_cuda volley_model volley_kernels_cuda
                   volley_kernels volley_common)
endif()
