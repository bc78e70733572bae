// AutoparHerringPushPull: the worker side of autopar's Herring transport.
//
// An asynchronous kernel: it cuts its 1-D float32 input (one balanced fusion
// buffer) into the shards of its fusion_buffer attr (the buffer's entry of
// the Plan's fusion layout, fusion_buffer_reader.h), pushes every shard to its
// summation server (sum_server.cc) in segments, and completes once every
// segment of every shard came back summed over all contributors. Wire format:
// herring_wire.h.
//
// Server addresses are not attrs (a graph is the same on every worker and
// must not name hosts): they come from AUTOPAR_SUMSERVERS="host:port,..."
// (server index = position), read at first use. The process keeps one TCP
// connection per server, opened at first use and shared by every op; each
// has a sender thread (encodes to the wire dtype and writes, segment by
// segment) and a receiver thread (decodes results into the ops' outputs).
// A connection that fails fails every op waiting on it with an error naming
// the server (INTERNAL: TensorFlow turns an op's UNAVAILABLE into INTERNAL
// anyway, keeping UNAVAILABLE for its own network layer); an op with no result after its timeout fails naming the servers
// that still owe segments. The next op reconnects.
#include <netdb.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fusion_buffer_reader.h"
#include "herring_wire.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace ah = autopar_herring;

namespace tensorflow {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kServersEnv[] = "AUTOPAR_SUMSERVERS";
constexpr char kTimeoutEnv[] = "AUTOPAR_HERRING_TIMEOUT_S";
constexpr double kDefaultTimeoutS = 60.0;

REGISTER_OP("AutoparHerringPushPull")
    .Input("buffer: float")
    .Output("reduced: float")
    .Attr("fusion_buffer: string")
    .Attr("num_contributors: int")
    .Attr("contributor_index: int")
    .Attr("wire_dtype: {'float32', 'float16', 'bfloat16'} = 'float32'")
    .Attr("average: bool = true")
    .Attr("timeout_s: float = 0")
    .Attr("segment_elements: int = 16384")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      c->set_output(0, c->input(0));
      return OkStatus();
    })
    .Doc(R"doc(
Element-wise sum (or mean) of `buffer` over `num_contributors` processes,
through autopar's summation servers (addresses from AUTOPAR_SUMSERVERS).
`fusion_buffer` is the buffer's entry of the Plan's fusion layout, a
serialized autopar.transforms.FusionBuffer (transforms/fusion_layout.proto):
its index (matches the contributions of every process), element count and
shard table (server, offset, length).
)doc");

// A status whose message is the concatenation of `args` (absl::StrCat).
template <typename... Args>
Status MakeError(absl::StatusCode code, const Args&... args) {
  return Status(code, absl::StrCat(args...));
}

// One push/pull in flight.
struct OpState {
  struct Shard {
    int server;
    std::string address;
    int64_t offset;
    int64_t length;
    int64_t remaining;  // elements not yet received
  };
  std::mutex mu;
  bool finished = false;
  OpKernelContext* ctx = nullptr;
  AsyncOpKernel::DoneCallback done;
  float* output = nullptr;
  // References to the input and output buffers, released only with the
  // state itself: the sender reads the input and the receiver writes the
  // output without holding `mu`, possibly after the op failed (the shards
  // are fixed once the op is submitted; `remaining` changes under `mu`).
  Tensor input, result;
  // Undoes the registrations with connections (run when the op fails, so
  // nothing keeps the state and its buffers alive).
  std::vector<std::function<void()>> unregister;
  std::vector<Shard> shards;
  size_t shards_left = 0;
  // Pacing (under `mu`): segments each shard's sender has handed to its
  // socket. A shard's sender runs at most kPaceLagSegments ahead of the
  // slowest of the op's other shards, so every server receives this
  // worker's copy at the same rate and can return its sums while the
  // pushes go on (left to TCP, one flow to a server fell behind, and the
  // server could send its sums only after the last of it arrived).
  std::vector<uint64_t> segments_sent;
  std::condition_variable paced;
  Clock::time_point deadline;
  double timeout_s = 0;
  std::string what;  // "buffer 3 (push 7)"
};

