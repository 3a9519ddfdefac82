// Structure-aware mutation for the harnesses whose input is protobuf (the
// Generate request, the worker's plans). libFuzzer's byte mutations rarely
// turn a varint into a negative or huge value without breaking the message,
// and such values are exactly what a hostile client sends; so, most of the
// time, the input is parsed, one field is changed through reflection to a
// boundary value (or nudged, or an element added, dropped or duplicated, or
// a string's bytes changed) and the message is written back.
#ifndef CHUNKATTN_TESTS_FUZZ_PROTO_MUTATOR_H_
#define CHUNKATTN_TESTS_FUZZ_PROTO_MUTATOR_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/message.h"
#include "google/protobuf/reflection.h"

// libFuzzer's own mutation, the fallback of the custom mutators.
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace chunkattn::fuzz {

namespace proto_mutator_internal {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// One place a mutation can land: a field of a message (index < 0: the
// field as a whole, for adding an element or setting a singular value).
struct Slot {
  Message* message;
  const FieldDescriptor* field;
  int index;
};

inline void CollectSlots(Message* m, int depth, std::vector<Slot>* out) {
  const auto* d = m->GetDescriptor();
  const Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      out->push_back({m, f, -1});
      const int n = r->FieldSize(*m, f);
      for (int k = 0; k < n; ++k) {
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          if (depth < 4) CollectSlots(r->MutableRepeatedMessage(m, f, k), depth + 1, out);
        } else {
          out->push_back({m, f, k});
        }
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      // Set or cleared as a whole; entered only when present (entering
      // would set it, and switch a oneof).
      out->push_back({m, f, -1});
      if (depth < 4 && r->HasField(*m, f)) CollectSlots(r->MutableMessage(m, f), depth + 1, out);
    } else {
      out->push_back({m, f, -1});
    }
  }
}

inline int64_t Boundary(std::mt19937_64& rng, int64_t current) {
  const int64_t values[] = {-5,
                            -4,
                            -1,
                            0,
                            1,
                            2,
                            15,
                            16,
                            17,
                            95,
                            96,
                            97,
                            511,
                            512,
                            513,
                            1 << 20,
                            1 << 30,
                            std::numeric_limits<int32_t>::max(),
                            std::numeric_limits<int32_t>::min(),
                            std::numeric_limits<uint32_t>::max(),
                            std::numeric_limits<int64_t>::max(),
                            std::numeric_limits<int64_t>::min()};
  if (rng() % 3 == 0) return static_cast<int64_t>(static_cast<uint64_t>(current) + rng() % 5 - 2);  // wraps
  return values[rng() % (sizeof(values) / sizeof(values[0]))];
}

inline double BoundaryReal(std::mt19937_64& rng, double current) {
  const double values[] = {0.0,  -0.0,   1e-38, -1e-38, 1e-45,  1.0,    -1.0,   0.5,
                           2.0,  1e30,   3e38,  -3e38,  1e300,  1e-300, std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN()};
  if (rng() % 4 == 0) return current * (1.0 + (static_cast<double>(rng() % 200) - 100.0) / 100.0);
  return values[rng() % (sizeof(values) / sizeof(values[0]))];
}

inline std::string MutateString(std::mt19937_64& rng, std::string s) {
  const char* const pieces[] = {"\xff", "\xc3", "\xe2\x82", "\xf0\x9f\x91\x8b", "\n", "\0", "hello", "\xe2\x96\x81"};
  switch (rng() % 4) {
    case 0:
      return std::string();
    case 1:
      s.insert(rng() % (s.size() + 1), pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))]);
      return s;
    case 2:
      if (!s.empty()) s.resize(rng() % s.size());
      return s;
    default:
      return s + std::string(static_cast<size_t>(1) << (rng() % 12), static_cast<char>('a' + rng() % 26));
  }
}

