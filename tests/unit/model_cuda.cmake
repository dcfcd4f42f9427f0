# The GPT's CUDA kernels (float32 and bfloat16 operands) and training step
# against the CPU; only built with the CUDA kernels, and without a device
# it reports itself skipped (exit 77).
if(VOLLEY_HAVE_CUDA AND TARGET volley_model_cuda)
  volley_unit_test(test_model_cuda volley_model_cuda volley_model volley_kernels_cuda
                   volley_kernels volley_common)
  volley_unit_test(test_model_cuda_bf16 volley_kernels_cuda volley_kernels volley_common)
endif()