// Completes `op` with `status` unless it already completed. Returns whether
// this call completed it.
bool Finish(const std::shared_ptr<OpState>& op, const Status& status) {
  AsyncOpKernel::DoneCallback done;
  std::vector<std::function<void()>> unregister;
  {
    std::lock_guard<std::mutex> lock(op->mu);
    if (op->finished) return false;
    op->finished = true;
    op->paced.notify_all();
    if (!status.ok()) op->ctx->SetStatus(status);
    done = std::move(op->done);
    unregister.swap(op->unregister);
  }
  for (auto& undo : unregister) undo();
  done();
  return true;
}

using PendingKey = std::tuple<uint64_t, uint64_t, uint64_t>;  // buffer, generation, shard offset

// How far (in segments) one shard's sender may run ahead of the op's others.
constexpr uint64_t kPaceLagSegments = 2;

// A connection to one summation server.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  struct Job {  // one shard of one op to send
    std::shared_ptr<OpState> op;
    ah::FrameHeader header;  // everything but the segment fields
    const float* data;
    size_t shard_index;      // in op->shards
    uint64_t next_offset = 0, next_segment = 0;  // progress (a preempted job resumes there)
  };

  Connection(int index, std::string address, int fd)
      : index_(index), address_(std::move(address)), fd_(fd) {}
  ~Connection() { ::close(fd_); }

  void Start() {
    auto self = shared_from_this();
    std::thread([self] { self->SendLoop(); }).detach();
    std::thread([self] { self->ReceiveLoop(); }).detach();
  }

  const std::string& address() const { return address_; }
  bool dead() {
    std::lock_guard<std::mutex> lock(mu_);
    return dead_;
  }

  // Registers the shard's pending result and queues its segments; false if
  // the connection is already dead.
  bool Submit(Job job) {
    const PendingKey key{job.header.buffer_id, job.header.generation, job.header.shard_offset};
    {
      std::lock_guard<std::mutex> l(job.op->mu);
      if (job.op->finished) return true;  // failed meanwhile (its deadline): nothing to send
      std::weak_ptr<Connection> self = shared_from_this();
      job.op->unregister.push_back([self, key] {
        if (auto conn = self.lock()) conn->Forget(key);
      });
    }
    std::shared_ptr<OpState> preempted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (dead_) return false;
      pending_[key] = job.op;
      const JobKey order = OrderOf(job);
      if (sending_ != nullptr && order < sending_order_) {
        preempt_ = true;
        preempted = sending_;
      }
      jobs_.emplace(order, std::move(job));
      cv_.notify_one();
    }
    if (preempted != nullptr) {
      // Under its lock, so a sender about to wait for its pace sees the flag
      // or gets the notification.
      std::lock_guard<std::mutex> lock(preempted->mu);
      preempted->paced.notify_all();
    }
    return true;
  }

  void Forget(const PendingKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(key);
  }

 private:
  std::string Where() const {
    return "summation server " + address_ + " (server " + std::to_string(index_) + " in " +
           kServersEnv + ")";
  }

  // The connection failed: no op waiting on it can complete.
  void Fail(const std::string& why) {
    std::map<PendingKey, std::shared_ptr<OpState>> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (dead_) return;
      dead_ = true;
      pending.swap(pending_);
      jobs_.clear();
      ::shutdown(fd_, SHUT_RDWR);
      cv_.notify_all();
    }
    for (auto& entry : pending) {
      Finish(entry.second, MakeError(absl::StatusCode::kInternal, "herring push_pull of ", entry.second->what,
                                               ": lost the connection to ", Where(), ": ", why));
    }
  }

  // The order in which a connection sends its jobs, segment by segment: the
  // earliest push first, then the lowest buffer index (the gradients the
  // backward pass produced first). Every worker computes the same key for
  // the same op, so all of them send a server the same buffer at the same
  // time, whatever order their executors ran the ops in: a server returns a
  // segment only when every worker's copy is in, and workers sending it
  // different buffers (several become ready at once when one gradient
  // spans them) left the return direction idle while both pushes went on.
  using JobKey = std::tuple<uint64_t, uint64_t, uint64_t>;  // generation, buffer, shard offset
  static JobKey OrderOf(const Job& job) {
    return {job.header.generation, job.header.buffer_id, job.header.shard_offset};
  }

  void SendLoop() {
    std::vector<char> wire;
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return dead_ || !jobs_.empty(); });
        if (dead_) return;
        auto first = jobs_.begin();
        sending_order_ = first->first;
        job = std::move(first->second);
        jobs_.erase(first);
        sending_ = job.op;
        preempt_ = false;
      }
      ah::FrameHeader h = job.header;
      const size_t esize = ah::wire_size(h.wire_dtype);
      bool preempted = false;
      for (uint64_t off = job.next_offset, segment = job.next_segment; off < h.shard_len;
           off += h.seg_elems, ++segment) {
        {
          std::unique_lock<std::mutex> lock(job.op->mu);
          job.op->paced.wait(lock, [&] {
            return job.op->finished || preempt_ || InPace(*job.op, segment);
          });
          if (job.op->finished) break;  // failed meanwhile: the job is going down
          preempted = preempt_;
        }
        if (preempted) {
          // An op earlier in the order arrived: it goes first, this job
          // resumes at this segment (its op's other shards wait for it,
          // never the other way round, so pacing cannot cycle).
          job.next_offset = off;
          job.next_segment = segment;
          break;
        }
        h.seg_offset = off;
        h.seg_len = static_cast<uint32_t>(std::min<uint64_t>(h.seg_elems, h.shard_len - off));
        h.payload_bytes = static_cast<uint64_t>(h.seg_len) * esize;
        const float* src = job.data + h.shard_offset + off;
        const void* payload = src;
        if (h.wire_dtype != ah::kFloat32) {
          wire.resize(h.payload_bytes);
          ah::encode(src, h.seg_len, h.wire_dtype, wire.data());
          payload = wire.data();
        }
        if (!ah::send_frame(fd_, h, payload, h.payload_bytes)) {
          Fail("sending failed: " + ah::errno_text(errno));
          return;
        }
        std::lock_guard<std::mutex> lock(job.op->mu);
        job.op->segments_sent[job.shard_index] = segment + 1;
        job.op->paced.notify_all();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        sending_ = nullptr;
        if (preempted) {
          if (dead_) return;
          jobs_.emplace(OrderOf(job), std::move(job));
          continue;
        }
      }
      std::lock_guard<std::mutex> lock(job.op->mu);
      job.op->segments_sent[job.shard_index] = ~uint64_t{0};  // done: never waited for
      job.op->paced.notify_all();
    }
  }

  // Whether segment `segment` of a shard may go: every other shard of the
  // op has sent all but kPaceLagSegments of the segments before it (or all
  // of its own). Caller holds op.mu.
  static bool InPace(const OpState& op, uint64_t segment) {
    if (segment < kPaceLagSegments) return true;
    for (uint64_t sent : op.segments_sent) {
      if (sent < segment - kPaceLagSegments) return false;
    }
    return true;
  }

  void ReceiveLoop() {
    std::vector<char> raw;
    while (true) {
      ah::FrameHeader h;
      if (!ah::recv_all(fd_, &h, sizeof(h))) return Fail(ah::errno_text(errno));
      if (h.magic != ah::kMagic || (h.type != ah::kResult && h.type != ah::kError) ||
          h.payload_bytes > (uint64_t{1} << 32)) {
        return Fail("malformed frame from the server");
      }
      const PendingKey key{h.buffer_id, h.generation, h.shard_offset};
      std::shared_ptr<OpState> op;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = pending_.find(key);
        if (it != pending_.end()) {
          op = it->second;
          if (h.type == ah::kError) pending_.erase(it);
        }
      }
      OpState::Shard* shard = nullptr;
      if (op != nullptr && h.type == ah::kResult) {
        for (auto& s : op->shards) {
          if (static_cast<uint64_t>(s.offset) == h.shard_offset && s.server == index_) shard = &s;
        }
        if (shard != nullptr &&
            (h.seg_offset + h.seg_len > static_cast<uint64_t>(shard->length) ||
             h.payload_bytes != static_cast<uint64_t>(h.seg_len) * ah::wire_size(h.wire_dtype))) {
          shard = nullptr;  // cannot happen with a well-behaved server
        }
      }
      // A float32 segment goes straight into the output (segments are
      // disjoint, and op->result keeps the buffer alive); the rest via `raw`.
      float* dst = shard ? op->output + h.shard_offset + h.seg_offset : nullptr;
      char* target = raw.data();
      if (dst != nullptr && h.wire_dtype == ah::kFloat32) {
        target = reinterpret_cast<char*>(dst);
      } else {
        raw.resize(h.payload_bytes);
        target = raw.data();
      }
      if (!ah::recv_all(fd_, target, h.payload_bytes)) return Fail(ah::errno_text(errno));
      if (op == nullptr) continue;  // an op that already failed
      if (h.type == ah::kError) {
        Finish(op, MakeError(absl::StatusCode::kInternal, "herring push_pull of ", op->what, ": ", Where(),
                                    " reported: ", std::string(raw.begin(), raw.end())));
        continue;
      }
      if (shard == nullptr) continue;
      if (h.wire_dtype != ah::kFloat32) ah::decode(raw.data(), h.seg_len, h.wire_dtype, dst);
      bool complete = false, shard_done = false;
      {
        std::lock_guard<std::mutex> lock(op->mu);
        if (op->finished) continue;
        shard->remaining -= h.seg_len;
        if (shard->remaining == 0) {
          shard_done = true;
          complete = --op->shards_left == 0;
        }
      }
      if (shard_done) Forget(key);
      if (complete) Finish(op, OkStatus());
    }
  }

  const int index_;
  const std::string address_;
  const int fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool dead_ = false;
  std::multimap<JobKey, Job> jobs_;  // by OrderOf
  // The job being sent (its op and order; null between jobs) and whether a
  // job earlier in the order has arrived since (read by the sender while it
  // waits for its pace, under its op's lock).
  std::shared_ptr<OpState> sending_;
  JobKey sending_order_{};
  std::atomic<bool> preempt_{false};
  std::map<PendingKey, std::shared_ptr<OpState>> pending_;
};

