// The strategy search against hand-written strategies, measured:
//
//   source scripts/env.sh; mpirun -n 2 build/benchmarks/bench_search
//
// The model is bench_training's MLP as a searched_mlp (1024 -> 4096, relu, 4096 -> 1024; batch
// 64, double, parallel_cross_entropy, momentum), one training step through the driver
// (xshard::trainer::train_step). First the GEMM speed and the memory bandwidth of one rank are
// measured (the cost model's `gemm_flops` and `memory_bandwidth`: a momentum update on every
// rank at once), then every hand strategy of the exhaustive set below is timed, and the
// search's choice (recursive_programming over every dp x tp x pp and hsdp level) is timed
// the same way. Pipelined strategies run through the driver's pipeline (mesh pp x dp x tp),
// cut where the cost model prices the cut.
//
// Cases:
//   hand_<name>: each hand strategy's measured step time against its predicted one (baseline
//       "predicted": ratio = measured / predicted, the cost model's error). The set, on p ranks:
//       dp (mesh p x 1, weights replicated), dp_hsdp1, dp_hsdp2 (the same under optimizer
//       sharding level1 / level2), dp_over_tp (mesh 1 x p, rows over every rank),
//       tp_megatron (mesh 1 x p: column- then row-parallel), tp_gather (column-parallel, its
//       output gathered, the second layer replicated), tp_row_first (the first layer's input
//       split by features: row- then column-parallel), pp (mesh p x 1 x 1: p pipeline stages,
//       4 micro-batches, 1F1B, weights replicated).
//   searched_mlp: the searched strategy's measured step against the fastest hand strategy's
//       (baseline "best_hand_strategy"), target ratio <= 1.10.
//   hand_transformer_<name>: a transformer's hand strategies (xshard::searched_transformer: 2
//       blocks, 256 features, 8 heads, 64 tokens per sequence, vocabulary 4000, 16 sequences;
//       --quick: 64 features, 4 heads, 16 tokens, vocabulary 500), measured against predicted:
//       dp (mesh p x 1) and megatron (mesh 1 x p: qkv and up split by columns, proj and down
//       by rows, the head's classes over tp for the vocabulary-parallel loss).
//   searched_transformer: the searched strategy's measured step against the faster hand
//       strategy's (baseline "best_hand_strategy"); searched_transformer_predicted: its
//       prediction against its measurement.

#include <xshard/comm/environment.hpp>
#include <xshard/driver/auto_parallel.hpp>
#include <xshard/driver/trainer.hpp>
#include <xshard/models/searched_mlp.hpp>
#include <xshard/models/searched_transformer.hpp>
#include <xshard/nn/embedding.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/search/calibrate.hpp>
#include <xshard/search/networks.hpp>
#include <xshard/search/recursive_programming.hpp>
#include <xshard/tensor/distribute.hpp>

