#pragma once
// The graph tests' shared machinery: meshes of the world, distributed copies of serial
// arrays, a compiled program's weights and gradients, and `op_case` / `check_op`, which check
// one primitive's forward pass against an xtensor reference and its gradients against central
// differences of that reference, on every dp x mp mesh of the world.

#include <xshard/graph.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xrandom.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace graph_test {

using xshard::layout;
using xshard::traced_tensor;
using xshard::testing::world;
namespace ops = xshard::ops;
using mesh_t = xshard::mesh<"dp", "mp">;
using array = xt::xarray<double>;

/// Every dp x mp factorisation of the world size.
template <class F>
void for_each_2d_mesh(F&& f) {
    const int p = world().size();
    for (int dp = 1; dp <= p; ++dp)
        if (p % dp == 0)
            f(mesh_t(world(), {dp, p / dp}));
}

/// A distributed tensor of `global` (every rank holds it) laid out as `l`.
template <std::size_t N, class T = double>
auto dist(const mesh_t& mesh, const xt::xarray<T>& global, const layout& l) {
    xt::xtensor<T, N> g = global;
    return xshard::distribute<xshard::dynamic_layout(N)>(mesh, g, l);
}

/// `f` applied to a replicated distributed tensor of `global` (of 1 to 4 dimensions).
template <class T, class F>
auto with_replicated(const mesh_t& mesh, const xt::xarray<T>& global, F&& f) {
    const auto l = layout::replicated(global.dimension());
    switch (global.dimension()) {
    case 1:
        return f(dist<1, T>(mesh, global, l));
    case 2:
        return f(dist<2, T>(mesh, global, l));
    case 3:
        return f(dist<3, T>(mesh, global, l));
    default:
        return f(dist<4, T>(mesh, global, l));
    }
}

/// The gathered gradient of the weight named `name`.
inline array gradient_of(xshard::compiled_program<double, mesh_t>& net, const std::string& name) {
    array out;
    bool found = false;
    xshard::for_each_weight(net, [&](const std::string& n, auto& w) {
        if (n == name) {
            out = xshard::gather_all(w.grad);
            found = true;
        }
    });
    EXPECT_TRUE(found) << name;
    return out;
}

inline array value_of(xshard::compiled_program<double, mesh_t>& net, const std::string& name) {
    array out;
    xshard::for_each_weight(net, [&](const std::string& n, auto& w) {
        if (n == name)
            out = xshard::gather_all(w.value);
    });
    return out;
}

inline double max_error(const array& a, const array& b) {
    if (a.shape() != b.shape())
        return 1e300;
    return a.size() == 0 ? 0.0 : double(xt::amax(xt::abs(a - b))());
}

// --- one primitive at a time -----------------------------------------------------------------

/// A primitive under test: the program's operands are weights `w0, w1, ...` of the given
/// shapes; `traced` applies the operation (possibly annotated for the mesh), `reference` the
/// same in xtensor on the whole arrays. The loss is sum(op(w) * r) for a fixed random r.
struct op_case {
    std::string name;
    std::vector<xshard::value_shape> shapes;
    std::function<traced_tensor(const std::vector<traced_tensor>&, const xshard::mesh_shape&)>
        traced;
    std::function<array(const std::vector<array>&)> reference;
    /// Inputs that must stay positive (log, sqrt, division).
    bool positive = false;
    /// Integer operands (ids, labels), where the operation takes one: the program's input
    /// "ids" (replicated when bound), which `traced` receives after the weights and
    /// `reference` after the weights' arrays (as doubles). Not differentiated.
    std::optional<xt::xarray<std::int64_t>> ids = std::nullopt;
};

/// The initializer the program draws weight i with.
inline xshard::initializer init_for(const op_case& c) {
    return c.positive ? xshard::initializer::uniform(0.5, 1.5)
                      : xshard::initializer::uniform(-1.0, 1.0);
}

