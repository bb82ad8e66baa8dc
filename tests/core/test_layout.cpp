// Layouts, strategies and block partition arithmetic: compile-time and exhaustive checks.

#include <xshard/core/layout.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/strategy.hpp>

#include "layouts.hpp"

#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <set>
#include <string>

namespace {

using xshard::axis_set;
using xshard::layout;
using xshard::mesh_shape;
using xshard::reduction;
using xshard::strategy;

// --- compile time ---------------------------------------------------------------------

constexpr mesh_shape m2x4 = mesh_shape::parse("dp=2,mp=4");
constexpr mesh_shape m222 = mesh_shape::parse("dp=2,mp=2,sp=2");

// Four kinds of layout: one axis per dimension, two axes fused on one, replicated, and a
// pending reduction.
constexpr layout dp_mp = "[dp, mp]";
constexpr layout fused = "[(dp,mp), -]";
constexpr layout replicated = "[-, -]";
constexpr layout pending = "[-, mp] partial(sum: dp)";

static_assert(dp_mp.rank() == 2 && dp_mp.axes(0).size() == 1 && dp_mp.axes(1)[0] == "mp");
static_assert(fused.axes(0).size() == 2 && fused.axes(0)[0] == "dp" && fused.axes(0)[1] == "mp");
static_assert(!fused.is_split(1) && fused.is_split(0));
static_assert(replicated.is_fully_replicated() && !dp_mp.is_fully_replicated());
static_assert(!pending.is_fully_replicated() && pending.is_partial() &&
              pending.op == reduction::sum);
static_assert(layout("[]").rank() == 0 && layout("[]").is_fully_replicated());

// Queries on a mesh.
static_assert(dp_mp.split_count(0, m2x4) == 2 && dp_mp.split_count(1, m2x4) == 4);
static_assert(fused.split_count(0, m2x4) == 8 && fused.split_count(1, m2x4) == 1);
static_assert(pending.partial_axes(m2x4) == axis_set::of(0));
static_assert(pending.replicated_axes(m2x4).empty());
static_assert(layout("[mp, -]").replicated_axes(m2x4) == axis_set::of(0));
static_assert(layout("[sp, -] partial(max: dp)").replicated_axes(m222) == axis_set::of(1));
static_assert(layout("[sp, -] partial(max: dp)").op == reduction::max);
static_assert(*fused.dim_of("mp") == 0 && !replicated.dim_of("dp"));

// Equality, spacing, and what the checks find.
static_assert(layout("[ ( dp , mp ) , - ]") == fused && !(fused == dp_mp));
static_assert(layout("[(mp,dp), -]") != fused); // order within a dimension matters
static_assert(dp_mp.check(m2x4.names) == xshard::layout_problem::none);
static_assert(layout("[dp, dp]").check(m2x4.names) == xshard::layout_problem::axis_used_twice);
static_assert(layout("[dp, -] partial(sum: dp)").check(m2x4.names) ==
              xshard::layout_problem::axis_used_twice);
static_assert(layout("[tp, -]").check(m2x4.names) == xshard::layout_problem::unknown_axis);

// Strategies resolve with xshard's device-matrix rule (last axis backwards, repetition on the
// leading axes).
static_assert(resolve(strategy{2, 4}, m2x4) == dp_mp);
static_assert(resolve(strategy{8, 1}, m2x4) == fused);
static_assert(resolve(strategy{4, 1}, m2x4) == layout("[mp, -]")); // dp repeats
static_assert(resolve(strategy{1, 1}, m2x4) == replicated);
static_assert(resolve(strategy{2, 2, 2}, m222) == layout("[dp, mp, sp]"));
static_assert(resolve(strategy{4, 2}, m222) == layout("[(dp,mp), sp]"));
static_assert(resolve(strategy{1, 4}, m222) == layout("[-, (mp,sp)]"));

// MindSpore MatMul strategies: one device matrix [a, b, c] for both operands, the leading
// axes left over repeat the computation.
static_assert(resolve_matmul({2, 4}, {4, 1}, m2x4).x == layout("[dp, mp]"));
static_assert(resolve_matmul({2, 4}, {4, 1}, m2x4).w == layout("[mp, -]"));
static_assert(resolve_matmul({1, 1}, {1, 2}, m222).x == layout("[-, -]")); // dp, mp repeat
static_assert(resolve_matmul({1, 1}, {1, 2}, m222).w == layout("[-, sp]"));
static_assert(resolve_matmul({2, 2}, {2, 2}, m222).x == layout("[dp, mp]")); // contraction on mp
static_assert(resolve_matmul({2, 2}, {2, 2}, m222).w == layout("[mp, sp]")); // for both sides
static_assert(resolve_matmul({2, 1, 2}, {2, 2, 1}, m222).w == layout("[mp, sp, -]")); // batched:
static_assert(resolve_matmul({2, 1, 2}, {2, 2, 1}, m222).x == layout("[mp, -, sp]")); // dp repeats

// Partition arithmetic.
static_assert(xshard::block_extent(10, 4, 0) == 3 && xshard::block_extent(10, 4, 3) == 2);
static_assert(xshard::block_offset(10, 4, 2) == 6 && xshard::block_holding(10, 4, 6) == 2);
static_assert(xshard::block_extent(2, 4, 3) == 0 && xshard::block_offset(2, 4, 3) == 2);

// --- run time -------------------------------------------------------------------------

TEST(partition, blocks_tile_every_extent_exhaustively) {
    for (std::size_t n = 0; n <= 40; ++n) {
        for (std::size_t k = 1; k <= 12; ++k) {
            std::size_t next = 0;
            for (std::size_t i = 0; i < k; ++i) {
                const auto e = xshard::block_extent(n, k, i);
                ASSERT_EQ(xshard::block_offset(n, k, i), next) << n << "/" << k << " block " << i;
                ASSERT_TRUE(e == n / k || e == n / k + 1) << n << "/" << k;
                if (i > 0) { // larger blocks first
                    ASSERT_LE(e, xshard::block_extent(n, k, i - 1));
                }
                for (std::size_t x = next; x < next + e; ++x)
                    ASSERT_EQ(xshard::block_holding(n, k, x), i) << n << "/" << k << " x " << x;
                next += e;
            }
            ASSERT_EQ(next, n) << n << "/" << k;
        }
    }
}

TEST(layout, notation_round_trips_for_every_layout) {
    for (const char* mesh : {"x=4", "dp=2,mp=4", "a=2,b=1,c=2"}) {
        const auto m = mesh_shape::parse(mesh);
        for (std::size_t rank = 0; rank <= 3; ++rank) {
            for (const auto& l : xshard::testing::all_layouts(m, rank, true)) {
                const auto text = l.to_string();
                EXPECT_EQ(layout::parse(text), l) << text;
                EXPECT_NO_THROW(l.validate(m)) << text;
            }
        }
    }
    EXPECT_EQ(layout("[(dp,mp), -] partial(sum: sp, tp)").to_string(),
              "[(dp,mp), -] partial(sum: sp, tp)");
}

TEST(layout, equal_layouts_hash_alike_and_the_hash_tells_most_apart) {
    const std::hash<layout> hash;
    EXPECT_EQ(hash(layout("[dp, -] partial(sum: sp, tp)")),
              hash(layout("[dp, -] partial(sum: tp, sp)")));
    EXPECT_EQ(hash(layout("[dp, -]")), hash(layout::parse("[dp, -]")));
    // The reduction counts only where some axis is partial, as for ==.
    layout a("[dp, -]"), b("[dp, -]");
    b.op = xshard::reduction::max;
    ASSERT_EQ(a, b);
    EXPECT_EQ(hash(a), hash(b));
    // Every layout of rank 0 to 3 on a mesh of three axes (456): equal hashes are rare.
    const auto m = mesh_shape::parse("a=2,b=2,c=2");
    std::set<std::size_t> hashes;
    std::size_t layouts = 0;
    for (std::size_t rank = 0; rank <= 3; ++rank)
        for (const auto& l : xshard::testing::all_layouts(m, rank, true)) {
            hashes.insert(hash(l));
            ++layouts;
        }
    EXPECT_GT(layouts, 400u);
    EXPECT_GE(hashes.size() * 100, layouts * 99) << hashes.size() << " of " << layouts;
}

TEST(layout, malformed_notation_is_rejected_with_a_reason) {
    const std::pair<const char*, const char*> cases[] = {
        {"dp, mp", "a layout starts with '['"},
        {"[dp, mp", "expected ',' or ']'"},
        {"[(dp, mp]", "expected ',' or the end of an axis list"},
        {"[dp] partial(avg: mp)", "sum, max or min"},
        {"[dp] extra", "only 'partial(op: axes)' may follow"},
        {"[1x]", "expected a mesh axis name"},
        {"[dp] partial(sum: mp) x", "unexpected text"},
        {"[-,-,-,-,-,-,-,-,-]", "more than 8 dimensions"},
    };
    for (const auto& [text, why] : cases) {
        try {
            (void)layout::parse(text);
            ADD_FAILURE() << text << " parsed";
        } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find(why), std::string::npos)
                << text << ": " << e.what();
        }
    }
    try {
        layout("[tp, -]").validate(m2x4);
        ADD_FAILURE();
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(), "xshard: the layout [tp, -] names an axis the mesh(dp=2, mp=4) "
                               "does not have");
    }
}

