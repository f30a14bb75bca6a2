// Lab 08 step 2 graders: tags that name the micro-batch, non-blocking sends, receives that get
// exactly the message they name whatever order the messages arrive in. Checked on the payloads
// (each message carries its sender, flow and micro-batch in its values) and on the byte
// counters. Every test gets its own communicator (labtest::new_world), so a message a wrong
// answer leaves behind cannot reach the next test.
#include <chrono>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "common/comm/stats.hpp"
#include "common/ops/ops.hpp"
#include "pipeline_parallel.hpp"
#include "pp_test.hpp"
#include "tests/support/traffic_budget.hpp"

using namespace scalelab;

namespace {

constexpr int kM = 4;
const std::vector<int64_t> kShape = {2, 16, 32};  // (B/m, T, C) of a tiny micro-batch
// Each receive is waited in this order: not the order the messages were sent.
const std::vector<int> kReceiveOrder = {3, 1, 0, 2};

// The value every element of a message carries: who sent it, what and which micro-batch.
double payload(int sender, lab08::Flow flow, int mb) {
  return 1000.0 * sender + (flow == lab08::Flow::gradient ? 100.0 : 0.0) + mb;
}

Tensor filled(double value) {
  Tensor t = Tensor::empty(kShape);
  ops::fill(t, value);
  return t;
}

// What a stage got: for each micro-batch, does its buffer hold the message meant for it?
testing::AssertionResult got_the_right_ones(const std::vector<Tensor>& got, int sender,
                                            lab08::Flow flow) {
  for (int mb = 0; mb < static_cast<int>(got.size()); ++mb) {
    if (got[mb].shape() != kShape)
      return testing::AssertionFailure() << "micro-batch " << mb << " arrived with another shape";
    const double want = payload(sender, flow, mb);
    if (got[mb].item(0) != want || got[mb].item(got[mb].numel() - 1) != want)
      return testing::AssertionFailure()
             << (flow == lab08::Flow::activation ? "activation" : "gradient") << " of micro-batch "
             << mb << " from rank " << sender << " holds " << got[mb].item(0) << ", the payload of "
             << "another message (want " << want << ")";
  }
  return testing::AssertionSuccess();
}

}  // namespace

TEST(Step2_Tags, OnePerFlowMicroBatchAndChunk) {
  std::set<int> seen;
  for (lab08::Flow f : {lab08::Flow::activation, lab08::Flow::gradient})
    for (int c = 0; c < lab08::kMaxChunks; ++c)
      for (int mb = 0; mb < lab08::kMaxMicroBatches; ++mb) {
        const int tag = lab08::message_tag(f, mb, c);
        ASSERT_GE(tag, 0);
        ASSERT_LT(tag, 2 * lab08::kMaxChunks * lab08::kMaxMicroBatches) << "MPI's tag space";
        ASSERT_TRUE(seen.insert(tag).second)
            << "two messages share tag " << tag << " (micro-batch " << mb << ", chunk " << c << ")";
      }
}

