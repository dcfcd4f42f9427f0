# bench_gpu_train: GPT training on a CUDA device (tokens/s, model FLOP/s)
# against cuBLAS at the step's GEMM shapes in the same run. Only with the
# CUDA kernels; without a device it says so and exits 77.
if(VOLLEY_HAVE_CUDA AND TARGET volley_model_cuda)
  add_executable(bench_gpu_train gpu_train.c)
  target_link_libraries(bench_gpu_train PRIVATE volley_model_cuda volley_model
                        volley_kernels_cuda volley_kernels volley_common)
endif()
