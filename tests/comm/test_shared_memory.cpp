// The node-local transport: which ranks share a node, shared-memory windows (every member
// reads every other's segment), and the node barrier that orders writers and readers, with
// deliberately slow writers: no rank may read a segment before its owner finished writing.

#include <xshard/comm/node.hpp>
#include <xshard/comm/node_arena.hpp>
#include <xshard/comm/node_barrier.hpp>
#include <xshard/comm/pairwise_reduce.hpp>
#include <xshard/comm/shared_window.hpp>

#include "mpi_test.hpp"
#include "traffic.hpp"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

using xshard::testing::world;

TEST(shared_memory, the_test_world_is_one_node) {
    const auto w = world();
    const xshard::node_group node(w);
    // ctest starts every rank on this machine.
    EXPECT_EQ(node.comm().size(), w.size()) << "rank " << w.rank();
    EXPECT_EQ(node.whole_communicator_shares_memory(), xshard::shared_memory_allowed())
        << "rank " << w.rank();
    // A split communicator: each half on its own, still one node.
    const auto half = w.split(w.rank() % 2, w.rank());
    const xshard::node_group sub(half);
    EXPECT_EQ(sub.comm().size(), half.size()) << "rank " << w.rank();
}

/// A window over ranks of several nodes raises on every rank with the reason, where MPI
/// would end the job (the suite's multi_host.comm runs this on two hosts; ctest's other runs
/// are one node, and skip it).
TEST(shared_memory, a_window_across_nodes_raises_on_every_rank) {
    const auto w = world();
    if (xshard::node_group(w).comm().size() == w.size())
        GTEST_SKIP() << "every rank on one node";
    try {
        const xshard::shared_window across(w, 64);
        ADD_FAILURE() << "a window across nodes was made on rank " << w.rank();
    } catch (const xshard::error& e) {
        EXPECT_NE(std::string(e.what()).find("spans several nodes"), std::string::npos)
            << e.what();
    }
    // Within the node it is made, and every member reads every member's segment.
    const xshard::node_group node(w);
    xshard::shared_window within(node.comm(), 8);
    std::int64_t mine = w.rank();
    std::memcpy(within.segment(node.comm().rank()), &mine, sizeof mine);
    within.sync();
    xshard::mpi::barrier(node.comm());
    within.sync();
    std::vector<std::int64_t> members(std::size_t(node.comm().size()));
    xshard::mpi::allgather(node.comm(), std::span(&mine, 1), members);
    for (int q = 0; q < node.comm().size(); ++q) {
        std::int64_t theirs = -1;
        std::memcpy(&theirs, within.segment(q), sizeof theirs);
        EXPECT_EQ(theirs, members[std::size_t(q)]) << "segment " << q << ", rank " << w.rank();
    }
}

TEST(shared_memory, every_member_reads_every_segment) {
    const auto w = world();
    if (!xshard::node_group(w).whole_communicator_shares_memory())
        GTEST_SKIP() << "shared memory turned off";
    // Segments of different sizes (rank 0's empty when there are several ranks).
    auto bytes = [&](int q) {
        return std::size_t(w.size() > 1 ? q : 1) * 1000 * sizeof(long);
    };
    xshard::shared_window window(w, bytes(w.rank()));
    xshard::node_barrier barrier(w);
    ASSERT_EQ(window.size(), w.size());
    for (int q = 0; q < w.size(); ++q)
        EXPECT_GE(window.segment_bytes(q), bytes(q)) << "rank " << w.rank() << " segment " << q;
    long* mine = reinterpret_cast<long*>(window.local());
    for (std::size_t i = 0; i < bytes(w.rank()) / sizeof(long); ++i)
        mine[i] = long(w.rank()) * 1000000 + long(i);
    barrier.arrive_and_wait();
    for (int q = 0; q < w.size(); ++q) {
        const long* theirs = reinterpret_cast<const long*>(window.segment(q));
        for (std::size_t i = 0; i < bytes(q) / sizeof(long); ++i)
            ASSERT_EQ(theirs[i], long(q) * 1000000 + long(i))
                << "rank " << w.rank() << " segment " << q << " element " << i;
    }
    barrier.arrive_and_wait();
}

