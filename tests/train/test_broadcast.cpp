// Parameter broadcast (train/broadcast.hpp): every redundant copy takes its owner's values,
// on every test mesh and every layout; misuse raises on every rank before data moves.

#include <xshard/tensor/distribute.hpp>
#include <xshard/train/broadcast.hpp>

#include "layouts.hpp"
#include "mpi_test.hpp"
#include "parameters.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

namespace {

using xshard::layout;
using xshard::testing::dyn;
using xshard::testing::filled;
using xshard::testing::for_each_mesh;
using xshard::testing::start;
using xshard::testing::where;
using xshard::testing::world;

TEST(parameter_broadcast, every_redundant_copy_takes_its_owners_values) {
    for_each_mesh([](const auto& m) {
        using M = std::remove_cvref_t<decltype(m)>;
        std::map<std::string, dyn<M>> params;
        const auto all = xshard::testing::all_layouts(m.shape(), 2, false);
        for (std::size_t k = 0; k < all.size(); ++k)
            if (!all[k].is_partial())
                params.emplace("p" + std::to_string(100 + k),
                               filled<double>(m, {5, 7 + k % 3}, all[k], start));
        // Bucketed (the default) and one parameter per collective.
        for (double fusion : {64.0, 0.0}) {
            for (auto& [name, t] : params)
                for (std::size_t i = 0; i < t.local().size(); ++i)
                    t.local().data()[i] = start(m.rank(), i);
            const auto report = xshard::parameter_broadcast(
                params, {.cur_rank = world().rank(), .initial_rank = 0, .fusion_mib = fusion});
            for (auto& [name, t] : params) {
                const int owner = report.owner.at(name);
                const auto repl = t.layout().replicated_axes(m.shape());
                if (m.shape().group_size(repl) == 1) {
                    EXPECT_EQ(owner, -1) << name;
                } else {
                    // Every member of the group holds the owner's starting values.
                    EXPECT_NE(
                        std::find(m.group_ranks(repl).begin(), m.group_ranks(repl).end(), owner),
                        m.group_ranks(repl).end())
                        << name << " " << where(m);
                }
                const int from = owner < 0 ? m.rank() : owner;
                for (std::size_t i = 0; i < t.local().size(); ++i)
                    ASSERT_EQ(t.local().data()[i], start(from, i))
                        << name << " " << t.layout() << " " << where(m);
            }
            // Owners are balanced: no rank originates more than the largest parameter more
            // than another.
            const auto [lo, hi] =
                std::minmax_element(report.bytes_owned.begin(), report.bytes_owned.end());
            std::size_t largest = 0;
            for (auto& [name, t] : params)
                largest =
                    std::max(largest, t.local().size() * sizeof(double) * std::size_t(m.size()));
            EXPECT_LE(*hi - *lo, largest) << where(m);
            if (fusion == 0) { // one collective per redundant parameter
                std::size_t redundant = 0;
                for (const auto& [name, owner] : report.owner)
                    redundant += owner >= 0 ? 1 : 0;
                EXPECT_EQ(report.buckets, redundant) << where(m);
            }
        }
    });
}

TEST(parameter_broadcast, mixed_element_types_and_nested_modules) {
    using M = xshard::mesh<"dp", "mp">;
    const M m = xshard::testing::world_mesh_2d();
    if (m.size() == 1)
        GTEST_SKIP() << "needs redundant copies (more than one rank)";
    auto params = std::tuple(
        xshard::parameter{"f", xshard::full<float, "[-]">(m, {5}, float(m.rank()))},
        xshard::parameter{"d", xshard::full<double, "[-, -]">(m, {3, 4}, double(m.rank()))});
    const auto report = xshard::parameter_broadcast(params);
    EXPECT_EQ(report.buckets, 2u); // one per element type
    const float f = std::get<0>(params).value.local()(0);
    EXPECT_EQ(f, float(report.owner.at("f")));
    for (float x : std::get<0>(params).value.local())
        EXPECT_EQ(x, f);
}

TEST(parameter_broadcast, errors_are_raised_on_every_rank_before_any_data_moves) {
    const auto w = world();
    const xshard::mesh<"x"> m(w, {w.size()});
    std::map<std::string, xshard::dtensor<double, xshard::mesh<"x">, xshard::dynamic_layout(2)>>
        params{{"w",
                xshard::full<double, xshard::dynamic_layout(2)>(m, {4, 4}, 1.0, layout("[-, -]"))}};
    auto message = [&](xshard::broadcast_options o) -> std::string {
        try {
            xshard::parameter_broadcast(params, o);
            return "";
        } catch (const xshard::error& e) {
            return e.what();
        }
    };
    // A wrong cur_rank on the last rank only.
    const int last = w.size() - 1;
    EXPECT_EQ(message({.cur_rank = w.rank() == last ? w.rank() + 1 : w.rank()}),
              "xshard: parameter_broadcast: cur_rank " + std::to_string(last + 1) +
                  " is not this process's rank " + std::to_string(last));
    // initial_rank must start the pipeline stage (2 stages when the ranks allow).
    if (w.size() % 2 == 0 && w.size() > 1) {
        EXPECT_NE(message({.initial_rank = 0, .pipeline_stages = 2}), "");
        EXPECT_EQ(message({.initial_rank = w.rank() / (w.size() / 2) * (w.size() / 2),
                           .pipeline_stages = 2}),
                  "");
    }
    EXPECT_NE(message({.initial_rank = 1}).find("is not the first rank"), std::string::npos);
    // A layout dictionary naming a parameter the container does not have.
    EXPECT_EQ(
        message({.layouts = xshard::layout_dict{{"nope", layout("[-, -]")}}}),
        "xshard: the layout dictionary names parameter 'nope', which the container does not have");
    // A shard resized on rank 0 only.
    if (w.rank() == 0)
        params.at("w").local() = xt::zeros<double>({3, 3});
    EXPECT_NE(message({}).find("has a local shard of shape (3, 3)"), std::string::npos);
}

} // namespace
