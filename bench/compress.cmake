# bench_compress: Count Sketch encode, exact top-k, Gaussian-k and the sparse
# update codec as ratios to memcpy of the same vector, with a full sort as
# the baseline top-k must beat, all measured in the same run.
add_executable(bench_compress compress.c)
target_link_libraries(bench_compress PRIVATE volley_compress volley_common m OpenMP::OpenMP_C)
