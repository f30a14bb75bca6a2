// Lab 11 step 4 (optional): all-to-all attention (DeepSpeed-Ulysses), on cp = every rank (2, 4).
//  - The attention alone: output and dq, dk, dv of this rank's zig-zag rows against the single
//    device's flash attention (fp32 1e-5 relative / 1e-6 absolute: only copies around one flash
//    call, so in practice exact; bf16 3e-2 as the ring's).
//  - Bytes (the ledger, raw MPI counted): by all-to-all alone, q, k, v in and y out in forward, dy in and dq, dk,
//    dv out in backward: 4 x the bytes of this rank's q each way; no send, no all-gather.
//  - Work (ops::work_stats, over each call): one causal flash attention over this rank's heads
//    and the whole sequence, its pairs and FLOPs; no attention written out with (T, T) scores.
//  - The whole model: the context-parallel GPT with all-to-all attention against the single
//    device (4 heads so that cp = 4 divides them), tolerances as step 3's.
// Planted into a copy of the reference (solutions/11_context_parallel/planted/cheats.plant;
// labs/11_context_parallel/lab.cmake):
// an all-to-all attention that runs causal attention on the rows in the order they arrive (rank
// by rank: zig-zag), not in sequence order, fails the output check; attention on the heads written
// out (batched_matmul scores, a softmax, the probabilities kept) fails the work check.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "common/data/sampler.hpp"
#include "tests/11_context_parallel/cp_checks.hpp"

using namespace scalelab;

namespace {

constexpr int64_t kB = 2, kNH = 4, kC = 8, kHs = 16;

struct Ulysses {
  Tensor y, dq, dk, dv;      // what the attendee's code gave
  Tensor want_y, want_dq, want_dk, want_dv;
  comm::Traffic fwd, bwd;  // the ledger of each, raw MPI counted
  ops::WorkCount work_fwd, work_bwd;  // the work counters over each
  std::size_t q_bytes = 0;
};

Ulysses run(DType dt, comm::Communicator& cp) {
  const int n = cp.size(), r = cp.rank();
  const cptest::Full full = cptest::full_attention(kB * kNH, 2 * n * kC, kHs, dt, 3000 + n);
  Ulysses u;
  const Tensor q = cptest::zigzag_rows(full.q, n, r), k = cptest::zigzag_rows(full.k, n, r),
               v = cptest::zigzag_rows(full.v, n, r), dy = cptest::zigzag_rows(full.dy, n, r);
  u.want_y = cptest::zigzag_rows(full.y, n, r);
  u.want_dq = cptest::zigzag_rows(full.dq, n, r);
  u.want_dk = cptest::zigzag_rows(full.dk, n, r);
  u.want_dv = cptest::zigzag_rows(full.dv, n, r);
  u.q_bytes = q.nbytes();
  u.y = Tensor::empty(q.shape(), dt);
  std::vector<Tensor> kept;
  cp.barrier();
  Tensor lse;
  const ops::WorkCount before = ops::work_stats();
  u.fwd = labtest::traffic_of(
      [&] { lse = lab11::all_to_all_attention_forward(u.y, q, k, v, kNH, full.scale, cp, kept); });
  const ops::WorkCount between = ops::work_stats();
  u.work_fwd = between - before;
  u.dq = Tensor::empty(q.shape(), dt), u.dk = u.dq.clone(), u.dv = u.dq.clone();
  u.bwd = labtest::traffic_of([&] {
    lab11::all_to_all_attention_backward(u.dq, u.dk, u.dv, dy, lse, kept, kNH, full.scale, cp);
  });
  u.work_bwd = ops::work_stats() - between;
  return u;
}

// The ledger of one call (raw MPI counted: labtest::traffic_of) against 4 all-to-alls of q's size.
std::string bytes_problem(const comm::Traffic& did, std::size_t q_bytes, const char* what) {
  comm::CommCount a2a;
  std::vector<std::string> others;
  for (const auto& [key, count] : did) {
    if (key.op == "all_to_all") a2a.calls += count.calls, a2a.bytes += count.bytes;
    else others.push_back(fmt::format("{} x{}", comm::traffic_key_str(key), count.calls));
  }
  if (a2a.calls == 4 && a2a.bytes == 4 * static_cast<int64_t>(q_bytes) && others.empty())
    return "";
  return fmt::format("{}: {} all-to-alls of {} bytes in all and {} other operations{}{}; want 4 "
                     "all-to-alls of this rank's q-sized tensors ({} bytes each) and nothing else",
                     what, a2a.calls, a2a.bytes, others.size(), others.empty() ? "" : ": ",
                     fmt::join(others, ", "), q_bytes);
}

// The work counters of one call against one causal flash attention over this rank's heads and
// the whole sequence: its (query, key) pairs and every matmul's FLOPs, fused or not (forward: 2
// GEMMs per pair, backward 5, of 2 hs FLOPs each: common/ops/work.hpp). Attention written out
// with (T, T) score matrices (ops::batched_matmul and a softmax) computes every pair of them.
std::string work_problem(const ops::WorkCount& did, int n, bool backward) {
  const int64_t heads = kB * kNH / n, T = 2 * n * kC;
  const int64_t pairs = heads * T * (T + 1) / 2, flops = pairs * (backward ? 10 : 4) * kHs;
  if (did.matmul_flops == flops && (backward || did.attention_pairs == pairs)) return "";
  return fmt::format("{}: {} FLOPs of matrix multiplies in {} calls and {} fused attention score "
                     "pairs; one causal flash attention over this rank's {} heads of the whole "
                     "sequence ({} tokens) does {} FLOPs{}: attention on the heads written out "
                     "(score matrices through ops::batched_matmul) or run more than once?",
                     backward ? "backward" : "forward", did.matmul_flops, did.matmul_calls,
                     did.attention_pairs, heads, T, flops,
                     backward ? "" : fmt::format(" over {} pairs", pairs));
}

void attention_matches(DType dt) {
  comm::Communicator cp = labtest::new_world();
  const Ulysses u = run(dt, cp);
  const double rt = cptest::rtol(dt), at = cptest::atol(dt);
  EXPECT_TRUE(labtest::close_on_every_rank(u.y, u.want_y, rt, at));
  EXPECT_TRUE(labtest::close_on_every_rank(u.dq, u.want_dq, rt, at));
  EXPECT_TRUE(labtest::close_on_every_rank(u.dk, u.want_dk, rt, at));
  EXPECT_TRUE(labtest::close_on_every_rank(u.dv, u.want_dv, rt, at));
}

}  // namespace

