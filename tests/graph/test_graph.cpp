// Programs: tracing, the VJP of every primitive, compiling onto meshes, training.
//
// Every expected value comes from serial xtensor code: each primitive's forward pass is
// compared with an xtensor expression of the same thing, its gradients with central
// differences of that expression; programs on every dp x mp mesh of the world (and with
// strategies) are compared with the same xtensor reference.

#include <xshard/graph.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>
#include <xshard/train/gradients.hpp>

#include "expect_error.hpp"
#include "mpi_test.hpp"
#include "op_case.hpp"

#include <gtest/gtest.h>
#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace graph_test;

array relu(const array& x) {
    return xt::maximum(x, 0.0);
}

array matmul(const array& a, const array& b) {
    if (a.dimension() == 2)
        return xt::linalg::dot(a, b);
    array out = xt::zeros<double>({a.shape()[0], a.shape()[1], b.shape()[b.dimension() - 1]});
    for (std::size_t i = 0; i < a.shape()[0]; ++i) {
        array ai = xt::view(a, i);
        array bi = b.dimension() == 3 ? array(xt::view(b, i)) : b;
        xt::view(out, i) = xt::linalg::dot(ai, bi);
    }
    return out;
}

array softmax_rows(const array& x, bool log) {
    array out = x;
    const std::size_t n = x.shape().back(), rows = x.size() / n;
    for (std::size_t r = 0; r < rows; ++r) {
        double m = -1e300, s = 0;
        for (std::size_t j = 0; j < n; ++j)
            m = std::max(m, x.flat(r * n + j));
        for (std::size_t j = 0; j < n; ++j)
            s += std::exp(x.flat(r * n + j) - m);
        for (std::size_t j = 0; j < n; ++j)
            out.flat(r * n + j) =
                log ? x.flat(r * n + j) - m - std::log(s) : std::exp(x.flat(r * n + j) - m) / s;
    }
    return out;
}

