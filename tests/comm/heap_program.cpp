// The heap that xshard::environment leaves (comm/heap.hpp): a 24 MiB block, freed and then
// allocated again, comes back without page faults (the freed block was kept for reuse). Run
// with XSHARD_KEEP_FREED_MEMORY=0 ("default"), glibc's own policy shows: the block was
// returned to the system, and touching it again faults in every page. Rank 0 prints the
// largest count over the ranks and the verdict; the exit status is 1 when it is wrong.
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/environment.hpp>

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <string_view>

namespace {

long minor_faults() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

/// The page faults of allocating, touching and freeing `bytes`, the second time.
long faults_when_reused(std::size_t bytes) {
    long faults = 0;
    for (int round = 0; round < 2; ++round) {
        const long before = minor_faults();
        auto* p = static_cast<char*>(std::malloc(bytes));
        if (!p)
            std::abort();
        std::memset(p, round + 1, bytes);
        asm volatile("" : : "r"(p) : "memory"); // the block is used: no elision
        std::free(p);
        faults = minor_faults() - before;
    }
    return faults;
}

bool huge_pages_always() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    std::getline(f, line);
    return line.find("[always]") != std::string::npos;
}

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto world = xshard::communicator::world();
    const bool kept = argc > 1 && std::string_view(argv[1]) == "kept";
    constexpr std::size_t bytes = std::size_t(24) << 20;
    long faults = faults_when_reused(bytes);
    xshard::mpi::allreduce(world, std::span(&faults, 1), xshard::reduction::max);
    const long pages = long(bytes / 4096);
    bool ok = true;
    if (world.rank() == 0) {
        std::printf("reusing a freed 24 MiB block (%ld pages): %ld page faults\n", pages, faults);
        if (kept) {
            ok = faults <= 16;
            std::printf("%s\n", ok ? "freed blocks kept for reuse"
                                   : "freed blocks were returned to the system");
        } else if (huge_pages_always()) {
            std::printf("glibc's default: not checked, transparent huge pages are always on\n");
        } else {
            ok = faults >= pages / 2;
            std::printf("glibc's default: %s\n", ok ? "freed blocks returned to the system"
                                                    : "freed blocks kept, unexpectedly");
        }
    }
    int status = ok ? 0 : 1;
    xshard::mpi::bcast(world, std::span(&status, 1), 0);
    return status;
}
