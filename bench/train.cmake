# bench_train: GPT training-step FLOP/s against OpenBLAS sgemm at the same
# shapes, measured in the same run.
add_executable(bench_train train.c)
target_link_libraries(bench_train PRIVATE volley_model volley_kernels volley_common
                      OpenMP::OpenMP_C)
