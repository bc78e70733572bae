// Wire format and helpers shared by the push/pull kernel (herring_ops.cc) and
// the summation server (sum_server.cc). Plain C++17, no TensorFlow.
//
// One TCP connection per (worker process, server). Both directions carry
// frames: a fixed 72-byte header, then `payload_bytes` bytes. Integers are in
// the host's byte order (every supported host is x86-64, little-endian).
//
//   PUSH   worker -> server: one segment of one shard of one buffer, in the
//          wire dtype. The server adds it into the shard's float32 accumulator.
//   RESULT server -> worker: the same segment, summed over all contributors
//          (divided by their number if `average`), in the wire dtype.
//   ERROR  server -> worker: payload is a UTF-8 message about the buffer/shard
//          named in the header (mismatched headers, a contributor that left or
//          never came).
//
// A shard is identified by (buffer_id, generation, shard_offset): generation
// counts the pushes of one buffer_id by one worker process, so every worker's
// n-th push of a buffer meets the others' n-th push.
#ifndef AUTOPAR_HERRING_WIRE_H_
#define AUTOPAR_HERRING_WIRE_H_

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace autopar_herring {

constexpr uint32_t kMagic = 0x31475248;  // "HRG1"
constexpr uint16_t kPush = 1;
constexpr uint16_t kResult = 2;
constexpr uint16_t kError = 3;

enum WireDtype : uint8_t { kFloat32 = 0, kFloat16 = 1, kBfloat16 = 2 };

inline size_t wire_size(uint8_t dtype) { return dtype == kFloat32 ? 4 : 2; }

inline const char* wire_name(uint8_t dtype) {
  switch (dtype) {
    case kFloat32: return "float32";
    case kFloat16: return "float16";
    case kBfloat16: return "bfloat16";
  }
  return "?";
}

struct FrameHeader {
  uint32_t magic;
  uint16_t type;
  uint8_t wire_dtype;
  uint8_t average;
  uint32_t num_contributors;
  uint32_t contributor_index;
  uint32_t seg_len;        // elements in this frame's segment
  uint32_t seg_elems;      // nominal segment size (all but a shard's last)
  uint64_t buffer_id;
  uint64_t generation;
  uint64_t shard_offset;   // elements, within the buffer
  uint64_t shard_len;      // elements
  uint64_t seg_offset;     // elements, within the shard
  uint64_t payload_bytes;
};
static_assert(sizeof(FrameHeader) == 72, "wire header must be 72 bytes, no padding");

// ---------------------------------------------------------------------------
// float32 <-> float16 / bfloat16, round to nearest even (as numpy does).
// ---------------------------------------------------------------------------

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t f32_to_f16(float value) {
  uint32_t x = f32_bits(value);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {                       // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {                        // subnormal half (or zero)
    // value * 2^24 rounded to an integer, nearest even: the float adder does it.
    float scaled = bits_f32(abs) + 0.5f;          // 0.5 = 2^-1: aligns the ulp 2^-24 to 1
    uint32_t m = f32_bits(scaled) - f32_bits(0.5f);
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;                  // rebias exponent (-112 << 23) and round
  return static_cast<uint16_t>(sign | (abs >> 13));
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {                                 // zero or subnormal: mant * 2^-24
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t f32_to_bf16(float value) {
  uint32_t x = f32_bits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float bf16_to_f32(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

#if defined(__x86_64__)
// The same conversions with the F16C instructions (8 values at a time, round
// to nearest even like the scalar code), used where the CPU has them; the
// binaries themselves target baseline x86-64. AUTOPAR_HERRING_NO_F16C=1
// forces the scalar code (the tests cover both).
inline bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx") &&
                          std::getenv("AUTOPAR_HERRING_NO_F16C") == nullptr;
  return yes;
}

__attribute__((target("avx,f16c"))) inline void encode_f16c(const float* in, size_t n,
                                                            uint16_t* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = f32_to_f16(in[i]);
}

__attribute__((target("avx,f16c"))) inline void decode_f16c(const uint16_t* in, size_t n,
                                                            float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = f16_to_f32(in[i]);
}
#endif

// `n` float32 values into the wire representation at `out`.
inline void encode(const float* in, size_t n, uint8_t dtype, void* out) {
  if (dtype == kFloat32) {
    std::memcpy(out, in, n * 4);
  } else if (dtype == kFloat16) {
    uint16_t* o = static_cast<uint16_t*>(out);
#if defined(__x86_64__)
    if (has_f16c()) return encode_f16c(in, n, o);
#endif
    for (size_t i = 0; i < n; ++i) o[i] = f32_to_f16(in[i]);
  } else {
    uint16_t* o = static_cast<uint16_t*>(out);
    for (size_t i = 0; i < n; ++i) o[i] = f32_to_bf16(in[i]);
  }
}

// `n` wire values at `in` into float32 at `out`.
inline void decode(const void* in, size_t n, uint8_t dtype, float* out) {
  if (dtype == kFloat32) {
    std::memcpy(out, in, n * 4);
  } else if (dtype == kFloat16) {
    const uint16_t* i16 = static_cast<const uint16_t*>(in);
#if defined(__x86_64__)
    if (has_f16c()) return decode_f16c(i16, n, out);
#endif
    for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(i16[i]);
  } else {
    const uint16_t* i16 = static_cast<const uint16_t*>(in);
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(i16[i]);
  }
}

// ---------------------------------------------------------------------------
// Blocking socket I/O. Both return false on EOF or error (errno set; 0 on EOF).
// MSG_NOSIGNAL: a peer that died gives EPIPE, never SIGPIPE.
// ---------------------------------------------------------------------------

inline bool recv_all(int fd, void* data, size_t len) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t got = ::recv(fd, p, len, 0);
    if (got == 0) { errno = 0; return false; }
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += got;
    len -= static_cast<size_t>(got);
  }
  return true;
}

// Header and payload in one sendmsg where possible.
inline bool send_frame(int fd, const FrameHeader& header, const void* payload, size_t len) {
  iovec iov[2];
  iov[0].iov_base = const_cast<FrameHeader*>(&header);
  iov[0].iov_len = sizeof(header);
  iov[1].iov_base = const_cast<void*>(payload);
  iov[1].iov_len = len;
  int first = 0;
  while (first < 2) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = 2 - first;
    ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(sent);
    while (first < 2 && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (first < 2) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return true;
}

// Incast. A summation server receives every worker's push at once, and a
// worker every server's results: N flows into one link, whose switch-side
// queue overflows when their windows together exceed it (the bench's
// emulated links queue 1000 frames, 1.5 MB; shallow real switches less).
// Each receiver therefore grants a sender a bounded window of bytes in
// flight (its TCP receive window, set before the connection exists so that
// the window scale matches), and a worker's send buffer is bounded the same.
//
// What stays in flight beyond the link's bandwidth-delay product only waits
// in a queue, and a result waits behind it: a server returns a segment after
// every worker's copy arrived, so the queues on a push's way and on its
// result's way delay the result stream by their depth (at 25 Mbit/s, eight
// 128 KiB windows queue for 0.34 s per link). The launcher therefore sets
// the window from the spec's link speed and the number of flows sharing a
// link (runtime/flow_windows.py); without it (link speed
// unknown) each flow gets kFlowWindowBytes: 8 of them fit a 1000-frame
// queue, and one covers a 1 Gbit/s link's bandwidth-delay product many times.
constexpr int kFlowWindowBytes = 128 << 10;
constexpr const char* kFlowWindowEnv = "AUTOPAR_HERRING_WINDOW_BYTES";

// $AUTOPAR_HERRING_WINDOW_BYTES if it is a number in [4 KiB, 64 MiB], else
// kFlowWindowBytes.
inline int flow_window_bytes() {
  const char* env = std::getenv(kFlowWindowEnv);
  if (env == nullptr || *env == 0) return kFlowWindowBytes;
  char* end = nullptr;
  long value = std::strtol(env, &end, 10);
  if (*end != 0 || value < (4 << 10) || value > (64 << 20)) return kFlowWindowBytes;
  return static_cast<int>(value);
}

// Before connect() or listen() (accepted sockets inherit it).
inline void bound_receive_window(int fd) {
  int bytes = flow_window_bytes();
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

// A worker's pushes are paced per segment handed to the socket
// (herring_ops.cc, kPaceLagSegments): with the kernel's default send buffer
// (megabytes) a handed-over segment may still be far from the wire, so the
// worker's sockets keep at most a flow window of unsent bytes.
inline void bound_send_buffer(int fd) {
  int bytes = flow_window_bytes();
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

inline std::string errno_text(int err) {
  return err == 0 ? std::string("connection closed by peer") : std::string(std::strerror(err));
}

}  // namespace autopar_herring

#endif  // AUTOPAR_HERRING_WIRE_H_
