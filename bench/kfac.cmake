# bench_kfac: steps and wall time for the MLP and the default GPT to reach
# a target evaluation loss with K-FAC, against AdamW measured in the same run.
add_executable(bench_kfac kfac.c kfac_gpt.c)
target_link_libraries(bench_kfac PRIVATE volley_model volley_kernels volley_common
                      OpenMP::OpenMP_C m)
