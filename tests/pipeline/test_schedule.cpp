// Schedule tables at run time: the same function as at compile time (larger grids than a
// static_assert affords), and misuse raising xshard::error with a sentence.

#include <xshard/pipeline/analysis.hpp>

#include "expect_error.hpp"

#include <gtest/gtest.h>

namespace pp = xshard::pipeline;
using xshard::testing::expect_error;

TEST(schedule, closed_forms_on_a_larger_grid) {
    for (int p : {1, 2, 3, 4, 7, 8, 16})
        for (int m : {1, 2, 5, 8, 16, 32, 64}) {
            for (auto k : {pp::schedule_kind::gpipe, pp::schedule_kind::one_f_one_b}) {
                const auto r = pp::analyze(pp::schedule_config{k, p, m, 1});
                ASSERT_TRUE(r.deadlock_free) << r.problem;
                EXPECT_NEAR(r.bubble(), double(p - 1) / (m + p - 1), 1e-15);
            }
            const auto zb =
                pp::analyze(pp::schedule_config{pp::schedule_kind::zero_bubble, p, m, 1});
            ASSERT_TRUE(zb.deadlock_free) << zb.problem;
            if (m >= p) {
                EXPECT_NEAR(zb.bubble(), double(p - 1) / (3 * m + p - 1), 1e-15);
            }
            for (int v : {2, 4}) {
                if (m % p != 0)
                    continue;
                const auto r =
                    pp::analyze(pp::schedule_config{pp::schedule_kind::interleaved, p, m, v});
                ASSERT_TRUE(r.deadlock_free) << r.problem;
                EXPECT_NEAR(r.bubble(), double(p - 1) / (v * m + p - 1), 1e-15);
            }
        }
}

TEST(schedule, misuse_raises_a_sentence) {
    using k = pp::schedule_kind;
    expect_error(
        [] {
            pp::make_schedule({k::interleaved, 4, 6, 2});
        },
        "the interleaved schedule needs the micro-batches (6) to be a multiple of the "
        "stages (4)");
    expect_error(
        [] {
            pp::make_schedule({k::one_f_one_b, 0, 6, 1});
        },
        "a pipeline needs between 1 and 65536 stages, not 0");
    expect_error(
        [] {
            pp::make_schedule({k::gpipe, 2, 0, 1});
        },
        "between 1 and 2^20 micro-batches, not 0");
    expect_error(
        [] {
            pp::make_schedule({k::one_f_one_b, 2, 4, 2});
        },
        "virtual stages (2 per rank) need the interleaved schedule, not 1f1b");
    expect_error(
        [] { pp::parse_schedule("pipedream"); },
        "unknown pipeline schedule 'pipedream' (known: gpipe, 1f1b, interleaved, zero_bubble)");
    EXPECT_EQ(pp::parse_schedule("zbh1"), k::zero_bubble);
    EXPECT_EQ(pp::parse_schedule("1f1b"), k::one_f_one_b);
}