TEST(Step4_AllToAll, EqualsFullAttentionF32) { attention_matches(DType::f32); }
TEST(Step4_AllToAll, EqualsFullAttentionBf16) { attention_matches(DType::bf16); }

TEST(Step4_AllToAll, FourAllToAllsEachWay) {
  comm::Communicator cp = labtest::new_world();
  const Ulysses u = run(DType::f32, cp);
  EXPECT_EQ(bytes_problem(u.fwd, u.q_bytes, "forward"), "");
  EXPECT_EQ(bytes_problem(u.bwd, u.q_bytes, "backward"), "");
}

// What ran on this rank's heads: one fused causal attention each way (the work counters).
TEST(Step4_AllToAll, FlashAttentionOnItsHeadsOnly) {
  comm::Communicator cp = labtest::new_world();
  const Ulysses u = run(DType::f32, cp);
  EXPECT_EQ(work_problem(u.work_fwd, cp.size(), false), "");
  EXPECT_EQ(work_problem(u.work_bwd, cp.size(), true), "");
}

TEST(Step4_Model, LossAndGradientsEqualSingleDeviceF32) {
  cptest::model_matches_single_device(DType::f32, lab11::Attention::all_to_all, /*n_head=*/4);
}
TEST(Step4_Model, LossAndGradientsEqualSingleDeviceBf16) {
  cptest::model_matches_single_device(DType::bf16, lab11::Attention::all_to_all, /*n_head=*/4);
}

// All-to-all attention (step 4) in the whole model on the simulated GPU, fp32 and bf16: the host's numbers bit for bit
// (cptest::model_runs_on_sim_as_on_host). Not at 3 ranks, as the model tests above.
TEST(Step4_Model, RunsOnTheSimulatedGpuAsOnTheHost) {
  if (labtest::world().size() == 3)
    GTEST_SKIP() << "the model's context does not cut into 6 chunks";
  const std::string problems = cptest::model_runs_on_sim_as_on_host(lab11::Attention::all_to_all, /*backward=*/true);
  if (!problems.empty()) LABTEST_FAIL() << problems;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}
