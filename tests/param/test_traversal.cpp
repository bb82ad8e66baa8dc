// Parameter containers (param/traversal.hpp): every kind enumerates its parameters with
// dotted names, on a (dp, mp) mesh of the whole world.

#include <xshard/param/parameter.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/tensor/distribute.hpp>

#include "mpi_test.hpp"
#include "parameters.hpp"

#include <gtest/gtest.h>
#include <range/v3/view/all.hpp>
#include <range/v3/view/take.hpp>

#include <map>
#include <string>
#include <tuple>
#include <typeindex>
#include <unordered_map>
#include <utility>
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

/// A layer with a weight and a tensor that is not one (a running statistic).
struct normalised {
    xshard::weight<xshard::dtensor<double, xshard::mesh<"dp", "mp">, "[-, mp]">> scale;
    xshard::dtensor<float, xshard::mesh<"dp", "mp">, "[dp]"> running;
    friend void visit_parameters(normalised& n, auto&& visit) {
        visit("scale", n.scale);
        visit("running", n.running);
    }
};

TEST(containers, records_give_each_parameter_as_its_tensor_holds_it) {
    using M = xshard::mesh<"dp", "mp">;
    const M m = xshard::testing::world_mesh_2d();
    normalised n{xshard::weight<xshard::dtensor<double, M, "[-, mp]">>(
                     xshard::full<double, "[-, mp]">(m, {5, 6}, 1.0)),
                 xshard::full<float, "[dp]">(m, {7}, 2.f)};
    auto frozen = xshard::parameter{"frozen", xshard::zeros<double, "[-]">(m, {3})};
    frozen.trainable = false;
    auto both = std::tie(n, frozen);
    const auto records = xshard::parameter_records(both);
    ASSERT_EQ(records.size(), 3u);
    // What each tensor says of itself, read directly.
    const auto expect = [&](const xshard::tensor_record& r, const std::string& name,
                            const auto& t, bool trainable) {
        using T = typename std::remove_cvref_t<decltype(t)>::value_type;
        EXPECT_EQ(r.name, name);
        EXPECT_EQ(r.trainable, trainable) << name;
        EXPECT_EQ(r.type, std::type_index(typeid(T))) << name;
        EXPECT_EQ(r.element, sizeof(T)) << name;
        EXPECT_EQ(r.lay, t.layout()) << name;
        EXPECT_EQ(r.shape, std::vector<std::size_t>(t.shape().begin(), t.shape().end()));
        const auto& local = t.local().shape();
        EXPECT_EQ(r.local, std::vector<std::size_t>(local.begin(), local.end())) << name;
        EXPECT_EQ(r.count, t.local().size()) << name;
        EXPECT_EQ(r.cdata, reinterpret_cast<const std::byte*>(t.local().data())) << name;
        EXPECT_EQ(r.data, r.cdata) << name;
        // Every group of the mesh, by axis set, is the mesh's own.
        for (std::uint32_t bits = 0; bits < 4; ++bits)
            EXPECT_EQ(&r.sub(xshard::axis_set{bits}), &m.sub(xshard::axis_set{bits})) << name;
        EXPECT_EQ(r.group, &m.sub(r.replicated)) << name;
    };
    // (A tuple names its elements that are not parameters by their index.)
    expect(records[0], "0.scale", n.scale.value, true);
    expect(records[1], "0.running", n.running, true);
    expect(records[2], "frozen", frozen.value, false);
    // A const container's records are read-only.
    const auto read_only = xshard::parameter_records(std::as_const(n));
    ASSERT_EQ(read_only.size(), 2u);
    for (const auto& r : read_only) {
        EXPECT_EQ(r.data, nullptr) << r.name;
        EXPECT_NE(r.cdata, nullptr) << r.name;
    }
    // The weights alone: their values.
    const auto weights = xshard::weight_records(both);
    ASSERT_EQ(weights.size(), 1u);
    expect(weights[0], "0.scale", n.scale.value, true);
    EXPECT_EQ(xshard::parameter_names(both, /*trainable_only=*/true),
              (std::vector<std::string>{"0.scale", "0.running"}));
    EXPECT_EQ(xshard::layouts_of(both).at("frozen"), layout("[-]"));
}

} // namespace
