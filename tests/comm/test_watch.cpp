// Watched waits (comm/watch.hpp): a rank that fails between two collectives of a failure
// scope ends the others' wait, which raise peer_failure naming it; the communicator is then
// broken on every rank; the watchdog ends a collective that a rank never reaches and names
// that rank; the flight recorder keeps the last waits.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/watch.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <mpi.h>

#include <chrono>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace {

using xshard::testing::world;
/// Failures unprinted, and a grace of 0.1 s after a notice: in these tests the failing rank
/// never reaches the collective the others wait in, so the grace (1 s by default) only
/// delays what they raise; the assertions hold for any grace.
struct quiet_watch : xshard::testing::quiet_failures {
    quiet_watch() {
        auto s = xshard::current_watch_settings();
        s.notice_grace = std::chrono::duration<double>(0.1);
        xshard::set_watch_settings(s);
    }
};

/// What a failing rank throws: not an xshard::error, so that the test tells it from the
/// peer_failure the others raise.
struct user_failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// The world rank of rank `r` of `c`.
int world_rank_of(const xshard::communicator& c, int r) {
    return xshard::detail::world_ranks(c.native())[std::size_t(r)];
}

constexpr int chain_length = 7;

/// Collective `i` of a chain over `c` (short and long reductions, a broadcast, an
/// all-gather, a barrier, a ring of point-to-point messages, an all-to-all), each checked
/// against its serial value.
void chain_step(const xshard::communicator& c, int i) {
    namespace mpi = xshard::mpi;
    const int p = c.size(), me = c.rank();
    switch (i) {
    case 0: {
        int v = me + 1;
        mpi::allreduce(c, std::span(&v, 1), xshard::reduction::sum);
        EXPECT_EQ(v, p * (p + 1) / 2);
        break;
    }
    case 1: { // past watch_barrier_bytes: the barrier, then MPI's blocking call
        std::vector<double> v(2048, double(me));
        mpi::allreduce(c, v, xshard::reduction::sum);
        EXPECT_EQ(v[2047], double(p * (p - 1) / 2));
        break;
    }
    case 2: {
        std::vector<int> v(4096, me == 0 ? 7 : 0);
        mpi::bcast(c, v, 0);
        EXPECT_EQ(v[4095], 7);
        break;
    }
    case 3: {
        std::vector<int> all(static_cast<std::size_t>(p));
        const int mine = 10 * me;
        mpi::allgather(c, std::span(&mine, 1), all);
        for (int r = 0; r < p; ++r)
            EXPECT_EQ(all[std::size_t(r)], 10 * r);
        break;
    }
    case 4:
        mpi::barrier(c);
        break;
    case 5: {
        const int out = me;
        int in = -1;
        mpi::sendrecv(c, std::span(&out, 1), (me + 1) % p, std::span(&in, 1), (me + p - 1) % p);
        EXPECT_EQ(in, (me + p - 1) % p);
        break;
    }
    default: {
        std::vector<int> out(std::size_t(p) * 1024), in(out.size());
        for (std::size_t k = 0; k < out.size(); ++k)
            out[k] = me * 100000 + int(k / 1024);
        mpi::alltoall(c, out, in);
        for (int r = 0; r < p; ++r)
            EXPECT_EQ(in[std::size_t(r) * 1024], r * 100000 + me);
        break;
    }
    }
}

/// Runs the chain in a failure scope over a new communicator, rank `thrower` throwing
/// before collective `at` (at == chain_length: after the last), and checks what every rank
/// raises and whether the communicator is broken.
void throw_in_chain(int thrower, int at) {
    const auto c = world().dup();
    const std::string text = "the test's failure before collective " + std::to_string(at);
    try {
        xshard::agreed(c, [&] {
            for (int i = 0; i < chain_length; ++i) {
                if (i == at && c.rank() == thrower)
                    throw user_failure(text);
                chain_step(c, i);
            }
            if (at == chain_length && c.rank() == thrower)
                throw user_failure(text);
        });
        ADD_FAILURE() << "rank " << c.rank() << " did not raise (failure at " << at << ")";
    } catch (const user_failure& e) {
        EXPECT_EQ(c.rank(), thrower);
        EXPECT_EQ(e.what(), text);
    } catch (const xshard::peer_failure& e) {
        EXPECT_NE(c.rank(), thrower);
        EXPECT_EQ(e.rank(), world_rank_of(c, thrower));
        EXPECT_EQ(e.message(), text);
        EXPECT_EQ(std::string(e.what()),
                  "xshard: rank " + std::to_string(e.rank()) + " failed: " + text);
    }
    // The others waited in collective `at`, which the thrower never reached.
    const bool abandoned = c.size() > 1 && at < chain_length;
    EXPECT_EQ(c.broken(), abandoned) << "failure at " << at;
    if (abandoned) {
        int v = 1;
        EXPECT_THROW(xshard::mpi::allreduce(c, std::span(&v, 1), xshard::reduction::sum),
                     xshard::error);
        EXPECT_THROW(xshard::agreed(c, [] {}), xshard::error);
    }
}

