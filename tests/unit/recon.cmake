# The leakage benchmark's tools: reconstruction decoder, SSIM, PNG grids.
volley_unit_test(test_recon volley_model)
