# bench_gpu_compress: the CUDA sketch encode, exact top-k and Gaussian-k at
# d = 124,439,808 as ratios to a device-to-device cudaMemcpy of the same
# vector in the same run. Built only with the CUDA kernels.
if(VOLLEY_HAVE_CUDA AND TARGET volley_kernels_cuda)
  add_executable(bench_gpu_compress gpu_compress.cu)
  target_link_libraries(bench_gpu_compress PRIVATE volley_kernels_cuda volley_compress
                        volley_common)
  set_property(TARGET bench_gpu_compress PROPERTY COMPILE_OPTIONS "")
  target_compile_options(bench_gpu_compress PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  if(VOLLEY_WERROR)
    target_compile_options(bench_gpu_compress PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
  endif()
endif()