/// Every rank still in step on a communicator made after the failures: no notice is left
/// over to end a later wait.
void expect_in_step() {
    const auto c = world().dup();
    for (int i = 0; i < chain_length; ++i)
        chain_step(c, i);
    EXPECT_FALSE(c.broken());
}

TEST(watch, a_throw_at_every_position_of_a_chain_raises_on_every_rank) {
    quiet_watch quiet;
    const int last = world().size() - 1;
    for (int at = 0; at <= chain_length; ++at)
        throw_in_chain(last, at);
    throw_in_chain(0, 3);
    expect_in_step();
}

TEST(watch, several_ranks_failing_at_once_name_the_lowest) {
    quiet_watch quiet;
    const auto c = world().dup();
    const bool fails = c.rank() % 2 == 1 || c.size() == 1;
    try {
        xshard::agreed(c, [&] {
            for (int i = 0; i < chain_length; ++i) {
                if (fails && i == 2)
                    throw user_failure("rank " + std::to_string(c.rank()));
                chain_step(c, i);
            }
        });
        ADD_FAILURE() << "rank " << c.rank() << " did not raise";
    } catch (const user_failure& e) {
        EXPECT_TRUE(fails);
        EXPECT_EQ(e.what(), "rank " + std::to_string(c.rank()));
    } catch (const xshard::peer_failure& e) {
        // Whichever notice ended its wait, every other rank names the lowest failing rank.
        EXPECT_FALSE(fails);
        EXPECT_EQ(e.rank(), world_rank_of(c, 1));
        EXPECT_EQ(e.message(), "rank 1");
    }
    EXPECT_EQ(c.broken(), c.size() > 1);
    expect_in_step();
}

TEST(watch, the_watchdog_names_the_rank_that_never_arrives) {
    const auto c = world().dup();
    if (c.size() == 1)
        GTEST_SKIP() << "one rank waits for no one";
    quiet_watch quiet;
    auto s = xshard::current_watch_settings();
    s.timeout = std::chrono::duration<double>(0.3);
    xshard::set_watch_settings(s);
    const int absent = c.size() - 1;
    if (c.rank() == absent) {
        // Away, in no wait, until the others have given up and asked.
        std::this_thread::sleep_for(std::chrono::seconds(3));
    } else {
        int v = 1;
        try {
            xshard::mpi::allreduce(c, std::span(&v, 1), xshard::reduction::sum);
            ADD_FAILURE() << "the all-reduce completed without rank " << absent;
        } catch (const xshard::collective_timeout& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find("MPI_Allreduce (4 bytes) has not completed after 0.3"),
                      std::string::npos)
                << what;
            EXPECT_NE(what.find("not waiting in a collective: " +
                                std::to_string(world_rank_of(c, absent))),
                      std::string::npos)
                << what;
            EXPECT_NE(
                what.find("ranks (in MPI_COMM_WORLD): " + std::to_string(world_rank_of(c, 0))),
                std::string::npos)
                << what;
        }
        EXPECT_TRUE(c.broken());
        const auto recorded = xshard::flight_recorder();
        ASSERT_FALSE(recorded.empty());
        EXPECT_EQ(recorded.back().operation, "MPI_Allreduce");
        EXPECT_EQ(recorded.back().status, xshard::flight_entry::state::abandoned);
        EXPECT_EQ(recorded.back().members, c.size());
    }
    xshard::set_watch_settings(quiet.saved);
    expect_in_step();
}

TEST(watch, the_flight_recorder_keeps_the_last_waits) {
    const auto c = world().dup();
    if (c.size() == 1)
        GTEST_SKIP() << "a one-rank collective waits for no one";
    std::vector<double> v(1000, 1.0);
    xshard::mpi::allreduce(c, v, xshard::reduction::sum);
    xshard::mpi::bcast(c, v, 0);
    const auto recorded = xshard::flight_recorder();
    ASSERT_GE(recorded.size(), 2u);
    const auto& a = recorded[recorded.size() - 2];
    const auto& b = recorded.back();
    EXPECT_EQ(a.operation, "MPI_Allreduce");
    EXPECT_EQ(a.bytes, 8000u);
    EXPECT_EQ(b.operation, "MPI_Bcast");
    EXPECT_EQ(b.sequence, a.sequence + 1);
    for (const auto* e : {&a, &b}) {
        EXPECT_EQ(e->status, xshard::flight_entry::state::done);
        EXPECT_EQ(e->members, c.size());
        EXPECT_EQ(e->communicator, reinterpret_cast<std::uintptr_t>(c.native()));
    }
    const std::string text = xshard::detail::flight_recorder_text();
    EXPECT_NE(text.find("MPI_Bcast, 8000 bytes, " + std::to_string(c.size()) + " ranks"),
              std::string::npos)
        << text;
}

} // namespace
