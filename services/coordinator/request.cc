#include "services/coordinator/request.h"

#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace chunkattn {

namespace {

// The payload: "<field>" or "<field>,<index>", the enum's value in decimal.
constexpr char kFieldPayload[] = "chunkattn.request.field";

}  // namespace

absl::Status InvalidField(FieldRef at, absl::string_view rule) {
  absl::Status status = absl::InvalidArgumentError(rule);
  std::string payload = absl::StrCat(static_cast<int>(at.field));
  if (at.index >= 0) absl::StrAppend(&payload, ",", at.index);
  status.SetPayload(kFieldPayload, absl::Cord(payload));
  return status;
}

std::optional<FieldRef> ErrorField(const absl::Status& status) {
  auto payload = status.GetPayload(kFieldPayload);
  if (!payload.has_value()) return std::nullopt;
  const std::vector<std::string> parts = absl::StrSplit(std::string(*payload), ',');
  int field = 0;
  FieldRef at{RequestField::kRequestId};
  if (!absl::SimpleAtoi(parts[0], &field) || (parts.size() > 1 && !absl::SimpleAtoi(parts[1], &at.index))) {
    return std::nullopt;
  }
  at.field = static_cast<RequestField>(field);
  return at;
}

absl::Status NameErrorField(const absl::Status& status, absl::FunctionRef<std::string(FieldRef)> name) {
  std::optional<FieldRef> at = ErrorField(status);
  if (!at.has_value()) return status;
  absl::Status named(status.code(), absl::StrCat(name(*at), " ", status.message()));
  status.ForEachPayload(
      [&named](absl::string_view url, const absl::Cord& payload) { named.SetPayload(url, payload); });
  return named;
}

std::string WithIndex(absl::string_view name, int index) {
  return index < 0 ? std::string(name) : absl::StrCat(name, "[", index, "]");
}

}  // namespace chunkattn
