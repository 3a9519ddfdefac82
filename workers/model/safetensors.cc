#include "workers/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace chunkattn {
namespace {

using Json = nlohmann::json;

// A header bigger than this is not a model header (the reference reader
// caps it at 100 MB too).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

std::optional<DType> SafetensorsDType(const std::string& s) {
  if (s == "F32") return DType::kFloat32;
  if (s == "F16") return DType::kFloat16;
  if (s == "BF16") return DType::kBFloat16;
  return std::nullopt;
}

int ElementBytes(const std::string& s) {
  static const std::map<std::string, int> kBytes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8},
      {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = kBytes.find(s);
  return it == kBytes.end() ? 0 : it->second;
}

const char* SafetensorsName(DType t) {
  switch (t) {
    case DType::kFloat32: return "F32";
    case DType::kFloat16: return "F16";
    case DType::kBFloat16: return "BF16";
  }
  return "?";
}

}  // namespace

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s", path, what));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrFormat("%s: cannot open: %s", path, std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrFormat("%s: fstat: %s", path, std::strerror(errno)));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return bad("truncated: shorter than the 8-byte header length");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrFormat("%s: mmap: %s", path, std::strerror(errno)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;
  file->map_size_ = size;
  const auto* bytes = static_cast<const uint8_t*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) return bad("header length is implausibly large");
  if (header_len > size - 8) {
    return bad(absl::StrFormat("truncated: header of %d bytes but the file has %d", header_len,
                               size - 8));
  }
  file->data_ = bytes + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  const char* text = reinterpret_cast<const char*>(bytes + 8);
  Json header = Json::parse(text, text + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return bad("header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const Json& v = it.value();
    auto bad_tensor = [&](const std::string& what) {
      return bad(absl::StrFormat("tensor \"%s\": %s", name, what));
    };
    if (!v.is_object()) return bad_tensor("entry is not an object");
    auto dt = v.find("dtype");
    auto shape = v.find("shape");
    auto offsets = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return bad_tensor("missing dtype");
    if (shape == v.end() || !shape->is_array()) return bad_tensor("missing shape");
    if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2) {
      return bad_tensor("data_offsets must be [begin, end]");
    }
    Entry e;
    e.dtype = dt->get<std::string>();
    const int elem = ElementBytes(e.dtype);
    if (elem == 0) return bad_tensor("unknown dtype " + e.dtype);
    uint64_t count = 1;
    for (const Json& d : *shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) {
        return bad_tensor("shape must be non-negative integers");
      }
      count *= d.get<uint64_t>();
      if (count > (uint64_t{1} << 40)) return bad_tensor("too many elements");
      e.shape.push_back(d.get<int64_t>());
    }
    if (!(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return bad_tensor("data_offsets must be non-negative integers");
    }
    const uint64_t begin = (*offsets)[0].get<uint64_t>();
    const uint64_t end = (*offsets)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return bad_tensor(absl::StrFormat(
          "bytes [%d, %d) outside the data region of %d bytes (truncated file?)", begin, end,
          data_size));
    }
    if (end - begin != count * elem) {
      return bad_tensor(absl::StrFormat("holds %d bytes but its shape needs %d", end - begin,
                                        count * elem));
    }
    e.begin = static_cast<int64_t>(begin);
    e.end = static_cast<int64_t>(end);
    file->entries_.emplace(name, std::move(e));
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

absl::StatusOr<TensorView> SafetensorsFile::Get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrFormat("%s: no tensor \"%s\"", path_, name));
  }
  const Entry& e = it->second;
  auto dtype = SafetensorsDType(e.dtype);
  if (!dtype) {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: tensor \"%s\" has dtype %s (supported: F32, F16, BF16)", path_, name, e.dtype));
  }
  TensorView t;
  t.name = name;
  t.file = path_;
  t.dtype = *dtype;
  t.shape = e.shape;
  t.data = data_ + e.begin;
  return t;
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, e] : entries_) names.push_back(name);
  return names;
}

absl::StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::Open(const std::string& dir) {
  auto model = std::make_unique<SafetensorsModel>();
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::ifstream index(index_path, std::ios::binary);
  if (!index) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(dir + "/model.safetensors"));
    for (const std::string& name : file->Names()) model->by_name_[name] = file.get();
    model->files_.push_back(std::move(file));
    return model;
  }
  std::stringstream text;
  text << index.rdbuf();
  const std::string s = text.str();
  Json j = Json::parse(s, nullptr, /*allow_exceptions=*/false);
  auto map = j.is_object() ? j.find("weight_map") : j.end();
  if (j.is_discarded() || !j.is_object() || map == j.end() || !map->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: must be a JSON object with a \"weight_map\" object", index_path));
  }
  std::map<std::string, const SafetensorsFile*> shards;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: weight_map[\"%s\"] must be a file name", index_path, it.key()));
    }
    const std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "..") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: weight_map[\"%s\"] = \"%s\" is not a file in the folder", index_path, it.key(),
          shard));
    }
    auto found = shards.find(shard);
    if (found == shards.end()) {
      ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(dir + "/" + shard));
      found = shards.emplace(shard, file.get()).first;
      model->files_.push_back(std::move(file));
    }
    model->by_name_[it.key()] = found->second;
  }
  return model;
}

absl::StatusOr<TensorView> SafetensorsModel::Get(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    std::string where = files_.size() == 1 ? files_[0]->path() : "the model's safetensors index";
    return absl::NotFoundError(absl::StrFormat("%s: missing tensor \"%s\"", where, name));
  }
  return it->second->Get(name);
}

bool SafetensorsModel::Has(const std::string& name) const { return by_name_.count(name) > 0; }

absl::Status WriteSafetensors(const std::string& path, absl::Span<const TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    uint64_t count = 1;
    for (int64_t d : t.shape) count *= static_cast<uint64_t>(d);
    if (count * DTypeBytes(t.dtype) != t.bytes.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tensor \"%s\" has %d bytes, its shape needs %d", path, t.name, t.bytes.size(),
          count * DTypeBytes(t.dtype)));
    }
    header[t.name] = {{"dtype", SafetensorsName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrFormat("%s: cannot create", path));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const TensorToWrite& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrFormat("%s: write failed", path));
  return absl::OkStatus();
}

void ToFloat(const TensorView& t, int64_t begin, int64_t count, float* out) {
  if (count <= 0) return;  // an empty tensor's buffer may be null: memcpy must not see it
  switch (t.dtype) {
    case DType::kFloat32:
      std::memcpy(out, t.data + begin * 4, static_cast<size_t>(count) * 4);
      return;
    case DType::kFloat16:
    case DType::kBFloat16: {
      const uint8_t* p = t.data + begin * 2;
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);  // the mapping's alignment is not promised
        out[i] = t.dtype == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
      }
      return;
    }
  }
}

}  // namespace chunkattn
