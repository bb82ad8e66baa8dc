// The heap that xshard::environment leaves (comm/heap.hpp): a 24 MiB block comes from the
// heap, not a mapping of its own, and, freed and then allocated again, comes back without
// page faults (the freed block was kept for reuse). Run with XSHARD_KEEP_FREED_MEMORY=0, or
// with a threshold of the user's in GLIBC_TUNABLES ("default"), glibc's own policy shows:
// the block is mapped on its own and returned to the system when freed, so that touching it
// again faults in every page (counted where pages are 4 KiB). Rank 0 prints the verdict of
// every rank together; the exit status is 1 when it is wrong.
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/environment.hpp>
#include <xshard/comm/heap.hpp>

#include <malloc.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>

namespace {

long minor_faults() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

struct reuse {
    bool mapped = false; ///< the first allocation was mapped on its own
    long faults = 0;     ///< the page faults of allocating, touching and freeing it again
};

reuse allocate_twice(std::size_t bytes) {
    reuse r;
    for (int round = 0; round < 2; ++round) {
        const long before = minor_faults();
        const auto mappings = mallinfo2().hblks;
        auto* p = static_cast<char*>(std::malloc(bytes));
        if (!p)
            std::abort();
        if (round == 0)
            r.mapped = mallinfo2().hblks > mappings;
        std::memset(p, round + 1, bytes);
        asm volatile("" : : "r"(p) : "memory"); // the block is used: no elision
        std::free(p);
        r.faults = minor_faults() - before;
    }
    return r;
}

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto world = xshard::communicator::world();
    const bool kept = argc > 1 && std::string_view(argv[1]) == "kept";
    constexpr std::size_t bytes = std::size_t(24) << 20;
    const reuse r = allocate_twice(bytes);
    const long pages = long(bytes / 4096);
    // Where the heap is on huge pages, touching the block again faults once per 2 MiB.
    const bool small_pages = !xshard::heap_on_huge_pages();
    bool ok = kept ? !r.mapped && r.faults <= 16
                   : r.mapped && (!small_pages || r.faults >= pages / 2);
    long worst[2] = {r.faults, ok ? 0 : 1};
    xshard::mpi::allreduce(world, std::span(worst), xshard::reduction::max);
    ok = worst[1] == 0;
    if (world.rank() == 0) {
        std::printf("reusing a freed 24 MiB block (%ld pages of 4 KiB): %ld page faults, %s\n",
                    pages, worst[0], small_pages ? "4 KiB pages" : "huge pages");
        if (kept)
            std::printf("%s\n", ok ? "freed blocks kept for reuse"
                                   : "blocks mapped on their own or returned to the system");
        else
            std::printf("glibc's default: %s\n", ok ? "freed blocks returned to the system"
                                                    : "freed blocks kept, unexpectedly");
    }
    return ok ? 0 : 1;
}
