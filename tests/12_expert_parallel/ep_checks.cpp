#include "tests/12_expert_parallel/ep_checks.hpp"

#include "common/data/sampler.hpp"
#include "common/nn/gpt.hpp"
#include "common/nn/mappings.hpp"

namespace eptest {

Shape draw_shape(int nth) {
  Shape s;
  s.seed = labtest::grading_seed() + static_cast<uint64_t>(nth);
  std::mt19937_64 rng(s.seed);
  s.drawn = nth;
  s.E = 2 + static_cast<int64_t>(rng() % 5);              // 2..6 experts
  s.k = 1 + static_cast<int64_t>(rng() % 2);              // top-1 or top-2
  s.N = 5 + static_cast<int64_t>(rng() % 28);             // 5..32 tokens
  s.C = 3 + static_cast<int64_t>(rng() % 6);              // 3..8 wide
  s.cf = 0.5 + 0.25 * static_cast<double>(rng() % 5);     // 0.5 .. 1.5: drops likely
  return s;
}

Layer::Layer(const MoEConfig& c, int64_t C, uint64_t seed, DType dtype, int ep_rank, int ep_size)
    : moe("moe", C, 2, {.config = c, .ep_rank = ep_rank, .ep_size = ep_size}) {
  set.bind(moe.parameters(), dtype, Device::cpu(), seed);
  // the whole tensors drawn, then this rank's experts kept: every rank agrees on the values
  for (nn::Parameter* p : moe.parameters()) {
    int64_t full = 1;
    for (int64_t d : p->full_shape) full *= d;
    const Tensor all = Tensor::uniform({full}, seed + std::hash<std::string>{}(p->name) % 1000,
                                       dtype, Device::cpu(), -0.5, 0.5);
    const int64_t per = full / p->full_shape[0];
    const int64_t lo = p->shard.whole() ? 0 : p->shard.ranges[0].first;
    p->value.copy_from(all.flat(lo * per, p->value.numel()));
  }
}

lab12::Routing Layer::library_routing(const Tensor& x) const {
  nn::MoEActivations a;
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  nn::Mappings all_here;  // every expert here: the library's own experts_forward
  moe.forward(y, x, a, all_here);
  lab12::Routing r;
  r.probs = a.probs;
  r.values = a.values;
  r.indices = a.indices;
  r.gates = a.gates;
  r.dest = a.dest;
  r.assigned = a.assigned;
  r.kept = a.kept_counts;
  r.capacity = a.capacity;
  r.dropped = a.dropped;
  r.aux = a.aux;
  return r;
}

scalelab::testing::MoEReference Layer::reference(const Tensor& x) const {
  return scalelab::testing::moe_reference(x, moe.router.value, moe.fc_weight.value,
                                         moe.fc_bias.value,
                                moe.proj_weight.value, moe.proj_bias.value, moe.config(), 1);
}

std::string only_all_to_all(const comm::Traffic& did, const std::string& group, int64_t calls,
                            int64_t bytes) {
  std::string seen;
  bool ok = true;
  comm::CommCount a2a;
  for (const auto& [key, count] : did) {
    seen += fmt::format("{}{}: {} calls, {} bytes", seen.empty() ? "" : "; ",
                        comm::traffic_key_str(key), count.calls, count.bytes);
    const bool mine = key.op == "all_to_all" && key.group == group;
    if (mine) a2a.calls += count.calls, a2a.bytes += count.bytes;
    ok = ok && mine;
  }
  ok = ok && a2a.calls == calls && a2a.bytes == bytes;
  if (ok) return "";
  return fmt::format("expected {} all_to_all calls of {} bytes in all on {} and nothing else; "
                     "saw: {}", calls, bytes, group, seen.empty() ? "no traffic" : seen);
}

void model_matches_single_device(DType dt, int ep, int64_t k, double cf) {
  comm::Communicator world = labtest::new_world();
  const int n = world.size();
  ModelConfig config = model_config("tiny-moe");
  config.moe.top_k = k;
  config.moe.capacity_factor = cf;
  const data::Sampler sampler(labtest::synthetic_corpus(3), 2 * n, config.block_size, 12);
  const data::Batch batch = sampler.batch(0);
  lab12::EpGroups groups = lab12::make_ep_groups(world, ep);
  const nn::GPTOptions base{.seed = 77, .compute_dtype = dt};
  nn::GPT model(config, lab12::ep_model_options(base, groups.ep));
  model.set_mappings(lab12::make_ep_mappings(groups.ep));
  nn::GPTOptions twin_options = base;
  twin_options.moe.groups = n;  // one routing group per rank, as the ranks route their own rows
  // a failure names the first tensor off the twin (this rank's rows; its experts' gradients)
  labtest::Explain why(model, twin_options, {.first_row = world.rank() * (batch.x.size(0) / n)});
  const double loss = lab12::ep_forward_backward(model, batch.x, batch.y, world, groups);
  why.step_done(batch);
  nn::GPT twin(config, twin_options);
  twin.zero_grad();
  const double want = twin.forward(batch.x, batch.y);
  twin.backward();
  const bool bf16 = dt == DType::bf16;
  LABTEST_EXPECT(labtest::close_on_every_rank(Tensor::from_vector({loss}, {1}, DType::f64),
                                              Tensor::from_vector({want}, {1}, DType::f64),
                                              bf16 ? 2e-3 : 1e-5, 0),
                 "the loss against the single-device twin's: ");
  // every parameter this rank holds: its gradient against the twin's (its experts' rows)
  std::vector<double> got_all, want_all;
  const std::vector<nn::Parameter*>& mine = model.parameters();
  const std::vector<nn::Parameter*>& theirs = twin.parameters();
  ASSERT_EQ(mine.size(), theirs.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const std::vector<double> g = mine[i]->grad.to_vector();
    const Tensor& tg = theirs[i]->grad;
    const int64_t rows = mine[i]->grad.size(0);
    const int64_t lo = mine[i]->shard.whole() ? 0 : mine[i]->shard.ranges[0].first;
    const std::vector<double> w = tg.rows(lo, lo + rows).clone().to_vector();
    got_all.insert(got_all.end(), g.begin(), g.end());
    want_all.insert(want_all.end(), w.begin(), w.end());
  }
  const int64_t total = static_cast<int64_t>(got_all.size());
  const Tensor got_t = Tensor::from_vector(got_all, {total}, DType::f64);
  const Tensor want_t = Tensor::from_vector(want_all, {total}, DType::f64);
  const char* what = "the gradients this rank holds against the twin's: ";
  if (bf16)
    LABTEST_EXPECT(
        labtest::close_on_every_rank(got_t, want_t, 0, 3e-2 * labtest::max_abs(want_t), why),
        what);
  else
    LABTEST_EXPECT(labtest::close_on_every_rank(got_t, want_t, labtest::kAllReduceRtol,
                                                labtest::kAllReduceAtol, why),
                   what);
}

}  // namespace eptest