// Connects to "host:port", retrying refused connections (a server still
// starting) until `deadline`.
int ConnectTo(const std::string& address, Clock::time_point deadline, std::string* error) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos) {
    *error = "not host:port";
    return -1;
  }
  std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (rc != 0) {
      *error = std::string("cannot resolve: ") + gai_strerror(rc);
    } else {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        // Non-blocking connect bounded by the deadline: a host that drops
        // SYNs must not hold the op for the kernel's minutes-long retry.
        int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) continue;
        ah::bound_receive_window(fd);   // S servers' results arrive at once
        ah::bound_send_buffer(fd);      // pacing counts what reached the wire
        int err = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
        if (err == EINPROGRESS) {
          auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
          pollfd pfd{fd, POLLOUT, 0};
          int ready = ::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(left.count(), 1000)));
          socklen_t len = sizeof(err);
          if (ready == 1) {
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          } else {
            err = ETIMEDOUT;
          }
        }
        if (err == 0) {
          ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          ::freeaddrinfo(res);
          return fd;
        }
        *error = std::strerror(err);
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// The process-wide state: server addresses, connections, push counters, and
// the watchdog that fails ops past their deadline.
class Transport {
 public:
  static Transport& Get() {
    static Transport* transport = new Transport();  // never destroyed: threads use it
    return *transport;
  }

