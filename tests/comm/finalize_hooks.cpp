// Hooks registered with before_finalize run at the start of MPI_Finalize (here the
// environment's), on every rank, the last registered first, with MPI still working: the first
// hook (run last) checks with an all-reduce that the second ran on every rank, and frees
// shared-memory windows kept on overlapping communicators (the world, and pairs of
// neighbours) in the order they were made, after windows made and freed meanwhile in an
// order that differs between ranks. Rank 0 prints what it found; a hook that did not run
// leaves the line out, one that hangs is stopped by ctest's timeout.
#include <xshard/comm/before_finalize.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/environment.hpp>
#include <xshard/comm/node.hpp>
#include <xshard/comm/shared_window.hpp>

#include <cstdio>
#include <memory>
#include <span>
#include <vector>

namespace {

int second_ran = 0;
std::vector<std::unique_ptr<xshard::shared_window>> kept; // freed by the first hook

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto world = xshard::communicator::world();
    const int rank = world.rank(), size = world.size();
    const bool shared = xshard::node_group(world).whole_communicator_shares_memory();
    if (shared) {
        // Windows kept on the world and on pairs of neighbours ({0, 1}, {2, 3}, ...), with
        // short-lived ones made and freed between them, more on odd ranks: each rank's MPI
        // numbers the kept windows differently.
        const auto pairs = world.split(rank / 2);
        kept.push_back(std::make_unique<xshard::shared_window>(world, 64));
        for (int i = 0; i < 1 + rank % 2; ++i) {
            const xshard::shared_window brief(xshard::communicator::self(), 64);
        }
        kept.push_back(std::make_unique<xshard::shared_window>(pairs, 64));
        kept.push_back(std::make_unique<xshard::shared_window>(world, 64));
    }
    xshard::detail::before_finalize([=] {
        int ran = second_ran;
        xshard::mpi::allreduce(world, std::span(&ran, 1), xshard::reduction::sum);
        for (auto& w : kept)
            w.reset(); // collective, in the order made
        kept.clear();
        if (rank == 0 && ran == size)
            std::printf("finalize hooks: the second before the first on every rank, %s\n",
                        shared ? "kept windows freed" : "no shared memory");
        else if (rank == 0)
            std::printf("finalize hooks: the second ran first on %d of %d ranks\n", ran, size);
    });
    xshard::detail::before_finalize([] { second_ran = 1; });
    if (rank == 0)
        std::printf("hooks registered\n");
    return 0;
}
