// The data pipeline's random numbers (data/random.hpp): defined bit for bit, so every rank
// draws the same; checked against the standard's own definitions and their statistics.

#include <xshard/comm/collectives.hpp>
#include <xshard/data/random.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace {

namespace xd = xshard::data;

TEST(random, the_engine_is_mt19937_64_seeded_through_seed_seq) {
    // The standard fixes both: the 10000th draw of a default-seeded mt19937_64 is
    // 9981545732273789042, and seed_seq's mixing is specified word for word.
    std::mt19937_64 reference;
    reference.discard(9999);
    EXPECT_EQ(reference(), 9981545732273789042ull);
    std::seed_seq seq{0x89abcdefu, 0x01234567u, 7u, 0u};
    std::mt19937_64 expected(seq);
    auto e = xd::seeded_engine(0x0123456789abcdefull, 7);
    for (int i = 0; i < 100; ++i)
        ASSERT_EQ(e(), expected());
    // Different streams differ.
    auto a = xd::seeded_engine(1, 0), b = xd::seeded_engine(1, 1);
    EXPECT_NE(a(), b());
}

TEST(random, uniform_draws_stay_in_range_and_are_the_same_on_every_rank) {
    const auto w = xshard::testing::world();
    auto e = xd::seeded_engine(42, 3);
    std::vector<std::uint64_t> counts(7, 0);
    std::uint64_t checksum = 0;
    for (int i = 0; i < 70000; ++i) {
        const auto x = xd::uniform_below(e, 7);
        ASSERT_LT(x, 7u);
        ++counts[x];
        checksum = checksum * 31 + x;
        const double u = xd::uniform_unit(e);
        ASSERT_GE(u, 0.0);
        ASSERT_LT(u, 1.0);
    }
    for (auto c : counts) // 10000 expected each; 5 standard deviations is about 450
        EXPECT_NEAR(double(c), 10000.0, 500.0);
    EXPECT_EQ(xd::uniform_below(e, 1), 0u);
    // Every rank drew the same numbers.
    std::vector<std::uint64_t> all(std::size_t(w.size()));
    xshard::mpi::allgather(w, std::span(&checksum, 1), all);
    for (auto c : all)
        EXPECT_EQ(c, checksum);
}

TEST(random, normal_draws_have_mean_0_and_variance_1) {
    auto e = xd::seeded_engine(5, 0);
    double sum = 0, squares = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
        const double x = xd::standard_normal(e);
        ASSERT_TRUE(std::isfinite(x));
        sum += x;
        squares += x * x;
    }
    EXPECT_NEAR(sum / n, 0.0, 0.02);
    EXPECT_NEAR(squares / n, 1.0, 0.02);
}

} // namespace