  Status Addresses(std::vector<std::string>* out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!loaded_) {
      const char* env = std::getenv(kServersEnv);
      std::string value = env ? env : "";
      size_t start = 0;
      while (start <= value.size() && !value.empty()) {
        size_t comma = value.find(',', start);
        if (comma == std::string::npos) comma = value.size();
        std::string item = value.substr(start, comma - start);
        if (!item.empty()) addresses_.push_back(item);
        start = comma + 1;
      }
      loaded_ = true;
    }
    *out = addresses_;
    return OkStatus();
  }

  std::shared_ptr<Connection> Connect(int index, const std::string& address,
                                      Clock::time_point deadline, Status* status) {
    // One connect at a time per server (not for all: a server still starting
    // must not hold up connecting to the others).
    std::shared_ptr<std::mutex> server_mu;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto& slot = connect_mu_[index];
      if (!slot) slot = std::make_shared<std::mutex>();
      server_mu = slot;
    }
    std::lock_guard<std::mutex> lock(*server_mu);
    bool lost = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = connections_.find(index);
      if (it != connections_.end()) {
        if (!it->second->dead()) return it->second;
        lost = true;
      }
    }
    // A first connection retries while the server may still be starting; a
    // server whose connection was lost gets one attempt, so a dead server
    // fails the op at once instead of after the timeout.
    std::string error;
    int fd = ConnectTo(address, lost ? Clock::now() : deadline, &error);
    if (fd < 0) {
      *status = MakeError(absl::StatusCode::kInternal, "herring push_pull: cannot connect to summation server ",
                                    address, " (server ", index, " in ", kServersEnv, ")",
                                    lost ? " again after losing the connection" : "", ": ", error);
      return nullptr;
    }
    auto conn = std::make_shared<Connection>(index, address, fd);
    conn->Start();
    std::lock_guard<std::mutex> l(mu_);
    connections_[index] = conn;
    return conn;
  }

  uint64_t NextGeneration(int64_t buffer_id) {
    std::lock_guard<std::mutex> lock(mu_);
    return generations_[buffer_id]++;
  }

  void Watch(const std::shared_ptr<OpState>& op) {
    std::lock_guard<std::mutex> lock(mu_);
    watched_.push_back(op);
    if (!watchdog_started_) {
      watchdog_started_ = true;
      std::thread([this] { WatchLoop(); }).detach();
    }
  }

 private:
  void WatchLoop() {
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::vector<std::shared_ptr<OpState>> expired;
      {
        std::lock_guard<std::mutex> lock(mu_);
        const auto now = Clock::now();
        std::vector<std::weak_ptr<OpState>> keep;
        for (auto& weak : watched_) {
          auto op = weak.lock();
          if (!op) continue;
          {
            std::lock_guard<std::mutex> l(op->mu);
            if (op->finished) continue;
          }
          if (now >= op->deadline) {
            expired.push_back(op);
          } else {
            keep.push_back(weak);
          }
        }
        watched_.swap(keep);
      }
      for (auto& op : expired) {
        std::string owing;
        {
          std::lock_guard<std::mutex> l(op->mu);
          for (auto& s : op->shards) {
            if (s.remaining > 0) owing += (owing.empty() ? "" : ", ") + s.address;
          }
        }
        char seconds[32];
        std::snprintf(seconds, sizeof(seconds), "%.0f", op->timeout_s);
        Finish(op, MakeError(absl::StatusCode::kDeadlineExceeded, 
                       "herring push_pull of ", op->what, ": no complete result from summation server(s) ",
                       owing, " after ", seconds, " s (", kTimeoutEnv,
                       "): a stalled server, or a worker that did not push this buffer"));
      }
    }
  }

  std::mutex mu_;
  std::map<int, std::shared_ptr<std::mutex>> connect_mu_;
  bool loaded_ = false;
  bool watchdog_started_ = false;
  std::vector<std::string> addresses_;
  std::map<int, std::shared_ptr<Connection>> connections_;
  std::map<int64_t, uint64_t> generations_;
  std::vector<std::weak_ptr<OpState>> watched_;
};

