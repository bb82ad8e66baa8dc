// The redistribution planner at compile time, and plan costs against closed forms at scale.

#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/planner.hpp>

#include "layouts.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>

namespace {

using xshard::layout;
using xshard::mesh_shape;
using xshard::plan_redistribution;
using xshard::step_kind;
using K = step_kind;

/// Whether candidate `i` of the plan from `a` to `b` has exactly the steps `kinds`.
constexpr bool plan_is(const layout& a, const layout& b, std::size_t i,
                       std::initializer_list<step_kind> kinds) {
    const auto c = plan_redistribution(a, b);
    if (i >= c.paths.size() || c.paths[i].size() != kinds.size())
        return false;
    std::size_t k = 0;
    for (auto kind : kinds)
        if (c.paths[i][k++].kind != kind)
            return false;
    return true;
}

constexpr std::size_t candidates(const layout& a, const layout& b) {
    return plan_redistribution(a, b).paths.size();
}

// The step table, one mesh axis at a time.
static_assert(plan_is("[dp, -]", "[-, -]", 0, {K::all_gather}));
static_assert(plan_is("[-, -]", "[dp, -]", 0, {K::slice}));
static_assert(plan_is("[dp, -]", "[-, dp]", 0, {K::all_to_all}));
static_assert(plan_is("[-, -] partial(sum: dp)", "[-, -]", 0, {K::all_reduce}));
static_assert(plan_is("[-, -] partial(sum: dp)", "[dp, -]", 0, {K::reduce_scatter}));
static_assert(plan_is("[-, -]", "[-, -] partial(sum: dp)", 0, {K::zero}));
static_assert(plan_is("[dp, mp]", "[dp, mp]", 0, {}) && candidates("[dp, mp]", "[dp, mp]") == 1);
static_assert(plan_is("[-] partial(max: dp, mp)", "[-] partial(max: mp, dp)", 0, {}));
// Each of those is a single step, so both candidates agree.
static_assert(candidates("[dp, -]", "[-, dp]") == 1 && candidates("[-, -]", "[dp, -]") == 1);

// The steps name their axes and dimensions.
constexpr auto a2a = plan_redistribution("[dp, -]", "[-, dp]").paths[0][0];
static_assert(a2a.axes.size() == 1 && a2a.axes[0] == "dp" && a2a.dim == 0 && a2a.dim2 == 1);
constexpr auto rs = plan_redistribution("[-, -] partial(sum: mp)", "[-, mp]").paths[0][0];
static_assert(rs.axes[0] == "mp" && rs.dim == 1 && rs.to == layout("[-, mp]"));

// Tricky pairs. A reorder of a fused dimension: two all-to-alls, or one exchange.
static_assert(plan_is("[(dp,mp), -]", "[-, (mp,dp)]", 0, {K::all_to_all, K::all_to_all}));
static_assert(plan_is("[(dp,mp), -]", "[-, (mp,dp)]", 1, {K::exchange}));
// (dp,mp) -> (mp,dp) on one dimension: gathers then slices, or one exchange.
static_assert(plan_is("[(dp,mp)]", "[(mp,dp)]", 0,
                      {K::slice, K::all_gather, K::all_gather, K::slice}) ||
              plan_is("[(dp,mp)]", "[(mp,dp)]", 0,
                      {K::all_gather, K::all_gather, K::slice, K::slice}));
static_assert(plan_is("[(dp,mp)]", "[(mp,dp)]", 1, {K::exchange}));
// A pending sum scattered into dim 0 while dim 1 is gathered: reduce_scatter first (it
// shrinks the data), then all_gather (the first two candidates agree); or, valid whatever
// the extents, all_reduce then one exchange.
static_assert(plan_is("[-, mp] partial(sum: dp)", "[dp, -]", 0,
                      {K::reduce_scatter, K::all_gather}));
static_assert(plan_is("[-, mp] partial(sum: dp)", "[dp, -]", 1, {K::all_reduce, K::exchange}));
static_assert(candidates("[-, mp] partial(sum: dp)", "[dp, -]") == 2);
// Partial to partial with another reduction: reduce, then keep one term.
static_assert(plan_is("[-] partial(sum: dp)", "[-] partial(max: dp)", 0, {K::all_reduce, K::zero}));
// Split to partial: gather, then keep one term.
static_assert(plan_is("[dp]", "[-] partial(sum: dp)", 0, {K::all_gather, K::zero}));
// Every candidate ends on the destination and chains its layouts.
constexpr bool chains(const layout& a, const layout& b) {
    for (const auto& path : plan_redistribution(a, b).paths) {
        layout x = a;
        for (const auto& s : path) {
            if (!(s.from == x))
                return false;
            x = s.to;
        }
        if (!(x == b))
            return false;
    }
    return true;
}
static_assert(chains("[(dp,mp), -] partial(sum: sp)", "[sp, (mp,dp)]"));
static_assert(chains("[mp, dp, sp]", "[-, -, -] partial(max: dp, mp, sp)"));

TEST(planner, every_pair_of_layouts_has_chained_candidates) {
    // Exhaustive over a 3-axis mesh and rank-2 tensors (constexpr code run at run time).
    const auto m = mesh_shape::parse("a=2,b=2,c=2");
    const auto layouts = xshard::testing::all_layouts(m, 2, true);
    std::size_t pairs = 0;
    for (const auto& from : layouts) {
        for (const auto& to : layouts) {
            EXPECT_TRUE(chains(from, to)) << from << " -> " << to;
            ++pairs;
        }
    }
    EXPECT_GT(pairs, 10000u);
}

TEST(planner, costs_at_scale_match_the_closed_forms) {
    // Meshes far larger than the machine: the plan is priced for rank 0 from the shape alone.
    const xshard::cost_model model{};
    for (int p : {1024, 16384}) {
        const auto m = mesh_shape::parse("dp=" + std::to_string(p));
        const std::array<std::size_t, 2> shape{std::size_t(p) * 4, std::size_t(p) * 2}; // divisible
        const std::size_t n = shape[0] * shape[1] * sizeof(double);
        const double pp = double(p);
        auto price = [&](const layout& a, const layout& b) {
            const auto c = plan_redistribution(a, b);
            return xshard::summarize(c.paths[0], m, shape, sizeof(double), 0, model);
        };
        // Ring all-gather: (p-1) alpha + (p-1)/p n beta.
        const auto ag = price("[dp, -]", "[-, -]");
        const double ag_expected = (pp - 1) * model.all_gather.alpha +
                                   (pp - 1) / pp * double(n) * model.all_gather.beta +
                                   model.copy * double(n) / pp;
        EXPECT_NEAR(ag.seconds, ag_expected, 1e-9 * ag_expected) << p;
        EXPECT_EQ(ag.bytes_received(), n - n / std::size_t(p));
        // All-reduce: 2 (p-1) alpha + 2 (p-1)/p n beta.
        const auto ar = price("[-, -] partial(sum: dp)", "[-, -]");
        const double ar_expected = 2 * (pp - 1) * model.all_reduce.alpha +
                                   2 * (pp - 1) / pp * double(n) * model.all_reduce.beta;
        EXPECT_NEAR(ar.seconds, ar_expected, 1e-9 * ar_expected) << p;
        // Reduce-scatter: (p-1) alpha + (p-1)/p n beta (+ the copy of the own term).
        const auto rsum = price("[-, -] partial(sum: dp)", "[dp, -]");
        const double rs_expected = (pp - 1) * model.reduce_scatter.alpha +
                                   (pp - 1) / pp * double(n) * model.reduce_scatter.beta +
                                   model.copy * double(n) / pp;
        EXPECT_NEAR(rsum.seconds, rs_expected, 1e-9 * rs_expected) << p;
        // All-to-all: (p-1) alpha + (p-1)/p (n/p) beta per rank.
        const auto at = price("[dp, -]", "[-, dp]");
        const double at_expected =
            (pp - 1) * model.all_to_all.alpha +
            (pp - 1) / pp * double(n / std::size_t(p)) * model.all_to_all.beta +
            model.copy * double(n / std::size_t(p) / std::size_t(p));
        EXPECT_NEAR(at.seconds, at_expected, 1e-9 * at_expected) << p;
        // Slice: a local copy only.
        const auto sl = price("[-, -]", "[dp, -]");
        EXPECT_EQ(sl.bytes_sent(), 0u);
        EXPECT_NEAR(sl.seconds, model.copy * double(n) / pp, 1e-15);
    }
}

TEST(planner, printout_names_steps_communicators_and_costs) {
    const auto m = mesh_shape::parse("dp=2,mp=2");
    const std::array<std::size_t, 2> shape{1024, 1024};
    const auto c = plan_redistribution("[-, mp] partial(sum: dp)", "[dp, -]");
    const auto s = xshard::summarize(c.paths[0], m, shape, sizeof(double), 0, xshard::cost_model{});
    const auto text = xshard::describe(s, m);
    EXPECT_NE(text.find("1. reduce_scatter(dp): [-, mp] partial(sum: dp) -> [dp, mp]"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("over {dp} (2 ranks), 1 messages, sent 2.000 MiB, received 2.000 MiB"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("2. all_gather(mp): [dp, mp] -> [dp, -]"), std::string::npos) << text;
    EXPECT_NE(text.find("per rank: sent 4.000 MiB, received 4.000 MiB"), std::string::npos) << text;
    EXPECT_NE(text.find("on mesh(dp=2, mp=2)"), std::string::npos) << text;
}

} // namespace
