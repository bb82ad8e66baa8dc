// Parameter containers (param/traversal.hpp): every kind enumerates its parameters with
// dotted names, on a (dp, mp) mesh of the whole world.

#include <xshard/param/parameter.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/tensor/distribute.hpp>

#include "mpi_test.hpp"
#include "parameters.hpp"

#include <gtest/gtest.h>
#include <range/v3/view/all.hpp>
#include <range/v3/view/take.hpp>

#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace {

using xshard::layout;
using xshard::testing::dyn;
using xshard::testing::filled;

struct dense {
    xshard::dtensor<double, xshard::mesh<"dp", "mp">, "[-, mp]"> weight;
    xshard::dtensor<float, xshard::mesh<"dp", "mp">, "[mp]"> bias;
    friend void visit_parameters(dense& d, auto&& visit) {
        visit("weight", d.weight);
        visit("bias", d.bias);
    }
};

struct block {
    dense dense1, dense2;
    friend void visit_parameters(block& b, auto&& visit) {
        visit("dense1", b.dense1);
        visit("dense2", b.dense2);
    }
};

struct model {
    std::vector<block> blocks;
    friend void visit_parameters(model& m, auto&& visit) { visit("block", m.blocks); }
};

TEST(containers, every_kind_enumerates_its_parameters_with_dotted_names) {
    using M = xshard::mesh<"dp", "mp">;
    const M m = xshard::testing::world_mesh_2d();
    auto d = [&] {
        return dense{xshard::zeros<double, "[-, mp]">(m, {4, 4}),
                     xshard::zeros<float, "[mp]">(m, {4})};
    };
    model net{{block{d(), d()}, block{d(), d()}}};
    EXPECT_EQ(xshard::parameter_names(net),
              (std::vector<std::string>{"block.0.dense1.weight", "block.0.dense1.bias",
                                        "block.0.dense2.weight", "block.0.dense2.bias",
                                        "block.1.dense1.weight", "block.1.dense1.bias",
                                        "block.1.dense2.weight", "block.1.dense2.bias"}));
    std::map<std::string, dyn<M>> map{
        {"b", filled<double>(m, {2, 2}, layout("[-, -]"), [](int, std::size_t) { return 1; })},
        {"a", filled<double>(m, {2, 2}, layout("[dp, -]"), [](int, std::size_t) { return 1; })}};
    EXPECT_EQ(xshard::parameter_names(map), (std::vector<std::string>{"a", "b"}));
    std::unordered_map<std::string, dyn<M>> umap(map.begin(), map.end());
    EXPECT_EQ(xshard::parameter_names(umap).size(), 2u);
    std::vector<xshard::parameter<dyn<M>>> list{{"x", map.at("a")}, {"y", map.at("b")}};
    EXPECT_EQ(xshard::parameter_names(list), (std::vector<std::string>{"x", "y"}));
    EXPECT_EQ(xshard::parameter_names(ranges::views::all(list) | ranges::views::take(1)),
              (std::vector<std::string>{"x"}));
    auto mixed = std::tuple(xshard::parameter{"f", xshard::zeros<float, "[-]">(m, {3})},
                            xshard::parameter{"g", xshard::zeros<double, "[dp]">(m, {3})});
    EXPECT_EQ(xshard::parameter_names(mixed), (std::vector<std::string>{"f", "g"}));
    const auto layouts = xshard::layouts_of(net);
    EXPECT_EQ(layouts.at("block.1.dense2.bias"), layout("[mp]"));
}

} // namespace
