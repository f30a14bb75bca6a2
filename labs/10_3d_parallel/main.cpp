// Lab 10 driver (not edited by attendees): trains one GPT on a dp x tp x pp grid of ranks (your
// step 2 model, your step 3 step), prints the grid's group table, this rank layout's stages and
// the single-device twin's losses beside its own for the first steps.
//
//   ./scalelab run 10 --solution -n 8 -- --dp 2 --tp 2 --pp 2
//   ./scalelab run 10 -n 4 -- --dp 1 --tp 2 --pp 2 --grid-order picotron --steps 5
#include <memory>

#include <fmt/format.h>

#include "3d_parallel.hpp"
#include "common/cli.hpp"
#include "common/comm/stats.hpp"
#include "common/log.hpp"
#include "common/metrics.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"
#include "common/train/loop.hpp"

using namespace scalelab;
using namespace scalelab::lab10;

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    auto options = cli::make_options("lab10_3d_parallel",
                                     "Lab 10: one GPT trained on a dp x tp x pp grid of ranks");
    cli::add_run_options(options);
    train::add_train_options(options, {.model = "small", .batch = 8, .steps = 10});
    options.add_options("lab 10")
        ("dp", "data-parallel replicas", cxxopts::value<int>()->default_value("1"))
        ("tp", "tensor-parallel ranks per stage", cxxopts::value<int>()->default_value("1"))
        ("pp", "pipeline stages", cxxopts::value<int>()->default_value("1"))
        ("grid-order", "megatron (tp, dp, pp from the inside out) or picotron (tp, pp, dp)",
         cxxopts::value<std::string>()->default_value("megatron"))
        ("micro-batches", "micro-batches per replica and step (m)",
         cxxopts::value<int>()->default_value("2"))
        ("twin-steps", "steps compared with the single-device twin (rank 0)",
         cxxopts::value<int>()->default_value("3"));
    const auto parsed = cli::parse(options, argc, argv);
    const auto run = cli::run_options(parsed);
    const auto opt = train::read_train_options(parsed);
    const GridShape shape{parsed["dp"].as<int>(), parsed["tp"].as<int>(), parsed["pp"].as<int>(),
                          comm::parse_grid_order(parsed["grid-order"].as<std::string>())};
    const int m = parsed["micro-batches"].as<int>();
    const int twin_steps = parsed["twin-steps"].as<int>();
    const ModelConfig config = model_config(opt.model);

    auto world = comm::Communicator::world(run.backend);
    // Bad grids are usage errors on every rank, before any data is read.
    check_3d(config, shape, world.size(), opt.batch, m);
    SCALELAB_REQUIRE(run.device == "cpu", "lab 10 runs on the CPU (lab 07's operators are CPU "
                                          "only), got --device {}", run.device);

    const comm::ProcessGrid grid(world, shape.dp, shape.tp, shape.pp, shape.order);
    Groups g = groups_of(grid);
    const auto tokens = train::load_train_tokens(opt);
    data::Sampler sampler(tokens, opt.batch, config.block_size, run.seed);
    auto model = build_3d_model(config, g, {.seed = run.seed});
    optim::AdamW adamw(optim::groups(model->parameters()));

    log::info("lab 10 3d_parallel: model {} ({} layers, {} heads), global batch {} = dp {} x {} "
              "micro-batches of {} rows, {} steps", config.name, config.n_layer, config.n_head,
              opt.batch, shape.dp, m, opt.batch / shape.dp / m, opt.steps);
    log::info("{}", grid.table());
    for (int s = 0; s < shape.pp; ++s) {  // what every stage holds (the same rule on every rank)
      const lab08::LayerRange r = lab08::stage_layers(static_cast<int>(config.n_layer), shape.pp, s);
      log::info("stage {}: blocks [{}, {}){}{}, each block split over tp {}", s, r.first, r.last,
                s == 0 ? ", embedding" : "", s == shape.pp - 1 ? ", ln_f and head" : "", shape.tp);
    }
    // Parameters per rank: gathered to show that the model is cut, not copied.
    Tensor mine = Tensor::from_vector({static_cast<double>(model->num_parameters())}, {1},
                                      DType::f64);
    Tensor all = Tensor::zeros({world.size()}, DType::f64);
    world.all_gather(mine, all);
    std::string per_rank;
    for (double x : all.to_vector()) per_rank += fmt::format(" {:.0f}", x);
    log::info("parameters per rank:{} (the whole model: {})", per_rank, parameter_count(config));

    // The single-device twin (world rank 0): the same seed, the same global batches, AdamW.
    std::unique_ptr<nn::GPT> twin;
    std::unique_ptr<optim::AdamW> twin_opt;
    if (world.rank() == 0 && twin_steps > 0) {
      twin = std::make_unique<nn::GPT>(config, nn::GPTOptions{.seed = run.seed});
      twin_opt = std::make_unique<optim::AdamW>(optim::groups(twin->parameters()));
    }
    train::StepReporter reporter(config, opt.batch * config.block_size, Device::cpu(),
                                 opt.peak_tflops, world);
    for (int64_t step = 0; step < opt.steps; ++step) {
      const double lr = train::learning_rate(opt, step);
      metrics::Timer timer(Device::cpu());
      const data::Batch batch = sampler.batch(step);
      if (step == 0) comm::reset_comm_stats();
      const double loss = step_3d(*model, g, batch, m);
      adamw.step(lr);
      const double dt = timer.elapsed();
      if (step == 0) {
        const comm::CommStats first = comm::comm_stats();
        log::info("payload bytes of step 0 on rank 0, per group (tp: the blocks' all-reduces; "
                  "pp: activations and gradients, the tied embedding; dp: the gradients):\n{}",
                  comm::format_comm_stats(first));
      }
      log::info("{}", reporter.line(step, loss, dt, lr));
      if (twin && step < twin_steps) {
        twin->zero_grad();
        const double want = twin->forward(batch.x, batch.y);
        twin->backward();
        twin_opt->step(lr);
        log::info("  single-device twin step={} loss={:.6f} (3D - twin: {:+.2e})", step, want,
                  loss - want);
      }
    }
    return 0;
  });
}
