// Lab 10, given: the planner's search. plan_all (every grid dp x cp x tp x pp check_4d accepts, every m in
// {1, 2, 4, 8}, schedule of lab 08 (AFAB, 1F1B, interleaved with 2 or 4 chunks), attention of
// lab 11 (ring, all-to-all), ZeRO stage and checkpointing (check_runnable: all of them run),
// predicted by your predict(), kept when it fits the memory, sorted by predicted step time). Not an exercise: read
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
  const int L = static_cast<int>(config.n_layer);
  // Axis sizes check_4d refuses whatever the rest are skipped before the loops below try (and
  // check_4d refuses) each of their combinations: a million ranks had a throw per combination.
  for (int dp : divisors(world_size)) {
    if (global_batch % dp != 0) continue;  // dp x micro-batches divides the batch
    for (int cp : divisors(world_size / dp)) {  // cp: lab 11 over the sequence (4th axis)
      if (config.block_size % (2 * static_cast<int64_t>(cp)) != 0) continue;  // 2 cp equal chunks
      for (int tp : divisors(world_size / dp / cp)) {
        const int pp = world_size / dp / cp / tp;
        if (config.n_head % tp != 0 || pp > L) continue;  // tp divides the heads, pp <= the layers
        for (int m : {1, 2, 4, 8}) {
          // lab 08's schedules, where they differ from 1F1B: AFAB holds every micro-batch (the
          // same order as 1F1B with one stage or one micro-batch); interleaved needs a pipeline,
          // m in groups of pp and the layers in pp x v equal pieces (v = 2 or 4 chunks per rank)
          std::vector<std::pair<lab08::Kind, int>> schedules = {{lab08::Kind::one_f_one_b, 1}};
          if (pp > 1 && m > 1) schedules.push_back({lab08::Kind::afab, 1});
          for (int v : {2, 4})
            if (pp > 1 && m % pp == 0 && L % (pp * v) == 0)
              schedules.push_back({lab08::Kind::interleaved, v});
          // with cp, lab 11's two attention cores (all-to-all where the heads split over cp x tp:
          // check_4d)
          std::vector<lab11::Attention> attentions = {lab11::Attention::ring};
          if (cp > 1) attentions.push_back(lab11::Attention::all_to_all);
          for (const auto& [schedule, v] : schedules)
            for (lab11::Attention attention : attentions)
              for (int zero = 0; zero <= (dp * cp > 1 ? 3 : 0); ++zero)
                for (bool ckpt : {false, true}) {
                  const Plan plan{{dp, tp, pp, GridOrder::megatron, cp}, m, zero, ckpt, schedule,
                                  v, attention};
                  try {
                    check_4d(config, plan.grid, world_size, global_batch, m, plan.attention);
                    // Every ZeRO stage runs with micro-batches and a pipeline; ZeRO-2/3 then
                    // reduce (2) or gather (3) every unit once per micro-batch, which predict
                    // counts (m x their dp traffic), so they rank where they cost.
                    check_runnable(plan);
                  } catch (const UsageError&) {
                    continue;  // not a valid grid for this model and batch, or not a runnable plan
                  }
                  const Prediction p = predict(config, global_batch, plan, machine, precision);
                  if (p.total_bytes <= memory_bytes) out.emplace_back(plan, p);
                }
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second.step_s != b.second.step_s ? a.second.step_s < b.second.step_s
                                              : a.second.total_bytes < b.second.total_bytes;
  });
  return out;
}

}  // namespace scalelab::lab10
