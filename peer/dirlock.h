/*
 * dirlock: one process at a time writes a peer's directory. Two `run`s on
 * one DIR would lease tasks as one peer, overwrite each other's trainer
 * state and pending upload and have their updates refused as replays; a
 * `keygen --force` or `rotate-key` under a running `run` would change the
 * key it signs with. Every command that writes DIR holds an flock on
 * DIR/peer.lock for its life; the file names the holder (its pid and
 * command) so that the one refused can say who has it. `status` only
 * reads and takes no lock.
 */
#ifndef VOLLEY_PEER_DIRLOCK_H
#define VOLLEY_PEER_DIRLOCK_H

#include "common/common.h"

/* The lock file's name in DIR. */
#define PEER_LOCK_FILE "peer.lock"

/* Takes the lock of dir for command (e.g. "volley-peer run"), which goes
 * into the lock file beside this process's pid. Returns 0 with *fd the
 * open descriptor that holds it, or -1 where dir does not exist (the
 * command then fails on its own, with nothing to guard); or a negative
 * vl_error code, *fd -1: VL_ECONFLICT when another process holds it, with
 * a message naming that process and what to do. The descriptor is closed
 * on exec (a re-executing `run` takes it again) and released by
 * peer_dir_unlock or the process's exit; the caller owns it. */
int peer_dir_lock(const char *dir, const char *command, int *fd, vl_error *err) VL_MUST_CHECK;

/* Releases a lock peer_dir_lock took (fd < 0 is fine). The file stays:
 * removing it would let a third process lock a new file while a second
 * still waits on the old one. */
void peer_dir_unlock(int fd);

#endif
