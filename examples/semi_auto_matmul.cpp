// The two ways MindSpore's distributed training tutorial splits a weight: semi-auto parallel,
// MatMul().shard(((1, 1), (1, 2))) followed by ReduceSum over the last axis; and hybrid parallel,
// where the callable computes on its weight slice and declares its output a pending sum over the
// split axis. 2 ranks. First each forward pass through shard(), then both networks trained as
// programs (SemiAutoParallelNet and HybridParallelNet): xshard derives their backward passes,
// and the losses equal a serial xtensor gradient descent.
//
//   mpirun -n 2 build/examples/semi_auto_matmul
#include <xshard/core.hpp>
#include <xshard/graph.hpp>
#include <xshard/ops.hpp>
#include <xshard/tensor.hpp>
#include <xshard/train.hpp>

#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

/// `steps` steps of gradient descent on mean((sum_j (x w)_ij - t_i)^2), serially: the losses.
std::vector<float> serial_training(const xt::xtensor<float, 2>& x, xt::xtensor<float, 2> w,
                                   const xt::xtensor<float, 1>& t, int steps, float lr) {
    std::vector<float> losses;
    for (int s = 0; s < steps; ++s) {
        const xt::xtensor<float, 1> r = xt::sum(xt::linalg::dot(x, w), {1}) - t;
        losses.push_back(xt::mean(r * r)());
        // d loss / d w_kj = sum_i x_ik 2 r_i / n, the same for every column j.
        const xt::xtensor<float, 1> g = xt::linalg::dot(xt::transpose(x), r) * (2.0f / float(r.size()));
        w -= lr * xt::view(g, xt::all(), xt::newaxis());
    }
    return losses;
}

/// The tutorial's network as a program: MatMul (annotated by `matmul`), ReduceSum over the
/// last axis, and the mean squared error against the targets. Its weight starts at `w0`.
template <class Annotated>
xshard::program tutorial_net(Annotated matmul) {
    namespace ops = xshard::ops;
    return xshard::trace(
        [&](xshard::traced_tensor x, xshard::traced_tensor t) {
            auto w = xshard::param("weight", {512, 128}, xshard::initializer::uniform(0, 1.0 / 32768));
            auto r = ops::sum<1>(matmul(x, w)) - t;
            return ops::mean<0>(ops::square(r));
        },
        xshard::input<float>("x", {32, 512}), xshard::input<float>("t", {32}));
}

/// Trains `p` on `mesh` with gradient descent; returns the losses.
template <class Mesh>
std::vector<float> train(xshard::program p, const Mesh& mesh, const xt::xtensor<float, 2>& x,
                         const xt::xtensor<float, 1>& t, int steps, float lr,
                         xt::xtensor<float, 2>& w0) {
    auto net = xshard::compile<float>(std::move(p), mesh, {.seed = 5});
    xshard::optim::sgd optimizer({.lr = lr});
    const auto dx = xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[-, -]");
    const auto dt = xshard::distribute<xshard::dynamic_layout(1)>(mesh, t, "[-]");
    xshard::for_each_weight(net, [&](const std::string&, auto& w) {
        if constexpr (std::remove_cvref_t<decltype(w.value)>::rank == 2)
            w0 = xshard::gather_all(w.value);
    });
    std::vector<float> losses;
    for (int s = 0; s < steps; ++s) {
        losses.push_back(float(net.train_step(dx, dt)));
        auto grads = xshard::gradients_of(net);
        xshard::synchronize_gradients(net, grads);
        optimizer.step(net);
        xshard::for_each_weight(net, [](const std::string&, auto& w) { w.zero_grad(); });
    }
    return losses;
}

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

    // Training: SemiAutoParallelNet (the strategy ((1, 1), (1, p))) and HybridParallelNet (the
    // weight's slice per rank, [-, mp]; the ReduceSum's pending sum is the hand-written
    // AllReduce, here the redistribution xshard inserts before the loss).
    const xt::xtensor<float, 1> target = xt::random::rand<float>({32}, 0.0f, 1.0f, engine);
    constexpr int steps = 5;
    constexpr float lr = 5e-6f;
    xt::xtensor<float, 2> w_semi, w_hybrid;
    const auto semi_losses = train(tutorial_net(xshard::ops::matmul.shard({{1, 1}, {1, p}})), mesh,
                                   x, target, steps, lr, w_semi);
    const auto hybrid_losses = train(
        tutorial_net(xshard::ops::matmul.shard({xshard::layout("[-, -]"), xshard::layout("[-, mp]")})),
        mesh, x, target, steps, lr, w_hybrid);
    const auto reference = serial_training(x, w_semi, target, steps, lr);
    float el = xt::amax(xt::abs(w_semi - w_hybrid))();
    for (int s = 0; s < steps; ++s)
        el = std::max({el, std::abs(semi_losses[s] - reference[s]) / reference[s],
                       std::abs(hybrid_losses[s] - reference[s]) / reference[s]});
    const bool ok = ea <= 1e-5f && eb <= 1e-5f && el <= 1e-4f;
    if (mesh.rank() == 0) {
        std::printf("semi-auto MatMul ((1, 1), (1, %d)) + ReduceSum on mesh(%s)\n%s", p,
                    mesh.shape().to_string().c_str(), semi_auto.describe().c_str());
        std::printf("hybrid: local matmul on the weight slice, ReduceSum, declared partial\n%s",
                    hybrid.describe().c_str());
        std::printf("max abs error against serial xtensor: semi-auto %.3g, hybrid %.3g\n", ea, eb);
        for (int s = 0; s < steps; ++s)
            std::printf("step %d  loss semi-auto %.6f  hybrid %.6f  serial xtensor %.6f\n", s + 1,
                        semi_losses[s], hybrid_losses[s], reference[s]);
        std::printf("trained as programs, largest relative difference from serial xtensor %.3g: "
                    "%s\n",
                    el, ok ? "ok" : "WRONG");
    }
    return ok ? 0 : 1;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(); });
}
