/*
 * The nonce journal: the request nonces the coordinator has accepted,
 * kept on disk beside the database so that a restart does not forget them.
 *
 * The replay cache (vcrypto_nonce_cache) lives in memory. Were it lost on a
 * restart, a request captured in the last VCRYPTO_TS_WINDOW_S seconds would
 * be accepted again, while refusing every timestamp from before the
 * restart would refuse honest peers whose clocks run a little behind.
 * So each accepted nonce is appended to `<database>-nonces`, the appends
 * are written and fdatasynced once a second, and on start both journal
 * files are read back into the cache (the entries still live).
 *
 * A nonce is live until its own timestamp (the request's created) plus
 * VCRYPTO_TS_WINDOW_S: a created may be up to a window ahead of the clock,
 * so a request can be valid up to two windows after it arrived. The
 * current file becomes `<database>-nonces.old` (and a new one starts) at
 * least a window after it began and only once the latest timestamp in the
 * old file it replaces is no longer live, so no live nonce is ever
 * dropped, whatever the rotations and restarts, and the current file
 * holds at most about two windows of requests.
 *
 * What is not covered: nonces accepted in the last second before a crash
 * or power cut (the flush interval). Uploads and key rotations are safe
 * against such a replay on their own (a task takes one update; a key a
 * peer left is retired).
 *
 * Contents: coord_nonce_log, coord_nonce_log_open, coord_nonce_log_open_at,
 * coord_nonce_log_add, coord_nonce_log_flush, coord_nonce_log_flush_at,
 * coord_nonce_log_close.
 */
#ifndef VOLLEY_COORD_NONCE_LOG_H
#define VOLLEY_COORD_NONCE_LOG_H

#include <stdint.h>

#include "common/common.h"

struct vcrypto_nonce_cache;
struct event_base;

typedef struct coord_nonce_log coord_nonce_log;

/* Reads the journal of the database at db_path into cache (the entries
 * still live now), rewrites it as one file holding only those, and starts
 * the flush timer on base (none when base is NULL: the caller flushes).
 * *out is the caller's; close it with coord_nonce_log_close. A journal
 * line that does not parse (a torn last line) is skipped. */
int coord_nonce_log_open(const char *db_path, struct vcrypto_nonce_cache *cache,
                         struct event_base *base, coord_nonce_log **out,
                         vl_error *err) VL_MUST_CHECK;
/* The same at a given clock (unix s), for tests that step through
 * rotations; the timer's flushes still read the real clock. */
int coord_nonce_log_open_at(const char *db_path, struct vcrypto_nonce_cache *cache,
                            struct event_base *base, int64_t now, coord_nonce_log **out,
                            vl_error *err) VL_MUST_CHECK;

/* Notes a nonce the cache has just accepted (nonce: hex, at most
 * VCRYPTO_NONCE_HEX characters; anything else is not journalled). Written
 * at the next flush. */
void coord_nonce_log_add(coord_nonce_log *l, int64_t peer_id, const char *nonce, int64_t ts);

/* Writes and syncs what is pending now (also done once a second), and
 * rotates the files when due. */
int coord_nonce_log_flush(coord_nonce_log *l, vl_error *err) VL_MUST_CHECK;
/* The same with now as the clock (unix s). */
int coord_nonce_log_flush_at(coord_nonce_log *l, int64_t now, vl_error *err) VL_MUST_CHECK;

/* Flushes, syncs and frees l (NULL is fine). */
void coord_nonce_log_close(coord_nonce_log *l);

#endif