TEST(Step2_SendRecv, EachReceiveGetsTheMicroBatchItNames) {
  comm::Communicator pp = labtest::new_world();
  const int p = pp.size(), s = pp.rank();
  const bool has_next = s + 1 < p, has_prev = s > 0;
  const comm::Traffic c0 = comm::traffic();
  // Every stage first starts all its sends (activations forward, gradients backward: both
  // neighbours send to each other at once, a deadlock if a send waited for its receive) ...
  std::vector<Tensor> out;
  std::vector<comm::Work> sends;
  for (int mb = 0; mb < kM; ++mb) {
    if (has_next) {
      out.push_back(filled(payload(s, lab08::Flow::activation, mb)));
      sends.push_back(lab08::send_to(pp, out.back(), s + 1, lab08::Flow::activation, mb));
    }
    if (has_prev) {
      out.push_back(filled(payload(s, lab08::Flow::gradient, mb)));
      sends.push_back(lab08::send_to(pp, out.back(), s - 1, lab08::Flow::gradient, mb));
    }
  }
  // ... then receives them in another order.
  std::vector<Tensor> acts(kM), grads(kM);
  for (int mb : kReceiveOrder) {
    if (has_prev) {
      lab08::Incoming in = lab08::recv_from(pp, kShape, s - 1, lab08::Flow::activation, mb);
      in.work.wait();
      acts[mb] = in.t;
    }
    if (has_next) {
      lab08::Incoming in = lab08::recv_from(pp, kShape, s + 1, lab08::Flow::gradient, mb);
      in.work.wait();
      grads[mb] = in.t;
    }
  }
  comm::wait_all(sends);
  testing::AssertionResult ok = testing::AssertionSuccess();
  if (has_prev) ok = got_the_right_ones(acts, s - 1, lab08::Flow::activation);
  if (ok && has_next) ok = got_the_right_ones(grads, s + 1, lab08::Flow::gradient);
  EXPECT_TRUE(pptest::on_every_rank(ok));
  // One message per micro-batch and direction, each exactly one (B/m, T, C) float32 tensor.
  // Exactly that, to and from each neighbour, and nothing else on any communicator.
  const comm::Traffic moved = comm::traffic() - c0;
  const int64_t msg = 2 * 16 * 32 * 4;
  labtest::TrafficBudget budget;
  if (has_next) budget.send(pp, s + 1, kM, kM * msg).recv(pp, s + 1, kM, kM * msg);
  if (has_prev) budget.send(pp, s - 1, kM, kM * msg).recv(pp, s - 1, kM, kM * msg);
  EXPECT_TRUE(labtest::exact_traffic(moved, budget));
}

TEST(Step2_SendRecv, LargeMessagesBothWaysAtOnce) {
  // 1F1B's steady state with messages past MPI's eager limit (256 KiB): every stage sends to
  // both neighbours before receiving. A send that waits for its receive hangs here (the
  // watchdog then names the rank and the send it waits in).
  comm::Communicator pp = labtest::new_world();
  const int p = pp.size(), s = pp.rank();
  const std::vector<int64_t> big = {2, 64, 512};
  std::vector<Tensor> out;
  std::vector<comm::Work> sends;
  if (s + 1 < p) {
    out.push_back(Tensor::empty(big));
    ops::fill(out.back(), s + 0.5);
    sends.push_back(lab08::send_to(pp, out.back(), s + 1, lab08::Flow::activation, 1));
  }
  if (s > 0) {
    out.push_back(Tensor::empty(big));
    ops::fill(out.back(), -s - 0.5);
    sends.push_back(lab08::send_to(pp, out.back(), s - 1, lab08::Flow::gradient, 0));
  }
  bool ok = true;
  if (s > 0) {
    lab08::Incoming in = lab08::recv_from(pp, big, s - 1, lab08::Flow::activation, 1);
    in.work.wait();
    ok = ok && in.t.item(0) == s - 1 + 0.5;
  }
  if (s + 1 < p) {
    lab08::Incoming in = lab08::recv_from(pp, big, s + 1, lab08::Flow::gradient, 0);
    in.work.wait();
    ok = ok && in.t.item(in.t.numel() - 1) == -(s + 1) - 0.5;
  }
  comm::wait_all(sends);
  EXPECT_TRUE(pptest::on_every_rank(ok ? testing::AssertionSuccess()
                                       : testing::AssertionFailure() << "wrong payload"));
}

TEST(Step2_SendRecv, ChunksAreDifferentMessages) {
  // The same micro-batch for two chunks (interleaved): two messages, never confused.
  comm::Communicator pp = labtest::new_world();
  const int p = pp.size(), s = pp.rank();
  const int next = (s + 1) % p, prev = (s + p - 1) % p;
  Tensor c0 = filled(10.0 + s), c1 = filled(20.0 + s);
  std::vector<comm::Work> sends = {lab08::send_to(pp, c0, next, lab08::Flow::activation, 0, 0),
                                   lab08::send_to(pp, c1, next, lab08::Flow::activation, 0, 1)};
  lab08::Incoming in1 = lab08::recv_from(pp, kShape, prev, lab08::Flow::activation, 0, 1);
  lab08::Incoming in0 = lab08::recv_from(pp, kShape, prev, lab08::Flow::activation, 0, 0);
  in1.work.wait();
  in0.work.wait();
  comm::wait_all(sends);
  const bool ok = in0.t.item(0) == 10.0 + prev && in1.t.item(0) == 20.0 + prev;
  EXPECT_TRUE(pptest::on_every_rank(ok ? testing::AssertionSuccess()
                                       : testing::AssertionFailure()
                                             << "chunk 0 got " << in0.t.item(0) << ", chunk 1 got "
                                             << in1.t.item(0)));
}

