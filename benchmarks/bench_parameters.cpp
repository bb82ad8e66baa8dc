// Parameter broadcast and gradient all-reduce of a model of 1000 parameters of mixed sizes
// totalling 64 MiB (and of one 64 MiB parameter), data-parallel (replicated) doubles, against
// one MPI_Bcast / MPI_Allreduce of the same 64 MiB, one MPI_Bcast per parameter, and the
// MindSpore's "zero every non-owner copy, then all-reduce". 2 ranks:
//
//   mpirun -n 2 build/benchmarks/bench_parameters

#include "harness.hpp"

#include <xshard/core.hpp>
#include <xshard/tensor.hpp>
#include <xshard/train.hpp>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace bench = xshard::bench;
using mesh_1d = xshard::mesh<"dp">;
using param_t = xshard::parameter<xshard::dtensor<double, mesh_1d, "[-]">>;

/// `count` parameters whose sizes spread over three orders of magnitude and add up to `total`
/// bytes.
std::vector<param_t> make_model(const mesh_1d& m, std::size_t count, std::size_t total) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> spread(0.0, 3.0 * std::log(10.0));
    std::vector<double> weights(count);
    double sum = 0;
    for (auto& w : weights)
        sum += w = std::exp(spread(rng));
    std::vector<param_t> model;
    std::size_t left = total / sizeof(double);
    for (std::size_t i = 0; i < count; ++i) {
        const std::size_t n =
            i + 1 == count ? left
                           : std::max<std::size_t>(
                                 1, std::size_t(weights[i] / sum * double(total / sizeof(double))));
        left -= n;
        model.push_back(
            {"p" + std::to_string(i), xshard::full<double, "[-]">(m, {n}, double(m.rank()))});
    }
    return model;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto o = bench::options::parse(argc, argv);
    const mesh_1d m({xshard::auto_size});
    const MPI_Comm comm = m.comm().native();
    const std::size_t total = o.quick ? 1u << 20 : 64u << 20;
    const std::string size = o.quick ? "1MiB" : "64MiB";
    std::vector<char> flat(total, 1);

    for (const std::size_t count : {std::size_t(1000), std::size_t(1)}) {
        auto model = make_model(m, count, total);
        const std::string name =
            "broadcast_" + std::to_string(count) + (count == 1 ? "_param_" : "_params_") + size;
        if (o.wants(name)) {
            auto ours = [&] {
                (void)xshard::parameter_broadcast(model);
            };
            bench::report(m.comm(), name, total, "single_bcast",
                          bench::compare(m.comm(), o, ours, [&] {
                              MPI_Bcast(flat.data(), int(total), MPI_BYTE, 0, comm);
                          }));
            if (count > 1) {
                bench::report(m.comm(), name, total, "per_parameter_bcast",
                              bench::compare(m.comm(), o, ours, [&] {
                                  for (auto& p : model)
                                      MPI_Bcast(p.value.local().data(), int(p.value.local().size()),
                                                MPI_DOUBLE, 0, comm);
                              }));
                // MindSpore's algorithm: every non-owner zeroes its copies, then one all-reduce
                // (fused) adds them up.
                std::vector<double> sums(total / sizeof(double));
                bench::report(
                    m.comm(), name, total, "zero_then_allreduce",
                    bench::compare(m.comm(), o, ours, [&] {
                        std::size_t at = 0;
                        for (auto& p : model) {
                            auto& l = p.value.local();
                            if (m.rank() != 0)
                                std::memset(l.data(), 0, l.size() * sizeof(double));
                            std::memcpy(sums.data() + at, l.data(), l.size() * sizeof(double));
                            at += l.size();
                        }
                        MPI_Allreduce(MPI_IN_PLACE, sums.data(), int(sums.size()), MPI_DOUBLE,
                                      MPI_SUM, comm);
                        at = 0;
                        for (auto& p : model) {
                            auto& l = p.value.local();
                            std::memcpy(l.data(), sums.data() + at, l.size() * sizeof(double));
                            at += l.size();
                        }
                    }));
            }
        }
        const std::string grad = "grad_allreduce_" + std::to_string(count) +
                                 (count == 1 ? "_param_" : "_params_") + size;
        if (o.wants(grad)) {
            auto grads = make_model(m, count, total);
            xshard::gradient_synchronizer sync(model, grads);
            if (m.rank() == 0)
                std::fprintf(stderr, "%s: %zu buckets\n", grad.c_str(), sync.buckets());
            std::vector<double> buffer(total / sizeof(double), 1.0), out(buffer.size());
            bench::report(m.comm(), grad, total, "MPI_Allreduce",
                          bench::compare(
                              m.comm(), o, [&] { sync.synchronize(); },
                              [&] {
                                  MPI_Allreduce(buffer.data(), out.data(), int(buffer.size()),
                                                MPI_DOUBLE, MPI_SUM, comm);
                              }));
        }
    }
    return 0;
}
