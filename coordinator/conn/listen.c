/* Binding the listeners ahead of the database (listen.h). libevent's
 * evhttp_bind_socket_with_handle would do the same steps, but its failure
 * carries no reason; here each step's errno becomes the message. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coordinator/conn/listen.h"

/* libevent's own backlog for the sockets it binds. */
#define BACKLOG 128

/* The reason a bind or listen failed, in words an operator can act on. */
static const char *reason(int e, char *buf, size_t cap) {
    switch (e) {
    case EADDRINUSE:
        return "address already in use (another process listens there: a second coordinator? "
               "pick another port)";
    case EACCES: return "permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)";
    case EADDRNOTAVAIL: return "cannot assign address (it is not an address of this machine)";
    default: snprintf(buf, cap, "%s", strerror(e)); return buf;
    }
}

int coord_listen_bind(const char *what, const char *host, int port, int *fd, vl_error *err) {
    *fd = -1;
    const char *who = what ? what : "";
    const char *sep = what ? " for " : "";
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(host, service, &hints, &res);
    if (g != 0)
        return vl_fail(err, VL_EIO, "cannot listen on %s:%d%s%s: cannot resolve the host: %s", host,
                       port, sep, who, gai_strerror(g));
    int s = -1, e = 0;
    const char *step = "socket";
    /* The first address that binds wins, as in libevent. */
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        step = "socket";
        s = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) {
            e = errno;
            continue;
        }
        /* A restarted server binds at once, whatever sockets of its last
         * life linger in TIME_WAIT. */
        int one = 1;
        (void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        step = "bind";
        if (bind(s, a->ai_addr, a->ai_addrlen) == 0) {
            step = "listen";
            if (listen(s, BACKLOG) == 0) break;
        }
        e = errno;
        close(s);
        s = -1;
    }
    freeaddrinfo(res);
    if (s < 0) {
        char buf[128];
        return vl_fail(err, VL_EIO, "cannot listen on %s:%d%s%s: %s%s%s", host, port, sep, who,
                       strcmp(step, "bind") ? step : "", strcmp(step, "bind") ? ": " : "",
                       reason(e, buf, sizeof buf));
    }
    *fd = s;
    return VL_OK;
}

/* The local port of a listening socket (-1 when unknown) and, with addr,
 * its address as text (left as it was when unknown); *v6 for IPv6. */
int coord_listen_bound_addr(int fd, char *addr, size_t cap, int *v6) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) return -1;
    *v6 = ss.ss_family == AF_INET6;
    const void *host = *v6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                           : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
    if (addr) inet_ntop(*v6 ? AF_INET6 : AF_INET, host, addr, (socklen_t)cap);
    return *v6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
               : ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

int coord_bound_port(int fd) {
    int v6 = 0;
    return coord_listen_bound_addr(fd, NULL, 0, &v6);
}
