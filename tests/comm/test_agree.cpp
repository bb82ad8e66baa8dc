// Error agreement (comm/agree.hpp), MPI errors (comm/error.hpp) and requests
// (comm/request.hpp): a fault seen by one rank raises on every rank, naming that rank, and
// leaves every rank in step.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/request.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <mpi.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using xshard::testing::world;

/// A collective every rank completes: the ranks are still in step.
void expect_in_step(const xshard::communicator& c) {
    int one = 1;
    xshard::mpi::allreduce(c, std::span(&one, 1), xshard::reduction::sum);
    EXPECT_EQ(one, c.size());
}

TEST(agree, the_lowest_reporting_rank_on_every_rank) {
    const auto w = world();
    EXPECT_EQ(xshard::first_reporting_rank(w, false), -1);
    EXPECT_EQ(xshard::first_reporting_rank(w, true), 0);
    // Every rank from the middle up reports: the middle one is named everywhere.
    const int middle = w.size() / 2;
    EXPECT_EQ(xshard::first_reporting_rank(w, w.rank() >= middle), middle);
    expect_in_step(w);
}

TEST(agree, the_message_of_the_first_rank_is_raised_everywhere) {
    const auto w = world();
    EXPECT_NO_THROW(xshard::agree_on_error(w, std::nullopt));
    const int last = w.size() - 1;
    std::optional<std::string> mine;
    if (w.rank() >= last) // only the last rank sees the fault
        mine = "file " + std::to_string(w.rank()) + " is damaged";
    try {
        xshard::agree_on_error(w, mine);
        ADD_FAILURE() << "rank " << w.rank() << " did not throw";
    } catch (const xshard::error& e) {
        EXPECT_EQ(std::string(e.what()), "file " + std::to_string(last) + " is damaged");
    }
    expect_in_step(w);
}

struct custom_error : xshard::error {
    using xshard::error::error;
};

TEST(agree, a_callable_throwing_on_one_rank_raises_on_all) {
    const auto w = world();
    // Success: the value, on every rank; a reference stays a reference.
    EXPECT_EQ(xshard::agreed(w, [&] { return w.rank() * 2; }), w.rank() * 2);
    int x = 5;
    int& same = xshard::agreed(w, [&]() -> int& { return x; });
    EXPECT_EQ(&same, &x);
    // The thrower rethrows its own exception; the others throw the named Error type, naming
    // the rank and its message.
    const int thrower = w.size() - 1;
    try {
        xshard::agreed<custom_error>(w, [&] {
            if (w.rank() == thrower)
                throw std::out_of_range("index 7 out of range");
        });
        ADD_FAILURE() << "rank " << w.rank() << " did not throw";
    } catch (const std::out_of_range& e) {
        EXPECT_EQ(w.rank(), thrower);
        EXPECT_STREQ(e.what(), "index 7 out of range");
    } catch (const custom_error& e) {
        EXPECT_NE(w.rank(), thrower);
        EXPECT_EQ(std::string(e.what()),
                  "xshard: rank " + std::to_string(thrower) + " failed: index 7 out of range");
    }
    // Something not derived from std::exception.
    try {
        xshard::agreed(w, [&] {
            if (w.rank() == 0)
                throw 42;
        });
        ADD_FAILURE();
    } catch (int v) {
        EXPECT_EQ(v, 42);
        EXPECT_EQ(w.rank(), 0);
    } catch (const xshard::error& e) {
        EXPECT_NE(std::string(e.what()).find("rank 0 failed: an exception not derived"),
                  std::string::npos)
            << e.what();
    }
    expect_in_step(w);
}

TEST(error, mpi_errors_name_the_call_the_rank_and_mpis_text) {
    const auto w = world();
    try {
        xshard::detail::check_mpi(MPI_ERR_RANK, "MPI_Send");
        ADD_FAILURE();
    } catch (const xshard::mpi_error& e) {
        EXPECT_EQ(e.code(), MPI_ERR_RANK);
        EXPECT_EQ(e.operation(), "MPI_Send");
        EXPECT_EQ(e.rank(), w.rank());
        EXPECT_EQ(std::string(e.what()), "xshard: MPI_Send failed on rank " +
                                             std::to_string(w.rank()) + ": " +
                                             xshard::mpi_error::error_string(MPI_ERR_RANK));
        EXPECT_FALSE(xshard::mpi_error::error_string(MPI_ERR_RANK).empty());
    }
    EXPECT_NO_THROW(xshard::detail::check_mpi(MPI_SUCCESS, "MPI_Send"));
    EXPECT_EQ(xshard::detail::world_rank(), w.rank());
}

TEST(request, waits_tests_moves_and_finishes_on_destruction) {
    const auto w = world();
    std::vector<int> v(4, w.rank() == 0 ? 7 : 0);
    {
        auto r = xshard::mpi::ibcast(w, v, 0);
        EXPECT_TRUE(r.active());
        auto moved = std::move(r);
        EXPECT_FALSE(r.active()); // NOLINT: the moved-from request is empty
        while (!moved.test()) {
        }
        EXPECT_EQ(v, std::vector<int>(4, 7));
    }
    // Destroyed while active: waited for, so the buffer is ready afterwards.
    std::vector<int> u(3, w.rank() == 0 ? 9 : 0);
    { auto r = xshard::mpi::ibcast(w, u, 0); }
    EXPECT_EQ(u, std::vector<int>(3, 9));
    // wait_all over several.
    int a = w.rank(), b = 1;
    std::vector<xshard::request> rs;
    rs.push_back(xshard::mpi::iallreduce(w, std::span(&a, 1), xshard::reduction::max));
    rs.push_back(xshard::mpi::iallreduce(w, std::span(&b, 1), xshard::reduction::sum));
    xshard::wait_all(rs);
    EXPECT_EQ(a, w.size() - 1);
    EXPECT_EQ(b, w.size());
    xshard::request empty;
    EXPECT_FALSE(empty.active());
    EXPECT_TRUE(empty.test());
    empty.wait();
}

} // namespace
