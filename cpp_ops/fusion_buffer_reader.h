// Reads one FusionBuffer message of transforms/fusion_layout.proto (the
// Plan's balanced-fusion-buffer table) from its serialized bytes: the
// buffer's index, size and shard table, and the variables it packs (for
// error messages).
//
// A decoder of the protobuf wire format for this one message instead of
// protoc-generated code: generated C++ must match the protobuf runtime
// TensorFlow was built with exactly, which the installed protoc need not.
// Unknown fields are skipped, so the schema can grow (proto3 rules).
#ifndef AUTOPAR_FUSION_BUFFER_READER_H_
#define AUTOPAR_FUSION_BUFFER_READER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace autopar_herring {

struct ShardEntry {
  int64_t server = 0;
  int64_t offset = 0;
  int64_t length = 0;
};

struct FusionBufferEntry {
  int64_t index = 0;
  int64_t elements = 0;
  std::vector<ShardEntry> shards;
  std::vector<std::string> variables;  // of its segments, in order
};

namespace wire {

class Reader {
 public:
  Reader(const char* p, size_t n) : p_(reinterpret_cast<const uint8_t*>(p)), end_(p_ + n) {}
  bool done() const { return p_ == end_; }

  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) return false;
      const uint8_t b = *p_++;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }

  // A length-delimited field's bytes.
  bool Bytes(const char** data, size_t* n) {
    uint64_t len;
    if (!Varint(&len) || len > static_cast<uint64_t>(end_ - p_)) return false;
    *data = reinterpret_cast<const char*>(p_);
    *n = static_cast<size_t>(len);
    p_ += len;
    return true;
  }

  bool Skip(uint32_t wire_type) {
    uint64_t v;
    const char* d;
    size_t n;
    switch (wire_type) {
      case 0: return Varint(&v);
      case 1: return Advance(8);
      case 2: return Bytes(&d, &n);
      case 5: return Advance(4);
      default: return false;  // groups (3, 4) are not in this schema
    }
  }

 private:
  bool Advance(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) return false;
    p_ += n;
    return true;
  }
  const uint8_t* p_;
  const uint8_t* end_;
};

// Calls on_field(field number, wire type, reader) for every field of the
// message in [p, p + n); on_field consumes the value (or skips it).
template <typename F>
bool ForEachField(const char* p, size_t n, F on_field) {
  Reader r(p, n);
  while (!r.done()) {
    uint64_t key;
    if (!r.Varint(&key)) return false;
    if (!on_field(static_cast<uint32_t>(key >> 3), static_cast<uint32_t>(key & 7), r)) return false;
  }
  return true;
}

// An int32/int64 varint field (two's complement for negatives).
inline bool IntField(uint32_t wire_type, Reader& r, int64_t* out) {
  uint64_t v;
  if (wire_type != 0 || !r.Varint(&v)) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

}  // namespace wire

// Parses `bytes` (a serialized FusionBuffer) into `out`. False if the bytes
// are not a well-formed FusionBuffer.
inline bool ParseFusionBuffer(const std::string& bytes, FusionBufferEntry* out) {
  *out = FusionBufferEntry();
  return wire::ForEachField(bytes.data(), bytes.size(), [out](uint32_t field, uint32_t type,
                                                               wire::Reader& r) {
    const char* d;
    size_t n;
    switch (field) {
      case 1: return wire::IntField(type, r, &out->index);     // index
      case 2: return wire::IntField(type, r, &out->elements);  // elements
      case 3:                                                  // segments: variable = 1
        if (type != 2 || !r.Bytes(&d, &n)) return false;
        out->variables.emplace_back();
        return wire::ForEachField(d, n, [out](uint32_t f, uint32_t t, wire::Reader& s) {
          const char* v;
          size_t len;
          if (f != 1) return s.Skip(t);
          if (t != 2 || !s.Bytes(&v, &len)) return false;
          out->variables.back().assign(v, len);
          return true;
        });
      case 4: {                                                // shards: server, offset, length
        if (type != 2 || !r.Bytes(&d, &n)) return false;
        ShardEntry shard;
        const bool ok = wire::ForEachField(d, n, [&shard](uint32_t f, uint32_t t, wire::Reader& s) {
          switch (f) {
            case 1: return wire::IntField(t, s, &shard.server);
            case 2: return wire::IntField(t, s, &shard.offset);
            case 3: return wire::IntField(t, s, &shard.length);
            default: return s.Skip(t);
          }
        });
        out->shards.push_back(shard);
        return ok;
      }
      default: return r.Skip(type);
    }
  });
}

}  // namespace autopar_herring

#endif  // AUTOPAR_FUSION_BUFFER_READER_H_
