#pragma once
/// \file
/// The machine figures the strategy search prices computation with, measured on the ranks
/// that will run: one rank's GEMM speed (`machine_model::gemm_flops`) and the memory
/// bandwidth of its elementwise work (`memory_bandwidth`). Every rank measures at the same
/// time, since ranks of a node share its memory bandwidth when they train, and the slowest
/// rank's figures are kept, the same on every rank. The links (alpha and beta per mesh axis)
/// are bench_calibrate's.
///
///     auto machine = xshard::measure_machine<double>(mesh.comm());
///     net.set_machine_model(machine); // auto_parallel: what its engines price with
///
/// The defaults of machine_model are guesses; a machine's measured figures can differ from
/// them several times over, and so would every predicted step time (benchmarks/README.md,
/// "Strategy search", gives figures).

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/ops/matmul.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/search/machine_model.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

namespace xshard {

namespace detail {

/// Seconds of the fastest of `repeats` calls of `f`.
template <class F>
double fastest_of(int repeats, F&& f) {
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        best = std::min(
            best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}

} // namespace detail

/// FLOP/s of this rank's GEMM of T: the fastest of `repeats` [rows, in] x [in, out] products.
/// No communication.
template <class T>
double measure_gemm_flops(std::size_t rows, std::size_t in, std::size_t out, int repeats = 3) {
    std::vector<T> a(rows * in), b(in * out), c(rows * out);
    for (std::size_t i = 0; i < a.size(); ++i)
        a[i] = T(double(i % 17) / 17 - 0.5);
    for (std::size_t i = 0; i < b.size(); ++i)
        b[i] = T(double(i % 13) / 13 - 0.5);
    const double s = detail::fastest_of(repeats, [&] {
        detail::gemm(false, false, rows, out, in, a.data(), in, b.data(), out, false, c.data(),
                     out);
    });
    return 2.0 * double(rows) * double(in) * double(out) / std::max(s, 1e-9);
}

/// Bytes/s of this rank's elementwise work as the cost model counts it: Momentum's update of
/// `n` elements of T as the optimizer runs it (optim's `momentum_pass`: reads the weight, the
/// gradient and the velocity, writes the weight and the velocity) and the gradient's zeroing,
/// six passes over `n` elements; the fastest of `repeats`. No communication.
template <class T>
double measure_update_bandwidth(std::size_t n, int repeats = 3) {
    std::vector<T> w(n, T(1)), g(n, T(0.5)), v(n, T(0.25));
    const double s = detail::fastest_of(repeats, [&] {
        detail::momentum_pass(w.data(), v.data(), g.data(), n, T(0.9), T(1e-3), false);
        std::fill(g.begin(), g.end(), T(0));
    });
    // The weights are read below, so that the update is not optimised away.
    volatile T keep = w[n / 2];
    (void)keep;
    return 6.0 * double(n) * double(sizeof(T)) / std::max(s, 1e-9);
}

/// The sizes measure_machine measures at: a GEMM of [rows, in] x [in, out] (by default a
/// batch of 64 through a 1024 x 4096 layer, about 0.5 GFLOP) and an update of `elements`
/// (by default 2^21: 48 MiB of doubles in three arrays, past a 32 MiB cache).
struct machine_sample {
    std::size_t rows = 64, in = 1024, out = 4096;
    std::size_t elements = std::size_t(1) << 21;
    int repeats = 3;
};

/// `base` with the GEMM speed and the memory bandwidth of the ranks of `c` measured on T, each
/// the slowest rank's (the same on every rank), and its element size set to T's. Collective
/// over `c`: every rank measures at once, then one all-reduce of two doubles.
template <class T>
machine_model measure_machine(const communicator& c, machine_model base = {},
                              const machine_sample& sample = {}) {
    std::array<double, 2> figures{
        measure_gemm_flops<T>(sample.rows, sample.in, sample.out, sample.repeats),
        measure_update_bandwidth<T>(sample.elements, sample.repeats)};
    allreduce(c, std::span(figures), reduction::min);
    base.gemm_flops = figures[0];
    base.memory_bandwidth = figures[1];
    base.element = sizeof(T);
    return base;
}

} // namespace xshard