TEST(layout, blocks_of_a_layout_tile_the_tensor_and_owners_agree) {
    const auto m = mesh_shape::parse("a=2,b=3,c=2");
    const std::array<std::size_t, 2> shape{5, 7};
    for (const auto& l : xshard::testing::all_layouts(m, 2)) {
        // Count how many ranks hold each element; compare with ranks_holding.
        std::vector<std::set<int>> holders(shape[0] * shape[1]);
        for (int r = 0; r < m.size(); ++r) {
            const auto b = xshard::block_of(l, m, shape, r);
            for (std::size_t i = b.offset[0]; i < b.offset[0] + b.extent[0]; ++i)
                for (std::size_t j = b.offset[1]; j < b.offset[1] + b.extent[1]; ++j)
                    holders[i * shape[1] + j].insert(r);
        }
        const int copies = m.group_size(m.all_axes() - l.split_axes(m));
        for (std::size_t i = 0; i < shape[0]; ++i) {
            for (std::size_t j = 0; j < shape[1]; ++j) {
                const auto& h = holders[i * shape[1] + j];
                ASSERT_EQ(int(h.size()), copies) << l << " at " << i << "," << j;
                const auto owners = xshard::ranks_holding(l, m, shape, {i, j});
                ASSERT_EQ(std::set<int>(owners.begin(), owners.end()), h) << l;
            }
        }
    }
}