TEST(graph, every_primitive_against_central_differences_on_every_mesh) {
    using V = std::vector<traced_tensor>;
    using A = std::vector<array>;
    using M = xshard::mesh_shape;
    std::vector<op_case> cases;
    auto binary = [&](std::string name, auto op, auto ref, bool positive = false) {
        cases.push_back({name + " [dp, mp] with a bias broadcast",
                         {{6, 4}, {4}},
                         [op](const V& w, const M&) {
                             return op.shard({lay("[dp, mp]"), lay("[mp]")})(w[0], w[1]);
                         },
                         [ref](const A& w) { return array(ref(w[0], w[1])); },
                         positive});
        cases.push_back({name + " data parallel",
                         {{6, 4}, {6, 4}},
                         [op](const V& w, const M&) { return op(w[0], w[1]); },
                         [ref](const A& w) { return array(ref(w[0], w[1])); },
                         positive});
    };
    binary("add", ops::add, [](const array& a, const array& b) { return a + b; });
    binary("sub", ops::sub, [](const array& a, const array& b) { return a - b; });
    binary("mul", ops::mul, [](const array& a, const array& b) { return a * b; });
    binary(
        "div", ops::div, [](const array& a, const array& b) { return a / b; }, true);
    binary("maximum", ops::maximum,
           [](const array& a, const array& b) { return xt::maximum(a, b); });
    binary("minimum", ops::minimum,
           [](const array& a, const array& b) { return xt::minimum(a, b); });
    // Scalars (one run of one element), and a scalar broadcast against a vector.
    cases.push_back({"binary of scalars",
                     {{6}, {4}},
                     [](const V& w, const M&) {
                         const auto s0 = ops::sum<0>(w[0]);
                         return ops::mul(w[0], ops::add(ops::mul(s0, ops::sum<0>(w[1])), s0));
                     },
                     [](const A& w) {
                         const double s0 = xt::sum(w[0])();
                         return array(w[0] * (s0 * xt::sum(w[1])() + s0));
                     }});
    cases.push_back(
        {"a scalar broadcast",
         {{6}, {4}},
         [](const V& w, const M&) { return ops::maximum(ops::mul(w[0], ops::sum<0>(w[1])), w[0]); },
         [](const A& w) {
             return array(xt::maximum(w[0] * xt::sum(w[1])(), w[0]));
         }});
    auto unary = [&](std::string name, auto op, auto ref, bool positive = false) {
        cases.push_back({name,
                         {{5, 6}},
                         [op](const V& w, const M&) { return op.shard({lay("[mp, dp]")})(w[0]); },
                         [ref](const A& w) { return array(ref(w[0])); },
                         positive});
    };
    unary("neg", ops::neg, [](const array& x) { return -x; });
    unary("relu", ops::relu, [](const array& x) { return relu(x); });
    unary("gelu", ops::gelu,
          [](const array& x) { return 0.5 * x * (1.0 + xt::erf(x / std::sqrt(2.0))); });
    unary("exp", ops::exp, [](const array& x) { return xt::exp(x); });
    unary(
        "log", ops::log, [](const array& x) { return xt::log(x); }, true);
    unary("tanh", ops::tanh, [](const array& x) { return xt::tanh(x); });
    unary("sigmoid", ops::sigmoid, [](const array& x) { return 1.0 / (1.0 + xt::exp(-x)); });
    unary("abs", ops::abs, [](const array& x) { return xt::abs(x); });
    unary(
        "sqrt", ops::sqrt, [](const array& x) { return xt::sqrt(x); }, true);
    unary("square", ops::square, [](const array& x) { return x * x; });
    cases.push_back({"scale and add_scalar",
                     {{4, 3}},
                     [](const V& w, const M&) { return 3.0 * w[0] + 2.0 - w[0] / 4.0; },
                     [](const A& w) {
                         return array(3.0 * w[0] + 2.0 - w[0] / 4.0);
                     }});
    // Matrix products, with each strategy that fits: split rows, contraction, columns.
    for (const char* s : {"", "rows", "contraction", "columns", "all"}) {
        const std::string which = s;
        cases.push_back({"matmul " + which,
                         {{6, 5}, {5, 4}},
                         [which](const V& w, const M& m) {
                             const int dp = m.sizes[0], mp = m.sizes[1];
                             if (which == "rows")
                                 return ops::matmul.shard({{dp * mp, 1}, {1, 1}})(w[0], w[1]);
                             if (which == "contraction")
                                 return ops::matmul.shard({{1, dp * mp}, {dp * mp, 1}})(w[0], w[1]);
                             if (which == "columns")
                                 return ops::matmul.shard({{1, 1}, {1, dp * mp}})(w[0], w[1]);
                             if (which == "all")
                                 return ops::matmul.shard({{dp, mp}, {mp, 1}})(w[0], w[1]);
                             return ops::matmul(w[0], w[1]);
                         },
                         [](const A& w) {
                             return matmul(w[0], w[1]);
                         }});
    }
    cases.push_back(
        {"batched matmul",
         {{4, 3, 5}, {4, 5, 2}},
         [](const V& w, const M&) {
             return ops::matmul.shard({lay("[dp, -, mp]"), lay("[dp, mp, -]")})(w[0], w[1]);
         },
         [](const A& w) {
             return matmul(w[0], w[1]);
         }});
    cases.push_back({"batched matmul with a shared [k, n]",
                     {{4, 3, 5}, {5, 2}},
                     [](const V& w, const M&) { return ops::matmul(w[0], w[1]); },
                     [](const A& w) {
                         return matmul(w[0], w[1]);
                     }});
    cases.push_back({"matmul with transposed operands",
                     {{5, 6}, {4, 5}},
                     [](const V& w, const M&) {
                         return trace_call("matmul", xshard::op_attributes{{1, 1}, {}},
                                           xshard::op_annotation{}, w[0], w[1]);
                     },
                     [](const A& w) {
                         return array(xt::linalg::dot(xt::transpose(w[0]), xt::transpose(w[1])));
                     }});
    // Reductions: along a split dimension (a pending sum resolved on the edge), keepdims.
    cases.push_back({"sum along a split dimension",
                     {{6, 4}},
                     [](const V& w, const M&) {
                         return ops::sum<0>(ops::relu.shard({lay("[(dp,mp), -]")})(w[0]));
                     },
                     [](const A& w) {
                         return array(xt::sum(relu(w[0]), {0}));
                     }});
    cases.push_back({"mean keepdims",
                     {{6, 4}},
                     [](const V& w, const M&) { return ops::mean<1, true>(w[0]); },
                     [](const A& w) {
                         return array(xt::mean(w[0], {1}, xt::keep_dims));
                     }});
    cases.push_back({"max",
                     {{6, 4}},
                     [](const V& w, const M&) { return ops::max<1>(w[0]); },
                     [](const A& w) {
                         return array(xt::amax(w[0], {1}));
                     }});
    cases.push_back({"min",
                     {{6, 4}},
                     [](const V& w, const M&) { return ops::min<0>(w[0]); },
                     [](const A& w) {
                         return array(xt::amin(w[0], {0}));
                     }});
    cases.push_back({"mean of everything",
                     {{6, 4}},
                     [](const V& w, const M&) {
                         return ops::reshape(
                             ops::mean_all(ops::relu.shard({lay("[dp, mp]")})(w[0])),
                             std::array<std::size_t, 1>{1});
                     },
                     [](const A& w) {
                         return array(xt::reshape_view(array(xt::mean(relu(w[0]))), {1}));
                     }});
    // Normalisations.
    cases.push_back({"softmax",
                     {{6, 5}},
                     [](const V& w, const M&) {
                         return ops::softmax<1>(ops::relu.shard({lay("[dp, mp]")})(w[0]));
                     },
                     [](const A& w) {
                         return softmax_rows(relu(w[0]), false);
                     }});
    cases.push_back({"log_softmax",
                     {{6, 5}},
                     [](const V& w, const M&) { return ops::log_softmax<1>(w[0]); },
                     [](const A& w) {
                         return softmax_rows(w[0], true);
                     }});
    cases.push_back({"layer_norm with gamma and beta",
                     {{6, 5}, {5}, {5}},
                     [](const V& w, const M&) { return ops::layer_norm(w[0], w[1], w[2]); },
                     [](const A& w) {
                         const array mu = xt::mean(w[0], {1}, xt::keep_dims);
                         const array var = xt::mean(xt::square(w[0] - mu), {1}, xt::keep_dims);
                         return array((w[0] - mu) / xt::sqrt(var + 1e-5) * w[1] + w[2]);
                     }});
    auto batch_norm_ref = [](const A& w) {
        const array mu = xt::mean(w[0], {0}, xt::keep_dims);
        const array var = xt::mean(xt::square(w[0] - mu), {0}, xt::keep_dims);
        return array((w[0] - mu) / xt::sqrt(var + 1e-5) * w[1] + w[2]);
    };
    cases.push_back({"batch_norm split over the batch",
                     {{8, 3}, {3}, {3}},
                     [](const V& w, const M&) {
                         return ops::batch_norm(ops::relu.shard({lay("[(dp,mp), -]")})(w[0]) + w[0],
                                                w[1], w[2]);
                     },
                     [batch_norm_ref](const A& w) {
                         return batch_norm_ref({relu(w[0]) + w[0], w[1], w[2]});
                     }});
    cases.push_back({"batch_norm split over the channels",
                     {{8, 4}, {4}, {4}},
                     [](const V& w, const M&) {
                         return trace_call("batch_norm", xshard::op_attributes{{}, {1e-5}},
                                           xshard::op_annotation{
                                               {}, {lay("[dp, mp]"), lay("[mp]"), lay("[mp]")}, {}},
                                           w[0], w[1], w[2]);
                     },
                     batch_norm_ref});
    // Shapes.
    cases.push_back({"transpose",
                     {{3, 4, 5}},
                     [](const V& w, const M&) {
                         return ops::transpose<2, 0, 1>(
                             ops::relu.shard({lay("[dp, mp, -]")})(w[0]));
                     },
                     [](const A& w) {
                         return array(xt::transpose(relu(w[0]), {2, 0, 1}));
                     }});
    cases.push_back({"flatten and reshape",
                     {{6, 2, 3}},
                     [](const V& w, const M&) {
                         return ops::reshape(ops::flatten(w[0]), std::array<std::size_t, 2>{3, 12});
                     },
                     [](const A& w) {
                         return array(xt::reshape_view(w[0], {3, 12}));
                     }});
    cases.push_back({"concat of split operands, one of them twice",
                     {{6, 4}, {6, 3}},
                     [](const V& w, const M&) {
                         const auto a = ops::relu.shard({lay("[dp, mp]")})(w[0]);
                         const auto b = ops::relu.shard({lay("[mp, dp]")})(w[1]);
                         return ops::concat(1, a, b, a);
                     },
                     [](const A& w) {
                         return array(
                             xt::concatenate(xt::xtuple(relu(w[0]), relu(w[1]), relu(w[0])), 1));
                     }});
    cases.push_back({"concat along the batch and slice",
                     {{2, 3, 4}, {3, 3, 4}},
                     [](const V& w, const M&) {
                         return ops::slice(ops::concat(0, w[0], ops::relu(w[1])), 1, 1, 3);
                     },
                     [](const A& w) {
                         const array c = xt::concatenate(xt::xtuple(w[0], relu(w[1])), 0);
                         return array(xt::view(c, xt::all(), xt::range(1, 3), xt::all()));
                     }});
    for (const auto& c : cases) {
        SCOPED_TRACE(c.name);
        check_op(c);
    }
}

