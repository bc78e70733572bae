// autopar_sumserver: the summation server of autopar's Herring transport.
//
//   autopar_sumserver --port P [--host H] [--timeout-s S] [--parent-pid PID]
//
// Workers connect once (one TCP connection per worker process) and push the
// shards of their fusion buffers to it in segments (herring_wire.h). Each
// connection has a reader thread, which adds every arriving segment into the
// shard's float32 accumulator at once (so summing overlaps with receiving,
// and the adds of different workers' connections run on different cores; a
// copy that arrives before a lower-numbered contributor's waits for it, so
// the sum is the same bits in every run), and a writer thread, which sends
// results back. As soon as the last
// contributor's copy of a segment is in, the segment is averaged and queued
// to every contributor.
//
// Failure: a contributor whose connection closes, or a shard still incomplete
// `--timeout-s` seconds (default: $AUTOPAR_HERRING_TIMEOUT_S, else 60) after
// its last segment arrived, makes the server send
// an ERROR frame naming the missing contributors to those that did push. The
// server exits when its parent process does (the launcher, or ssh on a remote
// host), so it never outlives its job.
//
// SIGTERM is a stop request, as in every process of a job
// (runtime/stopping.py): clusters send it to all of a job's processes at
// once, and the step the chief is in needs this server to finish. The
// first is noted and ends the process kPeerStopS later; the second (the
// launcher's, once the chief has saved) ends it at once.
//
// On start it prints "autopar_sumserver listening on HOST:PORT" (the real
// port when --port 0) and flushes stdout.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "herring_wire.h"

namespace ah = autopar_herring;
using Clock = std::chrono::steady_clock;

namespace {

double g_timeout_s = 60.0;

// One worker connection; outgoing frames go through a queue and a writer
// thread so a reader thread never blocks on a slow receiver.
struct Conn {
  int fd = -1;
  std::string peer;
  std::mutex mu;
  std::condition_variable cv;
  struct Out {
    ah::FrameHeader header;
    std::shared_ptr<std::vector<char>> payload;
  };
  std::deque<Out> queue;
  bool closed = false;

  ~Conn() {
    if (fd >= 0) ::close(fd);
  }

  void send(const ah::FrameHeader& header, std::shared_ptr<std::vector<char>> payload) {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return;
    queue.push_back({header, std::move(payload)});
    cv.notify_one();
  }

  void close() {
    std::lock_guard<std::mutex> lock(mu);
    if (!closed) {
      closed = true;
      ::shutdown(fd, SHUT_RDWR);
    }
    cv.notify_all();
  }
};

// One segment of a shard. Copies are added in contributor order, whatever
// order they arrive in: ((x0 + x1) + x2) + ..., so the result is the same
// bits in every run (float addition is not associative). A copy that
// arrives before its predecessors waits in `parked` until they are in.
struct Segment {
  std::mutex mu;
  uint32_t folded = 0;                     // contributors 0..folded-1 are summed
  std::vector<uint8_t> pushed;             // per contributor: its copy arrived
  std::vector<std::vector<float>> parked;  // per contributor: early copies
};

inline void add_into(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];  // auto-vectorised
}

// The float32 accumulator of one shard of one buffer (one generation).
struct Accum {
  ah::FrameHeader first;  // the header that created it: every push must agree
  std::vector<float> data;
  std::vector<Segment> segments;
  std::mutex mu;  // guards contributors, done, last_activity
  std::vector<std::shared_ptr<Conn>> contributors;
  size_t done = 0;
  Clock::time_point last_activity;
  bool failed = false;
};

using Key = std::tuple<uint64_t, uint64_t, uint64_t>;  // buffer_id, generation, shard_offset
std::mutex g_map_mu;
std::map<Key, std::shared_ptr<Accum>> g_accums;

void send_error(const std::shared_ptr<Conn>& conn, const ah::FrameHeader& about,
                const std::string& message) {
  ah::FrameHeader h = about;
  h.magic = ah::kMagic;
  h.type = ah::kError;
  h.payload_bytes = message.size();
  conn->send(h, std::make_shared<std::vector<char>>(message.begin(), message.end()));
}

std::string describe(const ah::FrameHeader& h) {
  return "buffer " + std::to_string(h.buffer_id) + " (push " + std::to_string(h.generation + 1) +
         "), shard at offset " + std::to_string(h.shard_offset);
}

