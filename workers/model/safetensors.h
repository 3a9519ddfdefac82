// Reading and writing the safetensors format (an 8-byte little-endian header
// length, a JSON header of {name: {dtype, shape, data_offsets}}, then the raw
// tensor bytes), single-file or sharded through model.safetensors.index.json.
// Files are memory-mapped; nothing is copied until a tensor is converted.
#ifndef CHUNKATTN_WORKERS_MODEL_SAFETENSORS_H_
#define CHUNKATTN_WORKERS_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/api/dtype.h"

namespace chunkattn {

struct TensorView {
  std::string name;
  std::string file;  // the file it lives in, for error messages
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // borrowed from the mapping; prod(shape) elements
  int64_t num_elements() const;
};

// One memory-mapped .safetensors file. Immutable after Open: safe for
// concurrent readers.
class SafetensorsFile {
 public:
  // Validates the whole header: its length against the file size, every
  // entry's dtype, shape and byte range (inside the data region, sized
  // prod(shape) * element size). Errors name the file and the tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // NOT_FOUND naming the file and the tensor; UNIMPLEMENTED for a dtype we
  // do not load (the header may hold others, e.g. integer buffers).
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  std::vector<std::string> Names() const;

 private:
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    int64_t begin = 0, end = 0;  // byte range inside the data region
  };
  SafetensorsFile() = default;

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data region
  std::map<std::string, Entry> entries_;
};

// The tensors of a model folder: model.safetensors, or the shards that
// model.safetensors.index.json maps names to.
class SafetensorsModel {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsModel>> Open(const std::string& dir);
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  bool Has(const std::string& name) const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> by_name_;
};

// A tensor to write: `bytes` holds prod(shape) elements of `dtype`.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes a safetensors file (header padded to 8 bytes, as the reference
// implementation does). `metadata` goes under "__metadata__".
absl::Status WriteSafetensors(const std::string& path, absl::Span<const TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Converts a view's elements to fp32 (flat, row-major).
void ToFloat(const TensorView& t, int64_t begin, int64_t count, float* out);

}  // namespace chunkattn

#endif  // CHUNKATTN_WORKERS_MODEL_SAFETENSORS_H_