// --- the parameter-broadcast document's MLP --------------------------------------------------

/// The serial reference of the MLP step: the loss and every weight's gradient.
struct mlp_reference {
    double loss = 0;
    std::map<std::string, array> grads;
};

mlp_reference mlp_serial(const std::map<std::string, array>& w, const array& x,
                         const xt::xarray<std::int64_t>& y) {
    const array z1 = xt::linalg::dot(x, w.at("w1"));
    const array h1 = relu(z1);
    const array z2 = xt::linalg::dot(h1, w.at("w2"));
    const array h2 = relu(z2);
    const array logits = xt::linalg::dot(h2, w.at("w3"));
    const array p = softmax_rows(logits, false);
    const std::size_t b = x.shape()[0];
    mlp_reference r;
    array dlogits = p;
    for (std::size_t i = 0; i < b; ++i) {
        r.loss -= std::log(p(i, std::size_t(y(i)))) / double(b);
        dlogits(i, std::size_t(y(i))) -= 1.0;
    }
    dlogits /= double(b);
    r.grads["w3"] = xt::linalg::dot(xt::transpose(h2), dlogits);
    const array dz2 = xt::where(z2 > 0.0, xt::linalg::dot(dlogits, xt::transpose(w.at("w3"))), 0.0);
    r.grads["w2"] = xt::linalg::dot(xt::transpose(h1), dz2);
    const array dz1 = xt::where(z1 > 0.0, xt::linalg::dot(dz2, xt::transpose(w.at("w2"))), 0.0);
    r.grads["w1"] = xt::linalg::dot(xt::transpose(x), dz1);
    return r;
}

