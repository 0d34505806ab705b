/* fray's socket guard: a process that preloads it (LD_PRELOAD) accepts Unix-socket connections only from
 * processes of its own user.
 *
 * Monarch 0.7 serves every process's mailbox, and its host's, on *abstract* Unix sockets (random names, listed
 * in /proc/net/unix) that Linux does not protect by permissions: any local user could connect and send messages
 * that run code. Monarch offers no setting for it, so the check sits under it: accept() and accept4() return
 * only connections whose peer (SO_PEERCRED, set by the kernel at connect) has this process's effective uid.
 * Others are closed at once and the call accepts the next one, so a non-blocking listener sees EAGAIN, as if
 * nothing had come, and its server never learns of the refused peer.
 *
 * The other way round: an abstract name is free again once its process dies, and another user could bind it to
 * receive what this user's processes still send there. So connect() to an abstract Unix stream socket that
 * succeeds is checked as well: a listener of another user (root excepted) is cut off (shutdown) before anything
 * is sent, and the call fails with ECONNREFUSED. TCP and other families pass untouched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

/* Looked up by fray (dlsym in the running process) to tell whether the guard is loaded. */
int fray_socket_guard_version = 2;

typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);
typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

static int refusals_reported;

/* 1 if `conn` is a Unix-socket connection whose peer is not this user (or cannot be told). */
static int foreign_peer(int conn) {
    struct sockaddr_storage own;
    socklen_t len = sizeof own;
    if (getsockname(conn, (struct sockaddr *)&own, &len) != 0 || own.ss_family != AF_UNIX)
        return 0;
    struct ucred peer;
    socklen_t peer_len = sizeof peer;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0 || peer_len != sizeof peer)
        return 1;
    return peer.uid != geteuid();
}

static void report_connect(const struct ucred *peer) {
    if (refusals_reported >= 10)
        return;
    refusals_reported++;
    char line[200];
    int n = snprintf(line, sizeof line,
                     "fray socket guard: process %d refused to connect to an abstract Unix socket held by uid %d "
                     "(pid %d): only this user's processes may serve this user's\n",
                     (int)getpid(), (int)peer->uid, (int)peer->pid);
    if (n > 0)
        (void)!write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static void report(int conn) {
    if (refusals_reported >= 10) /* an attacker's flood must not flood the log too */
        return;
    refusals_reported++;
    struct ucred peer = {0, 0, 0};
    socklen_t peer_len = sizeof peer;
    getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len);
    char line[200];
    int n = snprintf(line, sizeof line,
                     "fray socket guard: refused a Unix-socket connection to process %d from uid %d (pid %d): "
                     "only this user's processes may connect\n",
                     (int)getpid(), (int)peer.uid, (int)peer.pid);
    if (n > 0)
        (void)!write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

int accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags) {
    static accept4_fn real;
    if (!real)
        real = (accept4_fn)dlsym(RTLD_NEXT, "accept4");
    socklen_t room = addrlen ? *addrlen : 0;
    for (;;) {
        int conn = real(fd, addr, addrlen, flags);
        if (conn < 0 || !foreign_peer(conn))
            return conn;
        report(conn);
        close(conn);
        if (addrlen)
            *addrlen = room;
    }
}

int accept(int fd, struct sockaddr *addr, socklen_t *addrlen) {
    static accept_fn real;
    if (!real)
        real = (accept_fn)dlsym(RTLD_NEXT, "accept");
    socklen_t room = addrlen ? *addrlen : 0;
    for (;;) {
        int conn = real(fd, addr, addrlen);
        if (conn < 0 || !foreign_peer(conn))
            return conn;
        report(conn);
        close(conn);
        if (addrlen)
            *addrlen = room;
    }
}

/* 1 if `addr` names an abstract Unix socket (a name that is free again once its process dies). */
static int abstract_name(const struct sockaddr *addr, socklen_t len) {
    return addr && len > offsetof(struct sockaddr_un, sun_path) && addr->sa_family == AF_UNIX &&
           ((const struct sockaddr_un *)addr)->sun_path[0] == '\0';
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static connect_fn real;
    if (!real)
        real = (connect_fn)dlsym(RTLD_NEXT, "connect");
    int done = real(fd, addr, len);
    if (done != 0 || !abstract_name(addr, len))
        return done;
    int type = 0;
    socklen_t type_len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 || (type != SOCK_STREAM && type != SOCK_SEQPACKET))
        return done;
    struct ucred peer = {0, (uid_t)-1, (gid_t)-1}; /* not told: refused */
    socklen_t peer_len = sizeof peer;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) == 0 && peer_len == sizeof peer &&
        (peer.uid == geteuid() || peer.uid == 0))
        return done;
    report_connect(&peer);
    shutdown(fd, SHUT_RDWR);
    errno = ECONNREFUSED;
    return -1;
}