// Fails an accumulator: every contributor that pushed gets `why` plus the
// list of contributors that did not. Caller holds acc->mu.
void fail_locked(Accum& acc, const std::string& why) {
  if (acc.failed) return;
  acc.failed = true;
  std::string missing;
  for (size_t i = 0; i < acc.contributors.size(); ++i) {
    if (!acc.contributors[i]) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
  }
  std::string message = "summation server: " + describe(acc.first) + ": " + why;
  if (!missing.empty()) message += "; contributors that never pushed it: " + missing;
  for (auto& c : acc.contributors) {
    if (c) send_error(c, acc.first, message);
  }
}

std::string mismatch(const ah::FrameHeader& a, const ah::FrameHeader& b) {
  if (a.num_contributors != b.num_contributors)
    return "num_contributors " + std::to_string(b.num_contributors) + " != " +
           std::to_string(a.num_contributors) + " of an earlier push";
  if (a.shard_len != b.shard_len)
    return "shard length " + std::to_string(b.shard_len) + " != " + std::to_string(a.shard_len);
  if (a.seg_elems != b.seg_elems) return "segment size differs between contributors";
  if (a.wire_dtype != b.wire_dtype)
    return std::string("wire dtype ") + ah::wire_name(b.wire_dtype) + " != " +
           ah::wire_name(a.wire_dtype);
  if (a.average != b.average) return "average flag differs between contributors";
  return "";
}

// Adds one received segment (already decoded to float32) into its shard.
void accumulate(const std::shared_ptr<Conn>& conn, const ah::FrameHeader& h, const float* values) {
  const Key key{h.buffer_id, h.generation, h.shard_offset};
  std::shared_ptr<Accum> acc;
  {
    std::lock_guard<std::mutex> lock(g_map_mu);
    auto it = g_accums.find(key);
    if (it == g_accums.end()) {
      acc = std::make_shared<Accum>();
      acc->first = h;
      acc->data.resize(h.shard_len);
      size_t nseg = (h.shard_len + h.seg_elems - 1) / h.seg_elems;
      acc->segments = std::vector<Segment>(nseg);
      for (auto& s : acc->segments) {
        s.pushed.assign(h.num_contributors, 0);
        s.parked.resize(h.num_contributors);
      }
      acc->contributors.resize(h.num_contributors);
      acc->last_activity = Clock::now();
      g_accums.emplace(key, acc);
    } else {
      acc = it->second;
    }
  }
  {
    std::lock_guard<std::mutex> lock(acc->mu);
    if (acc->failed) return;
    std::string bad = mismatch(acc->first, h);
    if (bad.empty() && h.contributor_index >= h.num_contributors)
      bad = "contributor index " + std::to_string(h.contributor_index) + " >= num_contributors";
    if (bad.empty() && (h.seg_offset % h.seg_elems != 0 || h.seg_offset >= h.shard_len ||
                        h.seg_len != std::min<uint64_t>(h.seg_elems, h.shard_len - h.seg_offset)))
      bad = "segment at " + std::to_string(h.seg_offset) + " has a bad length";
    if (!bad.empty()) {
      send_error(conn, h, "summation server: " + describe(h) + ": " + bad);
      if (h.contributor_index < acc->contributors.size() && !acc->contributors[h.contributor_index])
        acc->contributors[h.contributor_index] = conn;
      fail_locked(*acc, "contributor " + std::to_string(h.contributor_index) + ": " + bad);
      return;
    }
    acc->contributors[h.contributor_index] = conn;
    acc->last_activity = Clock::now();
  }
  Segment& seg = acc->segments[h.seg_offset / h.seg_elems];
  float* dst = acc->data.data() + h.seg_offset;
  const size_t n = h.seg_len;
  bool complete = false;
  {
    std::lock_guard<std::mutex> lock(seg.mu);
    if (seg.pushed[h.contributor_index]) {
      std::lock_guard<std::mutex> alock(acc->mu);
      fail_locked(*acc, "contributor " + std::to_string(h.contributor_index) +
                            " pushed the segment at " + std::to_string(h.seg_offset) + " twice");
      return;
    }
    seg.pushed[h.contributor_index] = 1;
    if (h.contributor_index != seg.folded) {
      seg.parked[h.contributor_index].assign(values, values + n);
    } else {
      if (seg.folded == 0) {
        std::memcpy(dst, values, n * sizeof(float));
      } else {
        add_into(dst, values, n);
      }
      ++seg.folded;
      while (seg.folded < h.num_contributors && !seg.parked[seg.folded].empty()) {
        add_into(dst, seg.parked[seg.folded].data(), n);
        std::vector<float>().swap(seg.parked[seg.folded]);  // free it now
        ++seg.folded;
      }
    }
    complete = seg.folded == h.num_contributors;
  }
  if (!complete) return;

  // Every contributor's copy is in; nobody writes this segment any more.
  if (h.average && h.num_contributors > 1) {
    const float divisor = static_cast<float>(h.num_contributors);
    for (size_t i = 0; i < n; ++i) dst[i] /= divisor;
  }
  auto payload = std::make_shared<std::vector<char>>(n * ah::wire_size(h.wire_dtype));
  ah::encode(dst, n, h.wire_dtype, payload->data());
  ah::FrameHeader out = h;
  out.type = ah::kResult;
  out.contributor_index = 0;
  out.payload_bytes = payload->size();
  std::vector<std::shared_ptr<Conn>> targets;
  bool all_done;
  {
    std::lock_guard<std::mutex> lock(acc->mu);
    if (acc->failed) return;
    targets = acc->contributors;
    all_done = ++acc->done == acc->segments.size();
    acc->last_activity = Clock::now();
  }
  for (auto& c : targets) c->send(out, payload);
  if (all_done) {
    std::lock_guard<std::mutex> lock(g_map_mu);
    auto it = g_accums.find(key);
    if (it != g_accums.end() && it->second == acc) g_accums.erase(it);
  }
}

