// Weights (param/weight.hpp): a value with a zeroed gradient of the same shape and layout and
// an optimizer state; traversals see the value as a parameter and the weight as a weight.

#include <xshard/param/traversal.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using M = xshard::mesh<"dp", "mp">;
using tensor = xshard::dtensor<double, M, "[dp, mp]">;

struct layer {
    xshard::weight<tensor> w;
    xshard::weight<tensor> b;
    friend void visit_parameters(layer& l, auto&& visit) {
        visit("w", l.w);
        visit("b", l.b);
    }
};

TEST(weight, the_gradient_starts_at_zero_with_the_values_layout) {
    const M m = xshard::testing::world_mesh_2d();
    xshard::weight<tensor> w(xshard::full<double, "[dp, mp]">(m, {5, 3}, 2.5));
    // The gradient holds terms laid out as the dual of the value's layout: with no replicated
    // axis, the value's layout itself.
    static_assert(std::is_same_v<decltype(w.grad), xshard::weight<tensor>::gradient_type>);
    EXPECT_EQ(w.grad.layout(), w.value.layout());
    EXPECT_EQ(w.grad.shape(), w.value.shape());
    EXPECT_EQ(w.grad.local().shape(), w.value.local().shape());
    EXPECT_EQ(xshard::gather_all(w.grad), xt::zeros<double>({5, 3}));
    const xt::xtensor<double, 2> filled = 2.5 * xt::ones<double>({5, 3});
    EXPECT_EQ(xshard::gather_all(w.value), filled);
    // The gradient is its own storage, not the value's.
    EXPECT_NE(w.grad.local().data(), w.value.local().data());
    w.grad.local().fill(4.0);
    w.zero_grad();
    EXPECT_EQ(xshard::gather_all(w.grad), xt::zeros<double>({5, 3}));
    EXPECT_EQ(xshard::gather_all(w.value)(0, 0), 2.5);
    EXPECT_TRUE(w.state.empty());
}

TEST(weight, traversals_see_values_as_parameters_and_weights_as_weights) {
    const M m = xshard::testing::world_mesh_2d();
    layer l{xshard::weight<tensor>(xshard::full<double, "[dp, mp]">(m, {4, 2}, 1.0)),
            xshard::weight<tensor>(xshard::full<double, "[dp, mp]">(m, {4, 2}, 2.0))};
    EXPECT_EQ(xshard::parameter_names(l), (std::vector<std::string>{"w", "b"}));
    std::vector<std::string> names;
    xshard::for_each_weight(l, [&](const std::string& name, auto& w) {
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(w)>, xshard::weight<tensor>>);
        names.push_back(name);
        w.grad.local().fill(1.0);
    });
    EXPECT_EQ(names, (std::vector<std::string>{"w", "b"}));
    EXPECT_EQ(xshard::gather_all(l.b.grad), xt::ones<double>({4, 2}));
}

} // namespace
