// The two ways MindSpore's distributed training tutorial splits a weight: semi-auto parallel,
// MatMul().shard(((1, 1), (1, 2))) followed by ReduceSum over the last axis; and hybrid parallel,
// where the callable computes on its weight slice and declares its output a pending sum over the
// split axis. 2 ranks.
//
//   mpirun -n 2 build/examples/semi_auto_matmul
#include <xshard/xshard.hpp>

#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xrandom.hpp>

#include <cstdio>

/// The example itself; main reports its errors.
int run() {
    using mesh_1d = xshard::mesh<"mp">;
    const mesh_1d mesh({xshard::auto_size});
    const int p = mesh.size();

    std::mt19937 engine(1);
    const xt::xtensor<float, 2> x = xt::random::rand<float>({32, 512}, 0.0f, 1.0f, engine);
    // Weights of order 1 / (512 * 128), so that the float results are of order 1.
    const xt::xtensor<float, 2> weight =
        xt::random::rand<float>({512, 128}, 0.0f, 1.0f / 32768, engine);
    const xt::xtensor<float, 1> expected = xt::sum(xt::linalg::dot(x, weight), {1});

    // Semi-auto: the MatMul strategy ((1, 1), (1, p)) resolves with MatMul's device matrix.
    const auto [lx, lw] = xshard::resolve_matmul({1, 1}, {1, p}, mesh.shape());
    auto semi_auto = xshard::shard(
        mesh,
        [](const auto& x, const auto& w) { return xshard::ops::sum<1>(xshard::ops::matmul(x, w)); },
        std::tuple(lx, lw), xshard::layout("[-]"));
    semi_auto.traced();
    const auto a = xshard::gather_all(semi_auto(x, weight));

    // Hybrid: the weight slice is this rank's; the reduction over it is a pending sum.
    auto hybrid = xshard::shard_local(
        mesh,
        [](const auto& x, const auto& w_slice) {
            return xt::xtensor<float, 1>(xt::sum(xt::linalg::dot(x, w_slice), {1}));
        },
        std::tuple(xshard::spec<"[-, -]">, xshard::spec<"[-, mp]">),
        xshard::spec<"[-] partial(sum: mp)">);
    hybrid.traced();
    const auto partial = hybrid(x, weight);
    const auto b = xshard::gather_all(xshard::ops::resolve(partial)); // MindSpore's AllReduce(Sum)

    const float ea = xt::amax(xt::abs(a - expected))(), eb = xt::amax(xt::abs(b - expected))();
    const bool ok = ea <= 1e-5f && eb <= 1e-5f;
    if (mesh.rank() == 0) {
        std::printf("semi-auto MatMul ((1, 1), (1, %d)) + ReduceSum on mesh(%s)\n%s", p,
                    mesh.shape().to_string().c_str(), semi_auto.describe().c_str());
        std::printf("hybrid: local matmul on the weight slice, ReduceSum, declared partial\n%s",
                    hybrid.describe().c_str());
        std::printf("max abs error against serial xtensor: semi-auto %.3g, hybrid %.3g: %s\n", ea,
                    eb, ok ? "ok" : "WRONG");
    }
    return ok ? 0 : 1;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(); });
}
