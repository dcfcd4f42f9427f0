/*
 * Private to the peer module: the K-FAC part of trainer.st (resume.c
 * writes and reads the file, kfac.c this part of it). The K-FAC momentum
 * is the F32 tensor PEER_KFAC_MOMENTUM [n_params], the factors are F32
 * factor tensors as compress_factors_write names them ("kfac.<layer>.A"),
 * and the settings are kfac_* metadata.
 */
#ifndef VOLLEY_PEER_KFAC_INTERNAL_H
#define VOLLEY_PEER_KFAC_INTERNAL_H

#include "peer/peer.h"

#define PEER_KFAC_MOMENTUM "kfac_momentum"

/* Floats in all the K-FAC factors of a model of configuration cfg. */
size_t peer_kfac_factor_floats(const model_gpt_config *cfg);

/* Adds r's K-FAC state (if it has one) to w; *scratch (freed by the caller
 * after st_writer_finish) may get a buffer the writer points into. */
int peer_kfac_state_write(st_writer *w, const peer_resume *r, void **scratch,
                          vl_error *err) VL_MUST_CHECK;
/* Reads the K-FAC state of a trainer.st into r (nothing when the file has
 * none), checking every setting, the momentum's shape and finiteness and
 * the factors against r->cfg's layers. On failure the caller frees r. */
int peer_kfac_state_read(const st_file *f, peer_resume *r, vl_error *err) VL_MUST_CHECK;
/* Makes r's K-FAC state t's (whose model has r's shape); r keeps its
 * buffers, which the caller frees. Nothing when r has none. */
int peer_kfac_state_apply(peer_trainer *t, peer_resume *r, vl_error *err) VL_MUST_CHECK;
/* Frees r's K-FAC buffers. */
void peer_kfac_state_free(peer_resume *r);
/* Points view's K-FAC fields at t's state for saving: the momentum is
 * borrowed, the factors copied into view->kfac_factor_data, which the
 * caller frees. Nothing when t has no K-FAC factors yet. */
int peer_kfac_state_view(peer_resume *view, const peer_trainer *t, vl_error *err) VL_MUST_CHECK;

#endif