/// The document's network (784-512-512-10, here 24-16-16-5 to stay quick) with its
/// strategies scaled to the mesh: matmul1 ((dp, mp), (mp, 1)), relu1 (mp, 1), matmul2
/// ((1, p), (p, 1)), relu2 (p, 1), matmul3 data parallel; the mean cross-entropy.
xshard::program mlp_program(std::size_t batch, int dp, int mp) {
    const int p = dp * mp;
    return xshard::trace(
        [&](traced_tensor x, traced_tensor y) {
            auto n = xshard::initializer::normal(0, 0.3);
            auto w1 = xshard::param("w1", {24, 16}, n);
            auto w2 = xshard::param("w2", {16, 16}, n);
            auto w3 = xshard::param("w3", {16, 5}, n);
            auto h = ops::matmul.shard({{dp, mp}, {mp, 1}})(x, w1);
            h = ops::relu.shard({{mp, 1}})(h);
            h = ops::matmul.shard({{1, p}, {p, 1}})(h, w2);
            h = ops::relu.shard({{p, 1}})(h);
            auto logits = ops::matmul(h, w3);
            return ops::mean<0>(ops::cross_entropy(logits, y));
        },
        xshard::input<double>("x", {batch, 24}), xshard::input<std::int64_t>("y", {batch}));
}

