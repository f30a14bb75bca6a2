// Lab 12 step 4 (optional): ep beside dp on 4 ranks, ep = 2 (two replicas of each expert). The
// reduction is checked first, on its own; the model's step needs step 3's exchange too.
//  - One step of the model against the single-device GPT (one routing group per rank): loss and
//    every gradient this rank holds, fp32 at the all-reduce tolerances.
//  - The counters: every expert gradient was all-reduced (sum) over its edp group only, every
//    other gradient over the world: exactly their bytes, nothing else reduced.
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/nn/gpt.hpp"
#include "tests/12_expert_parallel/ep_checks.hpp"

using namespace scalelab;

TEST(Step4_EpBesideDp, ExpertGradientsReducedOverTheirReplicasOnly) {
  comm::Communicator world = labtest::new_world();
  if (world.size() != 4) GTEST_SKIP() << "4 ranks: ep 2 x dp 2";
  lab12::EpGroups groups = lab12::make_ep_groups(world, 2);
  nn::GPT model(model_config("tiny-moe"), lab12::ep_model_options({.seed = 5}, groups.ep));
  int64_t expert_bytes = 0, other_bytes = 0;
  for (auto& b : model.blocks_)
    if (b->moe)
      for (nn::Parameter* p : b->moe->expert_parameters()) expert_bytes += p->grad.nbytes();
  other_bytes = static_cast<int64_t>(model.params().grads().nbytes()) - expert_bytes;
  world.barrier();
  // the ledger, raw MPI counted (a row of its own, no bytes: named among the others)
  const comm::Traffic did =
      labtest::traffic_of([&] { lab12::reduce_gradients(model, world, groups.edp); });
  int64_t on_edp = 0, on_world = 0, all = 0;
  std::string others;
  for (const auto& [key, count] : did) {
    all += count.bytes;
    if (key.op == "all_reduce" && key.group == groups.edp.name()) on_edp += count.bytes;
    else if (key.op == "all_reduce" && key.group == world.name()) on_world += count.bytes;
    else others += fmt::format("; {}: {} call(s)", comm::traffic_key_str(key), count.calls);
  }
  LABTEST_EXPECT(labtest::on_every_rank(
                     ::testing::AssertionResult(on_edp == expert_bytes && on_world == other_bytes &&
                                                all == expert_bytes + other_bytes && others.empty())
                     << "all-reduced " << on_edp << " bytes over " << groups.edp.name()
                     << " (the experts: " << expert_bytes << "), " << on_world << " over "
                     << world.name() << " (the rest: " << other_bytes << "), " << all << " in all"
                     << others),
                 "");
}

TEST(Step4_EpBesideDp, LossAndGradientsEqualSingleDevice) {
  if (labtest::world().size() != 4) GTEST_SKIP() << "4 ranks: ep 2 x dp 2";
  eptest::model_matches_single_device(DType::f32, 2, 2, 1.0);
}