TEST(shared_memory, no_rank_reads_before_the_owner_finished_writing) {
    const auto w = world();
    if (!xshard::node_group(w).whole_communicator_shares_memory())
        GTEST_SKIP() << "shared memory turned off";
    constexpr std::size_t n = 1 << 16;
    xshard::shared_window window(w, n * sizeof(std::uint64_t));
    xshard::node_barrier barrier(w);
    auto* mine = reinterpret_cast<std::uint64_t*>(window.local());
    for (std::uint64_t round = 1; round <= 40; ++round) {
        // A different rank is slow each round; it writes its segment in pieces, pausing.
        const bool slow = int(round % std::uint64_t(w.size())) == w.rank();
        for (std::size_t lo = 0; lo < n; lo += n / 4) {
            if (slow)
                std::this_thread::sleep_for(std::chrono::microseconds(500));
            for (std::size_t i = lo; i < lo + n / 4; ++i)
                mine[i] = round * 100 + std::uint64_t(w.rank());
        }
        barrier.arrive_and_wait();
        for (int q = 0; q < w.size(); ++q) {
            const auto* theirs = reinterpret_cast<const std::uint64_t*>(window.segment(q));
            for (std::size_t i = 0; i < n; i += 97)
                ASSERT_EQ(theirs[i], round * 100 + std::uint64_t(q))
                    << "rank " << w.rank() << " read segment " << q << " element " << i
                    << " in round " << round;
            ASSERT_EQ(theirs[n - 1], round * 100 + std::uint64_t(q));
        }
        // Nobody overwrites a segment another rank is still reading.
        barrier.arrive_and_wait();
    }
}

TEST(shared_memory, a_waiting_rank_keeps_mpi_progressing) {
    // Large messages (a rendezvous: the sender's request completes only when the receiver
    // progresses) straight before the node barrier: a rank done with its part waits in the
    // barrier while its peer still waits for MPI; without progress in the barrier, a hang
    // (ctest's timeout).
    const auto w = world();
    if (!xshard::node_group(w).whole_communicator_shares_memory() || w.size() < 2)
        GTEST_SKIP() << "needs shared memory and two ranks";
    xshard::node_barrier barrier(w);
    xshard::reducer<double> r(xshard::reduce_tuning{.shared_memory_min_bytes = SIZE_MAX});
    const std::size_t n = std::size_t(4) << 20; // 32 MiB, pairwise over MPI
    std::vector<double> in(n, 1.0), out(n);
    for (int round = 0; round < 4; ++round) {
        if (w.rank() == round % w.size())
            std::this_thread::sleep_for(std::chrono::milliseconds(3));
        r.all_reduce(w, in.data(), out.data(), n, xshard::reduction::sum);
        barrier.arrive_and_wait();
        EXPECT_EQ(out[n - 1], double(w.size())) << "rank " << w.rank();
    }
}

TEST(shared_memory, windows_are_moved_and_freed_collectively) {
    const auto w = world();
    if (!xshard::node_group(w).whole_communicator_shares_memory())
        GTEST_SKIP() << "shared memory turned off";
    xshard::shared_window a(w, 64);
    xshard::shared_window b = std::move(a);
    EXPECT_FALSE(bool(a));
    EXPECT_TRUE(bool(b));
    a = xshard::shared_window(w, 128);
    EXPECT_GE(a.segment_bytes(w.rank()), 128u);
}

