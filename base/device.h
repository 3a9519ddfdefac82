// The --device flag of the worker and the offline tools: "cpu", "cuda"
// (device 0) or "cuda:N".
#ifndef CHUNKATTN_BASE_DEVICE_H_
#define CHUNKATTN_BASE_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace chunkattn {

struct DeviceSpec {
  bool cuda = false;
  int index = 0;  // CUDA device ordinal

  std::string ToString() const { return cuda ? absl::StrCat("cuda:", index) : "cpu"; }
};

inline absl::StatusOr<DeviceSpec> ParseDevice(const std::string& value) {
  DeviceSpec d;
  if (value == "cpu") return d;
  d.cuda = true;
  if (value == "cuda") return d;
  int index = -1;
  if (absl::StartsWith(value, "cuda:") && absl::SimpleAtoi(value.substr(5), &index) && index >= 0 &&
      index < 1024 && value.substr(5) == absl::StrCat(index)) {
    d.index = index;
    return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device \"", value, "\": expected cpu, cuda or cuda:N"));
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_DEVICE_H_
