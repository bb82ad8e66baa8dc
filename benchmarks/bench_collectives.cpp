// xshard's typed collectives against the raw MPI calls on the same buffers. The wrapper
// should cost nothing measurable: ratio ~ 1.

#include "harness.hpp"

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/environment.hpp>

#include <string>
#include <vector>

namespace bench = xshard::bench;
using xshard::reduction;

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto o = bench::options::parse(argc, argv);
    const auto c = xshard::communicator::world().dup();
    const auto p = std::size_t(c.size());
    const MPI_Comm raw = c.native();

    const std::vector<std::size_t> sizes =
        o.quick ? std::vector<std::size_t>{1 << 12}
                : std::vector<std::size_t>{64 << 10, 1 << 20, 64 << 20};
    for (const std::size_t bytes : sizes) {
        // `bytes` is the size of the full (gathered / reduced) buffer; doubles throughout.
        const std::size_t n = bytes / sizeof(double) / p * p;
        const int piece = int(n / p);
        const std::string suffix = "_" + std::to_string(bytes >> 20 ? bytes >> 20 : bytes >> 10) +
                                   (bytes >> 20 ? "MiB" : "KiB");
        std::vector<double> full(n, 1.0), full_out(n), part(n / p, 1.0), part_out(n / p);

        auto run = [&](const std::string& name, auto&& mine, auto&& theirs) {
            if (o.wants(name))
                bench::report(c, name + suffix, n * sizeof(double), "MPI",
                              bench::compare(c, o, mine, theirs));
        };
        run(
            "allgather", [&] { xshard::mpi::allgather(c, part, full_out); },
            [&] {
                MPI_Allgather(part.data(), piece, MPI_DOUBLE, full_out.data(), piece, MPI_DOUBLE,
                              raw);
            });
        run(
            "alltoall", [&] { xshard::mpi::alltoall(c, full, full_out); },
            [&] {
                MPI_Alltoall(full.data(), piece, MPI_DOUBLE, full_out.data(), piece, MPI_DOUBLE,
                             raw);
            });
        run(
            "allreduce", [&] { xshard::mpi::allreduce(c, full, full_out, reduction::sum); },
            [&] { MPI_Allreduce(full.data(), full_out.data(), int(n), MPI_DOUBLE, MPI_SUM, raw); });
        run(
            "reduce_scatter",
            [&] { xshard::mpi::reduce_scatter_block(c, full, part_out, reduction::sum); },
            [&] {
                MPI_Reduce_scatter_block(full.data(), part_out.data(), piece, MPI_DOUBLE, MPI_SUM,
                                         raw);
            });
        run(
            "bcast", [&] { xshard::mpi::bcast(c, full, 0); },
            [&] { MPI_Bcast(full.data(), int(n), MPI_DOUBLE, 0, raw); });
    }
    return 0;
}
