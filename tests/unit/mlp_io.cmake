# The MLP classifier as a run's model (model/mlp_io.h): configuration JSON,
# checkpoint files and the AdamW step over its tensor table.
volley_unit_test(test_mlp_io volley_model)
# What the classifier's convolution front end refuses.
volley_unit_test(test_mlp_conv volley_model)
