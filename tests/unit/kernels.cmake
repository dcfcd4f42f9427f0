# Kernel tests. The CUDA test is only built with the CUDA kernels; on a
# machine without a device it reports itself skipped (exit 77).
volley_unit_test(test_kernels volley_kernels volley_common)
if(VOLLEY_HAVE_CUDA AND TARGET volley_kernels_cuda)
  volley_unit_test(test_kernels_cuda volley_kernels_cuda volley_kernels volley_common)
endif()
volley_unit_test(test_dcor volley_kernels volley_common)
# The 2-D convolution (im2col + sgemm) against direct loops and finite
# differences.
volley_unit_test(test_conv volley_kernels volley_common)
# The compressors and dCor on the GPU against the CPU; skipped (exit 77)
# without a device, like test_kernels_cuda.
if(VOLLEY_HAVE_CUDA AND TARGET volley_kernels_cuda)
  volley_unit_test(test_compress_cuda volley_kernels_cuda volley_compress volley_kernels
                   volley_common)
endif()
