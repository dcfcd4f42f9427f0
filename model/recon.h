/*
 * model/recon: the attacker's side of the split-learning leakage benchmark.
 * An attacker who has seen pairs (X, Z) of inputs and the cut-layer
 * activations they produced trains a decoder Z -> X and runs it on the
 * activations of images it has never seen; how close the reconstructions
 * come to the originals (mean squared error and SSIM) measures how much
 * the cut layer leaks. The decoder is a one-hidden-layer MLP regressor
 * Z[q] -> GELU hidden -> sigmoid X[p], so its outputs lie in [0, 1] like
 * the pixels it reconstructs, trained with Adam on the mean squared error.
 * SSIM (ssim.c) is the structural similarity index of Wang et al. (2004),
 * which tracks what a person recognises in a picture better than MSE does.
 *
 * Conventions as in model/model.h: functions that can fail return 0 or a
 * negative VL_E* code and leave one line in err (which may be NULL). A
 * model_recon is used by one thread at a time; its passes run on the
 * kernels' OpenMP threads, so results are bitwise reproducible for a given
 * seed, call sequence and thread count.
 */
#ifndef VOLLEY_MODEL_RECON_H
#define VOLLEY_MODEL_RECON_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* ---- the decoder (recon.c) ------------------------------------------------------ */

typedef struct model_recon model_recon;

/* Bounds on q, hidden and p (each in [1, MODEL_RECON_MAX_WIDTH]) and on
 * the parameter count, which with gradients and Adam's two moments costs
 * 16 bytes a parameter: at most 1 GiB. */
#define MODEL_RECON_MAX_WIDTH (1 << 16)
#define MODEL_RECON_MAX_PARAMS ((size_t)1 << 26)
/* Most rows (samples) one call takes, the most epochs, and the largest
 * minibatch, so a mistaken argument fails at once instead of running for
 * days or allocating without bound. */
#define MODEL_RECON_MAX_ROWS (1 << 24)
#define MODEL_RECON_MAX_EPOCHS 100000
#define MODEL_RECON_MAX_BATCH 65536

/* Creates a decoder from q activations to p pixels through `hidden` GELU
 * units, initialised from the common vl_rng seeded with seed: weights
 * normal with mean 0 and variance 1/fan_in, biases 0, so the output starts near 0.5. The same
 * seed also drives the minibatch order of model_recon_train. On success
 * *out is the caller's, released with model_recon_free; on failure it
 * is NULL. Returns 0, VL_EINVAL (a width outside [1, MODEL_RECON_MAX_WIDTH],
 * too many parameters, out NULL), VL_ENOMEM. */
int model_recon_create(int q, int hidden, int p, uint64_t seed, model_recon **out,
                       vl_error *err) VL_MUST_CHECK;

/* Frees everything the decoder owns. NULL is a no-op. */
void model_recon_free(model_recon *d);

/* Trains on n pairs: row i of Z (n*q floats, row-major) should decode to
 * row i of X (n*p floats, each in [0, 1]). Each of `epochs` epochs visits
 * every row once in a fresh shuffled order, in minibatches of `batch` rows
 * (the last one shorter; batch larger than n means whole-set batches), one
 * Adam step (beta1 0.9, beta2 0.999, eps 1e-8, no weight decay) at rate lr
 * per minibatch. Adam's moments and the shuffling stream carry over from
 * one call to the next, so two calls of e epochs train like one of 2e.
 * Z and X are only read and may be freed after the call. *final_mse (may
 * be NULL) receives the mean squared error per pixel over all n rows after
 * the last step. Every input is checked before anything changes, so a
 * refused call leaves the decoder as it was. Returns 0, VL_EINVAL (NULL
 * arrays, n, epochs or batch outside [1, their MODEL_RECON_MAX_*], lr not
 * in (0, 10], a pixel outside [0, 1], a batch too large for the widths),
 * VL_ERANGE (a NaN or infinite value in Z or X), VL_ENOMEM. */