class HerringPushPullOp : public AsyncOpKernel {
 public:
  explicit HerringPushPullOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    std::string serialized;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fusion_buffer", &serialized));
    ah::FusionBufferEntry entry;
    OP_REQUIRES(ctx, ah::ParseFusionBuffer(serialized, &entry),
                MakeError(absl::StatusCode::kInvalidArgument,
                          "fusion_buffer is not a serialized autopar.transforms.FusionBuffer"));
    buffer_id_ = entry.index;
    for (const auto& shard : entry.shards) {
      servers_.push_back(shard.server);
      offsets_.push_back(shard.offset);
      lengths_.push_back(shard.length);
    }
    variables_ = entry.variables;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_contributors", &num_contributors_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("contributor_index", &contributor_index_));
    std::string wire;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("wire_dtype", &wire));
    wire_ = wire == "float16" ? ah::kFloat16 : wire == "bfloat16" ? ah::kBfloat16 : ah::kFloat32;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("average", &average_));
    float timeout = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_s", &timeout));
    timeout_s_ = timeout;
    if (timeout_s_ <= 0) {
      const char* env = std::getenv(kTimeoutEnv);
      timeout_s_ = env && std::atof(env) > 0 ? std::atof(env) : kDefaultTimeoutS;
    }
    OP_REQUIRES_OK(ctx, ctx->GetAttr("segment_elements", &segment_elements_));
    OP_REQUIRES(ctx, segment_elements_ > 0 && segment_elements_ < (int64_t{1} << 30),
                MakeError(absl::StatusCode::kInvalidArgument, "segment_elements must be in [1, 2^30)"));
    OP_REQUIRES(ctx, !servers_.empty(),
                MakeError(absl::StatusCode::kInvalidArgument, "fusion buffer ", buffer_id_,
                          " has no shards"));
    OP_REQUIRES(ctx, num_contributors_ >= 1 && contributor_index_ >= 0 &&
                         contributor_index_ < num_contributors_,
                MakeError(absl::StatusCode::kInvalidArgument, "contributor_index ", contributor_index_,
                                        " not in [0, num_contributors=", num_contributors_, ")"));
    int64_t next = 0;
    for (size_t i = 0; i < offsets_.size(); ++i) {
      OP_REQUIRES(ctx, offsets_[i] == next && lengths_[i] >= 0 && servers_[i] >= 0,
                  MakeError(absl::StatusCode::kInvalidArgument, "shards must be contiguous from offset 0: shard ", i,
                                          " starts at ", offsets_[i], ", expected ", next));
      next += lengths_[i];
    }
    OP_REQUIRES(ctx, entry.elements == next,
                MakeError(absl::StatusCode::kInvalidArgument, "fusion buffer ", buffer_id_, " has ",
                          entry.elements, " elements but its shards cover ", next));
    total_ = next;
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, input.dims() == 1 && input.dim_size(0) == total_,
                      MakeError(absl::StatusCode::kInvalidArgument, "buffer ", buffer_id_,
                                Packs(), " must be 1-D of length ", total_,
                                " (the fusion layout's), got shape ", input.shape().DebugString()),
                      done);
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, input.shape(), &output), done);
    Transport& transport = Transport::Get();
    std::vector<std::string> addresses;
    OP_REQUIRES_OK_ASYNC(ctx, transport.Addresses(&addresses), done);
    for (int64_t server : servers_) {
      OP_REQUIRES_ASYNC(ctx, server < static_cast<int64_t>(addresses.size()),
                        MakeError(absl::StatusCode::kFailedPrecondition, 
                            "herring push_pull of buffer ", buffer_id_, " uses summation server ",
                            server, " but ", kServersEnv, " names ", addresses.size(),
                            " server(s) (\"", std::getenv(kServersEnv) ? std::getenv(kServersEnv) : "",
                            "\"); autopar's launcher sets it for jobs whose spec has servers"),
                        done);
    }
    const uint64_t generation = transport.NextGeneration(buffer_id_);
    auto op = std::make_shared<OpState>();
    op->ctx = ctx;
    op->done = std::move(done);
    op->output = output->flat<float>().data();
    op->input = input;
    op->result = *output;
    op->timeout_s = timeout_s_;
    op->deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(timeout_s_ * 1e6));
    op->what = "buffer " + std::to_string(buffer_id_) + Packs() + " (push " +
               std::to_string(generation + 1) + ")";
    for (size_t i = 0; i < servers_.size(); ++i) {
      if (lengths_[i] == 0) continue;
      op->shards.push_back({static_cast<int>(servers_[i]), addresses[servers_[i]], offsets_[i],
                            lengths_[i], lengths_[i]});
    }
    op->shards_left = op->shards.size();
    if (op->shards_left == 0) {
      Finish(op, OkStatus());
      return;
    }
    op->segments_sent.assign(op->shards.size(), 0);
    const float* data = input.flat<float>().data();
    std::vector<std::pair<std::shared_ptr<Connection>, Connection::Job>> jobs;
    for (size_t i = 0; i < op->shards.size(); ++i) {
      const OpState::Shard shard = op->shards[i];
      Status status;
      auto conn = transport.Connect(shard.server, shard.address, op->deadline, &status);
      Connection::Job job;
      job.op = op;
      job.data = data;
      job.shard_index = i;
      ah::FrameHeader& h = job.header;
      std::memset(&h, 0, sizeof(h));
      h.magic = ah::kMagic;
      h.type = ah::kPush;
      h.wire_dtype = wire_;
      h.average = average_ ? 1 : 0;
      h.num_contributors = static_cast<uint32_t>(num_contributors_);
      h.contributor_index = static_cast<uint32_t>(contributor_index_);
      h.seg_elems = static_cast<uint32_t>(segment_elements_);
      h.buffer_id = static_cast<uint64_t>(buffer_id_);
      h.generation = generation;
      h.shard_offset = static_cast<uint64_t>(shard.offset);
      h.shard_len = static_cast<uint64_t>(shard.length);
      if (conn == nullptr) {
        Finish(op, status);
        return;
      }
      jobs.emplace_back(std::move(conn), std::move(job));
    }
    {
      // An op's shards are queued on their connections together, and every
      // connection sends in one order (Connection::OrderOf): a paced shard
      // waits only for shards of its own op, which no job later in that
      // order holds up.
      static std::mutex submit_order;
      std::lock_guard<std::mutex> lock(submit_order);
      for (auto& [conn, job] : jobs) {
        if (!conn->Submit(std::move(job))) {
          Finish(op, MakeError(absl::StatusCode::kInternal, "herring push_pull of ", op->what,
                               ": lost the connection to summation server ", conn->address()));
          return;
        }
      }
    }
    // Watched from here: connecting above is bounded by the same deadline
    // and reports its own error (which server could not be reached).
    transport.Watch(op);
  }

 private:
  // " [a, b, +3 more]": the variables this buffer packs, for error messages.
  std::string Packs() const {
    if (variables_.empty()) return "";
    std::string out = " [";
    for (size_t i = 0; i < variables_.size() && i < 2; ++i) {
      absl::StrAppend(&out, i ? ", " : "", variables_[i]);
    }
    if (variables_.size() > 2) absl::StrAppend(&out, ", +", variables_.size() - 2, " more");
    return out + "]";
  }

  int64_t buffer_id_ = 0;
  std::vector<int64_t> servers_, offsets_, lengths_;
  std::vector<std::string> variables_;
  int64_t num_contributors_ = 1, contributor_index_ = 0, segment_elements_ = 0;
  uint8_t wire_ = ah::kFloat32;
  bool average_ = true;
  double timeout_s_ = kDefaultTimeoutS;
  int64_t total_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("AutoparHerringPushPull").Device(DEVICE_CPU), HerringPushPullOp);

}  // namespace
}  // namespace tensorflow
