/*
 * listen: the coordinator's listening sockets, bound before anything
 * touches the database, so that a server that cannot listen changes
 * nothing stored (no merge of waiting updates, no expired leases) and says
 * why it cannot, from the system's own reason.
 *
 * Contents: coord_listen_bind, coord_listen_bound_addr, coord_bound_port.
 */
#ifndef VOLLEY_COORD_LISTEN_H
#define VOLLEY_COORD_LISTEN_H

#include "common/common.h"

/* Binds a TCP socket to host:port (an address or a name; port 0 picks a
 * free one) and listens on it, non-blocking and close-on-exec. what names
 * the listener in a failure ("the admin listener"; NULL for the public
 * one). On success *fd is the caller's (close it, or hand it to libevent,
 * which then closes it). On failure VL_EIO with one line naming the
 * address and the reason: "address already in use", "permission denied",
 * "cannot assign address", or the system's words for others. */
int coord_listen_bind(const char *what, const char *host, int port, int *fd,
                      vl_error *err) VL_MUST_CHECK;

/* The address (into addr, cap bytes, when addr is not NULL) and port a
 * socket is bound to, and in *v6 whether it is IPv6; -1 when unknown. */
int coord_listen_bound_addr(int fd, char *addr, size_t cap, int *v6);
/* The local port a listening socket is bound to; -1 when unknown. */
int coord_bound_port(int fd);

#endif
