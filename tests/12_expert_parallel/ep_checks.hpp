#pragma once
// What lab 12's graders share: a routing built by the LIBRARY's nn::MoE (so step 2 and 3 are
// graded without the attendee's step 1), the written-out reference (every expert on every
// token, masked: tests/common/moe_reference.hpp), the shapes drawn at grading time, and the
// single-device twin of one expert-parallel step. The wrong techniques and missing fields the
// checks must stop (capacity ignored or left 0, dest unset, the balancing loss without its
// gradient or its loss scale, dye not set, a gather of every rank's tokens instead of the
// all-to-all, the counts exchanged again in backward, every rank running every expert on its own
// tokens, every expert's weights in a std::vector; and the planting audit's: the library doing
// route(), top-1 gates renormalised, f per token, the capacity unclamped, dlogits added to, a
// one-hot dispatch matmul, dx set, top-1 dgates left 0, bf16 rows sent as f32, the experts'
// forward recomputed, copies kept, the plan outside `kept`) are planted into a copy of the
// reference at build time (solutions/12_*/planted/cheats.plant, labs/12_expert_parallel/lab.cmake).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

// lab_fixture.hpp first: it names gtest's ::testing, which scalelab::testing (gradcheck.hpp)
// would hide inside namespace scalelab
#include "tests/support/drawn.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/lab_fixture.hpp"
#include "tests/support/memory_use.hpp"
#include "tests/support/own_work.hpp"
#include "tests/support/traffic_budget.hpp"

#include "common/allocator.hpp"
#include "common/comm/communicator.hpp"
#include "common/comm/stats.hpp"
#include "common/nn/moe.hpp"
#include "common/nn/parameter.hpp"
#include "common/ops/ops.hpp"
#include "common/ops/work.hpp"
#include "expert_parallel.hpp"
#include "tests/common/gradcheck.hpp"
#include "tests/common/moe_reference.hpp"

namespace eptest {

using namespace scalelab;

/// A routing shape: drawn from the grading seed (draw_shape), or fixed by a test.
struct Shape {
  uint64_t seed = 0;  ///< what the values (x, the weights) are drawn from
  int64_t N = 0, C = 0, E = 0, k = 1;
  double cf = 1.0;
  int drawn = -1;  ///< draw_shape's `nth` (seed: labtest::grading_seed() + nth); -1: fixed
  /// Printed on failure: the shape, and for a drawn one the grading seed and the line that
  /// draws it again ("shape 2 drawn from grading seed 370013 (rerun: SCALELAB_GRADE_SEED=370013
  /// ./scalelab grade 12): N 17, C 6, E 4, top-2, capacity factor 0.75").
  std::string str() const {
    const std::string what = fmt::format("N {}, C {}, E {}, top-{}, capacity factor {}", N, C, E,
                                         k, cf);
    if (drawn < 0) return fmt::format("a fixed shape (seed {}): {}", seed, what);
    return fmt::format("shape {} drawn from grading seed {} (rerun: {}): {}", drawn,
                       labtest::grading_seed(), labtest::grade_rerun_line(), what);
  }
  MoEConfig config(double aux = 0.05) const {
    return {.n_expert = E, .top_k = k, .every = 1, .capacity_factor = cf, .aux_coef = aux};
  }
};
/// The `nth` shape of this grading run (seeded labtest::grading_seed() + nth: every lab's drawn
/// shapes come from the one grading seed, tests/support/drawn.hpp).
Shape draw_shape(int nth);


/// One nn::MoE of all E experts, with random f64 (or f32) values (not the usual init, so no zero
/// bias can hide a bug), and its routing of x as the library computes it (one group).
struct Layer {
  nn::MoE moe;
  nn::ParameterSet set;
  Layer(const MoEConfig& c, int64_t C, uint64_t seed, DType dtype = DType::f64,
        int ep_rank = 0, int ep_size = 1);
  /// The routing of x (N, C) by the library, as a lab12::Routing (dest included).
  lab12::Routing library_routing(const Tensor& x) const;
  /// The written-out reference on x: needs every expert (ep_size 1).
  scalelab::testing::MoEReference reference(const Tensor& x) const;
};

/// What the ledger saw of one exchange (labtest::traffic_of: raw MPI counted): "" when the only
/// traffic was `calls` all_to_alls of exactly `bytes` in all on the group named `group`, else
/// what was.
std::string only_all_to_all(const comm::Traffic& did, const std::string& group, int64_t calls,
                            int64_t bytes);

/// One step of lab 12's expert-parallel GPT (model tiny-moe, capacity factor `cf`, top-`k`)
/// over every rank with ep = `ep`, against the single-device GPT (one routing group per rank):
/// loss, and every gradient this rank holds (the experts': the twin's rows of them). fp32 at
/// the all-reduce tolerances, bf16 at 2e-3 of the loss and 3e-2 of the largest gradient.
void model_matches_single_device(DType dt, int ep, int64_t k, double cf);

}  // namespace eptest
