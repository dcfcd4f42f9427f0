# bench_ingest: durable upload ingest of a coordinator (uploads/s and the
# latency of each 202) beside the disk's bare fsync rate, measured in the
# same run; bench/ingest.sh drives it. Also the upload client of
# tests/integration/crash.sh.
add_executable(bench_ingest ingest.c)
target_link_libraries(bench_ingest PRIVATE volley_peer)
