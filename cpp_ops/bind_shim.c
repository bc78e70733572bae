/* Bind shim: loaded with LD_PRELOAD into the worker and server processes the
 * autopar launcher starts, so that TensorFlow's gRPC servers, which always
 * listen on the wildcard address ("0.0.0.0:" + port in GrpcServer::Init,
 * tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc; no option
 * changes it), listen only on their host's address from the resource spec.
 *
 *   AUTOPAR_BIND="ADDR/PORT,ADDR/PORT,..."   every endpoint of the job
 *
 * A bind() to the wildcard address (0.0.0.0 or ::) on a port of the job is
 * rewritten to that port's address. When several hosts of the job use the
 * same port, each of their addresses is tried in turn: only this host's own
 * one can be bound (the others fail with EADDRNOTAVAIL). A wildcard bind of
 * the other address family (gRPC first tries a dual-stack [::] socket) fails
 * with EAFNOSUPPORT, and gRPC then binds the family of the spec address.
 * Every other bind() is passed through unchanged.
 *
 * Receive windows of TensorFlow's connections between a job's processes:
 *
 *   AUTOPAR_TCP_WINDOW_BYTES="BYTES"
 *   AUTOPAR_TCP_WINDOW_PEERS="ADDR/PORT,ADDR/PORT,..."
 *
 * TensorFlow's gRPC moves a tensor on a connection its receiver opened (the
 * receiver asks the sender: RecvTensor, a collective's RecvBuf): a worker's
 * pull of variables on the connection it opened to the server, a server's
 * take of a worker's pushed gradient on the one it opened to the worker, a
 * ring step on the one a worker opened to its neighbour. A connect() to one
 * of the listed endpoints (a worker lists the workers and the servers, a
 * server the workers) gets SO_RCVBUF = BYTES first: the receiver grants each
 * sender at most a window, so S servers answering one worker's pull at once
 * (or N workers' pushes into one server) queue at most S (N) windows at its
 * link instead of what autotuned windows let in (megabytes each; at
 * 25 Mbit/s a 1000-frame queue is 0.5 s deep, past the retransmission
 * timer). The launcher chooses BYTES (runtime/flow_windows.py);
 * unset, every connect() is passed through.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

/* The next entry of an "ADDR/PORT,ADDR/PORT,..." list: its address text into
 * `entry` and its port into `*port` (0 for an entry that is not ADDR/PORT or
 * too long: no job has port 0); advances `*spec`. Returns 0 at the end. */
static int next_endpoint(const char **spec, char entry[128], unsigned long *port) {
  if (*spec == NULL || **spec == '\0') return 0;
  const char *comma = strchr(*spec, ',');
  size_t n = comma ? (size_t)(comma - *spec) : strlen(*spec);
  char *slash = NULL;
  *port = 0;
  entry[0] = '\0';
  if (n < 128) {
    memcpy(entry, *spec, n);
    entry[n] = '\0';
    slash = strrchr(entry, '/');
  }
  if (slash != NULL) {
    *slash = '\0';
    *port = strtoul(slash + 1, NULL, 10);
  }
  *spec = comma ? comma + 1 : *spec + n;
  return 1;
}

/* Try the job's addresses for `port` of `family` on fd. Returns the bind
 * result, or -2 when the job has no endpoint on that port at all. */
static int bind_job_address(bind_fn real_bind, int fd, const struct sockaddr *addr,
                            sa_family_t family, unsigned port) {
  const char *spec = getenv("AUTOPAR_BIND");
  int matched_port = 0, saved_errno = EAFNOSUPPORT;
  char entry[128];
  unsigned long p;
  if (spec == NULL) return -2;
  while (next_endpoint(&spec, entry, &p)) {
    if (p != port) continue;
    struct in_addr a4;
    struct in6_addr a6;
    matched_port = 1;
    if (family == AF_INET && inet_pton(AF_INET, entry, &a4) == 1) {
      struct sockaddr_in copy = *(const struct sockaddr_in *)addr;
      copy.sin_addr = a4;
      if (real_bind(fd, (const struct sockaddr *)&copy, sizeof copy) == 0) return 0;
      saved_errno = errno;
    } else if (family == AF_INET6 && inet_pton(AF_INET6, entry, &a6) == 1) {
      struct sockaddr_in6 copy = *(const struct sockaddr_in6 *)addr;
      copy.sin6_addr = a6;
      if (real_bind(fd, (const struct sockaddr *)&copy, sizeof copy) == 0) return 0;
      saved_errno = errno;
    }
  }
  if (!matched_port) return -2;
  errno = saved_errno;
  return -1;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  static bind_fn real_bind = NULL;
  if (real_bind == NULL) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  if (real_bind == NULL) {
    errno = ENOSYS;
    return -1;
  }
  if (addr == NULL) return real_bind(fd, addr, len);

  if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
    if (in->sin_addr.s_addr == htonl(INADDR_ANY)) {
      int r = bind_job_address(real_bind, fd, addr, AF_INET, ntohs(in->sin_port));
      if (r != -2) return r;
    }
  } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
    if (memcmp(&in6->sin6_addr, &in6addr_any, sizeof in6addr_any) == 0) {
      int r = bind_job_address(real_bind, fd, addr, AF_INET6, ntohs(in6->sin6_port));
      if (r != -2) return r;
    }
  }
  return real_bind(fd, addr, len);
}

/* Whether `spec` ("ADDR/PORT,...") lists the endpoint `addr` (AF_INET or
 * AF_INET6). */
static int endpoint_listed(const char *spec, const struct sockaddr *addr) {
  char entry[128];
  unsigned long p;
  while (next_endpoint(&spec, entry, &p)) {
    struct in_addr a4;
    struct in6_addr a6;
    if (addr->sa_family == AF_INET && inet_pton(AF_INET, entry, &a4) == 1) {
      const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
      if (ntohs(in->sin_port) == p && in->sin_addr.s_addr == a4.s_addr) return 1;
    } else if (addr->sa_family == AF_INET6) {
      /* gRPC connects dual-stack sockets: an IPv4 endpoint as ::ffff:a.b.c.d */
      const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
      int same = 0;
      if (inet_pton(AF_INET6, entry, &a6) == 1)
        same = memcmp(&in6->sin6_addr, &a6, sizeof a6) == 0;
      else if (inet_pton(AF_INET, entry, &a4) == 1 && IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
        same = memcmp(in6->sin6_addr.s6_addr + 12, &a4, 4) == 0;
      if (same && ntohs(in6->sin6_port) == p) return 1;
    }
  }
  return 0;
}

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
  static connect_fn real_connect = NULL;
  if (real_connect == NULL) real_connect = (connect_fn)dlsym(RTLD_NEXT, "connect");
  if (real_connect == NULL) {
    errno = ENOSYS;
    return -1;
  }
  const char *bytes = getenv("AUTOPAR_TCP_WINDOW_BYTES");
  if (bytes != NULL && *bytes && addr != NULL &&
      ((addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) ||
       (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6))) &&
      endpoint_listed(getenv("AUTOPAR_TCP_WINDOW_PEERS"), addr)) {
    char *end = NULL;
    long value = strtol(bytes, &end, 10);
    int type = 0;
    socklen_t type_len = sizeof type;
    if (*end == '\0' && value >= 4096 && value <= (64L << 20) &&
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) == 0 && type == SOCK_STREAM) {
      int window = (int)value;
      int saved = errno;
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &window, sizeof window);
      errno = saved;   /* the caller sees connect()'s own errno only */
    }
  }
  return real_connect(fd, addr, len);
}
