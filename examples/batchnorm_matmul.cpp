// MindSpore's semi-auto parallel sub-model: BatchNorm with strategy [4, 1] (the batch split over 4
// ranks), then MatMul with strategy ((1, 1), (1, 4)) (the weight split by columns). The two layouts
// of the activations differ, so a redistribution goes between them: an all-gather along the batch
// axis, which this example prints. 4 ranks.
//
//   mpirun -n 4 build/examples/batchnorm_matmul
#include <xshard/xshard.hpp>

#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xrandom.hpp>

#include <cstdio>

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
    if (mesh.rank() == 0) {
        std::printf("BatchNorm [%d, 1] on mesh(%s)\n%s", p, mesh.shape().to_string().c_str(),
                    bn.describe().c_str());
        std::printf("MatMul ((1, 1), (1, %d)): the redistribution inserted before it\n%s", p,
                    mm.describe().c_str());
        std::printf("max abs error against serial xtensor: %.3g: %s\n", error,
                    error <= 1e-12 ? "ok" : "WRONG");
    }
    return error <= 1e-12 ? 0 : 1;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(); });
}