// A contributor's connection ended: every shard it was part of (or that is
// still waiting for contributors) can no longer complete for it.
void drop_connection(const std::shared_ptr<Conn>& conn, const std::string& why) {
  std::lock_guard<std::mutex> lock(g_map_mu);
  for (auto it = g_accums.begin(); it != g_accums.end();) {
    std::shared_ptr<Accum> acc = it->second;
    std::lock_guard<std::mutex> alock(acc->mu);
    bool involved = false;
    for (auto& c : acc->contributors) involved |= c == conn;
    if (involved) {
      fail_locked(*acc, "the connection of worker " + conn->peer + " ended (" + why + ")");
      it = g_accums.erase(it);
    } else {
      ++it;
    }
  }
}

void writer_loop(std::shared_ptr<Conn> conn) {
  while (true) {
    Conn::Out out;
    {
      std::unique_lock<std::mutex> lock(conn->mu);
      conn->cv.wait(lock, [&] { return conn->closed || !conn->queue.empty(); });
      if (conn->queue.empty()) return;  // closed and drained
      out = std::move(conn->queue.front());
      conn->queue.pop_front();
    }
    if (!ah::send_frame(conn->fd, out.header, out.payload->data(), out.payload->size())) {
      conn->close();
      return;
    }
  }
}

void reader_loop(std::shared_ptr<Conn> conn) {
  std::vector<char> raw;
  std::vector<float> values;
  std::string why = "closed by the worker";
  while (true) {
    ah::FrameHeader h;
    if (!ah::recv_all(conn->fd, &h, sizeof(h))) {
      why = ah::errno_text(errno);
      break;
    }
    if (h.magic != ah::kMagic || h.type != ah::kPush || h.wire_dtype > ah::kBfloat16 ||
        h.seg_elems == 0 || h.num_contributors == 0 ||
        h.payload_bytes != static_cast<uint64_t>(h.seg_len) * ah::wire_size(h.wire_dtype)) {
      why = "malformed frame (not an autopar herring worker?)";
      break;
    }
    raw.resize(h.payload_bytes);
    values.resize(h.seg_len);
    char* target = h.wire_dtype == ah::kFloat32 ? reinterpret_cast<char*>(values.data()) : raw.data();
    if (!ah::recv_all(conn->fd, target, h.payload_bytes)) {
      why = ah::errno_text(errno);
      break;
    }
    if (h.wire_dtype != ah::kFloat32) ah::decode(raw.data(), h.seg_len, h.wire_dtype, values.data());
    accumulate(conn, h, values.data());
  }
  drop_connection(conn, why);
  conn->close();
}

