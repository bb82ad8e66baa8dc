// Tensor-parallel matrix products against one rank doing the whole product with the same
// BLAS, and against ScaLAPACK's pdgemm on a 1 x p grid; and the cost of a shard() call on
// tiny tensors against the same collectives called by hand. Double precision, 2 ranks:
//
//   source scripts/env.sh; mpirun -n 2 build/benchmarks/bench_matmul
//
// (scripts/env.sh sets one BLAS thread per rank and chooses OpenBLAS's kernels for this CPU;
// the program prints what it ran with.)

#include "harness.hpp"

#include <xshard/core.hpp>
#include <xshard/ops.hpp>
#include <xshard/tensor.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifdef XSHARD_HAVE_SCALAPACK
#include "scalapack.hpp"
#endif

namespace bench = xshard::bench;
using mesh_1d = xshard::mesh<"x">;

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto o = bench::options::parse(argc, argv);
    const mesh_1d m({xshard::auto_size});
    const int p = m.size();
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
    if (m.rank() == 0)
        std::fprintf(stderr,
                     "bench_matmul: %d ranks, OPENBLAS_CORETYPE=%s OPENBLAS_NUM_THREADS=%s\n", p,
                     coretype ? coretype : "(unset)", threads ? threads : "(unset)");

    const std::size_t n = o.quick ? 256 : 4096;
    const std::string size = std::to_string(n);
    const std::size_t bytes = n * n * sizeof(double);
    const double flops = 2.0 * double(n) * double(n) * double(n);

    // The whole product on rank 0, the other ranks idle: the one-rank baseline.
    xt::xtensor<double, 2> full_a, full_b, full_c;
    if (m.rank() == 0) {
        full_a = xt::ones<double>({n, n});
        full_b = xt::ones<double>({n, n});
        full_c = xt::zeros<double>({n, n});
    }
    auto one_rank = [&] {
        if (m.rank() == 0)
            xshard::detail::gemm(false, false, n, n, n, full_a.data(), n, full_b.data(), n, false,
                                 full_c.data(), n);
    };

#ifdef XSHARD_HAVE_SCALAPACK
    // pdgemm on a 1 x p grid, column blocks (the same flops; column-major local arrays).
    int ctx = 0, info = 0;
    Cblacs_get(0, 0, &ctx);
    Cblacs_gridinit(&ctx, "R", 1, p);
    const int N = int(n), nb = int((n + std::size_t(p) - 1) / std::size_t(p)), zero = 0, one = 1;
    int desc[9];
    descinit_(desc, &N, &N, &N, &nb, &zero, &zero, &ctx, &N, &info);
    std::vector<double> sa(n * std::size_t(nb), 1.0), sb(sa), sc(sa.size());
    const double alpha = 1.0, beta = 0.0;
    auto pdgemm = [&] {
        pdgemm_("N", "N", &N, &N, &N, &alpha, sa.data(), &one, &one, desc, sb.data(), &one, &one,
                desc, &beta, sc.data(), &one, &one, desc);
    };