TEST(graph, document_mlp_trains_with_its_strategies_like_serial_xtensor) {
    const std::size_t batch = 16;
    std::mt19937 engine(5);
    for_each_2d_mesh([&](const mesh_t& mesh) {
        const int dp = mesh.shape().sizes[0], mp = mesh.shape().sizes[1];
        auto net = xshard::compile<double>(mlp_program(batch, dp, mp), mesh, {.seed = 3});
        std::map<std::string, array> w;
        for (const char* name : {"w1", "w2", "w3"})
            w[name] = value_of(net, name);
        xshard::optim::sgd opt({.lr = 0.5});
        for (int step = 0; step < 3; ++step) {
            const array x = xt::random::rand<double>({batch, std::size_t(24)}, -1.0, 1.0, engine);
            xt::xarray<std::int64_t> y = xt::random::randint<std::int64_t>({batch}, 0, 5, engine);
            const auto ref = mlp_serial(w, x, y);
            const double loss = net.train_step(dist<2>(mesh, x, "[(dp,mp), -]"),
                                               dist<1, std::int64_t>(mesh, y, "[(dp,mp)]"));
            EXPECT_NEAR(loss, ref.loss, 1e-10) << "step " << step << "\n" << net.describe();
            for (const auto& [name, g] : ref.grads)
                EXPECT_LT(max_error(gradient_of(net, name), g), 1e-10) << name << " step " << step;
            auto grads = xshard::gradients_of(net);
            xshard::synchronize_gradients(net, grads);
            opt.step(net);
            xshard::for_each_weight(net, [](const std::string&, auto& wt) { wt.zero_grad(); });
            for (auto& [name, v] : w)
                v -= 0.5 * ref.grads.at(name);
            for (const auto& [name, v] : w)
                EXPECT_LT(max_error(value_of(net, name), v), 1e-10)
                    << name << " after step " << step;
        }
    });
}

// --- misuse ----------------------------------------------------------------------------------

TEST(graph, misuse_raises_one_sentence_naming_the_node_on_every_rank) {
    auto p = mlp_program(8, 1, 1);
    xshard::testing::expect_error([&] { p.node("matmul_9"); }, "no node is named 'matmul_9'");
    xshard::testing::expect_error(
        [&] {
            p.shard("relu", {{2, 1, 1}});
        },
        "node relu (relu): the strategy (2, 1, 1)");
    xshard::testing::expect_error(
        [&] {
            xshard::trace([](traced_tensor x) { return ops::matmul(x, x); },
                          xshard::input<double>("x", {3, 4}));
        },
        "node matmul (matmul): shapes (3, 4) and (3, 4) do not multiply");
    const mesh_t mesh(world(), {1, world().size()});
    if (world().size() > 1) {
        // A strategy needing more blocks than the mesh has ranks.
        auto q = mlp_program(8, 1, 1);
        q.shard("relu", {{3 * world().size(), 1}});
        xshard::testing::expect_error([&] { xshard::compile<double>(q, mesh); },
                                      "compile: node relu (relu)");
    }
    auto net = xshard::compile<double>(mlp_program(8, 1, 1), mesh);
    const array x = xt::zeros<double>({std::size_t(4), std::size_t(24)});
    const xt::xarray<std::int64_t> y = xt::zeros<std::int64_t>({std::size_t(4)});
    xshard::testing::expect_error(
        [&] { net.train_step(dist<2>(mesh, x, "[-, -]"), dist<1, std::int64_t>(mesh, y, "[-]")); },
        "input x takes f64(8, 24), not f64(4, 24)");
}

} // namespace
