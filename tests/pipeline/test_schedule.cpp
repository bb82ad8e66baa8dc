// Schedule tables at run time: the same function as at compile time (larger grids than a
// static_assert affords), and misuse raising xshard::error with a sentence.

#include <xshard/pipeline/analysis.hpp>

#include "expect_error.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

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

TEST(schedule, the_forward_schedule_runs_every_forward_pass_once_without_deadlock) {
    // Each (micro-batch, virtual stage) once, on its stage's rank, with the transfers its
    // stages imply; replayed as ranks that take their next pass once its input exists, every
    // rank reaches its end (no wait for ever), whatever m (no multiple of p needed).
    using k = pp::schedule_kind;
    for (int p : {1, 2, 3, 4, 7})
        for (int v : {1, 2, 3})
            for (int m : {1, 2, 5, 8}) {
                const pp::schedule_config c{v > 1 ? k::interleaved : k::one_f_one_b, p, m, v};
                const auto s = pp::make_forward_schedule(c);
                const std::string where = "p " + std::to_string(p) + " v " + std::to_string(v) +
                                          " m " + std::to_string(m);
                ASSERT_EQ(int(s.ranks.size()), p) << where;
                const int stages = p * v;
                std::vector<int> seen(std::size_t(stages * m), 0);
                for (int r = 0; r < p; ++r)
                    for (const auto& a : s.ranks[std::size_t(r)]) {
                        EXPECT_EQ(a.kind, pp::pass::forward) << where;
                        EXPECT_EQ(c.rank_of_stage(a.stage), r) << where;
                        EXPECT_EQ(a.recv_from, a.stage > 0 ? c.rank_of_stage(a.stage - 1) : -1);
                        EXPECT_EQ(a.send_to,
                                  a.stage < stages - 1 ? c.rank_of_stage(a.stage + 1) : -1);
                        ++seen[std::size_t(a.stage * m + a.micro_batch)];
                    }
                for (const int n : seen)
                    EXPECT_EQ(n, 1) << where;
                // The replay: done[(stage, mb)] once run; a pass runs when the previous
                // stage's pass of its micro-batch has.
                std::vector<bool> done(seen.size(), false);
                std::vector<std::size_t> next(std::size_t(p), 0);
                for (bool progress = true; progress;) {
                    progress = false;
                    for (int r = 0; r < p; ++r) {
                        auto& i = next[std::size_t(r)];
                        const auto& row = s.ranks[std::size_t(r)];
                        while (i < row.size() &&
                               (row[i].stage == 0 ||
                                done[std::size_t((row[i].stage - 1) * m + row[i].micro_batch)])) {
                            done[std::size_t(row[i].stage * m + row[i].micro_batch)] = true;
                            ++i;
                            progress = true;
                        }
                    }
                }
                for (int r = 0; r < p; ++r)
                    EXPECT_EQ(next[std::size_t(r)], s.ranks[std::size_t(r)].size())
                        << where << ": rank " << r << " waits for ever";
            }
    expect_error(
        [] {
            pp::make_forward_schedule({k::interleaved, 2, 4, 65});
        },
        "between 1 and 64 virtual stages per rank, not 65");
    expect_error(
        [] {
            pp::make_forward_schedule({k::one_f_one_b, 2, 0, 1});
        },
        "between 1 and 2^20 micro-batches, not 0");
}
