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

/* Try the job's addresses for `port` of `family` on fd. Returns the bind
 * result, or -2 when the job has no endpoint on that port at all. */
static int bind_job_address(bind_fn real_bind, int fd, const struct sockaddr *addr,
                            sa_family_t family, unsigned port) {
  const char *spec = getenv("AUTOPAR_BIND");
  int matched_port = 0, saved_errno = EAFNOSUPPORT;
  if (spec == NULL) return -2;
  while (*spec) {
    const char *comma = strchr(spec, ',');
    size_t n = comma ? (size_t)(comma - spec) : strlen(spec);
    char entry[128];
    if (n < sizeof entry) {
      memcpy(entry, spec, n);
      entry[n] = '\0';
      char *slash = strrchr(entry, '/');
      if (slash != NULL) {
        *slash = '\0';
        unsigned long p = strtoul(slash + 1, NULL, 10);
        if (p == port) {
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
      }
    }
    if (comma == NULL) break;
    spec = comma + 1;
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