/// The weights' values as the program draws them (the counter-based initializer, serially).
inline std::vector<array> drawn_weights(const op_case& c, std::uint64_t seed) {
    std::vector<array> out;
    for (std::size_t i = 0; i < c.shapes.size(); ++i) {
        std::vector<std::size_t> shape(c.shapes[i].begin(), c.shapes[i].end());
        array w(shape);
        const std::string name = "w" + std::to_string(i);
        for (std::size_t k = 0; k < w.size(); ++k)
            w.flat(k) = init_for(c).value(seed, xshard::parameter_stream(name), k, c.shapes[i]);
        out.push_back(w);
    }
    return out;
}

inline void check_op(const op_case& c) {
    constexpr std::uint64_t seed = 7;
    const auto w = drawn_weights(c, seed);
    auto reference = [&](std::vector<array> ws) {
        if (c.ids)
            ws.push_back(xt::cast<double>(*c.ids));
        return c.reference(ws);
    };
    const array y0 = reference(w);
    std::mt19937 engine(11);
    const array r = xt::random::rand<double>(y0.shape(), -1.0, 1.0, engine);
    auto loss_of = [&](const std::vector<array>& ws) {
        return double(xt::sum(reference(ws) * r)());
    };
    // Central differences of the xtensor reference.
    std::vector<array> expected;
    for (std::size_t i = 0; i < w.size(); ++i) {
        array g = xt::zeros<double>(w[i].shape());
        for (std::size_t k = 0; k < w[i].size(); ++k) {
            auto up = w, down = w;
            const double h = 1e-6;
            up[i].flat(k) += h;
            down[i].flat(k) -= h;
            g.flat(k) = (loss_of(up) - loss_of(down)) / (2 * h);
        }
        expected.push_back(g);
    }
    const xshard::value_shape rshape(y0.shape().begin(), y0.shape().end());
    for_each_2d_mesh([&](const mesh_t& mesh) {
        auto body = [&](traced_tensor rr, std::optional<traced_tensor> ids) {
            std::vector<traced_tensor> ws;
            for (std::size_t i = 0; i < c.shapes.size(); ++i)
                ws.push_back(xshard::param("w" + std::to_string(i), c.shapes[i], init_for(c)));
            if (ids)
                ws.push_back(*ids);
            return ops::sum_all(ops::mul(c.traced(ws, mesh.shape()), rr));
        };
        auto p =
            c.ids
                ? xshard::trace(
                      [&](traced_tensor rr, traced_tensor ids) { return body(rr, ids); },
                      xshard::input<double>("r", rshape),
                      xshard::input<std::int64_t>(
                          "ids", xshard::value_shape(c.ids->shape().begin(), c.ids->shape().end())))
                : xshard::trace([&](traced_tensor rr) { return body(rr, std::nullopt); },
                                xshard::input<double>("r", rshape));
        auto net = xshard::compile<double>(p, mesh, {.seed = seed});
        const double loss = with_replicated(mesh, r, [&](const auto& rd) {
            if (!c.ids)
                return net.train_step(rd);
            return with_replicated(mesh, *c.ids,
                                   [&](const auto& idd) { return net.train_step(rd, idd); });
        });
        EXPECT_NEAR(loss, loss_of(w), 1e-9)
            << c.name << " on mesh(" << mesh.shape().to_string() << ")\n"
            << net.describe();
        for (std::size_t i = 0; i < w.size(); ++i) {
            const array g = gradient_of(net, "w" + std::to_string(i));
            EXPECT_LT(max_error(g, expected[i]), 1e-6)
                << c.name << " gradient of operand " << i << " on mesh(" << mesh.shape().to_string()
                << ")\n"
                << net.describe();
        }
    });
}

/// Layouts for the meshes: "dp" / "mp" split a dimension when the mesh axis divides it
/// (otherwise the split is uneven, which every layout allows).
inline layout lay(const char* text) {
    return layout(text);
}

} // namespace graph_test
