// A .safetensors file from arbitrary bytes: SafetensorsFile::Open accepts or
// refuses it (an error naming the file), never crashes or reads outside the
// mapping; every tensor it accepts converts whole to fp32.
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "workers/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using chunkattn::fuzz::Fail;
  const std::string path = chunkattn::fuzz::PrivateDir() + "/model.safetensors";
  chunkattn::fuzz::WriteFile(path, data, size);
  auto file = chunkattn::SafetensorsFile::Open(path);
  if (!file.ok()) {
    if (file.status().message().find(path) == std::string::npos) {
      Fail("safetensors_file_fuzz", "an error that does not name the file: " + file.status().ToString());
    }
    return 0;
  }
  std::vector<float> values;
  for (const std::string& name : (*file)->Names()) {
    auto view = (*file)->Get(name);
    if (!view.ok()) {
      if (view.status().code() != absl::StatusCode::kUnimplemented) {
        Fail("safetensors_file_fuzz", "a listed tensor is not readable: " + view.status().ToString());
      }
      continue;  // a dtype we do not load
    }
    const int64_t n = view->num_elements();
    if (n < 0 || static_cast<uint64_t>(n) > size) Fail("safetensors_file_fuzz", "more elements than bytes");
    values.resize(static_cast<size_t>(n));
    chunkattn::ToFloat(*view, 0, n, values.data());
  }
  return 0;
}
