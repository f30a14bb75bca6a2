#include "common/comm/bandwidth.hpp"

#include <string>

#include "common/errors.hpp"

namespace scalelab::comm {

double busbw_factor(std::string_view collective, int ranks) {
  SCALELAB_REQUIRE(ranks >= 1, "busbw_factor: ranks must be >= 1, got {}", ranks);
  const double n = ranks;
  // all_reduce = reduce_scatter + all_gather: each rank sends and receives (n-1)/n of the data
  // twice. all_gather / reduce_scatter: (n-1)/n once. Rooted ones: the root's link carries it once.
  if (collective == "all_reduce") return 2.0 * (n - 1) / n;
  if (collective == "all_gather" || collective == "reduce_scatter" || collective == "all_to_all")
    return (n - 1) / n;
  if (collective == "broadcast" || collective == "reduce" || collective == "send_recv") return 1.0;
  throw UsageError("busbw_factor: unknown collective '" + std::string(collective) + "'");
}

double algbw(double bytes, double seconds) { return seconds > 0 ? bytes / seconds : 0.0; }

double busbw(std::string_view collective, int ranks, double bytes, double seconds) {
  return algbw(bytes, seconds) * busbw_factor(collective, ranks);
}

}  // namespace scalelab::comm
