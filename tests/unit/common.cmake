volley_unit_test(test_common volley_common)
volley_unit_test(test_safetensors volley_common)
# The command-line layer every program parses with (common/opts.h).
volley_unit_test(test_opts volley_common)