// Shards that stopped making progress: a contributor that never pushed.
void sweeper_loop() {
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(g_map_mu);
    for (auto it = g_accums.begin(); it != g_accums.end();) {
      std::shared_ptr<Accum> acc = it->second;
      std::lock_guard<std::mutex> alock(acc->mu);
      if (std::chrono::duration<double>(now - acc->last_activity).count() > g_timeout_s) {
        char why[96];
        std::snprintf(why, sizeof(why), "incomplete after %.0f s without progress", g_timeout_s);
        fail_locked(*acc, why);
        it = g_accums.erase(it);
      } else {
        ++it;
      }
    }
  }
}

// Exits once the process that started us is gone (reparented).
constexpr int kPeerStopS = 25;      // runtime/stopping.py PEER_STOP_S
std::atomic<int> g_sigterms{0};

void on_sigterm(int) {
  if (g_sigterms.fetch_add(1) >= 1) _exit(0);
}

// Also ends the process kPeerStopS after its first SIGTERM.
void parent_watch_loop(pid_t parent) {
  bool terminating = false;
  Clock::time_point since;
  while (true) {
    if (getppid() != parent) std::_Exit(0);
    if (!terminating && g_sigterms.load() > 0) {
      terminating = true;
      since = Clock::now();
    }
    if (terminating && Clock::now() - since > std::chrono::seconds(kPeerStopS)) std::_Exit(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "autopar_sumserver: %s\nusage: autopar_sumserver --port P [--host H] "
               "[--timeout-s S] [--parent-pid PID]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1";
  long port = -1;
  pid_t parent = getppid();
  // The job's setting (the launcher exports it), unless --timeout-s says otherwise.
  if (const char* env = std::getenv("AUTOPAR_HERRING_TIMEOUT_S"); env && std::atof(env) > 0)
    g_timeout_s = std::atof(env);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
    std::string value = argv[++i];
    char* end = nullptr;
    if (arg == "--host") {
      host = value;
    } else if (arg == "--port") {
      port = std::strtol(value.c_str(), &end, 10);
      if (*end || port < 0 || port > 65535) usage("bad --port");
    } else if (arg == "--timeout-s") {
      g_timeout_s = std::strtod(value.c_str(), &end);
      if (*end || g_timeout_s <= 0) usage("bad --timeout-s");
    } else if (arg == "--parent-pid") {
      parent = static_cast<pid_t>(std::strtol(value.c_str(), &end, 10));
      if (*end) usage("bad --parent-pid");
    } else {
      usage(("unknown option " + arg).c_str());
    }
  }
  if (port < 0) usage("--port is required");
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) return 0;  // the parent died before prctl
  ::signal(SIGPIPE, SIG_IGN);
  struct sigaction term {};
  term.sa_handler = on_sigterm;
  term.sa_flags = SA_RESTART;
  sigemptyset(&term.sa_mask);
  ::sigaction(SIGTERM, &term, nullptr);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    std::fprintf(stderr, "autopar_sumserver: cannot resolve %s: %s\n", host.c_str(), gai_strerror(rc));
    return 1;
  }
  int listener = ::socket(res->ai_family, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ah::bound_receive_window(listener);   // N workers' pushes arrive at once
  if (listener < 0 || ::bind(listener, res->ai_addr, res->ai_addrlen) != 0 ||
      ::listen(listener, 128) != 0) {
    std::fprintf(stderr, "autopar_sumserver: cannot listen on %s:%ld: %s\n", host.c_str(), port,
                 std::strerror(errno));
    return 1;
  }
  ::freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  int real_port = ntohs(bound.ss_family == AF_INET6
                            ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  std::printf("autopar_sumserver listening on %s:%d\n", host.c_str(), real_port);
  std::fflush(stdout);

  std::thread(parent_watch_loop, parent).detach();
  std::thread(sweeper_loop).detach();
  while (true) {
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    int fd = ::accept(listener, reinterpret_cast<sockaddr*>(&peer), &peer_len);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::fprintf(stderr, "autopar_sumserver: accept: %s\n", std::strerror(errno));
      return 1;
    }
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char name[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
    ::getnameinfo(reinterpret_cast<sockaddr*>(&peer), peer_len, name, sizeof(name), serv,
                  sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV);
    auto conn = std::make_shared<Conn>();
    conn->fd = fd;
    conn->peer = std::string(name) + ":" + serv;
    std::thread(writer_loop, conn).detach();
    std::thread(reader_loop, conn).detach();
  }
}
