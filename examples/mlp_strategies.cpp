// The three-layer MLP of MindSpore's parameter_broadcast example (784 -> 512 -> 512 -> 10),
// written as a traced program with the document's per-operator strategies on 8 ranks: matmul1
// ((2, 4), (4, 1)), relu1 (4, 1), matmul2 ((1, 8), (8, 1)), relu2 (8, 1), matmul3 data
// parallel. xshard derives the backward pass and the redistributions between the operators,
// then trains it as the document does: a few steps through the training driver, a
// checkpoint saved and loaded into a freshly compiled program, parameter_broadcast, more
// steps. The losses equal those of the same program on one rank.
//
//   mpirun -n 8 build/examples/mlp_strategies
#include <xshard/auto_parallel.hpp>
#include <xshard/core.hpp>
#include <xshard/graph.hpp>
#include <xshard/nn.hpp>
#include <xshard/ops.hpp>
#include <xshard/tensor.hpp>
#include <xshard/train.hpp>

#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xrandom.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

using mesh_2d = xshard::mesh<"dp", "mp">;
using matrix = xshard::dtensor<double, mesh_2d, xshard::dynamic_layout(2)>;
using labels = xshard::dtensor<std::int64_t, mesh_2d, xshard::dynamic_layout(1)>;

constexpr std::size_t batch = 64, steps = 4;

/// The network with the document's strategies on a dp x mp mesh (p = dp mp ranks).
xshard::program mlp(int dp, int mp) {
    namespace ops = xshard::ops;
    const int p = dp * mp;
    return xshard::trace(
        [&](xshard::traced_tensor x) {
            const auto init = xshard::initializer::normal(0, 0.05);
            auto w1 = xshard::param("layer1.weight", {784, 512}, init);
            auto w2 = xshard::param("layer2.weight", {512, 512}, init);
            auto w3 = xshard::param("layer3.weight", {512, 10}, init);
            auto h = ops::matmul.shard({{dp, mp}, {mp, 1}})(x, w1);
            h = ops::relu.shard({{mp, 1}})(h);
            h = ops::matmul.shard({{1, p}, {p, 1}})(h, w2);
            h = ops::relu.shard({{p, 1}})(h);
            return ops::matmul(h, w3); // no strategy: data parallel
        },
        xshard::input<double>("x", {batch, 784}));
}

/// The batches, the same on every rank: inputs and the labels of a hidden linear map.
std::vector<std::pair<xt::xtensor<double, 2>, xt::xtensor<std::int64_t, 1>>> data() {
    std::mt19937 engine(7);
    const xt::xtensor<double, 2> truth = xt::random::randn<double>({784, 10}, 0.0, 1.0, engine);
    std::vector<std::pair<xt::xtensor<double, 2>, xt::xtensor<std::int64_t, 1>>> out;
    for (std::size_t s = 0; s < 2 * steps; ++s) {
        xt::xtensor<double, 2> x = xt::random::rand<double>({batch, std::size_t(784)}, 0.0, 1.0, engine);
        const xt::xtensor<double, 2> scores = xt::linalg::dot(x, truth);
        xt::xtensor<std::int64_t, 1> y = xt::zeros<std::int64_t>({batch});
        for (std::size_t i = 0; i < batch; ++i)
            for (std::size_t c = 1; c < 10; ++c)
                if (scores(i, c) > scores(i, std::size_t(y(i))))
                    y(i) = std::int64_t(c);
        out.emplace_back(std::move(x), std::move(y));
    }
    return out;
}

/// Trains `net` (compiled on `mesh`) on batches [first, first + count), after loading
/// `load_from` when given, saving to `save_to` when given; returns the losses.
template <class Net>
std::vector<double> train(Net& net, const mesh_2d& mesh, std::size_t first, std::size_t count,
                          const std::string& load_from = "", const std::string& save_to = "") {
    xshard::auto_parallel parallel(net, mesh);
    xshard::nn::parallel_cross_entropy<double, mesh_2d> loss;
    xshard::optim::momentum optimizer({.lr = 0.1, .momentum = 0.9});
    xshard::trainer trainer(parallel, loss, optimizer);
    if (!load_from.empty()) {
        trainer.load_checkpoint(load_from);
        // MindSpore's parameter_broadcast after loading: every redundant copy takes its
        // owner's values.
        xshard::parameter_broadcast(net, {.cur_rank = xshard::communicator::world().rank()});
    }
    const auto all = data();
    std::vector<std::pair<matrix, labels>> batches;
    for (std::size_t s = first; s < first + count; ++s)
        batches.emplace_back(
            xshard::distribute<xshard::dynamic_layout(2)>(mesh, all[s].first, "[(dp,mp), -]"),
            xshard::distribute<xshard::dynamic_layout(1)>(mesh, all[s].second, "[(dp,mp)]"));
    auto losses = trainer.train(1, batches);
    if (!save_to.empty())
        trainer.save_checkpoint(save_to, std::int64_t(first + count));
    return losses;
}

/// The example itself; main reports its errors.
int run() {
    const int world = xshard::communicator::world().size();
    // 8 ranks: dp = 2, mp = 4 (the strategies' device matrices [2, 4, 1] and [1, 8, 1]).
    const int mp = world >= 4 ? 4 : world;
    const mesh_2d mesh({xshard::auto_size, mp});
    const int dp = mesh.axis_size<"dp">();
    const std::string dir = "mlp_strategies.ckpt";
    if (mesh.rank() == 0)
        std::filesystem::create_directories(dir);

    auto net = xshard::compile<double>(mlp(dp, mp), mesh, {.seed = 1});
    if (mesh.rank() == 0)
        std::printf("%s", net.report().c_str());
    auto losses = train(net, mesh, 0, steps, "", dir + "/step4.safetensors");
    // A freshly compiled program (other initial weights), loaded from the checkpoint (the
    // weights and the optimizer's state).
    auto resumed = xshard::compile<double>(mlp(dp, mp), mesh, {.seed = 2});
    const auto more = train(resumed, mesh, steps, steps, dir + "/step4.safetensors");
    losses.insert(losses.end(), more.begin(), more.end());

    // The same program, every operator whole, trained without interruption on one rank (each
    // rank alone).
    const mesh_2d one(xshard::communicator::self(), {1, 1});
    auto serial = xshard::compile<double>(mlp(1, 1), one, {.seed = 1});
    const auto reference = train(serial, one, 0, 2 * steps);

    double error = 0;
    for (std::size_t s = 0; s < losses.size(); ++s)
        error = std::max(error, std::abs(losses[s] - reference[s]));
    if (mesh.rank() == 0) {
        for (std::size_t s = 0; s < losses.size(); ++s)
            std::printf("step %zu  loss %.10f   one rank %.10f%s\n", s + 1, losses[s], reference[s],
                        s + 1 == steps ? "   (saved; loaded into a new program, broadcast)" : "");
        std::printf("losses equal one rank's (max abs difference %.3g): %s\n", error,
                    error <= 1e-9 ? "ok" : "WRONG");
    }
    return error <= 1e-9 ? 0 : 1;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(); });
}