TEST(Step2_SendRecv, AReceivePostedBeforeItsSendReturnsAtOnce) {
  // Rank 0 calls recv_from for a message rank 1 sends only once rank 0 says its receive is
  // posted (or after kPatience seconds, so a receive that blocks is named, not a hang): the
  // receive must return before its message exists (planted: blocking_recv). A pipeline stage
  // posts its receive, computes or sends, and only then waits.
  comm::Communicator pp = labtest::new_world();
  const int s = pp.rank();
  constexpr int kPosted = 2 * lab08::kMaxChunks * lab08::kMaxMicroBatches + 1;  // no lab08 tag
  constexpr double kPatience = 3.0;
  testing::AssertionResult ok = testing::AssertionSuccess();
  pp.barrier();
  if (s == 0) {
    lab08::Incoming in = lab08::recv_from(pp, kShape, 1, lab08::Flow::gradient, 1);
    const Tensor posted = filled(1.0);
    comm::Work said = pp.send_async(posted, 1, kPosted);
    in.work.wait();
    said.wait();
    if (in.t.item(0) != 7.5) ok = testing::AssertionFailure() << "wrong payload";
  } else if (s == 1) {
    Tensor heard_buf = Tensor::empty(kShape);
    comm::Work heard = pp.recv_async(heard_buf, 0, kPosted);
    const auto t0 = std::chrono::steady_clock::now();
    bool posted = false;
    while (!(posted = heard.test()) &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < kPatience)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const Tensor out = filled(7.5);
    comm::Work sent = lab08::send_to(pp, out, 0, lab08::Flow::gradient, 1);
    sent.wait();
    heard.wait();
    if (!posted)
      ok = testing::AssertionFailure()
           << "rank 0's recv_from, called before rank 1 sent its message, had not returned "
           << kPatience << " s later: a receive is started and returned at once (the caller "
           << "waits on its Work later), so a stage can post it before its neighbour sends";
  }
  EXPECT_TRUE(pptest::on_every_rank(ok));
}

TEST(Step2_SendRecv, ABfloat16MessageArrivesInBfloat16) {
  // Mixed precision: run_schedule moves activations and gradients in the model's compute dtype
  // (bf16) and passes it to recv_from, whose buffer must be of that dtype. Every stage sends one
  // bf16 message to the next (in a ring) and receives one from the previous.
  comm::Communicator pp = labtest::new_world();
  const int p = pp.size(), s = pp.rank();
  const int next = (s + 1) % p, prev = (s + p - 1) % p;
  Tensor out = Tensor::empty(kShape, DType::bf16);
  ops::fill(out, s + 0.5);  // exact in bf16
  std::vector<comm::Work> sends = {lab08::send_to(pp, out, next, lab08::Flow::activation, 2)};
  lab08::Incoming in =
      lab08::recv_from(pp, kShape, prev, lab08::Flow::activation, 2, 0, DType::bf16);
  std::string failed;  // a buffer of another dtype fails the receive (the sizes differ)
  try {
    in.work.wait();
  } catch (const std::exception& e) {
    failed = e.what();
  }
  comm::wait_all(sends);
  testing::AssertionResult ok = testing::AssertionSuccess();
  if (!in.t.defined() || in.t.dtype() != DType::bf16)
    ok = testing::AssertionFailure()
         << "recv_from(..., DType::bf16) gave a buffer of "
         << (in.t.defined() ? dtype_name(in.t.dtype()) : "nothing")
         << ": a receive is in the dtype it is given (bf16 activations in mixed precision)"
         << (failed.empty() ? "" : "; the receive then failed: " + failed);
  else if (!failed.empty())
    ok = testing::AssertionFailure() << "the bf16 receive failed: " << failed;
  else if (in.t.shape() != kShape)
    ok = testing::AssertionFailure() << "the bf16 message arrived as " << in.t.str();
  if (ok) {
    Tensor got = Tensor::empty(kShape);
    ops::cast(got, in.t);
    if (got.item(0) != prev + 0.5)
      ok = testing::AssertionFailure() << "the bf16 message from rank " << prev << " holds "
                                       << got.item(0) << ", not its payload " << prev + 0.5;
  }
  EXPECT_TRUE(pptest::on_every_rank(ok));
}