/// A window whose file one rank could not make (its file-size limit is lower than the window)
/// raises on every rank, naming that rank, instead of leaving the others waiting in MPI's
/// allocation; the next window, without the limit, is made.
TEST(shared_memory, a_window_one_rank_cannot_make_raises_on_every_rank) {
    const auto w = world();
    if (!xshard::node_group(w).whole_communicator_shares_memory())
        GTEST_SKIP() << "shared memory turned off";
    const int limited = w.size() - 1;
    rlimit before{};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
    const auto old_handler = std::signal(SIGXFSZ, SIG_IGN); // a write past it fails instead
    if (w.rank() == limited) {
        rlimit low = before;
        low.rlim_cur = 1 << 20;
        ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &low), 0);
    }
    try {
        xshard::shared_window big(w, w.rank() == 0 ? std::size_t(8) << 20 : 0);
        ADD_FAILURE() << "a window past rank " << limited << "'s file-size limit was made";
    } catch (const xshard::error& e) {
        EXPECT_NE(std::string(e.what()).find("file-size limit of rank " + std::to_string(limited)),
                  std::string::npos)
            << e.what();
    }
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &before), 0);
    std::signal(SIGXFSZ, old_handler);
    xshard::shared_window next(w, w.rank() == 0 ? std::size_t(8) << 20 : 0);
    EXPECT_TRUE(bool(next));
    EXPECT_GE(next.segment_bytes(0), std::size_t(8) << 20);
}

TEST(shared_memory, all_reduce_reads_summands_in_place) {
    // Every size through the shared-memory path (growing, so the window is made anew), in
    // place and not, over the world and over halves of it; exact sums, maxima, minima; and
    // not a byte through MPI point to point.
    const auto w = world();
    const bool shared = xshard::node_group(w).whole_communicator_shares_memory();
    const auto half = w.split(w.rank() % 2, w.rank());
    xshard::reducer<double> r(
        xshard::reduce_tuning{.shared_memory_min_bytes = 0, .shared_memory_all_reduce = true});
    for (const auto* c : {&w, &half}) {
        for (std::size_t n : {1, 3, 7, 4096, 4097, 20011}) {
            for (auto op :
                 {xshard::reduction::sum, xshard::reduction::max, xshard::reduction::min}) {
                auto term = [](int q, std::size_t i) {
                    return double(int((i * 13 + std::size_t(q) * 7) % 29) - 14 + 100 * q);
                };
                std::vector<double> in(n), out(n), expected(n);
                for (std::size_t i = 0; i < n; ++i) {
                    in[i] = term(c->rank(), i);
                    expected[i] = term(0, i);
                    for (int q = 1; q < c->size(); ++q)
                        expected[i] = xshard::detail::combine_one(expected[i], term(q, i), op);
                }
                // A slow rank: its summand is staged late.
                if (c->rank() == int(n % std::size_t(c->size())))
                    std::this_thread::sleep_for(std::chrono::milliseconds(2));
                xshard::testing::traffic::reset();
                r.all_reduce(*c, in.data(), out.data(), n, op);
                const auto sent = xshard::testing::traffic::sent();
                EXPECT_EQ(out, expected) << "rank " << w.rank() << " n " << n;
                if (shared) {
                    EXPECT_EQ(sent, 0u) << "rank " << w.rank() << " n " << n;
                }
                r.all_reduce(*c, in.data(), in.data(), n, op);
                EXPECT_EQ(in, expected) << "in place, rank " << w.rank() << " n " << n;
            }
        }
    }
}

