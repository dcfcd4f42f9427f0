/* K-FAC for linear layers: see model.h. */
