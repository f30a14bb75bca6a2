// Lab 10, given: the planner's search. plan_all (every grid dp x cp x tp x pp check_4d accepts, every m in
// {1, 2, 4, 8}, ZeRO stage and checkpointing (check_runnable: all of them run), predicted by your
// predict(), kept when it fits the memory, sorted by predicted step time). Not an exercise: read
// it to see which plans `./scalelab plan` ranks and why some are never listed.
#include "3d_parallel.hpp"

#include <algorithm>
#include <vector>

#include "common/errors.hpp"

namespace scalelab::lab10 {

namespace {
// The divisors of n, ascending: the sizes one axis of a grid of n ranks can have. Found up to
// sqrt(n), so planning for a million ranks takes no time (trying every dp and tp up to n took
// n log n steps).
std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int d = 1; d <= n / d; ++d)
    if (n % d == 0) {
      low.push_back(d);
      if (d != n / d) high.push_back(n / d);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}
}  // namespace

std::vector<std::pair<Plan, Prediction>> plan_all(const ModelConfig& config, int world_size,
                                                  int64_t global_batch, const Machine& machine,
                                                  std::size_t memory_bytes, DType precision) {
  std::vector<std::pair<Plan, Prediction>> out;
  for (int dp : divisors(world_size))
    for (int cp : divisors(world_size / dp))  // cp: lab 11's ring over the sequence (4th axis)
    for (int tp : divisors(world_size / dp / cp)) {
      const int pp = world_size / dp / cp / tp;
      for (int m : {1, 2, 4, 8})
        for (int zero = 0; zero <= (dp * cp > 1 ? 3 : 0); ++zero)
          for (bool ckpt : {false, true}) {
            const Plan plan{{dp, tp, pp, GridOrder::megatron, cp}, m, zero, ckpt};
            try {
              check_4d(config, plan.grid, world_size, global_batch, m, plan.attention);
              // Every ZeRO stage runs with micro-batches and a pipeline; ZeRO-2/3 then reduce
              // (2) or gather (3) every unit once per micro-batch, which predict counts (m x
              // their dp traffic), so they rank where they cost.
              check_runnable(plan);
            } catch (const UsageError&) {
              continue;  // not a valid grid for this model and batch, or not a runnable plan
            }
            const Prediction p = predict(config, global_batch, plan, machine, precision);
            if (p.total_bytes <= memory_bytes) out.emplace_back(plan, p);
          }
    }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second.step_s != b.second.step_s ? a.second.step_s < b.second.step_s
                                              : a.second.total_bytes < b.second.total_bytes;
  });
  return out;
}

}  // namespace scalelab::lab10
