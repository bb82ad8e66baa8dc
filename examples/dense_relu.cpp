// MindSpore's functional shard example: dense_relu(x, weight, bias) with in_strategy
// ((4, 2), None, None) on 8 ranks. x is split 4 x 2; the weight and the bias are derived
// (sliced to fit), the pending sum of the split contraction is all-reduced before relu
// (auto_redistribute), and the full_batch dataset strategy returns the output whole. Then
// the same under sharding_propagation: the Nones derived for the least memory.
//
//   mpirun -n 8 build/examples/dense_relu
#include <xshard/core.hpp>
#include <xshard/tensor.hpp>
#include <xshard/ops.hpp>

#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xrandom.hpp>

#include <cstdio>

/// The example itself; main reports its errors.
int run() {
    using mesh_2d = xshard::mesh<"dp", "mp">;
    const int world = xshard::communicator::world().size();
    const int mp = world % 2 == 0 ? 2 : 1;
    const auto mesh = mesh_2d({xshard::auto_size, mp})
                          .with_dataset_strategy(xshard::dataset_strategy::full_batch);

    // The same inputs on every rank (as the numpy arrays of MindSpore's shard() example).
    std::mt19937 engine(0);
    const xt::xtensor<double, 2> x = xt::random::rand<double>({32, 128}, 0.0, 1.0, engine);
    const xt::xtensor<double, 2> weight = xt::random::rand<double>({128, 10}, 0.0, 1.0, engine);
    const xt::xtensor<double, 1> bias = xt::random::rand<double>({10}, 0.0, 1.0, engine);

    auto dense_relu = [](const auto& x, const auto& w, const auto& b) {
        return xshard::ops::relu(xshard::ops::bias_add(xshard::ops::matmul(x, w), b));
    };
    auto sharded = xshard::shard(
        mesh, dense_relu, std::tuple(xshard::strategy{world / mp, mp}, xshard::none, xshard::none),
        xshard::none, xshard::auto_redistribute);
    sharded.traced();
    const auto result = sharded(x, weight, bias);

    const xt::xtensor<double, 2> expected = xt::maximum(xt::linalg::dot(x, weight) + bias, 0.0);
    const auto full = xshard::gather_all(result);
    const double error = xt::amax(xt::abs(full - expected))();
    if (mesh.rank() == 0) {
        std::printf("shard(dense_relu, in_strategy=((%d, %d), None, None)) on mesh(%s)\n%s",
                    world / mp, mp, mesh.shape().to_string().c_str(), sharded.describe().c_str());
        std::printf("result.shape: (%zu, %zu), layout %s\n", full.shape()[0], full.shape()[1],
                    result.layout().to_string().c_str());
        std::printf("max abs error against serial xtensor: %.3g: %s\n", error,
                    error <= 1e-12 ? "ok" : "WRONG");
    }

    // MindSpore's sharding_propagation mode: the Nones are derived by the objective `level`
    // (1: the least memory), each candidate layout of the weight and the bias tried once at
    // the first call.
    auto propagated = xshard::shard(
        mesh, dense_relu, std::tuple(xshard::strategy{world / mp, mp}, xshard::none, xshard::none),
        xshard::none, xshard::auto_redistribute, xshard::sharding_propagation{.level = 1});
    const auto derived_result = propagated(x, weight, bias);
    const double derived_error =
        xt::amax(xt::abs(xshard::gather_all(derived_result) - expected))();
    if (mesh.rank() == 0) {
        const auto& d = propagated.derived_layouts();
        std::printf("sharding_propagation (level 1, least memory): weight %s, bias %s\n",
                    d[1]->to_string().c_str(), d[2]->to_string().c_str());
        std::printf("max abs error against serial xtensor: %.3g: %s\n", derived_error,
                    derived_error <= 1e-12 ? "ok" : "WRONG");
    }
    return error <= 1e-12 && derived_error <= 1e-12 ? 0 : 1;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(); });
}