TEST(shared_memory, all_reduce_of_pieces_equals_the_packed_all_reduce) {
    // The concatenation of pieces (empty ones, ones across chunk and segment boundaries, in
    // all fewer elements than members too) all-reduced in place without packing, the result
    // finished (halved): exact against a serial sum of integer terms, and bit for bit the
    // packed all-reduce of random terms; sizes shrinking and growing (the window made anew);
    // not a byte through MPI. Over the world and over halves of it.
    const auto w = world();
    const auto half = w.split(w.rank() % 2, w.rank());
    const bool one_node = xshard::node_group(w).whole_communicator_shares_memory();
    xshard::reducer<double> pieces_r,
        packed_r(
            xshard::reduce_tuning{.shared_memory_min_bytes = 0, .shared_memory_all_reduce = true});
    auto halve = [](double* p, std::size_t m) {
        for (std::size_t j = 0; j < m; ++j)
            p[j] *= 0.5;
    };
    using sizes = std::vector<std::size_t>;
    for (const auto* c : {&w, &half}) {
        const bool shares = pieces_r.shares_node(*c);
        EXPECT_EQ(shares, one_node && c->size() > 1) << "rank " << w.rank();
        if (!shares)
            continue;
        for (const auto& lengths : {sizes{5000, 0, 3, 9000, 1}, sizes{1}, sizes{0, 2, 0},
                                    sizes{20011}, sizes{4095, 4097, 0, 12000, 7}}) {
            std::vector<std::vector<double>> exact, random;
            std::vector<double> packed, expected;
            std::mt19937 e(unsigned(c->rank() * 31 + int(lengths.size())));
            std::uniform_real_distribution<double> u(-1, 1);
            for (std::size_t len : lengths) {
                auto& x = exact.emplace_back(len);
                auto& y = random.emplace_back(len);
                for (std::size_t i = 0; i < len; ++i) {
                    const std::size_t at = expected.size();
                    x[i] = double(int((at * 13 + std::size_t(c->rank()) * 7) % 29) - 14);
                    double s = 0;
                    for (int q = 0; q < c->size(); ++q)
                        s += double(int((at * 13 + std::size_t(q) * 7) % 29) - 14);
                    expected.push_back(0.5 * s);
                    y[i] = u(e);
                    packed.push_back(y[i]);
                }
            }
            auto spans = [](std::vector<std::vector<double>>& v) {
                std::vector<std::span<double>> out;
                for (auto& x : v)
                    out.emplace_back(x);
                return out;
            };
            const auto exact_pieces = spans(exact), random_pieces = spans(random);
            xshard::testing::traffic::reset();
            pieces_r.all_reduce_pieces(*c, std::span<const std::span<double>>(exact_pieces),
                                       xshard::reduction::sum, halve);
            pieces_r.all_reduce_pieces(*c, std::span<const std::span<double>>(random_pieces),
                                       xshard::reduction::sum, halve);
            EXPECT_EQ(xshard::testing::traffic::sent(), 0u) << "rank " << w.rank();
            packed_r.all_reduce(*c, packed.data(), packed.data(), packed.size(),
                                xshard::reduction::sum, halve);
            std::vector<double> got, got_random;
            for (std::size_t k = 0; k < lengths.size(); ++k) {
                got.insert(got.end(), exact[k].begin(), exact[k].end());
                got_random.insert(got_random.end(), random[k].begin(), random[k].end());
            }
            EXPECT_EQ(got, expected) << "rank " << w.rank() << " n " << expected.size();
            EXPECT_EQ(got_random, packed) << "rank " << w.rank() << " n " << expected.size();
        }
    }
}