TEST(strategy, counts_that_fit_no_axis_are_named) {
    try {
        (void)resolve(strategy{1, 2}, m2x4);
        ADD_FAILURE();
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(), "xshard: strategy (1, 2): count 2 of dimension 1 fits no run of "
                               "mesh axes (matched from the last axis of mesh(dp=2, mp=4) "
                               "backwards)");
    }
    EXPECT_THROW((void)resolve(strategy{3, 1}, m2x4), std::invalid_argument);
    EXPECT_THROW((void)resolve(strategy{4, 4}, m2x4), std::invalid_argument);
    EXPECT_THROW((void)resolve(strategy{0, 1}, m2x4), std::invalid_argument);
    EXPECT_EQ(strategy({2, 4}).to_string(), "(2, 4)");
    EXPECT_EQ(strategy({8}).to_string(), "(8,)");
}

TEST(strategy, resolution_follows_xshards_device_matrix) {
    // On any mesh, a resolved strategy gives rank r the block xshard's device matrix
    // [p / q, s0, s1] (row-major over the ranks, the repetition leading) assigns it.
    // MindSpore's operators put the repetition last by default, [s0, s1, p / q]: the same
    // blocks, each on p / q ranks, placed on other ranks.
    for (const char* mesh : {"x=8", "dp=2,mp=4", "a=2,b=2,c=2", "a=4,b=2"}) {
        const auto m = mesh_shape::parse(mesh);
        for (const strategy s : {strategy{2, 4}, strategy{8, 1}, strategy{1, 2}, strategy{4, 1},
                                 strategy{2, 2}, strategy{1, 1}}) {
            layout l;
            try {
                l = resolve(s, m);
            } catch (const std::invalid_argument&) {
                continue; // does not fit this mesh; covered above
            }
            const int p = m.size(), q = s.blocks(), repeats = p / q;
            const std::array<std::size_t, 2> shape{16, 16};
            std::multiset<std::array<std::size_t, 2>> ours, mindspore;
            for (int r = 0; r < p; ++r) {
                const int within = r % q; // drop the repeated (leading) dimension
                const int i0 = within / s.counts[1], i1 = within % s.counts[1];
                const auto b = xshard::block_of(l, m, shape, r);
                EXPECT_EQ(b.offset[0], std::size_t(i0 * 16 / s.counts[0])) << mesh << " " << s;
                EXPECT_EQ(b.offset[1], std::size_t(i1 * 16 / s.counts[1])) << mesh << " " << s;
                ours.insert({b.offset[0], b.offset[1]});
                // MindSpore's default: device matrix [s0, s1, p / q], the repetition last.
                const int block = r / repeats;
                mindspore.insert({std::size_t(block / s.counts[1] * 16 / s.counts[0]),
                                  std::size_t(block % s.counts[1] * 16 / s.counts[1])});
            }
            // The same blocks, each on p / q ranks: only the rank placement differs.
            EXPECT_EQ(ours, mindspore) << mesh << " " << s;
            // With repetition, ranks 0 and 1 hold different blocks here (MindSpore's default
            // makes them repeat each other); without, the placements coincide.
            if (repeats > 1 && q > 1) {
                EXPECT_NE(xshard::block_of(l, m, shape, 0).offset,
                          xshard::block_of(l, m, shape, 1).offset)
                    << mesh << " " << s;
            }
        }
    }
}

} // namespace
