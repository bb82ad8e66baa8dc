// Mesh shapes (compile-time and run-time) and meshes over real communicators.

#include <xshard/comm/collectives.hpp>
#include <xshard/core/mesh.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <vector>

namespace {

using xshard::axis_set;
using xshard::mesh_shape;
using xshard::testing::for_each_mesh;
using xshard::testing::where;
using xshard::testing::world;

// Compile-time checks of the shape arithmetic.
constexpr mesh_shape m24 = mesh_shape::parse("dp=2, mp=4");
static_assert(m24.size() == 8 && m24.ndim() == 2);
static_assert(m24.axis_size("mp") == 4 && m24.index("dp") == 0);
static_assert(m24.coords(5)[0] == 1 && m24.coords(5)[1] == 1); // row-major, last fastest
static_assert(m24.rank_of(m24.coords(6)) == 6);
static_assert(m24.group_rank(6, axis_set::of(1)) == 2 && m24.group_color(6, axis_set::of(1)) == 1);
static_assert(m24.group_size(axis_set::of(0)) == 2 && m24.group_size(m24.all_axes()) == 8);
static_assert(mesh_shape::fit({"dp", "mp"}, {xshard::auto_size, 4}, 16).sizes[0] == 4);
static_assert(xshard::mesh<"dp", "mp">::axis_index<"mp">() == 1);
static_assert(xshard::mesh<"a", "b", "c">::axes<"a", "c">() == axis_set{0b101});

TEST(mesh_shape, rank_coordinate_round_trip_on_many_shapes) {
    for (const char* text : {"x=1", "x=7", "dp=2,mp=4", "a=2,b=3,c=4", "a=3,b=1,c=2,d=2"}) {
        const auto s = mesh_shape::parse(text);
        for (int r = 0; r < s.size(); ++r) {
            const auto c = s.coords(r);
            ASSERT_EQ(s.rank_of(c), r) << text;
            for (std::size_t i = 0; i < s.ndim(); ++i)
                ASSERT_TRUE(c[i] >= 0 && c[i] < s.sizes[i]) << text;
        }
    }
}

TEST(mesh_shape, groups_partition_the_ranks) {
    const auto s = mesh_shape::parse("a=2,b=3,c=2");
    for (std::uint32_t bits = 0; bits < 8; ++bits) {
        const axis_set axes{bits};
        std::vector<int> seen(std::size_t(s.size()), 0);
        for (int r = 0; r < s.size(); ++r) {
            const auto g = s.group_ranks(r, axes);
            ASSERT_EQ(int(g.size()), s.group_size(axes));
            EXPECT_EQ(g[std::size_t(s.group_rank(r, axes))], r);
            for (int q : g) { // members differ from r only along `axes`
                for (std::size_t i = 0; i < 3; ++i) {
                    if (!axes.contains(i)) {
                        EXPECT_EQ(s.coords(q)[i], s.coords(r)[i]);
                    }
                }
            }
            if (s.group_rank(r, axes) == 0) {
                for (int q : g)
                    ++seen[std::size_t(q)];
            }
        }
        for (int n : seen)
            EXPECT_EQ(n, 1) << "axes " << bits;
    }
}

TEST(mesh_shape, bad_input_is_rejected_with_a_reason) {
    EXPECT_THROW(mesh_shape::parse("dp=2,dp=2"), std::invalid_argument);
    EXPECT_THROW(mesh_shape::parse("dp"), std::invalid_argument);
    EXPECT_THROW(mesh_shape::parse("9p=2"), std::invalid_argument);
    EXPECT_THROW(mesh_shape::parse("dp=x"), std::invalid_argument);
    EXPECT_THROW(mesh_shape::fit({"a", "b"}, {xshard::auto_size, xshard::auto_size}, 4),
                 std::invalid_argument);
    try {
        (void)mesh_shape::fit({"dp", "mp"}, {xshard::auto_size, 4}, 6);
        FAIL();
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(), "xshard: cannot fit a mesh of dp=?, mp=4 to 6 ranks: 6 is not a "
                               "multiple of 4");
    }
}

TEST(mesh_shape, rank_counts_beyond_int_are_rejected) {
    // 65536 x 65536 ranks would wrap around an int to 0.
    EXPECT_THROW(mesh_shape::parse("dp=65536,mp=65536"), std::invalid_argument);
    EXPECT_THROW(mesh_shape::fit({"dp", "mp", "pp"}, {65536, 65536, xshard::auto_size}, 4),
                 std::invalid_argument);
    EXPECT_EQ(mesh_shape::parse("dp=65536,mp=32767").size(), 65536 * 32767);
}

TEST(mesh, coordinates_and_sub_communicators) {
    for_each_mesh([](const auto& m) {
        const auto& s = m.shape();
        EXPECT_EQ(m.size(), s.size()) << where(m);
        EXPECT_EQ(m.rank_of(m.coords()), m.rank()) << where(m);
        for (std::uint32_t bits = 0; bits <= s.all_axes().bits; ++bits) {
            const axis_set axes{bits};
            const auto& sub = m.sub(axes);
            EXPECT_EQ(sub.size(), s.group_size(axes)) << where(m) << ", axes " << bits;
            EXPECT_EQ(sub.rank(), s.group_rank(m.rank(), axes)) << where(m) << ", axes " << bits;
            // The members, as each reports itself, are the ranks the shape predicts.
            std::vector<int> members(std::size_t(sub.size()));
            const int me = m.rank();
            xshard::mpi::allgather(sub, std::span(&me, 1), members);
            EXPECT_EQ(members, m.group_ranks(axes)) << where(m) << ", axes " << bits;
        }
    });
}

TEST(mesh, named_sub_communicators_and_printing) {
    const auto w = world();
    // mp = 2 on an even world, the whole world otherwise (dp = 1).
    const int mp = w.size() % 2 == 0 ? 2 : w.size();
    const int dp = w.size() / mp;
    const xshard::mesh<"dp", "mp"> m(w, {xshard::auto_size, mp});
    EXPECT_EQ(m.axis_size<"dp">(), dp);
    EXPECT_EQ(m.sub<"mp">().size(), mp);
    EXPECT_EQ(m.sub<"dp">().size(), dp);
    EXPECT_EQ((m.sub<"dp", "mp">().size()), w.size());
    std::ostringstream os;
    os << m;
    EXPECT_EQ(os.str(), "mesh(dp=" + std::to_string(dp) + ", mp=" + std::to_string(mp) + ")");
    const std::string drawn = m.draw();
    EXPECT_NE(drawn.find(std::to_string(w.size() - 1) + "\n"), std::string::npos) << drawn;
}

TEST(mesh, sizes_that_do_not_fit_throw_on_every_rank) {
    const auto w = world();
    using m2 = xshard::mesh<"dp", "mp">;
    EXPECT_THROW((m2(w, {w.size() + 1, 1})), xshard::error);
    EXPECT_THROW((m2(w, {xshard::auto_size, w.size() + 1})), xshard::error);
    try {
        m2(w, {3, 5});
        FAIL();
    } catch (const xshard::error& e) {
        EXPECT_EQ(std::string(e.what()), "xshard: a mesh of dp=3, mp=5 has 15 ranks but the "
                                         "communicator has " +
                                             std::to_string(w.size()));
    }
    // After the failures every rank is still in step: a collective completes.
    int one = 1;
    xshard::mpi::allreduce(w, std::span(&one, 1), xshard::reduction::sum);
    EXPECT_EQ(one, w.size());
}

} // namespace
