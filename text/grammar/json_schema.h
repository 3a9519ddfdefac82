// JSON Schema, `json_object` mode and a choice of strings, as grammars.
//
// Supported JSON Schema keywords: type (string, number, integer, boolean,
// null, object, array, and arrays of these), properties, required,
// additionalProperties (false, true or a schema), items, prefixItems,
// minItems, maxItems, enum, const, minLength, maxLength, pattern, format
// (date, time, date-time, uuid, ipv4, email), minimum, maximum,
// exclusiveMinimum, exclusiveMaximum (integers: any integral bound; numbers:
// integral minimum/maximum, output then has no exponent), anyOf, oneOf
// (treated as anyOf: exclusivity is not enforced), allOf with one schema,
// $ref to "#", "#/$defs/...", "#/definitions/..." or any local JSON pointer
// (recursion included), $defs, definitions, nullable (OpenAPI), uniqueItems
// false. Annotations are ignored: title, description, default, examples,
// $schema, $id, $comment, deprecated, readOnly, writeOnly. Any other keyword
// is INVALID_ARGUMENT naming it and where it is: never silently ignored.
//
// The generated text is the canonical spelling of a value matching the
// schema, up to whitespace: properties in the schema's order (absent optional
// ones skipped), additional properties after them (their names differ from
// the declared ones; two additional ones may still repeat a name), enum and
// const values as compact JSON. Whitespace (see JsonWhitespace) is bounded so
// that a model cannot loop on it. Numbers are bounded so that every parser
// reads them: at most 19 integer digits (where no maximum bounds them) and 2
// exponent digits.
//
// Thread ownership: pure functions; safe to call from any thread.
#ifndef CHUNKATTN_TEXT_GRAMMAR_JSON_SCHEMA_H_
#define CHUNKATTN_TEXT_GRAMMAR_JSON_SCHEMA_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "text/grammar/grammar.h"

namespace chunkattn::grammar {

enum class JsonWhitespace {
  // No whitespace but one optional space after ',' and ':' (what both
  // json.dumps and compact writers print): the default.
  kCompact,
  // Up to JsonSchemaOptions::max_whitespace bytes of [ \t\n\r] wherever JSON
  // allows whitespace inside a value (pretty-printed output).
  kFlexible,
};

struct JsonSchemaOptions {
  JsonWhitespace whitespace = JsonWhitespace::kCompact;
  int32_t max_whitespace = 16;
  // OpenAI's strict mode: an absent additionalProperties means false, and an
  // array with prefixItems and no items has no further items. When false,
  // both mean "anything", as JSON Schema says.
  bool strict = true;
};

// INVALID_ARGUMENT for text that is not JSON, an unsupported keyword (named,
// with its JSON pointer), a bad $ref, or a bound of `limits` (size, nesting).
absl::StatusOr<Grammar> JsonSchemaToGrammar(std::string_view schema_json,
                                            const JsonSchemaOptions& options = JsonSchemaOptions(),
                                            const Limits& limits = Limits());

// Any JSON object (OpenAI's response_format json_object).
Grammar JsonObjectGrammar(const JsonSchemaOptions& options = JsonSchemaOptions());

// Exactly one of `choices`, as raw text (vLLM's `choice`). INVALID_ARGUMENT
// when empty or over the size limits.
absl::StatusOr<Grammar> ChoiceToGrammar(const std::vector<std::string>& choices,
                                        const Limits& limits = Limits());

}  // namespace chunkattn::grammar

#endif  // CHUNKATTN_TEXT_GRAMMAR_JSON_SCHEMA_H_