int model_recon_train(model_recon *d, const float *Z, const float *X, int n, int epochs, int batch,
                      float lr, double *final_mse, vl_error *err) VL_MUST_CHECK;

/* Decodes n rows of Z (n*q floats) into Xhat (n*p caller-owned floats,
 * each in [0, 1]). Returns 0, VL_EINVAL (NULL arrays, n outside
 * [1, MODEL_RECON_MAX_ROWS]), VL_ERANGE (a NaN or infinite value in Z),
 * VL_ENOMEM; on failure Xhat is unspecified. */
int model_recon_predict(model_recon *d, const float *Z, int n, float *Xhat,
                        vl_error *err) VL_MUST_CHECK;

/* Mean of (a[i] - b[i])^2 over the n floats, accumulated in double. NaN
 * when a or b is NULL or n is 0, so a missing result cannot pass for a
 * perfect one. */
double model_recon_mse(const float *a, const float *b, size_t n);

/* ---- the decoder's parameters (for tests and custom optimisers) ------------------ */

/* Parameters, in this order in one flat vector: W1 [q, hidden], b1
 * [hidden], W2 [hidden, p], b2 [p], weights stored [in, out] as the
 * kernels expect. The count is model_recon_num_params. */
size_t model_recon_num_params(const model_recon *d);

/* The flat parameter and gradient vectors, owned by the decoder and valid
 * until it is destroyed; callers may read and write them in place. The
 * gradient holds what the last model_recon_loss_grad or training step
 * left there. */
float *model_recon_params(model_recon *d);
float *model_recon_grads(model_recon *d);

/* The training objective on one batch of B rows, exposed so a test can
 * check the analytic gradient against finite differences: *loss (may be
 * NULL) = mean over the B*p outputs of (xhat - x)^2, and the gradient
 * vector is OVERWRITTEN with that loss's gradient with respect to every
 * parameter. The arguments are checked as model_recon_train checks them.
 * Returns 0, VL_EINVAL, VL_ERANGE, VL_ENOMEM. */
int model_recon_loss_grad(model_recon *d, const float *Z, const float *X, int B, double *loss,
                          vl_error *err) VL_MUST_CHECK;

/* ---- SSIM (ssim.c) --------------------------------------------------------------- */

/* The window is 11x11, so images need at least that many pixels a side;
 * the upper bound keeps the scratch memory (five doubles a pixel) under
 * 42 MB. */
#define MODEL_SSIM_WIN 11
#define MODEL_SSIM_MAX_SIDE 1024

/* Structural similarity of two grey images a and b of w x h pixels
 * (row-major floats on a data range of 1, as pixels in [0, 1] have): the
 * standard index of Wang et al. (2004) with an 11x11 Gaussian window of
 * sigma 1.5 (normalised to sum 1), C1 = 0.01^2 and C2 = 0.03^2, local
 * statistics with population (biased) variances, averaged over every
 * position where the window lies wholly inside the image (the "valid"
 * region, (w-10) x (h-10) positions). Computed in double. 1 for identical
 * images; symmetric in a and b. The images are only read. Returns 0,
 * VL_EINVAL (NULL, w or h outside [11, MODEL_SSIM_MAX_SIDE]), VL_ERANGE
 * (a NaN or infinite pixel), VL_ENOMEM. */
int model_ssim(const float *a, const float *b, int w, int h, double *out,
               vl_error *err) VL_MUST_CHECK;

/* The mean of model_ssim over n image pairs: image i of a and of b starts
 * at float i*w*h. Returns what model_ssim returns, and VL_EINVAL for n
 * outside [1, MODEL_RECON_MAX_ROWS]; messages name the failing image. */
int model_ssim_mean(const float *a, const float *b, int n, int w, int h, double *out,
                    vl_error *err) VL_MUST_CHECK;

#endif
