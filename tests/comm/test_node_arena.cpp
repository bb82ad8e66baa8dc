// Node storage: the arena in a shared window (first fit, 64-byte alignment, reuse and
// coalescing of freed blocks, the heap when full or closed), where a pointer lies in it,
// and every member reading a block another member allocated.

#include <xshard/comm/node_arena.hpp>
#include <xshard/comm/node_barrier.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace {

using xshard::testing::world;

TEST(node_arena, allocates_aligned_reuses_and_coalesces) {
    const auto w = world();
    xshard::node_storage storage(w, 64 * 1024);
    if (!storage.is_open())
        GTEST_SKIP() << "shared memory turned off";
    EXPECT_TRUE(xshard::node_arena::current());
    const std::size_t capacity = storage.capacity();
    EXPECT_GE(capacity, 64u * 1024u - 64u);
    xshard::node_allocator<double> a;
    double* p = a.allocate(3);
    double* q = a.allocate(10);
    double* r = a.allocate(1);
    for (const double* x : {p, q, r}) {
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(x) % 64, 0u) << "rank " << w.rank();
        const auto at = xshard::node_arena::locate(x);
        ASSERT_TRUE(at.has_value());
        EXPECT_EQ(at->node_rank, w.rank());
    }
    EXPECT_EQ(storage.free_bytes(), capacity - 64 - 128 - 64);
    // Freed blocks are reused (first fit) and free neighbours merge.
    a.deallocate(p, 3);
    double* p2 = a.allocate(8); // 64 bytes: fits where p was
    EXPECT_EQ(p2, p);
    a.deallocate(p2, 8);
    a.deallocate(r, 1);
    EXPECT_EQ(storage.free_blocks(), 2u) << "rank " << w.rank(); // where p was, and r to the end
    a.deallocate(q, 10);
    EXPECT_EQ(storage.free_blocks(), 1u) << "rank " << w.rank();
    EXPECT_EQ(storage.free_bytes(), capacity);
    // A block larger than the segment, and one that no longer fits, come from the heap.
    double* big = a.allocate(capacity); // capacity * 8 bytes
    EXPECT_FALSE(xshard::node_arena::locate(big).has_value());
    double* all = a.allocate(capacity / sizeof(double));
    EXPECT_TRUE(xshard::node_arena::locate(all).has_value());
    double* more = a.allocate(1);
    EXPECT_FALSE(xshard::node_arena::locate(more).has_value());
    a.deallocate(more, 1);
    a.deallocate(big, capacity);
    a.deallocate(all, capacity / sizeof(double));
    EXPECT_EQ(storage.free_bytes(), capacity);
    // Memory outside the arena.
    std::vector<double> heap(4);
    const double local = 0;
    EXPECT_FALSE(xshard::node_arena::locate(heap.data()).has_value());
    EXPECT_FALSE(xshard::node_arena::locate(&local).has_value());
    EXPECT_TRUE(a == xshard::node_allocator<float>());
}

TEST(node_arena, every_member_reads_a_block_another_allocated) {
    const auto w = world();
    xshard::node_storage storage(w, 1 << 20);
    if (!storage.is_open())
        GTEST_SKIP() << "shared memory turned off";
    xshard::node_barrier barrier(w);
    constexpr std::size_t n = 1000 + 7;
    xshard::node_allocator<std::int64_t> a;
    std::int64_t* skip = a.allocate(std::size_t(w.rank()) * 5 + 1); // offsets differ per rank
    std::int64_t* mine = a.allocate(n);
    for (std::size_t i = 0; i < n; ++i)
        mine[i] = std::int64_t(w.rank()) * 1000000 + std::int64_t(i);
    const auto at = xshard::node_arena::locate(mine);
    ASSERT_TRUE(at.has_value());
    std::vector<std::int64_t> where(2 * std::size_t(w.size()));
    const std::int64_t me[2] = {at->node_rank, std::int64_t(at->offset)};
    xshard::mpi::allgather(w, std::span(me, 2), where);
    barrier.arrive_and_wait();
    const auto arena = xshard::node_arena::current();
    for (int q = 0; q < w.size(); ++q) {
        const auto* theirs = reinterpret_cast<const std::int64_t*>(arena->address(
            int(where[2 * std::size_t(q)]), std::size_t(where[2 * std::size_t(q) + 1])));
        const auto back = xshard::node_arena::locate(theirs);
        ASSERT_TRUE(back.has_value());
        EXPECT_EQ(back->node_rank, where[2 * std::size_t(q)]);
        for (std::size_t i = 0; i < n; ++i)
            ASSERT_EQ(theirs[i], std::int64_t(q) * 1000000 + std::int64_t(i))
                << "rank " << w.rank() << " reading " << q << " element " << i;
    }
    barrier.arrive_and_wait();
    a.deallocate(mine, n);
    a.deallocate(skip, std::size_t(w.rank()) * 5 + 1);
}

TEST(node_arena, closed_storage_sends_allocations_to_the_heap) {
    const auto w = world();
    xshard::node_allocator<float> a;
    float* kept = nullptr;
    {
        xshard::node_storage storage(w, 4096);
        if (storage.is_open()) {
            EXPECT_THROW(xshard::node_storage(w, 4096), xshard::error);
        }
        kept = a.allocate(16); // outlives the storage: the window stays mapped
        kept[15] = 1.5f;
    }
    EXPECT_FALSE(xshard::node_arena::current());
    float* p = a.allocate(4);
    EXPECT_FALSE(xshard::node_arena::locate(p).has_value());
    a.deallocate(p, 4);
    EXPECT_EQ(kept[15], 1.5f);
    a.deallocate(kept, 16);
    // A new storage opens after the old one closed.
    xshard::node_storage again(w, 4096);
    EXPECT_EQ(again.is_open(), xshard::shared_memory_allowed());
}

} // namespace
