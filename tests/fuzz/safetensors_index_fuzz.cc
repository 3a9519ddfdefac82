// model.safetensors.index.json from arbitrary bytes, in a folder with two
// real shards: SafetensorsModel::Open accepts or refuses it, never opens a
// file outside the folder or crashes; every name it maps is readable or
// NOT_FOUND in its shard.
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "workers/model/safetensors.h"

namespace {

const char* const kNames[] = {"a.weight", "a.bias", "b.weight", "c.weight", "missing"};

void WriteShards(const std::string& dir) {
  auto tensor = [](const char* name, std::vector<int64_t> shape) {
    chunkattn::TensorToWrite t;
    t.name = name;
    t.shape = shape;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    t.bytes.assign(static_cast<size_t>(n) * 4, 0);
    return t;
  };
  const chunkattn::TensorToWrite a[] = {tensor("a.weight", {4, 4}), tensor("a.bias", {4})};
  const chunkattn::TensorToWrite b[] = {tensor("b.weight", {2, 3}), tensor("c.weight", {1})};
  if (!chunkattn::WriteSafetensors(dir + "/a.safetensors", a).ok() ||
      !chunkattn::WriteSafetensors(dir + "/b.safetensors", b).ok()) {
    chunkattn::fuzz::Fail("safetensors_index_fuzz", "cannot write the shards");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using chunkattn::fuzz::Fail;
  static const std::string dir = [] {
    const std::string d = chunkattn::fuzz::PrivateDir();
    WriteShards(d);
    return d;
  }();
  chunkattn::fuzz::WriteFile(dir + "/model.safetensors.index.json", data, size);
  auto model = chunkattn::SafetensorsModel::Open(dir);
  if (!model.ok()) return 0;
  for (const char* name : kNames) {
    auto view = (*model)->Get(name);
    if (view.ok()) {
      if (view->file != dir + "/a.safetensors" && view->file != dir + "/b.safetensors") {
        Fail("safetensors_index_fuzz", "read a tensor from " + view->file);
      }
      std::vector<float> values(static_cast<size_t>(view->num_elements()));
      chunkattn::ToFloat(*view, 0, view->num_elements(), values.data());
    } else if (view.status().code() != absl::StatusCode::kNotFound) {
      Fail("safetensors_index_fuzz", "unexpected " + view.status().ToString());
    }
  }
  return 0;
}