// On a GPU, run_schedule passes the model's device to recv_from, and the message must land in
// device memory: a buffer made on the host would be handed to the next piece's forward beside
// device weights. Here the device is the simulated GPU (Device::sim, host memory closed to host
// code as a GPU's): each stage sends one message around a ring and receives one from there.
TEST(Step2_SendRecv, AMessageArrivesOnTheDeviceItIsGiven) {
  comm::Communicator pp = labtest::new_world();
  const int p = pp.size(), s = pp.rank();
  const int next = (s + 1) % p, prev = (s + p - 1) % p;
  const Device sim = Device::sim();
  Tensor out = Tensor::empty(kShape, DType::f32, sim);
  ops::fill(out, s + 0.5);
  std::vector<comm::Work> sends = {lab08::send_to(pp, out, next, lab08::Flow::activation, 3)};
  lab08::Incoming in =
      lab08::recv_from(pp, kShape, prev, lab08::Flow::activation, 3, 0, DType::f32, sim);
  in.work.wait();
  comm::wait_all(sends);
  testing::AssertionResult ok = testing::AssertionSuccess();
  if (!in.t.defined() || in.t.device() != sim)
    ok = testing::AssertionFailure()
         << "recv_from(..., Device::sim()) gave a buffer "
         << (in.t.defined() ? "on " + in.t.device().str() : std::string("that is not defined"))
         << ": a receive lands on the device it is given (the model's: a GPU's memory on a GPU)";
  else if (in.t.shape() != kShape || in.t.to_vector().front() != prev + 0.5)
    ok = testing::AssertionFailure() << "the message from rank " << prev << " arrived as "
                                     << in.t.str() << " holding " << in.t.to_vector().front()
                                     << ", not its payload " << prev + 0.5;
  EXPECT_TRUE(pptest::on_every_rank(ok));
}

TEST(Step2_PlantedFault, ReceiveThatIgnoresTheMicroBatchIsCaught) {
  // The fault: every message of a pair of stages under one tag. Messages with the same tag
  // arrive in the order they were sent, so receiving micro-batch 3 first gets micro-batch 0.
  comm::Communicator pp = labtest::new_world();
  const int p = pp.size(), s = pp.rank();
  std::vector<Tensor> out;
  std::vector<comm::Work> sends;
  if (s + 1 < p)
    for (int mb = 0; mb < kM; ++mb) {
      out.push_back(filled(payload(s, lab08::Flow::activation, mb)));
      sends.push_back(pp.send_async(out.back(), s + 1, /*tag=*/0));
    }
  std::vector<Tensor> acts(kM);
  if (s > 0)
    for (int mb : kReceiveOrder) {
      acts[mb] = Tensor::empty(kShape);
      pp.recv(acts[mb], s - 1, /*tag=*/0);
    }
  comm::wait_all(sends);
  const testing::AssertionResult ok =
      s > 0 ? got_the_right_ones(acts, s - 1, lab08::Flow::activation) : testing::AssertionSuccess();
  if (p > 1)
    EXPECT_FALSE(pptest::on_every_rank(ok))
        << "the check of Step2_SendRecv must fail when a receive does not name its micro-batch";
}
