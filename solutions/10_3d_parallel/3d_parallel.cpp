// Lab 10: 3D parallelism (see 3d_parallel.hpp for the contract, README.md for the steps).
#include "3d_parallel.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/ops/flash_attention.hpp"
#include "common/ops/ops.hpp"
#include "common/train/global_loss.hpp"

namespace scalelab::lab10 {

// ---- Step 1 -------------------------------------------------------------------------------------

int grid_rank(const GridShape& shape, const GridCoord& c) {
  int rank = 0;
  // BEGIN SOLUTION step 1: the world rank of a coordinate, tp innermost in both orders
  // HINT: like a number written in mixed radix: the innermost axis is the last digit.
  if (shape.order == GridOrder::megatron)
    rank = (c.pp * shape.dp + c.dp) * shape.tp + c.tp;  // pp outermost, then dp, then tp
  else
    rank = (c.dp * shape.pp + c.pp) * shape.tp + c.tp;  // dp outermost, then pp, then tp
  // END SOLUTION
  return rank;
}

GridCoord grid_coord(const GridShape& shape, int rank) {
  GridCoord c;
  // BEGIN SOLUTION step 1: the coordinate of a world rank (grid_rank's inverse)
  c.tp = rank % shape.tp;
  const int rest = rank / shape.tp;
  if (shape.order == GridOrder::megatron) {
    c.dp = rest % shape.dp;
    c.pp = rest / shape.dp;
  } else {
    c.pp = rest % shape.pp;
    c.dp = rest / shape.pp;
  }
  // END SOLUTION
  return c;
}

std::vector<int> group_ranks(const GridShape& shape, int rank, Axis axis) {
  std::vector<int> ranks;
  // BEGIN SOLUTION step 1: vary one coordinate, keep the other two
  const GridCoord me = lab10::grid_coord(shape, rank);  // (comm:: has one too: ours)
  const int n = axis == Axis::tp ? shape.tp : axis == Axis::dp ? shape.dp : shape.pp;
  for (int i = 0; i < n; ++i) {
    GridCoord c = me;
    (axis == Axis::tp ? c.tp : axis == Axis::dp ? c.dp : c.pp) = i;
    ranks.push_back(lab10::grid_rank(shape, c));
  }
  // END SOLUTION
  return ranks;
}

// ---- given: check_3d and groups_of are in grid_setup.cpp ----------------------------------------

// ---- Step 2 -------------------------------------------------------------------------------------

std::unique_ptr<nn::GPT> build_3d_model(const ModelConfig& config, Groups& g,
                                        nn::GPTOptions options, bool checkpoint) {
  std::unique_ptr<nn::GPT> model;
  // BEGIN SOLUTION step 2: a pipeline stage of tensor-parallel blocks, vocabulary-parallel ends
  // HINT: nn::GPTOptions: first_block / last_block (lab08::stage_layers), tp_rank / tp_size and
  // HINT: cut_block (lab07::cut_block), vocab_lo / vocab_hi (lab07::vocab_range). Then the model's
  // HINT: hook points: set_mappings (lab 07's TensorParallel on g.tp), set_block_policy.
  const lab08::LayerRange r =
      lab08::stage_layers(static_cast<int>(config.n_layer), g.shape.pp, g.coord.pp);
  const lab07::VocabRange v = lab07::vocab_range(config.vocab_size, g.coord.tp, g.shape.tp);
  const int rank = g.coord.tp, tp = g.shape.tp;
  options.first_block = r.first;
  options.last_block = r.last;
  options.tp_rank = rank;
  options.tp_size = tp;
  options.cut_block = [config, rank, tp](nn::Block& b) { lab07::cut_block(b, config, rank, tp); };
  options.vocab_lo = v.lo;
  options.vocab_hi = v.hi;
  model = std::make_unique<nn::GPT>(config, options);
  // the blocks' f and g and the vocabulary-parallel ends, all on this rank's tp group
  model->set_mappings(std::make_shared<lab07::TensorParallel>(g.tp));
  if (checkpoint) model->set_block_policy(std::make_shared<FullCheckpoint>());
  // END SOLUTION
  return model;
}

// ---- Step 3 -------------------------------------------------------------------------------------

data::Batch dp_rows(const data::Batch& global, const Groups& g) {
  data::Batch mine;
  // BEGIN SOLUTION step 3: this dp replica's rows
  const int64_t b = global.batch_size() / g.shape.dp;
  mine = global.rows(g.coord.dp * b, (g.coord.dp + 1) * b);
  // END SOLUTION
  return mine;
}

double step_3d(nn::GPT& model, Groups& g, const data::Batch& global, int micro_batches,
               lab08::ExecStats* stats) {
  double loss = 0;
  // BEGIN SOLUTION step 3: the global batch's gradients and loss, each collective on its own group
  // HINT: the loss run_schedule returns is this replica's: the global one averages the replicas.
  model.zero_grad();
  const data::Batch mine = dp_rows(global, g);
  const int64_t b = mine.batch_size() / micro_batches;
  std::vector<data::Batch> micro;
  for (int i = 0; i < micro_batches; ++i) micro.push_back(mine.rows(i * b, (i + 1) * b));
  const lab08::Schedule schedule = lab08::schedule_1f1b(g.shape.pp, micro_batches, g.coord.pp);
  const std::vector<nn::GPT*> pieces = {&model};
  loss = lab08::run_schedule(pieces, schedule, micro, g.pp, stats);
  // The first and last stage of THIS pipeline (same dp, same tp) hold the two copies of this tp
  // rank's vocabulary rows of wte: the other tp ranks hold other rows.
  lab08::sync_tied_gradients(pieces, g.pp);
  // The replicas of this shard (same tp, same pp) saw different rows: average. The tp ranks hold
  // different slices, so a reduction over tp would add unrelated numbers.
  g.dp.all_reduce(model.params().grads(), comm::ReduceOp::avg);
  loss = train::global_loss(loss, g.dp);
  // END SOLUTION
  return loss;
}

// ---- given: Zero1Optimizer, check_runnable and Trainer3D are in trainer3d.cpp -------------------

// ---- Step 4 -------------------------------------------------------------------------------------

int64_t stage_parameters(const ModelConfig& config, int tp, int pp, int stage) {
  int64_t n = 0;
  // BEGIN SOLUTION step 4: what step 2's model holds, counted
  const int64_t C = config.n_embd, V = config.vocab_size;
  const lab08::LayerRange r = lab08::stage_layers(static_cast<int>(config.n_layer), pp, stage);
  const int64_t whole = 2 * C + 2 * C + C + C;  // ln1, ln2, the two row-parallel biases
  const int64_t split = (3 * C * C + 3 * C) + C * C + (4 * C * C + 4 * C) + 4 * C * C;
  n = r.size() * (whole + split / tp);
  if (stage == 0) n += V * C / tp + config.block_size * C;  // wte (V/tp rows), wpe whole
  if (stage == pp - 1) n += 2 * C + (stage == 0 ? 0 : V * C / tp);  // ln_f, the copy's rows
  // END SOLUTION
  return n;
}

std::size_t model_state_bytes(int64_t params, int zero_stage, int dp, DType precision) {
  std::size_t bytes = 0;
  // BEGIN SOLUTION step 4: the model state a rank keeps between steps, ZeRO sharding over dp
  // HINT: master_dtype(precision) for value, gradient, m and v; bf16 adds the 2-byte copy.
  const double p = static_cast<double>(params);
  const double value = zero_stage >= 3 ? p / dp : p;
  const double grad = zero_stage >= 2 ? p / dp : p;
  const double state = zero_stage >= 1 ? 2 * p / dp : 2 * p;
  // mixed precision: the whole bf16 compute copy (ZeRO-3 gathers it unit by unit instead)
  const double copy = precision == DType::bf16 && zero_stage < 3 ? p : 0;
  bytes = static_cast<std::size_t>(
      (value + grad + state) * static_cast<double>(dtype_size(master_dtype(precision))) +
      copy * static_cast<double>(dtype_size(precision)));
  // END SOLUTION
  return bytes;
}

std::size_t stage_activation_bytes(const ModelConfig& config, int64_t rows, int tp, int pp,
                                   int stage, bool checkpoint, DType precision, int cp,
                                   lab11::Attention attention) {
  int64_t n = 0, stats = 0, lse = 0;  // elements of activations, of LayerNorm statistics, of lse
  // BEGIN SOLUTION step 4: count GPTActivations tensor by tensor
  // HINT: activations are `precision` (bf16 in mixed precision), statistics ops::stats_dtype of it.
  const int64_t C = config.n_embd, V = config.vocab_size;
  const int64_t T = config.block_size / cp;  // this rank's tokens of a row (cp: T/cp of them)
  const int64_t N = rows * T, c = C / tp;    // tokens; this rank's share of a row's C
  const lab08::LayerRange r = lab08::stage_layers(static_cast<int>(config.n_layer), pp, stage);
  const int64_t input = N * C;
  // attention's core: the (T, T) probabilities of this rank's heads, or with cp lab 11's fused
  // core: a log-sum-exp per query and head (all-to-all also keeps its head-split q, k, v, y)
  const int64_t core = cp == 1 ? config.n_head / tp * rows * T * T
                               : (attention == lab11::Attention::all_to_all ? 4 * N * c : 0);
  const int64_t full = 3 * N * C                         // ln1, res2, ln2
                       + 4 * N * c                       // q, k, v, y: this rank's heads
                       + core                            // att (or the cp core's copies)
                       + 2 * N * 4 * c;                  // h, g
  n = r.size() * (input + (checkpoint ? 0 : full));
  stats = checkpoint ? 0 : r.size() * 4 * N;             // ln1's and ln2's mean and rstd
  lse = checkpoint || cp == 1 ? 0 : r.size() * config.n_head / tp * rows * T;
  if (stage == pp - 1) {
    n += 2 * N * C + N * V / tp;                         // x, lnf, probs
    stats += 2 * N;                                      // ln_f's mean and rstd
  }
  // END SOLUTION
  return static_cast<std::size_t>(n) * dtype_size(precision) +
         static_cast<std::size_t>(stats) * dtype_size(ops::stats_dtype(precision)) +
         static_cast<std::size_t>(lse) * dtype_size(ops::flash_attention_lse_dtype(precision));
}

std::size_t backward_transient_bytes(const ModelConfig& config, int64_t rows, int tp, int pp,
                                     int stage, bool checkpoint, DType precision, int cp,
                                     lab11::Attention attention) {
  int64_t n = 0;  // elements (of the activations' dtype: every temporary of a backward is)
  std::size_t recompute = 0;  // bytes of the recomputed block's activations (checkpointing)
  // BEGIN SOLUTION step 4: the largest moment of one micro-batch's backward, temporaries only
  const int64_t C = config.n_embd, T = config.block_size / cp, V = config.vocab_size;
  const int64_t N = rows * T, c = C / tp, A = config.n_head / tp * rows * T * T;
  const lab08::LayerRange r = lab08::stage_layers(static_cast<int>(config.n_layer), pp, stage);
  const int64_t mlp = 2 * N * C + 2 * N * 4 * c;            // dres2, dln2, dg, dh
  // attention: dres2, dx, dln1, dy, dyh, dq, dk, dv and the core's temporaries: the two (T, T)
  // score gradients datt, dpreatt; with cp lab 11's core on y's heads split again (yh), which
  // for the ring is q, the packed K/V, y, dy, dq and the packed dK/dV in chunk order (8 N c),
  // one block's dq, dk, dv of a query chunk (1.5 N c) and the blocks travelling round: the dK/dV
  // in hand and the next one (2 N c each), the next K/V block, and from cp 3 on the received
  // K/V block in hand beside it (double buffering: two remote K/V blocks at most); for
  // all-to-all dy sent and received, dy, dq, dk, dv in its head-split layout and one gradient's
  // way back (3 N c)
  const int64_t ring = 8 * N * c + 3 * N * c / 2 + 6 * N * c + (cp > 2 ? 2 * N * c : 0);
  const int64_t a2a = 9 * N * c;
  const int64_t att = cp == 1 ? 3 * N * C + 5 * N * c + 2 * A
                              : 3 * N * C + 6 * N * c +
                                    (attention == lab11::Attention::ring ? ring : a2a);
  const int64_t qkv = 3 * N * C + 8 * N * c;                // ... dqkv in place of the scores
  const int64_t block = r.size() > 0 ? std::max({mlp, att, qkv}) : 0;
  if (checkpoint && r.size() > 0)  // the recomputed block's activations, its input excepted
    recompute = (stage_activation_bytes(config, rows, tp, pp, stage, false, precision, cp,
                                        attention) -
                 stage_activation_bytes(config, rows, tp, pp, stage, true, precision, cp,
                                        attention)) / r.size();
  n = block;
  if (stage == pp - 1) {
    // freed before the blocks: x, lnf, probs and ln_f's 2 statistics (in their own dtype)
    const std::size_t head_acts = stage_activation_bytes(config, rows, tp, pp, stage, true,
                                                         precision, cp, attention) -
                                  static_cast<std::size_t>(r.size() * N * C) * dtype_size(precision);
    const std::size_t head = static_cast<std::size_t>(2 * N * C) * dtype_size(precision);
    const std::size_t blocks = static_cast<std::size_t>(N * C + block) * dtype_size(precision) +
                               recompute;
    return r.size() > 0 && blocks > head_acts ? std::max(head, blocks - head_acts) : head;
  }
  // END SOLUTION
  return static_cast<std::size_t>(std::max<int64_t>(n, 0)) * dtype_size(precision) + recompute;
}

std::size_t max_in_flight(int pp, int stage, int micro_batches, lab08::Kind schedule,
                          int chunks) {
  int n = 0;
  // BEGIN SOLUTION step 4: the most micro-batches (pieces) the schedule keeps on this stage
  const int m = micro_batches, v = chunks;
  if (schedule == lab08::Kind::afab) n = m;  // every forward before the first backward
  if (schedule == lab08::Kind::one_f_one_b) n = std::min(pp - stage, m);
  // interleaved: its warm-up of forwards, then one more before the first backward
  if (schedule == lab08::Kind::interleaved) n = std::min((pp - stage - 1) * 2 + (v - 1) * pp + 1,
                                                         m * v);
  // END SOLUTION
  return static_cast<std::size_t>(n);
}

Prediction predict(const ModelConfig& config, int64_t global_batch, const Plan& plan,
                   const Machine& machine, DType precision) {
  Prediction best;
  // BEGIN SOLUTION step 4: every stage's memory and time; the busiest one decides
  const GridShape& g = plan.grid;
  const int m = plan.micro_batches;
  // the rank's pieces: its stage, or interleaved its v chunks, virtual stages c * pp + s of
  // pp * v (lab08::chunk_layers' pieces are stage_layers' of pp * v when the layers divide)
  const int v = plan.schedule == lab08::Kind::interleaved ? plan.chunks : 1;
  const int64_t C = config.n_embd, T = config.block_size, V = config.vocab_size;
  const int64_t rows = global_batch / g.dp, mb_rows = rows / m;
  // cp: a rank keeps T/cp tokens of each row, in every activation (the memory functions take
  // cp). The replicas of a shard, over which gradients are averaged and ZeRO shards, are dp x cp.
  const int64_t Tl = T / g.cp, replicas = static_cast<int64_t>(g.dp) * g.cp;
  // bytes of an activation (bf16 in mixed precision), of a master value or gradient (fp32 then),
  // of a statistic (the cross-entropy's per-row numbers)
  const double act = static_cast<double>(dtype_size(precision));
  const double master = static_cast<double>(dtype_size(master_dtype(precision)));
  const double stat = static_cast<double>(dtype_size(ops::stats_dtype(precision)));
  const double mb_bytes = static_cast<double>(mb_rows * Tl * C) * act;
  const double bw = machine.bus_bytes_per_s, lat = machine.latency_s;
  Prediction slowest, largest;
  for (int s = 0; s < g.pp; ++s) {
    int64_t params = 0, layers = 0;
    std::vector<std::size_t> piece_acts;  // one micro-batch's activations of each piece
    std::size_t transient = 0;            // one micro-batch's backward, the largest piece's
    for (int k = 0; k < v; ++k) {
      const int vs = k * g.pp + s;
      params += stage_parameters(config, g.tp, g.pp * v, vs);
      layers += lab08::stage_layers(static_cast<int>(config.n_layer), g.pp * v, vs).size();
      piece_acts.push_back(stage_activation_bytes(config, mb_rows, g.tp, g.pp * v, vs,
                                                  plan.checkpoint, precision, g.cp,
                                                  plan.attention));
      transient = std::max(transient, backward_transient_bytes(config, mb_rows, g.tp, g.pp * v,
                                                               vs, plan.checkpoint, precision,
                                                               g.cp, plan.attention));
    }
    const std::size_t state = model_state_bytes(params, plan.zero_stage,
                                                static_cast<int>(replicas), precision);
    // The activations the schedule holds at once: walk its actions (a forward keeps its piece's,
    // a backward frees them). AFAB and 1F1B: max_in_flight x the stage's.
    std::size_t acts = 0, held = 0;
    for (const lab08::Action& a : lab08::make_schedule(plan.schedule, g.pp, m, v, s)) {
      if (a.op == lab08::Op::forward) held += piece_acts[static_cast<std::size_t>(a.chunk)];
      if (a.op == lab08::Op::backward) held -= piece_acts[static_cast<std::size_t>(a.chunk)];
      acts = std::max(acts, held);
    }
    // One block's parameters (1/tp of its matrices) and the embedding unit's (wte's V/tp rows,
    // wpe).
    const int64_t unit = (stage_parameters(config, g.tp, 1, 0) - V * C / g.tp - T * C - 2 * C) /
                         config.n_layer;
    const int64_t embedding = V * C / g.tp + T * C;
    // ZeRO-2/3's working set during the backward (lab 09's policies): whole unit gradients
    // (master dtype) are bound until reduced: the tied embedding's (with a pipeline: a tied
    // copy's, the embedding or the head's lm_head, kept whole until the tied sum), and the
    // block's being differentiated (an approximation beyond pp = 1); ZeRO-3 also holds that
    // block's gathered values and, when its piece has a block before it, that block's
    // all-gather buffer (the backward's prefetch; the embedding's backward reads no values, a
    // piece's first block has none to fetch) (what the layers read: the bf16 weights in mixed
    // precision).
    if (plan.zero_stage >= 2)
      transient += static_cast<std::size_t>(static_cast<double>(embedding + unit) * master);
    if (plan.zero_stage == 3)
      transient += static_cast<std::size_t>((layers / v >= 2 ? 2.0 : 1.0) * unit * act);
    // FLOPs per token: the blocks' GEMMs (their parameters, 1/tp) and attention, the head's GEMM.
    const double block_params = static_cast<double>(unit) * layers;
    const double blocks = 6 * block_params + 12.0 * layers * T * C / g.tp;
    const double head = s == g.pp - 1 ? 6.0 * V * C / g.tp : 0;
    const double recompute = plan.checkpoint ? blocks / 3 : 0;  // one more forward of the blocks
    // (attention's 12 T C per token is over the whole sequence's keys: cp divides the tokens)
    const double compute = (blocks + head + recompute) * static_cast<double>(rows * Tl) /
                           machine.flops;
    // tp, per micro-batch: 4 all-reduces of (rows/m, T, C) per block (6 with checkpointing: the
    // recomputed forward's 2), the embedding's 1, the head's 1 (f's backward) and the
    // cross-entropy's 3 small ones (rows/m * T numbers: latency, mostly).
    const double ring = 2.0 * (g.tp - 1) / g.tp;
    const double acts_ar = (plan.checkpoint ? 6.0 : 4.0) * layers + (s == 0 ? 1 : 0) +
                           (s == g.pp - 1 ? 1 : 0);
    const double ce_bytes = static_cast<double>(mb_rows * Tl) * stat;
    const double tp_s = g.tp == 1 ? 0 : m * (acts_ar * (ring * mb_bytes / bw + lat) +
                                             (s == g.pp - 1 ? 3 * (ring * ce_bytes / bw + lat) : 0));
    // pp: per micro-batch and piece one activation out and one gradient back (interleaved: v
    // pieces per rank, v times the messages)
    const double pp_s = g.pp == 1 ? 0 : 2.0 * m * v * (mb_bytes / bw + lat);
    // cp, per block and micro-batch: lab 11's ring passes this rank's K/V block (k and v of its
    // rows: 2 x mb_bytes / tp) cp - 1 times forward (again with checkpointing: the recomputed
    // forward) and 2 cp - 1 times backward (the K/V blocks and their gradients going home);
    // all-to-all exchanges q, k, v and y forward (again with checkpointing) and dy, dq, dk, dv
    // backward, each one (rows/m, T/cp, C/tp) activation of which (cp - 1)/cp leaves the rank.
    const double fwd = plan.checkpoint ? 2.0 : 1.0;
    double cp_s = 0;
    if (g.cp > 1 && plan.attention == lab11::Attention::ring)
      cp_s = m * layers * (fwd * (g.cp - 1) + (2.0 * g.cp - 1)) * (2.0 * mb_bytes / g.tp / bw + lat);
    if (g.cp > 1 && plan.attention == lab11::Attention::all_to_all)
      cp_s = m * layers * 4 * (fwd + 1) *
             ((g.cp - 1.0) / g.cp * mb_bytes / g.tp / bw + lat);
    // dp, within the step (the optimizer's all-gather of ZeRO 1/2 comes after it): ZeRO 0/1
    // one all-reduce of the gradients, after the last micro-batch; ZeRO-2 a reduce to the owners
    // per unit (half a ring all-reduce's bytes); ZeRO-3 per unit 2 all-gathers and a
    // reduce-scatter (1.5 all-reduces). ZeRO-2/3 run at every micro-batch's backward (ZeRO-3's
    // gathers at every forward too): m times.
    const double grad_bytes = static_cast<double>(params) * master;  // fp32 in mixed precision
    const double units = static_cast<double>(layers) + (s == 0 ? 1 : 0) + (s == g.pp - 1 ? 1 : 0);
    const double all_reduce = 2.0 * (replicas - 1) / replicas * grad_bytes / bw;
    double dp_s = all_reduce + lat;
    if (plan.zero_stage == 2) dp_s = m * (0.5 * all_reduce + units * lat);
    // (its all-gathers move what the layers read: half the bytes in mixed precision)
    if (plan.zero_stage == 3) dp_s = m * ((0.5 + act / master) * all_reduce + 3 * units * lat);
    if (replicas == 1) dp_s = 0;
    Prediction p;
    p.params = params;
    p.state_bytes = state;
    p.activation_bytes = acts;
    p.transient_bytes = transient;
    p.total_bytes = state + acts + transient;
    p.compute_s = compute;
    p.bubble = lab08::bubble_formula(plan.schedule, g.pp, m, v);
    p.tp_s = tp_s;
    p.pp_s = pp_s;
    p.dp_s = dp_s;
    p.cp_s = cp_s;
    p.step_s = (machine.shared_cores ? compute : compute / (1 - p.bubble)) + tp_s + pp_s + dp_s +
               cp_s;
    if (s == 0 || p.step_s > slowest.step_s) slowest = p;       // sets the pace
    if (s == 0 || p.total_bytes > largest.total_bytes) largest = p;  // must fit
  }
  best = slowest;
  best.params = largest.params;
  best.state_bytes = largest.state_bytes;
  best.activation_bytes = largest.activation_bytes;
  best.transient_bytes = largest.transient_bytes;
  best.total_bytes = largest.total_bytes;
  // END SOLUTION
  return best;
}

// ---- given: measure_machine is in planner_machine.cpp, plan_all in plan_search.cpp --------------

}  // namespace scalelab::lab10