#endif

    auto report_all = [&](const std::string& name, auto&& candidate) {
        const auto one = bench::compare(m.comm(), o, candidate, one_rank);
        bench::report(m.comm(), name, bytes, "one_rank_gemm", one);
        if (m.rank() == 0)
            std::fprintf(stderr, "%s: %.1f GFLOP/s (one rank: %.1f GFLOP/s, efficiency %.0f %%)\n",
                         name.c_str(), flops / one.seconds * 1e-9,
                         flops / one.baseline_seconds * 1e-9,
                         100.0 * one.baseline_seconds / one.seconds / p);
#ifdef XSHARD_HAVE_SCALAPACK
        const auto peer = bench::compare(m.comm(), o, candidate, pdgemm);
        bench::report(m.comm(), name, bytes, "pdgemm", peer);
        if (m.rank() == 0)
            std::fprintf(stderr, "%s: pdgemm %.1f GFLOP/s\n", name.c_str(),
                         flops / peer.baseline_seconds * 1e-9);
#endif
    };

    // Both sides write into arrays allocated once (matmul(a, b, out), a reused plan), as the
    // baselines do.
    if (o.wants("column_parallel")) {
        // Strategy ((1, 1), (1, p)): A whole, B split by columns; no messages.
        const auto a = xshard::full<double, "[-, -]">(m, {n, n}, 1.0);
        const auto b = xshard::full<double, "[-, x]">(m, {n, n}, 1.0);
        auto c = xshard::ops::matmul(a, b);
        report_all("column_parallel_" + size, [&] { xshard::ops::matmul(a, b, c); });
    }
    if (o.wants("row_parallel")) {
        // The contraction split: a pending sum, all-reduced.
        const auto a = xshard::full<double, "[-, x]">(m, {n, n}, 1.0);
        const auto b = xshard::full<double, "[x, -]">(m, {n, n}, 1.0);
        auto partial = xshard::ops::matmul(a, b);
        auto resolve = xshard::make_redistribution<"[-, -]">(partial);
        auto c = resolve(partial);
        report_all("row_parallel_" + size, [&] {
            xshard::ops::matmul(a, b, partial);
            resolve.execute(partial, c);
        });
    }
    if (o.wants("shard_dispatch")) {
        // shard() on 8 x 8 tensors (a row-parallel product all-reduced) against the same
        // local gemm and MPI_Allreduce by hand.
        const std::size_t t = 8;
        const auto a = xshard::full<double, "[-, x]">(m, {t, t}, 1.0);
        const auto b = xshard::full<double, "[x, -]">(m, {t, t}, 1.0);
        auto f = xshard::shard(m, xshard::ops::matmul,
                               std::tuple(xshard::spec<"[-, x]">, xshard::spec<"[x, -]">),
                               xshard::spec<"[-, -]">);
        xt::xtensor<double, 2> c = xt::zeros<double>({t, t});
        const auto& la = a.local();
        const auto& lb = b.local();
        const MPI_Comm comm = m.comm().native();
        auto hand = [&] {
            xt::xtensor<double, 2> part = xt::xtensor<double, 2>::from_shape({t, t});
            xshard::detail::gemm(false, false, t, t, la.shape()[1], la.data(), la.shape()[1],
                                 lb.data(), t, false, part.data(), t);
            MPI_Allreduce(part.data(), c.data(), int(t * t), MPI_DOUBLE, MPI_SUM, comm);
        };
        bench::report(m.comm(), "shard_dispatch_8x8", t * t * sizeof(double), "hand_written",
                      bench::compare(
                          m.comm(), o, [&] { (void)f(a, b); }, hand));
        // The same call with both inputs derived (sharding_propagation, level 0): after the
        // first call derives them, what a call adds is looking the choice up (one all-reduce
        // of the key's hash) and the redistributions the choice needs.
        auto g = xshard::shard(m, xshard::ops::matmul, std::tuple(xshard::none, xshard::none),
                               xshard::spec<"[-, -]">, xshard::sharding_propagation{.level = 0});
        // The first call derives: every pair of candidate layouts runs the call twice (3 x 3
        // pairs on one axis: [-, -], [x, -], [-, x] for each input), one measurement of it
        // against the time of one plain shard() call.
        xshard::mpi::barrier(m.comm());
        const auto first = std::chrono::steady_clock::now();
        (void)g(a, b);
        const std::chrono::duration<double> deriving = std::chrono::steady_clock::now() - first;
        bench::report(m.comm(), "shard_propagation_first_call_8x8", t * t * sizeof(double),
                      "shard_dispatch", {deriving.count(), bench::compare(
                                                               m.comm(), o, [&] { (void)f(a, b); },
                                                               [] {}).seconds});
        bench::report(m.comm(), "shard_dispatch_propagated_8x8", t * t * sizeof(double),
                      "hand_written",
                      bench::compare(
                          m.comm(), o, [&] { (void)g(a, b); }, hand));
    }
#ifdef XSHARD_HAVE_SCALAPACK
    Cblacs_gridexit(ctx);
#endif
    return 0;
}
