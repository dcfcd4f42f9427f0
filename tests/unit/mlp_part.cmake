# Split-learning parts of the MLP classifier (model/mlp_part.h).
volley_unit_test(test_mlp_part volley_model)
