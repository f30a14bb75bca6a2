// Lab 06, given: a checkpointing policy as text, both ways: Policy::str() ("every:2") and
// parse_policy (the program's --checkpoint option, with its usage errors). Not an exercise: read
// it to see which policies step 3's make_plan is given.
#include "activation_checkpointing.hpp"

#include <fmt/format.h>

#include "common/errors.hpp"

namespace scalelab::lab06 {

std::string Policy::str() const {
  switch (kind) {
    case none: return "none";
    case every: return "every";
    case every_kth: return fmt::format("every:{}", k);
    case selective: return "selective";
  }
  return "?";
}

Policy parse_policy(const std::string& text) {
  if (text == "none") return {Policy::none};
  if (text == "every") return {Policy::every};
  if (text == "selective") return {Policy::selective};
  if (text.rfind("every:", 0) == 0) {
    const std::string k = text.substr(6);
    std::size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(k, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SCALELAB_REQUIRE(!k.empty() && used == k.size() && value >= 1,
                     "checkpoint interval must be a positive integer, got '{}'", k);
    return {Policy::every_kth, value};
  }
  throw UsageError(fmt::format(
      "unknown checkpoint policy '{}' (none, every, every:K, selective)", text));
}

}  // namespace scalelab::lab06
