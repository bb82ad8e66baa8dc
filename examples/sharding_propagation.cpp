// MindSpore's AutoParallel document's ParallelNetwork under parallel_mode
// "sharding_propagation": flatten, a matmul with fc1 [16, 10] annotated ((1, 1), (1, 2)),
// relu, written once as an ordinary function. The one annotation is kept and the search on
// programs derives every other node's layouts (the flatten, the relu, the loss's operands);
// it prints why it chose each, saves the operator strategy file, and the driver trains the
// program. The losses equal those of the same network on one rank. With
// "recursive_programming" the annotation is ignored and every node is searched.
//
//   mpirun -n 4 build/examples/sharding_propagation [sharding_propagation|recursive_programming]
#include <xshard/auto_parallel.hpp>
#include <xshard/core.hpp>
#include <xshard/graph.hpp>
#include <xshard/nn.hpp>
#include <xshard/tensor.hpp>
#include <xshard/train.hpp>

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace ops = xshard::ops;
using mesh_2d = xshard::mesh<"dp", "tp">;
constexpr std::size_t batch = 24, classes = 10, steps = 4;

/// ParallelNetwork: the logits of 4 x 4 images; the matmul annotated with `strategy` when
/// given.
xshard::program parallel_network(const std::optional<std::vector<xshard::strategy>>& strategy) {
    return xshard::trace(
        [&](xshard::traced_tensor x) {
            auto fc1 = xshard::param("fc1", {16, classes}, xshard::initializer::normal(0, 0.25));
            auto h = ops::flatten(x);
            h = strategy ? ops::matmul.shard(*strategy)(h, fc1) : ops::matmul(h, fc1);
            return ops::relu(h);
        },
        xshard::input<double>("x", {batch, 4, 4}));
}

/// Trains `net` with the driver under `mode`; returns the losses.
std::vector<double> train(xshard::compiled_program<double, mesh_2d>& net, const mesh_2d& mesh,
                          std::string_view mode, const std::string& strategy_file) {
    xshard::auto_parallel parallel(net, mesh, mode);
    if (!strategy_file.empty())
        parallel.save_operator_strategy_file(strategy_file);
    xshard::nn::parallel_cross_entropy<double, mesh_2d> loss;
    xshard::optim::sgd optimizer({.lr = 0.5});
    xshard::trainer trainer(parallel, loss, optimizer); // compile(): the search, then compiles
    if (const auto& found = parallel.searched_program(); found && mesh.comm().rank() == 0)
        std::printf("%s", found->explain().c_str());
    std::mt19937 engine(7);
    std::vector<std::pair<xshard::dtensor<double, mesh_2d, xshard::dynamic_layout(3)>,
                          xshard::dtensor<std::int64_t, mesh_2d, xshard::dynamic_layout(1)>>>
        batches;
    for (std::size_t s = 0; s < steps; ++s) {
        const xt::xtensor<double, 3> x =
            xt::random::rand<double>({batch, std::size_t(4), std::size_t(4)}, -1.0, 1.0, engine);
        const xt::xtensor<std::int64_t, 1> y =
            xt::random::randint<std::int64_t>({batch}, 0, std::int64_t(classes), engine);
        batches.emplace_back(xshard::distribute<xshard::dynamic_layout(3)>(mesh, x, "[-, -, -]"),
                             xshard::distribute<xshard::dynamic_layout(1)>(mesh, y, "[(dp,tp)]"));
    }
    return trainer.train(1, batches);
}

/// The example itself; main reports its errors.
int run(std::string_view mode) {
    const auto& world = xshard::communicator::world();
    const int p = world.size();
    const bool annotated = p % 2 == 0; // ((1, 1), (1, 2)) needs a tp axis of 2
    const mesh_2d mesh(world, {annotated ? p / 2 : p, annotated ? 2 : 1});
    const auto file = (std::filesystem::temp_directory_path() /
                       ("xshard_sharding_propagation_np" + std::to_string(p) + ".json"))
                          .string();

    auto net = xshard::compile<double>(
        parallel_network(annotated ? std::optional<std::vector<xshard::strategy>>({{1, 1}, {1, 2}})
                                   : std::nullopt),
        mesh, {.seed = 3});
    const auto losses = train(net, mesh, mode, mode == "sharding_propagation" ? file : "");

    const mesh_2d one(xshard::communicator::self(), {1, 1});
    auto alone = xshard::compile<double>(parallel_network(std::nullopt), one, {.seed = 3});
    const auto reference = train(alone, one, "semi_auto", "");
    double worst = 0;
    for (std::size_t s = 0; s < losses.size(); ++s) {
        worst = std::max(worst, std::abs(losses[s] - reference[s]));
        if (world.rank() == 0)
            std::printf("step %zu: loss %.6f (one rank %.6f)\n", s, losses[s], reference[s]);
    }
    if (world.rank() == 0) {
        if (mode == "sharding_propagation")
            std::printf("operator strategy file: %s\n", file.c_str());
        std::printf("%s on mesh(%s): losses equal to one rank's within %.1e\n",
                    std::string(mode).c_str(), mesh.shape().to_string().c_str(), worst);
    }
    return worst < 1e-9 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const std::string mode = argc > 1 ? argv[1] : "sharding_propagation";
    return xshard::report_errors([&] { return run(mode); });
}
