// A request's constraint on the tokens its samples may draw (structured
// outputs: a JSON schema, a regex, a grammar). The scheduler asks for a
// sample's allowed next tokens when it schedules that sample's row, sends
// them with the plan (SampleRow::allowed), and reports each drawn token
// back; the constraint may then end the sample. The implementation (a
// grammar matcher per sample, services/coordinator/grammar_constraint.h)
// lives outside the scheduler, which knows only this interface.
//
// Thread ownership: called from the scheduler's thread while the request is
// in the scheduler, except that FillNextTokenMask runs for several samples
// of a step at once (SchedulerOptions::mask_pool): calls for distinct
// samples must share no mutable state.
#ifndef CHUNKATTN_SERVICES_CORE_TOKEN_CONSTRAINT_H_
#define CHUNKATTN_SERVICES_CORE_TOKEN_CONSTRAINT_H_

#include <cstdint>

#include "absl/types/span.h"

namespace chunkattn {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;

  // Words of a mask: ceil(tokenizer vocabulary / 32).
  virtual int32_t mask_words() const = 0;
  // Sets bit t % 32 of mask[t / 32] exactly when token t may come next in
  // sample `sample` (stop tokens exactly when the output may end), which has
  // `tokens_left` tokens of its budget left, this one included. Returns
  // false when no token may (a broken constraint): the caller then ends the
  // sample. REQUIRES: mask.size() == mask_words().
  virtual bool FillNextTokenMask(int32_t sample, int32_t tokens_left, absl::Span<uint32_t> mask) = 0;
  // Sample `sample` drew `token`. Returns true when the sample must end: a
  // stop token ended the output, no byte can follow the output, or the
  // token broke the constraint.
  virtual bool Accept(int32_t sample, int32_t token) = 0;
};

}  // namespace chunkattn

#endif  // CHUNKATTN_SERVICES_CORE_TOKEN_CONSTRAINT_H_
