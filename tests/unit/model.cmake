# GPT, optimiser, data sampling and checkpoint tests.
volley_unit_test(test_model volley_model)
volley_unit_test(test_model_io volley_model)
volley_unit_test(test_shard volley_model)
volley_unit_test(test_images volley_model)
volley_unit_test(test_mlp volley_model)
volley_unit_test(test_sgd volley_model)
volley_unit_test(test_kfac volley_model)
volley_unit_test(test_kfac_gpt volley_model)