#include "harness.hpp"

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace {

namespace bench = xshard::bench;
using mesh_t = xshard::mesh<"dp", "tp">;
using mlp_t = xshard::searched_mlp<double, mesh_t>;
using transformer_t = xshard::searched_transformer<double, mesh_t>;
using xshard::activation_split, xshard::weight_split, xshard::op_choice;

using pp_mesh_t = xshard::mesh<"pp", "dp", "tp">;

struct hand {
    std::string name;
    xshard::parallel_degrees degrees; ///< dp, tp, pp, micro-batches, hsdp level
    std::vector<op_choice> choices;
};

/// The measured seconds of one training step of `model` (its strategy applied) through the
/// driver over mesh `full` under hsdp level `hsdp`, on the batch (xs, ys): the median of
/// `o.reps` timed batches. With `stages` > 1 the steps run through the pipeline over `full`'s
/// axis pp, `micro` micro-batches, the modules on the stages `stage_config` says.
template <class Model, xshard::mesh_type Full, class X, class Y>
double time_steps(const bench::options& o, const Full& full, Model& model, int hsdp, const X& xs,
                  const Y& ys, int stages = 1, int micro = 1,
                  std::map<std::string, int> stage_config = {}) {
    xshard::auto_parallel<Model, Full> net(model, full);
    if (stages > 1)
        net.pipeline(stages);
    if (hsdp > 0)
        net.hsdp(-1, 0, hsdp == 1 ? "level1" : "level2");
    xshard::optim::momentum opt({.lr = 1e-3, .momentum = 0.9});
    xshard::nn::parallel_cross_entropy<double, mesh_t> loss;
    xshard::trainer trainer(net, loss, opt,
                            {.micro_batches = micro, .stage_config = std::move(stage_config)});
    const auto step = [&] {
        (void)trainer.train_step(xs, ys);
    };
    step(); // warm-up: plans built
    std::vector<double> t;
    for (int r = 0; r < o.reps; ++r)
        t.push_back(bench::time_batch(full.comm(), step, o.quick ? 1 : 3));
    return bench::median(t);
}

/// The measured seconds of one training step of `widths` with `choices` on degrees `d` (mesh
/// pp x dp x tp), the operators on the stages `stage_of` gives (under a pipeline).
double measure(const xshard::communicator& world, const bench::options& o,
               const std::vector<std::size_t>& widths, std::size_t batch,
               const xshard::parallel_degrees& d, const std::vector<op_choice>& choices,
               const std::vector<int>& stage_of) {
    const pp_mesh_t full(world, {d.pp, d.dp, d.tp});
    const auto m = xshard::pipeline::stage_mesh_of<mesh_t>(full);
    mlp_t model(m, widths, batch, 1);
    model.apply_strategy(choices);
    std::map<std::string, int> stage_config;
    if (d.pp > 1)
        for (std::size_t i = 0; i < stage_of.size(); ++i)
            stage_config[model.spec().ops[i].name] = stage_of[i];
    std::mt19937 e(7);
    const xt::xtensor<double, 2> x =
        xt::random::randn<double>({batch, widths.front()}, 0.0, 1.0, e);
    const xt::xtensor<std::int64_t, 1> y =
        xt::random::randint<std::int64_t>({batch}, 0, std::int64_t(widths.back()), e);
    return time_steps(
        o, full, model, d.hsdp_level,
        xshard::distribute<xshard::dynamic_layout(2)>(m, x, xshard::nn::make_layout({"dp", ""})),
        xshard::distribute<xshard::dynamic_layout(1)>(m, y, xshard::nn::make_layout({"dp"})),
        d.pp, d.micro_batches, std::move(stage_config));
}

/// The measured seconds of one training step of the transformer `sizes` (`batch` sequences)
/// with `choices` on mesh dp x tp.
double measure_transformer(const xshard::communicator& world, const bench::options& o,
                           const xshard::transformer_sizes& sizes, std::size_t batch, int dp,
                           int tp, int hsdp, const std::vector<op_choice>& choices) {
    const mesh_t m(world, {dp, tp});
    transformer_t model(m, sizes, batch, 1);
    model.apply_strategy(choices);
    std::mt19937 e(7);
    const auto v = std::int64_t(sizes.vocabulary);
    const std::size_t tokens = batch * sizes.sequence;
    const xt::xtensor<std::int64_t, 1> x = xt::random::randint<std::int64_t>({tokens}, 0, v, e);
    const xt::xtensor<std::int64_t, 1> y = xt::random::randint<std::int64_t>({tokens}, 0, v, e);
    const auto over_dp = xshard::nn::make_layout({"dp"});
    return time_steps(o, m, model, hsdp,
                      xshard::distribute<xshard::dynamic_layout(1)>(m, x, over_dp),
                      xshard::distribute<xshard::dynamic_layout(1)>(m, y, over_dp));
}

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto o = bench::options::parse(argc, argv);
    const auto world = xshard::communicator::world();
    const int p = world.size();
    const std::vector<std::size_t> widths = o.quick ? std::vector<std::size_t>{64, 256, 64}
                                                    : std::vector<std::size_t>{1024, 4096, 1024};
    const std::size_t batch = 64;

    // The cost model's GEMM speed (the first layer's product) and memory bandwidth (an update
    // of the first weight's share), measured on every rank at once (search/calibrate.hpp).
    xshard::search_options so;
    so.ranks = p;
    so.machine.optimizer_states = 1; // momentum: one slot per weight (the default is Adam's two)
    so.machine = xshard::measure_machine<double>(
        world, so.machine,
        {.rows = batch, .in = widths[0], .out = widths[1],
         .elements = widths[0] * widths[1] / std::size_t(p), .repeats = 5});
    if (world.rank() == 0)
        std::fprintf(stderr,
                     "bench_search: %d ranks, GEMM %.2f GFLOP/s, update %.2f GB/s per rank\n", p,
                     so.machine.gemm_flops / 1e9, so.machine.memory_bandwidth / 1e9);

    const auto net = xshard::mlp_network(widths, batch);
    using enum activation_split;
    const op_choice rep_rows{rows, weight_split::replicated, rows};
    std::vector<hand> hands{
        {"dp", {p, 1, 1, 1, 0}, {rep_rows, {rows, weight_split::replicated, rows}, rep_rows}},
        {"dp_hsdp1", {p, 1, 1, 1, 1}, {rep_rows, rep_rows, rep_rows}},
        {"dp_hsdp2", {p, 1, 1, 1, 2}, {rep_rows, rep_rows, rep_rows}},
        {"dp_over_tp",
         {1, p, 1, 1, 0},
         {{rows, weight_split::replicated, all_rows},
          {all_rows, weight_split::replicated, all_rows},
          {all_rows, weight_split::replicated, rows}}},
        {"tp_megatron",
         {1, p, 1, 1, 0},
         {{rows, weight_split::output, features},
          {features, weight_split::replicated, features},
          {features, weight_split::input, rows}}},
        {"tp_gather", {1, p, 1, 1, 0}, {{rows, weight_split::output, rows}, rep_rows, rep_rows}},
        {"tp_row_first",
         {1, p, 1, 1, 0},
         {{rows, weight_split::replicated, features},
          {features, weight_split::replicated, features},
          {features, weight_split::input, rows}}},
    };
    if (p > 1 && p <= int(net.ops.size())) // a stage per rank, at least one operator each
        hands.push_back({"pp", {1, 1, p, 4, 0}, {rep_rows, rep_rows, rep_rows}});
    double best_hand = std::numeric_limits<double>::infinity();
    std::string best_name;
    for (const auto& h : hands) {
        if (!o.wants("hand_" + h.name) && !o.wants("searched_mlp"))
            continue;
        const auto predicted = xshard::evaluate_strategy(net, h.degrees, h.choices, so);
        const double measured =
            measure(world, o, widths, batch, h.degrees, h.choices, predicted.stage_of);
        if (measured < best_hand) {
            best_hand = measured;
            best_name = h.name;
        }
        bench::report(world, "hand_" + h.name, 0, "predicted", {measured, predicted.step_seconds});
    }

    if (o.wants("searched_mlp")) {
        auto s = so;
        s.output_splits = {rows, features};
        const auto r = xshard::search_strategy(net, s);
        const auto& b = *r.best;
        if (world.rank() == 0) {
            std::fputs(xshard::describe(r, net).c_str(), stderr);
            std::fprintf(stderr, "the fastest hand strategy measured: %s\n", best_name.c_str());
        }
        const double measured = measure(world, o, widths, batch, b.degrees, b.choices, b.stage_of);
        bench::report(world, "searched_mlp", 0, "best_hand_strategy", {measured, best_hand});
        bench::report(world, "searched_mlp_predicted", 0, "measured", {b.step_seconds, measured});
    }

    if (o.wants("searched_transformer")) {
        const xshard::transformer_sizes sizes =
            o.quick ? xshard::transformer_sizes{2, 64, 4, 16, 500}
                    : xshard::transformer_sizes{2, 256, 8, 64, 4000};
        const std::size_t sequences = 16;
        const auto t = xshard::transformer_network(sizes.layers, sizes.hidden, sizes.heads,
                                                   sizes.sequence, sizes.vocabulary, sequences);
        auto s = so;
        s.max_pipeline_stages = 1;
        s.output_splits = {rows, features};
        // Hand strategies: pure dp, and Megatron tp (qkv, up column-parallel; proj, down
        // row-parallel; the rest on whole rows; the head's classes over tp).
        double best_hand_t = std::numeric_limits<double>::infinity();
        std::string best_name_t;
        for (const auto& [name, dp, tp] :
             {std::tuple{std::string("dp"), p, 1}, std::tuple{std::string("megatron"), 1, p}}) {
            std::vector<op_choice> c;
            for (const auto& op : t.ops) {
                const bool col = op.name.ends_with("qkv") || op.name.ends_with("up");
                const bool row = op.name.ends_with("proj") || op.name.ends_with("down");
                const bool mid = op.name.ends_with("attention") || op.name.ends_with("gelu");
                if (tp > 1 && (col || op.name == "head"))
                    c.push_back({rows, weight_split::output, features});
                else if (tp > 1 && row)
                    c.push_back({features, weight_split::input, rows});
                else if (tp > 1 && mid)
                    c.push_back({features, weight_split::replicated, features});
                else
                    c.push_back(rep_rows);
            }
            if (!o.wants("hand_transformer_" + name) && !o.wants("searched_transformer"))
                continue;
            const auto e = xshard::evaluate_strategy(t, {dp, tp, 1, 1, 0}, c, s);
            if (!e.valid)
                continue;
            const double measured =
                measure_transformer(world, o, sizes, sequences, dp, tp, 0, c);
            if (measured < best_hand_t) {
                best_hand_t = measured;
                best_name_t = name;
            }
            bench::report(world, "hand_transformer_" + name, 0, "predicted",
                          {measured, e.step_seconds});
        }
        const auto r = xshard::search_strategy(t, s);
        const auto& b = *r.best;
        if (world.rank() == 0) {
            std::fputs(xshard::describe(r, t).c_str(), stderr);
            std::fprintf(stderr, "the fastest hand transformer strategy measured: %s\n",
                         best_name_t.c_str());
        }
        const double measured = measure_transformer(world, o, sizes, sequences, b.degrees.dp,
                                                    b.degrees.tp, b.degrees.hsdp_level, b.choices);
        bench::report(world, "searched_transformer", 0, "best_hand_strategy",
                      {measured, best_hand_t});
        bench::report(world, "searched_transformer_predicted", 0, "measured",
                      {b.step_seconds, measured});
    }
    return 0;
}