/// Runs the shared-memory all-reduce of `c` on summands (and results) that lie where
/// `in_arena(rank)` / `out_arena(rank)` say, checking exact sums and maxima, in place and not;
/// returns the bytes sent through MPI point to point.
unsigned long long node_reduce_case(xshard::reducer<double>& r, const xshard::communicator& c,
                                    bool in_arena, bool out_arena) {
    using arena_vector = std::vector<double, xshard::node_allocator<double>>;
    unsigned long long sent = 0;
    for (std::size_t n : {1, 7, 4097, 20011}) {
        for (auto op : {xshard::reduction::sum, xshard::reduction::max}) {
            auto term = [](int q, std::size_t i) {
                return double(int((i * 11 + std::size_t(q) * 5) % 31) - 15 + 100 * q);
            };
            arena_vector in_a(in_arena ? n : 0), out_a(out_arena ? n : 0);
            std::vector<double> in_h(in_arena ? 0 : n), out_h(out_arena ? 0 : n), expected(n);
            double* in = in_arena ? in_a.data() : in_h.data();
            double* out = out_arena ? out_a.data() : out_h.data();
            for (std::size_t i = 0; i < n; ++i) {
                in[i] = term(c.rank(), i);
                expected[i] = term(0, i);
                for (int q = 1; q < c.size(); ++q)
                    expected[i] = xshard::detail::combine_one(expected[i], term(q, i), op);
            }
            // A slow writer: its summand is written late.
            if (c.rank() == int(n % std::size_t(c.size()))) {
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
                for (std::size_t i = 0; i < n; ++i)
                    in[i] = term(c.rank(), i);
            }
            xshard::testing::traffic::reset();
            r.all_reduce(c, in, out, n, op);
            sent += xshard::testing::traffic::sent();
            EXPECT_TRUE(std::equal(out, out + n, expected.begin()))
                << "rank " << c.rank() << " n " << n;
            r.all_reduce(c, in, in, n, op);
            sent += xshard::testing::traffic::sent();
            EXPECT_TRUE(std::equal(in, in + n, expected.begin()))
                << "in place, rank " << c.rank() << " n " << n;
        }
    }
    return sent;
}

TEST(shared_memory, all_reduce_reads_node_storage_in_place) {
    // Summands and results in node storage: read and written in place, over the world and
    // over halves of it; exact, not a byte through MPI and no staging window.
    const auto w = world();
    const auto half = w.split(w.rank() % 2, w.rank());
    xshard::node_storage storage(w, 4 << 20);
    int open = storage.is_open() ? 1 : 0;
    xshard::mpi::allreduce(w, std::span(&open, 1), xshard::reduction::min);
    const bool shared = xshard::node_group(w).whole_communicator_shares_memory() && open == 1;
    for (const auto* c : {&w, &half}) {
        xshard::reducer<double> r(
            xshard::reduce_tuning{.shared_memory_min_bytes = 0, .shared_memory_all_reduce = true});
        const auto sent = node_reduce_case(r, *c, true, true);
        if (shared) {
            EXPECT_EQ(sent, 0u) << "rank " << w.rank();
            EXPECT_EQ(r.node_staging_bytes(), 0u) << "rank " << w.rank();
        }
    }
    EXPECT_EQ(storage.free_blocks(), storage.is_open() ? 1u : 0u); // every block returned
}

TEST(shared_memory, all_reduce_stages_what_is_not_in_node_storage) {
    // Mixed: odd members' summands on the heap (staged), even members' in node storage (read
    // in place); then every summand in the arena and every result on the heap (results
    // published through the window). Exact; the window is allocated, no byte through MPI.
    const auto w = world();
    xshard::node_storage storage(w, 4 << 20);
    int open = storage.is_open() ? 1 : 0;
    xshard::mpi::allreduce(w, std::span(&open, 1), xshard::reduction::min);
    const bool shared = xshard::node_group(w).whole_communicator_shares_memory() && open == 1;
    for (int variant = 0; variant < 2; ++variant) {
        xshard::reducer<double> r(
            xshard::reduce_tuning{.shared_memory_min_bytes = 0, .shared_memory_all_reduce = true});
        const bool in_arena = variant == 0 ? w.rank() % 2 == 0 : true;
        const bool out_arena = variant == 0 ? in_arena : false;
        const auto sent = node_reduce_case(r, w, in_arena, out_arena);
        if (shared && w.size() > 1) {
            EXPECT_EQ(sent, 0u) << "rank " << w.rank();
            EXPECT_GT(r.node_staging_bytes(), 0u) << "rank " << w.rank() << " variant " << variant;
        }
    }
}

} // namespace
