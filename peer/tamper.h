/*
 * tamper: a hook into the peer's uploads that plays a hostile peer, for
 * tests of the coordinator's defences only (tests/integration/
 * hostile_peer.c). It is not part of the peer's API (peer/peer.h):
 * volley-peer never sets it. Private to the peer library and that test.
 */
#ifndef VOLLEY_PEER_TAMPER_H
#define VOLLEY_PEER_TAMPER_H

#include <stddef.h>

#include "peer/peer.h"

/* Called before each upload of a task is encoded, attempt 0 first and 1,
 * 2, ... after each refusal of that task's upload, with delta holding the
 * task's honest delta on attempt 0 and whatever the last call left after
 * that; it may rewrite delta. A refused upload is tried again while the
 * hook returns 0, up to PEER_TAMPER_ATTEMPTS in all; a refusal left after
 * that drops the task instead of ending the loop. A non-zero return gives
 * the task up. With a hook, no upload overlaps the next task. */
typedef int (*peer_tamper_fn)(void *arg, int attempt, float *delta, size_t n);

/* Uploads of one task a tamper hook may try. */
#define PEER_TAMPER_ATTEMPTS 8

/* peer_run with fn (and its arg) tampering with every upload. */
int peer_run_tampered(const peer_run_opts *o, peer_tamper_fn fn, void *arg,
                      vl_error *err) VL_MUST_CHECK;

#endif
