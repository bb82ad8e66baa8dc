// The three-layer MLP of MindSpore's parameter_broadcast example (784 -> 512 -> 512 -> 10) with
// per-operator strategies on 8 ranks: matmul1 ((2, 4), (4, 1)), relu1 (4, 1), matmul2 ((1, 8), (8,
// 1)), relu2 (8, 1), matmul3 data parallel; a forward pass on a batch of 64. Each operator is a
// shard() with its strategy; xshard redistributes the activations between them and prints every
// step.
//
//   mpirun -n 8 build/examples/mlp_strategies
#include <xshard/xshard.hpp>

#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xrandom.hpp>

#include <cstdio>
#include <string>

/// The example itself; main reports its errors.
int run() {
    const int world = xshard::communicator::world().size();
    // 8 ranks: dp = 2, mp = 4 (the strategies' device matrices [2, 4, 1] and [1, 8, 1]).
    const int mp = world >= 4 ? 4 : world;
    const xshard::mesh<"dp", "mp"> mesh({xshard::auto_size, mp});
    const int dp = mesh.axis_size<"dp">(), p = mesh.size();

    std::mt19937 engine(3);
    const xt::xtensor<double, 2> x = xt::random::rand<double>({64, 784}, 0.0, 1.0, engine);
    const xt::xtensor<double, 2> w1 = xt::random::randn<double>({784, 512}, 0.0, 0.05, engine);
    const xt::xtensor<double, 2> w2 = xt::random::randn<double>({512, 512}, 0.0, 0.05, engine);
    const xt::xtensor<double, 2> w3 = xt::random::randn<double>({512, 10}, 0.0, 0.05, engine);

    std::string log;
    auto step = [&](const std::string& name, auto&& sharded, auto&&... inputs) {
        sharded.traced();
        auto out = sharded(std::forward<decltype(inputs)>(inputs)...);
        log += name + "\n" + sharded.describe();
        return out;
    };
    const auto mm1 = xshard::resolve_matmul({dp, mp}, {mp, 1}, mesh.shape());
    const auto mm2 = xshard::resolve_matmul({1, p}, {p, 1}, mesh.shape());
    const auto mm3 = xshard::resolve_matmul({p, 1}, {1, 1}, mesh.shape());
    auto h1 = step("matmul1 ((" + std::to_string(dp) + ", " + std::to_string(mp) + "), (" +
                       std::to_string(mp) + ", 1))",
                   xshard::shard(mesh, xshard::ops::matmul, std::tuple(mm1.x, mm1.w)), x, w1);
    auto a1 = step("relu1 (" + std::to_string(mp) + ", 1)",
                   xshard::shard(mesh, xshard::ops::relu, std::tuple(xshard::strategy{mp, 1})), h1);
    auto h2 = step("matmul2 ((1, " + std::to_string(p) + "), (" + std::to_string(p) + ", 1))",
                   xshard::shard(mesh, xshard::ops::matmul, std::tuple(mm2.x, mm2.w)), a1, w2);
    auto a2 = step("relu2 (" + std::to_string(p) + ", 1)",
                   xshard::shard(mesh, xshard::ops::relu, std::tuple(xshard::strategy{p, 1})), h2);
    auto logits = step("matmul3 data parallel ((" + std::to_string(p) + ", 1), (1, 1))",
                       xshard::shard(mesh, xshard::ops::matmul, std::tuple(mm3.x, mm3.w)), a2, w3);

    const xt::xtensor<double, 2> r1 = xt::maximum(xt::linalg::dot(x, w1), 0.0);
    const xt::xtensor<double, 2> r2 = xt::maximum(xt::linalg::dot(r1, w2), 0.0);
    const xt::xtensor<double, 2> expected = xt::linalg::dot(r2, w3);
    const double error = xt::amax(xt::abs(xshard::gather_all(logits) - expected))();
    if (mesh.rank() == 0) {
        std::printf("MLP 784-512-512-10, batch 64, on mesh(%s)\n%s",
                    mesh.shape().to_string().c_str(), log.c_str());
        std::printf("logits %s; max abs error against serial xtensor: %.3g: %s\n",
                    logits.layout().to_string().c_str(), error, error <= 1e-12 ? "ok" : "WRONG");
    }
    return error <= 1e-12 ? 0 : 1;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(); });
}
