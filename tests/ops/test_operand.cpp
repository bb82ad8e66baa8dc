// Operands (ops/operand.hpp): what an operation does with an operand whose layout differs
// from the one its rule asks for. Free steps run locally (a replicated operand is sliced;
// one term of a new pending sum keeps the values, the others hold zeros); anything else
// raises on every rank unless redistributions may be inserted.

#include <xshard/ops/operand.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor/xview.hpp>

#include <string>

namespace {

using xshard::layout;
using xshard::testing::for_each_world_mesh;
using xshard::testing::where;

template <class Mesh>
auto global_of(const Mesh&) {
    xt::xtensor<double, 2> g = xt::zeros<double>({7, 5});
    for (std::size_t i = 0; i < g.size(); ++i)
        g.data()[i] = double(i) + 0.5;
    return g;
}

TEST(operand, free_steps_slice_or_keep_one_term) {
    for_each_world_mesh([](const auto& m) {
        const auto g = global_of(m);
        const auto t = xshard::distribute<xshard::dynamic_layout(2)>(m, g, layout("[-, -]"));
        // The same layout: the operand's own shard, not a copy.
        const auto same = xshard::detail::prepare(t, layout("[-, -]"), false, "test");
        EXPECT_EQ(&same.get(), &t.local());
        // Replicated -> split: this rank's block, sliced from the whole.
        const layout split("[dp, mp]");
        const auto sliced = xshard::detail::prepare(t, split, false, "test");
        const auto b = xshard::block_of(split, m.shape(), t.shape(), m.rank());
        const xt::xtensor<double, 2> expected =
            xt::view(g, xt::range(b.offset[0], b.offset[0] + b.extent[0]),
                     xt::range(b.offset[1], b.offset[1] + b.extent[1]));
        EXPECT_EQ(sliced.get(), expected) << where(m);
        // Replicated -> partial(sum: dp): the terms over dp add up to the value.
        const auto term =
            xshard::detail::prepare(t, layout("[-, mp] partial(sum: dp)"), false, "t");
        const auto as_partial =
            xshard::from_local(m, t.shape(), term.get(), layout("[-, mp] partial(sum: dp)"));
        EXPECT_EQ(xshard::gather_all(as_partial), g) << where(m);
    });
}

TEST(operand, steps_that_need_messages_raise_on_every_rank_unless_allowed) {
    for_each_world_mesh([](const auto& m) {
        const auto g = global_of(m);
        const auto t = xshard::distribute<xshard::dynamic_layout(2)>(m, g, layout("[dp, -]"));
        if (m.template axis_size<"dp">() == 1)
            return; // [dp, -] is whole then: everything is free
        try {
            (void)xshard::detail::prepare(t, layout("[-, dp]"), false, "matmul");
            ADD_FAILURE() << "no error " << where(m);
        } catch (const xshard::error& e) {
            EXPECT_EQ(std::string(e.what()),
                      "xshard: matmul: operand layout [dp, -] would need a redistribution to "
                      "[-, dp]; redistribute it (or pass xshard::auto_redistribute to shard())");
        }
        // Allowed: the block of the redistributed tensor.
        const layout to("[-, dp]");
        const auto moved = xshard::detail::prepare(t, to, true, "matmul");
        const auto b = xshard::block_of(to, m.shape(), t.shape(), m.rank());
        const xt::xtensor<double, 2> expected =
            xt::view(g, xt::range(b.offset[0], b.offset[0] + b.extent[0]),
                     xt::range(b.offset[1], b.offset[1] + b.extent[1]));
        EXPECT_EQ(moved.get(), expected) << where(m);
    });
}

} // namespace
