# bench_nopeek: what a split-learning cut leaks under NoPeek (test accuracy,
# dCor(X, Z) and a decoder attack's reconstruction error) beside the
# mean-image guess measured in the same run; bench/nopeek.sh drives it over
# real runs, one per alpha, and compares each with alpha = 0.
add_executable(bench_nopeek nopeek.c)
target_link_libraries(bench_nopeek PRIVATE volley_storage volley_model volley_kernels
                      volley_common OpenMP::OpenMP_C m)