// Sets one value (a singular field, or element `index` of a repeated one).
inline void SetValue(const Slot& s, std::mt19937_64& rng) {
  Message* m = s.message;
  const FieldDescriptor* f = s.field;
  const Reflection* r = m->GetReflection();
  const bool rep = s.index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      const int32_t v = static_cast<int32_t>(
          Boundary(rng, rep ? r->GetRepeatedInt32(*m, f, s.index) : r->GetInt32(*m, f)));
      rep ? r->SetRepeatedInt32(m, f, s.index, v) : r->SetInt32(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      const int64_t v = Boundary(rng, rep ? r->GetRepeatedInt64(*m, f, s.index) : r->GetInt64(*m, f));
      rep ? r->SetRepeatedInt64(m, f, s.index, v) : r->SetInt64(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      const uint32_t v = static_cast<uint32_t>(
          Boundary(rng, rep ? r->GetRepeatedUInt32(*m, f, s.index) : r->GetUInt32(*m, f)));
      rep ? r->SetRepeatedUInt32(m, f, s.index, v) : r->SetUInt32(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      const uint64_t v = static_cast<uint64_t>(Boundary(
          rng, static_cast<int64_t>(rep ? r->GetRepeatedUInt64(*m, f, s.index) : r->GetUInt64(*m, f))));
      rep ? r->SetRepeatedUInt64(m, f, s.index, v) : r->SetUInt64(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const float v = static_cast<float>(
          BoundaryReal(rng, rep ? r->GetRepeatedFloat(*m, f, s.index) : r->GetFloat(*m, f)));
      rep ? r->SetRepeatedFloat(m, f, s.index, v) : r->SetFloat(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      const double v = BoundaryReal(rng, rep ? r->GetRepeatedDouble(*m, f, s.index) : r->GetDouble(*m, f));
      rep ? r->SetRepeatedDouble(m, f, s.index, v) : r->SetDouble(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      const bool v = !(rep ? r->GetRepeatedBool(*m, f, s.index) : r->GetBool(*m, f));
      rep ? r->SetRepeatedBool(m, f, s.index, v) : r->SetBool(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int v = static_cast<int>(Boundary(rng, 0)) % 8;
      rep ? r->SetRepeatedEnumValue(m, f, s.index, v) : r->SetEnumValue(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string v = MutateString(rng, rep ? r->GetRepeatedString(*m, f, s.index) : r->GetString(*m, f));
      rep ? r->SetRepeatedString(m, f, s.index, std::move(v)) : r->SetString(m, f, std::move(v));
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      if (r->HasField(*m, f)) {
        r->ClearField(m, f);
      } else {
        r->MutableMessage(m, f);
      }
      break;
  }
}

// Adds, drops or duplicates an element of a repeated field.
inline void Resize(const Slot& s, std::mt19937_64& rng) {
  Message* m = s.message;
  const FieldDescriptor* f = s.field;
  const Reflection* r = m->GetReflection();
  const int n = r->FieldSize(*m, f);
  if (n > 0 && rng() % 2 == 0) {
    r->SwapElements(m, f, static_cast<int>(rng() % n), n - 1);
    r->RemoveLast(m, f);
    return;
  }
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    Message* added = r->AddMessage(m, f);
    if (n > 0) added->CopyFrom(r->GetRepeatedMessage(*m, f, static_cast<int>(rng() % n)));
    return;
  }
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: r->AddInt32(m, f, n > 0 ? r->GetRepeatedInt32(*m, f, n - 1) : 0); break;
    case FieldDescriptor::CPPTYPE_INT64: r->AddInt64(m, f, n > 0 ? r->GetRepeatedInt64(*m, f, n - 1) : 0); break;
    case FieldDescriptor::CPPTYPE_UINT32: r->AddUInt32(m, f, n > 0 ? r->GetRepeatedUInt32(*m, f, n - 1) : 0); break;
    case FieldDescriptor::CPPTYPE_UINT64: r->AddUInt64(m, f, n > 0 ? r->GetRepeatedUInt64(*m, f, n - 1) : 0); break;
    case FieldDescriptor::CPPTYPE_FLOAT: r->AddFloat(m, f, 1.0f); break;
    case FieldDescriptor::CPPTYPE_DOUBLE: r->AddDouble(m, f, 1.0); break;
    case FieldDescriptor::CPPTYPE_BOOL: r->AddBool(m, f, true); break;
    case FieldDescriptor::CPPTYPE_ENUM: r->AddEnumValue(m, f, 0); break;
    case FieldDescriptor::CPPTYPE_STRING: r->AddString(m, f, n > 0 ? r->GetRepeatedString(*m, f, n - 1) : "x"); break;
    case FieldDescriptor::CPPTYPE_MESSAGE: break;
  }
}

}  // namespace proto_mutator_internal

// Changes one thing in `message`, chosen with `rng`.
inline void MutateMessage(google::protobuf::Message* message, std::mt19937_64& rng) {
  using namespace proto_mutator_internal;
  // Invalid UTF-8 in string fields is meant (the parser must refuse it);
  // protobuf would log every such message.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  std::vector<Slot> slots;
  CollectSlots(message, 0, &slots);
  if (slots.empty()) return;
  const Slot& s = slots[rng() % slots.size()];
  if (s.field->is_repeated() && s.index < 0) {
    Resize(s, rng);
  } else {
    SetValue(s, rng);
  }
}

// A custom mutator's result: `bytes` written over the input, or, when they
// do not fit, a byte-level mutation of it instead.
inline size_t ReplaceInput(const std::string& bytes, uint8_t* data, size_t size, size_t max_size) {
  if (bytes.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, bytes.data(), bytes.size());
  return bytes.size();
}

// A custom mutator for an input that is one serialized `M`: mostly one
// field changed through reflection; one time in five, or when the input
// does not parse, libFuzzer's own byte mutation.
template <typename M>
size_t MutateSerialized(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::mt19937_64 rng(seed);
  M message;
  if (rng() % 5 == 0 || !message.ParseFromArray(data, static_cast<int>(size))) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  MutateMessage(&message, rng);
  return ReplaceInput(message.SerializeAsString(), data, size, max_size);
}

}  // namespace chunkattn::fuzz

#endif  // CHUNKATTN_TESTS_FUZZ_PROTO_MUTATOR_H_
