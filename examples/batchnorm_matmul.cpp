// MindSpore's semi-auto parallel sub-model: BatchNorm with strategy [4, 1] (the batch split over 4
// ranks), then MatMul with strategy ((1, 1), (1, 4)) (the weight split by columns). The two layouts
// of the activations differ, so a redistribution goes between them: an all-gather along the batch
// axis, which this example prints. 4 ranks. Then the sub-model with BatchNorm's affine weights
// is trained as a program, its strategies set by node name; its losses equal one rank's.
//
//   mpirun -n 4 build/examples/batchnorm_matmul
#include <xshard/core.hpp>
#include <xshard/graph.hpp>
#include <xshard/ops.hpp>
#include <xshard/tensor.hpp>
#include <xshard/train.hpp>

#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

/// The sub-model as a program: BatchNorm (gamma, beta) then MatMul, and the mean squared error
/// against targets; with the document's strategies on `p` ranks, set by node name.
xshard::program sub_model(int p) {
    namespace ops = xshard::ops;
    auto prog = xshard::trace(
        [](xshard::traced_tensor x, xshard::traced_tensor t) {
            auto gamma = xshard::param("bn.gamma", {8}, xshard::initializer::constant(1));
            auto beta = xshard::param("bn.beta", {8}, xshard::initializer::zeros());
            auto w = xshard::param("fc.weight", {8, 12}, xshard::initializer::uniform(-1, 1));
            const auto y = ops::batch_norm(x, gamma, beta);
            return ops::mean_all(ops::square(ops::matmul(y, w) - t));
        },
        xshard::input<double>("x", {16, 8}), xshard::input<double>("t", {16, 12}));
    prog.shard("batch_norm", {{p, 1}, {1}, {1}});
    prog.shard("matmul", {{1, 1}, {1, p}});
    return prog;
}

/// Trains the sub-model on `mesh` with momentum; returns the losses.
template <class Mesh>
std::vector<double> train(const Mesh& mesh, int p, const xt::xtensor<double, 2>& x,
                          const xt::xtensor<double, 2>& t, std::string* report = nullptr) {
    auto net = xshard::compile<double>(sub_model(p), mesh, {.seed = 9});
    if (report)
        *report = net.describe();
    xshard::optim::momentum optimizer({.lr = 0.05, .momentum = 0.9});
    const auto dx = xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[-, -]");
    const auto dt = xshard::distribute<xshard::dynamic_layout(2)>(mesh, t, "[-, -]");
    std::vector<double> losses;
    for (int s = 0; s < 5; ++s) {
        losses.push_back(net.train_step(dx, dt));
        auto grads = xshard::gradients_of(net);
        xshard::synchronize_gradients(net, grads);
        optimizer.step(net);
        xshard::for_each_weight(net, [](const std::string&, auto& w) { w.zero_grad(); });
    }
    return losses;
}

/// The example itself; main reports its errors.
int run() {
    const xshard::mesh<"dev"> mesh({xshard::auto_size});
    const int p = mesh.size();

    std::mt19937 engine(2);
    const xt::xtensor<double, 2> x = xt::random::rand<double>({16, 8}, -1.0, 1.0, engine);
    const xt::xtensor<double, 2> w = xt::random::rand<double>({8, 12}, -1.0, 1.0, engine);

    // BatchNorm, strategy [p, 1]: statistics all-reduced over the batch axis.
    auto bn = xshard::shard(
        mesh, [](const auto& x) { return xshard::ops::batch_norm(x); },
        std::tuple(xshard::strategy{p, 1}));
    bn.traced();
    const auto y = bn(x);

    // MatMul, strategy ((1, 1), (1, p)): x whole, the weight split by columns.
    const auto [lx, lw] = xshard::resolve_matmul({1, 1}, {1, p}, mesh.shape());
    auto mm = xshard::shard(mesh, xshard::ops::matmul, std::tuple(lx, lw));
    mm.traced();
    const auto z = mm(y, w);

    // Serial reference.
    const xt::xtensor<double, 2> mu = xt::mean(x, {0}, xt::keep_dims);
    const xt::xtensor<double, 2> var = xt::mean((x - mu) * (x - mu), {0}, xt::keep_dims);
    const xt::xtensor<double, 2> expected = xt::linalg::dot((x - mu) / xt::sqrt(var + 1e-5), w);
    const double error = xt::amax(xt::abs(xshard::gather_all(z) - expected))();

    // Training the sub-model with BatchNorm's gamma and beta, against one rank.
    const xt::xtensor<double, 2> target = xt::random::rand<double>({16, 12}, -1.0, 1.0, engine);
    std::string program_report;
    const auto losses = train(mesh, p, x, target, &program_report);
    const xshard::mesh<"dev"> one(xshard::communicator::self(), {1});
    const auto reference = train(one, 1, x, target);
    double loss_error = 0;
    for (std::size_t s = 0; s < losses.size(); ++s)
        loss_error = std::max(loss_error, std::abs(losses[s] - reference[s]));
    const bool ok = error <= 1e-12 && loss_error <= 1e-10;
    if (mesh.rank() == 0) {
        std::printf("BatchNorm [%d, 1] on mesh(%s)\n%s", p, mesh.shape().to_string().c_str(),
                    bn.describe().c_str());
        std::printf("MatMul ((1, 1), (1, %d)): the redistribution inserted before it\n%s", p,
                    mm.describe().c_str());
        std::printf("max abs error against serial xtensor: %.3g\n", error);
        std::printf("the sub-model trained as a program:\n%s", program_report.c_str());
        for (std::size_t s = 0; s < losses.size(); ++s)
            std::printf("step %zu  loss %.10f  one rank %.10f\n", s + 1, losses[s], reference[s]);
        std::printf("losses equal one rank's (max abs difference %.3g): %s\n", loss_error,
                    ok ? "ok" : "WRONG");
    }
    return ok ? 0 : 1;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(); });
}
