// Tensor-parallel layers: the adjoint identity of every redistribution, and every layer's
// forward and backward against the same layer on one rank (parity) and against finite
// differences, on the meshes dp x tp of the world.

#include <xshard/nn/activation.hpp>
#include <xshard/nn/attention.hpp>
#include <xshard/nn/blocks.hpp>
#include <xshard/nn/embedding.hpp>
#include <xshard/nn/layer_normalization.hpp>
#include <xshard/nn/linear.hpp>
#include <xshard/nn/module.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/tensor/gather.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/norms.hpp>

#include "layouts.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace {

using xshard::layout;
using xshard::testing::for_each_mesh;
using xshard::testing::where;
using xshard::testing::world;
namespace nn = xshard::nn;
using mesh_t = xshard::mesh<"dp", "tp">;
template <std::size_t N = 2>
using tensor = nn::tensor<double, mesh_t, N>;

// --- the adjoint of a redistribution ------------------------------------------------------

constexpr auto m22 = xshard::mesh_shape::parse("dp=2, tp=2");
static_assert(xshard::dual("[dp, -]", m22) == layout("[dp, -] partial(sum: tp)"));
static_assert(xshard::dual("[-, -] partial(sum: tp)", m22) == layout("[-, -] partial(sum: dp)"));
static_assert(xshard::dual("[dp, tp]", m22) == layout("[dp, tp]"));
static_assert(xshard::dual(xshard::dual("[(tp, dp)]", m22), m22) == layout("[(tp, dp)]"));
static_assert(xshard::dual(xshard::dual("[-] partial(sum: dp)", m22), m22) ==
              layout("[-] partial(sum: dp)"));

/// A valid random tensor laid out as `l`: replicas equal, pending-sum terms different.
template <class M>
auto random_tensor(const M& m, const std::array<std::size_t, 2>& shape, const layout& l,
                   unsigned seed) {
    const auto& ms = m.shape();
    const auto b = xshard::block_of(l, ms, shape, m.rank());
    std::mt19937 engine(seed * 7919u + unsigned(ms.group_color(m.rank(), l.replicated_axes(ms))));
    xt::xtensor<double, 2> local = xt::random::rand<double>(b.extent, -1.0, 1.0, engine);
    return xshard::dtensor<double, M, xshard::dynamic_layout(2)>(xshard::detail::unchecked, m,
                                                                 shape, std::move(local), l);
}

/// The sum over the ranks of the dot products of their local blocks.
template <class A, class B>
double local_inner(const A& a, const B& b) {
    double s = xt::sum(a.local() * b.local())();
    xshard::mpi::allreduce(a.mesh().comm(), std::span(&s, 1), xshard::reduction::sum);
    return s;
}

TEST(adjoint, every_redistribution_satisfies_the_adjoint_identity) {
    for_each_mesh([](const auto& m) {
        const auto layouts = xshard::testing::all_layouts(m.shape(), 2, false);
        std::mt19937 pick(11);
        for (int trial = 0; trial < 40; ++trial) {
            const auto& from = layouts[pick() % layouts.size()];
            const auto& to = layouts[pick() % layouts.size()];
            const std::array<std::size_t, 2> shape{5, 6};
            const auto x = random_tensor(m, shape, from, unsigned(trial));
            const auto y =
                random_tensor(m, shape, xshard::dual(to, m.shape()), unsigned(trial) + 100);
            const auto ax = xshard::redistribute<xshard::dynamic_layout(2)>(x, to);
            const auto aty = xshard::redistribute_adjoint(y, from);
            EXPECT_EQ(aty.layout(), xshard::dual(from, m.shape()));
            const double lhs = local_inner(ax, y), rhs = local_inner(x, aty);
            EXPECT_NEAR(lhs, rhs, 1e-12 * (1 + std::abs(lhs)))
                << from.to_string() << " -> " << to.to_string() << " " << where(m);
        }
    });
}

// --- layers: parity with one rank and finite differences ---------------------------------

/// The meshes dp x tp of the world: (W, 1), (1, W) and (2, W/2).
template <class F>
void for_each_dp_tp(F&& f) {
    const auto w = world();
    std::vector<std::array<int, 2>> shapes{{w.size(), 1}};
    if (w.size() > 1)
        shapes.push_back({1, w.size()});
    if (w.size() > 2 && w.size() % 2 == 0)
        shapes.push_back({2, w.size() / 2});
    for (const auto& s : shapes)
        f(mesh_t(w, s));
}

/// The same mesh type on this rank alone: the serial reference.
mesh_t serial_mesh() {
    return mesh_t(xshard::communicator::self(), {1, 1});
}

xt::xtensor<double, 2> random_array(std::array<std::size_t, 2> shape, unsigned seed) {
    std::mt19937 e(seed);
    return xt::random::rand<double>(shape, -1.0, 1.0, e);
}

/// Adds `delta` to global element `index` of `t` on every rank holding it.
template <class D>
void nudge(D& t, std::size_t index, double delta) {
    const auto b = t.block();
    std::array<std::size_t, D::rank> g{};
    for (std::size_t d = D::rank, rest = index; d-- > 0;) {
        g[d] = rest % t.shape()[d];
        rest /= t.shape()[d];
    }
    std::size_t local = 0;
    for (std::size_t d = 0; d < D::rank; ++d) {
        if (g[d] < b.offset[d] || g[d] >= b.offset[d] + b.extent[d])
            return;
        local = local * b.extent[d] + (g[d] - b.offset[d]);
    }
    t.local().data()[local] += typename D::value_type(delta);
}

/// The global values of a gradient (its terms summed).
template <class D>
auto resolved(const D& g) {
    return xshard::gather_all(xshard::ops::resolve(g));
}

/// Checks a layer made by `make(mesh)`: forward and backward on `m` against the same layer on
/// one rank, and the gradients of L = <layer(x), r> against central differences.
template <class Make>
void check_layer(const mesh_t& m, Make make, const std::array<std::size_t, 2>& in_shape,
                 const layout& in_layout, const std::string& name) {
    const auto context = name + " " + where(m);
    const auto gx = random_array(in_shape, 1);
    auto layer = make(m);
    const auto one = serial_mesh();
    auto serial = make(one);
    auto x = xshard::distribute<xshard::dynamic_layout(2)>(m, gx, in_layout);
    const auto sx =
        xshard::distribute<xshard::dynamic_layout(2)>(one, gx, nn::make_layout({"", ""}));
    const auto y = layer.forward(x);
    const auto sy = serial.forward(sx);
    const auto gy = xshard::gather_all(y);
    ASSERT_TRUE(xt::allclose(gy, sy.local(), 1e-12, 1e-12))
        << context << ": forward differs from one rank";
    const auto r = random_array({gy.shape()[0], gy.shape()[1]}, 2);
    const auto dx = layer.backward(
        nn::as_gradient(xshard::distribute<xshard::dynamic_layout(2)>(m, r, y.layout())));
    const auto sdx = serial.backward(
        nn::as_gradient(xshard::distribute<xshard::dynamic_layout(2)>(one, r, sy.layout())));
    auto grads = xshard::gradients_of{layer};
    xshard::synchronize_gradients(layer, grads);
    const auto gdx = resolved(dx);
    EXPECT_TRUE(xt::allclose(gdx, sdx.local(), 1e-12, 1e-12))
        << context << ": input gradient differs from one rank";
    std::vector<xt::xarray<double>> serial_grads;
    xshard::for_each_weight(
        serial, [&](const std::string&, auto& w) { serial_grads.emplace_back(w.grad.local()); });
    std::size_t i = 0;
    xshard::for_each_weight(layer, [&](const std::string& wname, auto& w) {
        EXPECT_TRUE(xt::allclose(xshard::gather_all(w.grad), serial_grads[i++], 1e-12, 1e-12))
            << context << ": gradient of " << wname << " differs from one rank";
    });

    // Central differences of L = <layer(x), r> (every rank computes the same).
    auto loss = [&] {
        return xt::sum(xshard::gather_all(layer.forward(x)) * r)();
    };
    const double eps = 1e-5;
    auto check = [&](auto& value, double analytic, std::size_t index, const std::string& what) {
        nudge(value, index, eps);
        const double up = loss();
        nudge(value, index, -2 * eps);
        const double down = loss();
        nudge(value, index, eps);
        const double numeric = (up - down) / (2 * eps);
        EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
            << context << ": d L / d " << what << "[" << index << "]";
    };
    for (std::size_t k = 0; k < 3; ++k) {
        const std::size_t index = (k * 7919) % gx.size();
        check(x, gdx.data()[index], index, "x");
    }
    xshard::for_each_weight(layer, [&](const std::string& wname, auto& w) {
        const auto g = xshard::gather_all(w.grad);
        for (std::size_t k = 0; k < 3; ++k) {
            const std::size_t index = (k * 7919 + 3) % g.size();
            check(w.value, g.data()[index], index, wname);
        }
    });
}

constexpr std::array<std::size_t, 2> rows_by_features{8, 6};

layout rows_split() {
    return nn::make_layout({"dp", ""});
}

TEST(layers, column_parallel_linear) {
    for_each_dp_tp([](const mesh_t& m) {
        for (const bool gather : {false, true})
            check_layer(
                m,
                [&](const mesh_t& mm) {
                    return nn::column_parallel_linear<double, mesh_t>(mm, 6, 10, 3,
                                                                      {.gather_output = gather});
                },
                rows_by_features, rows_split(),
                gather ? "column_parallel_linear(gather)" : "column_parallel_linear");
    });
}

TEST(layers, row_parallel_linear) {
    for_each_dp_tp([](const mesh_t& m) {
        check_layer(
            m,
            [](const mesh_t& mm) { return nn::row_parallel_linear<double, mesh_t>(mm, 6, 5, 4); },
            rows_by_features, nn::make_layout({"dp", "tp"}), "row_parallel_linear");
        check_layer(
            m,
            [](const mesh_t& mm) {
                return nn::row_parallel_linear<double, mesh_t>(mm, 6, 5, 4,
                                                               {.output = layout("[(dp, tp), -]")});
            },
            rows_by_features, nn::make_layout({"dp", "tp"}),
            "row_parallel_linear(sequence parallel)");
    });
}

TEST(layers, activations_and_layer_norm) {
    for_each_dp_tp([](const mesh_t& m) {
        check_layer(
            m, [](const mesh_t& mm) { return nn::gelu_activation<double, mesh_t>(mm); },
            rows_by_features, rows_split(), "gelu");
        check_layer(
            m, [](const mesh_t& mm) { return nn::relu_activation<double, mesh_t>(mm); },
            rows_by_features, rows_split(), "relu");
        check_layer(
            m, [](const mesh_t& mm) { return nn::layer_normalization<double, mesh_t>(mm, 6); },
            rows_by_features, rows_split(), "layer_norm");
    });
}

TEST(layers, mlp_and_sequential) {
    for_each_dp_tp([](const mesh_t& m) {
        check_layer(
            m, [](const mesh_t& mm) { return nn::mlp_block<double, mesh_t>(mm, 6, 8, 5); },
            rows_by_features, rows_split(), "mlp_block");
        check_layer(
            m,
            [](const mesh_t& mm) {
                return nn::sequential(nn::column_parallel_linear<double, mesh_t>(mm, 6, 8, 6),
                                      nn::gelu_activation<double, mesh_t>(mm),
                                      nn::row_parallel_linear<double, mesh_t>(mm, 8, 3, 7),
                                      nn::layer_normalization<double, mesh_t>(mm, 3));
            },
            rows_by_features, rows_split(), "sequential");
    });
}

TEST(layers, attention_and_transformer_block) {
    for_each_dp_tp([](const mesh_t& m) {
        // 4 sequences of 3 positions, 8 features in 4 heads of 2.
        const std::array<std::size_t, 2> tokens{12, 8};
        if (4 % m.shape().axis_size("dp") || 4 % m.shape().axis_size("tp"))
            return;
        check_layer(
            m,
            [](const mesh_t& mm) {
                return nn::self_attention<double, mesh_t>(mm, 8, 8, {.heads = 4, .sequence = 3});
            },
            tokens, rows_split(), "self_attention");
        check_layer(
            m,
            [](const mesh_t& mm) {
                return nn::transformer_block<double, mesh_t>(
                    mm, 8, 9, {.heads = 4, .sequence = 3, .hidden = 12});
            },
            tokens, rows_split(), "transformer_block");
    });
}

TEST(layers, vocab_parallel_embedding_and_cross_entropy) {
    for_each_dp_tp([](const mesh_t& m) {
        const auto context = where(m);
        const std::size_t vocab = 11, rows = 8, features = 6;
        std::mt19937 e(5);
        const xt::xtensor<std::int64_t, 1> gids =
            xt::random::randint<std::int64_t>({rows}, 0, std::int64_t(vocab), e);
        const auto r = random_array({rows, features}, 6);
        auto run = [&](const mesh_t& mm, const layout& ids_layout) {
            nn::vocab_parallel_embedding<double, mesh_t> emb(mm, vocab, features, 12, {}, 1.0);
            const auto ids = xshard::distribute<xshard::dynamic_layout(1)>(mm, gids, ids_layout);
            const auto y = emb.forward(ids);
            emb.backward(
                nn::as_gradient(xshard::distribute<xshard::dynamic_layout(2)>(mm, r, y.layout())));
            auto g = xshard::gradients_of{emb};
            xshard::synchronize_gradients(emb, g);
            xt::xtensor<double, 2> table_grad;
            xshard::for_each_weight(
                emb, [&](const std::string&, auto& w) { table_grad = xshard::gather_all(w.grad); });
            return std::pair(xt::xtensor<double, 2>(xshard::gather_all(y)), table_grad);
        };
        const auto [y, dt] = run(m, nn::make_layout({"dp"}));
        const auto [sy, sdt] = run(serial_mesh(), nn::make_layout({""}));
        EXPECT_TRUE(xt::allclose(y, sy, 1e-12, 1e-12)) << context << ": embedding forward";
        EXPECT_TRUE(xt::allclose(dt, sdt, 1e-12, 1e-12)) << context << ": embedding backward";
        // The table's gradient is r's rows added up by id.
        xt::xtensor<double, 2> expected = xt::zeros<double>({vocab, features});
        for (std::size_t i = 0; i < rows; ++i)
            xt::view(expected, gids(i)) += xt::view(r, i);
        EXPECT_TRUE(xt::allclose(dt, expected, 1e-12, 1e-12)) << context << ": embedding gradient";

        // Cross-entropy with the classes split over tp: loss and gradient against one rank and
        // finite differences.
        const auto glogits = random_array({rows, vocab}, 7);
        auto loss_of = [&](const mesh_t& mm, const xt::xtensor<double, 2>& values, bool split) {
            nn::parallel_cross_entropy<double, mesh_t> ce;
            const auto labels = xshard::distribute<xshard::dynamic_layout(1)>(
                mm, gids, nn::make_layout({split ? "dp" : ""}));
            const auto logits = xshard::distribute<xshard::dynamic_layout(2)>(
                mm, values, split ? nn::make_layout({"dp", "tp"}) : nn::make_layout({"", ""}));
            const double loss = ce.forward(logits, labels);
            return std::pair(loss, xt::xtensor<double, 2>(resolved(ce.backward())));
        };
        const auto [loss, dl] = loss_of(m, glogits, true);
        const auto [sloss, sdl] = loss_of(serial_mesh(), glogits, false);
        EXPECT_NEAR(loss, sloss, 1e-12) << context;
        EXPECT_TRUE(xt::allclose(dl, sdl, 1e-12, 1e-12)) << context << ": cross-entropy gradient";
        for (std::size_t k = 0; k < 4; ++k) {
            const std::size_t index = (k * 31 + 2) % glogits.size();
            auto up = glogits, down = glogits;
            up.data()[index] += 1e-5;
            down.data()[index] -= 1e-5;
            const double numeric =
                (loss_of(m, up, true).first - loss_of(m, down, true).first) / 2e-5;
            EXPECT_NEAR(dl.data()[index], numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
                << context;
        }
    });
}

TEST(layers, labels_out_of_range_raise_on_every_rank_before_use) {
    for_each_dp_tp([](const mesh_t& m) {
        const auto context = where(m);
        const std::size_t rows = 6, classes = 5;
        const auto glogits = random_array({rows, classes}, 8);
        const auto logits = xshard::distribute<xshard::dynamic_layout(2)>(
            m, glogits, nn::make_layout({"dp", "tp"}));
        // The last row's label is out of range: its rank (the last along dp) reports it.
        for (const std::int64_t bad : {std::int64_t(classes), std::int64_t(-1)}) {
            xt::xtensor<std::int64_t, 1> glabels = {0, 1, 2, 3, 4, 0};
            glabels(rows - 1) = bad;
            const auto labels = xshard::distribute<xshard::dynamic_layout(1)>(
                m, glabels, nn::make_layout({"dp"}));
            nn::parallel_cross_entropy<double, mesh_t> ce;
            try {
                (void)ce.forward(logits, labels);
                ADD_FAILURE() << context << ": no exception";
            } catch (const xshard::error& e) {
                const int dp = m.shape().axis_size("dp"), tp = m.shape().axis_size("tp");
                EXPECT_EQ(std::string(e.what()),
                          "xshard: parallel_cross_entropy: rank " + std::to_string((dp - 1) * tp) +
                              " holds label " + std::to_string(bad) + ", outside [0, 5)")
                    << context;
            }
        }
        // The vocabulary-parallel embedding checks its ids too.
        nn::vocab_parallel_embedding<double, mesh_t> emb(m, 7, 4, 3, {.tensor = "tp"});
        const xt::xtensor<std::int64_t, 1> gids = {0, 6, 7, 1};
        const auto ids =
            xshard::distribute<xshard::dynamic_layout(1)>(m, gids, nn::make_layout({""}));
        EXPECT_THROW((void)emb.forward(ids), xshard::error) << context;
    });
}

TEST(layers, attention_rejects_zero_heads) {
    const auto m = serial_mesh();
    try {
        nn::self_attention<double, mesh_t> a(m, 8, 1, {.heads = 0, .sequence = 2});
        ADD_FAILURE() << "no exception";
    } catch (const xshard::error& e) {
        EXPECT_EQ(std::string(e.what()),
                  "xshard: self_attention: 8 features do not split into 0 heads");
    }
    EXPECT_THROW((nn::self_attention<double, mesh_t>(m, 8, 1, {.heads = 3, .sequence = 2})),
                 xshard::error);
    EXPECT_THROW((nn::self_attention<double, mesh_t>(m, 8, 1, {.heads = 2, .sequence = 0})),
                 xshard::error);
}

TEST(layers, a_gradient_says_whether_it_holds_terms_or_the_sum) {
    for_each_dp_tp([](const mesh_t& m) {
        const auto context = where(m);
        const auto gx = random_array({8, 6}, 21);
        const auto r = random_array({8, 4}, 22);
        auto run_backward = [&](const mesh_t& mm, nn::column_parallel_linear<double, mesh_t>& l,
                                const layout& rows) {
            const auto x = xshard::distribute<xshard::dynamic_layout(2)>(mm, gx, rows);
            const auto y = l.forward(x);
            (void)l.backward(
                nn::as_gradient(xshard::distribute<xshard::dynamic_layout(2)>(mm, r, y.layout())));
        };
        const auto one = serial_mesh();
        nn::column_parallel_linear<double, mesh_t> serial(one, 6, 4, 5);
        run_backward(one, serial, nn::make_layout({"", ""}));
        nn::column_parallel_linear<double, mesh_t> layer(m, 6, 4, 5);
        run_backward(m, layer, nn::make_layout({"dp", ""}));
        auto grads = xshard::gradients_of{layer};
        auto serial_grads = xshard::gradients_of{serial};
        // On one rank the terms are the gradient: nothing is pending.
        xshard::for_each_weight(serial, [&](const std::string& name, auto& w) {
            EXPECT_EQ(w.grad.layout(), w.value.layout()) << name;
        });
        const bool replicas = m.shape().axis_size("dp") > 1; // the weights are copied over dp
        std::vector<xt::xarray<double>> expected;
        xshard::for_each_weight(
            serial, [&](const std::string&, auto& w) { expected.emplace_back(w.grad.local()); });
        // Before synchronisation: terms, laid out as the dual; gathered, they sum to the
        // gradient; a norm of them is refused on every rank.
        std::size_t i = 0;
        xshard::for_each_weight(layer, [&](const std::string& name, auto& w) {
            EXPECT_EQ(w.grad.layout(), w.term_layout()) << context << name;
            EXPECT_EQ(w.grad.layout().is_partial(), replicas) << context << name;
            EXPECT_TRUE(xt::allclose(xshard::gather_all(w.grad), expected[i++], 1e-12, 1e-12))
                << context << ": " << name;
        });
        if (replicas) {
            EXPECT_THROW((void)xshard::global_norm(grads), xshard::error) << context;
            xshard::optim::sgd sgd({.lr = 0.1});
            EXPECT_THROW(sgd.step(layer), xshard::error) << context;
        }
        // After: the sum, laid out as the value; its norm is the serial one.
        xshard::synchronize_gradients(layer, grads);
        i = 0;
        xshard::for_each_weight(layer, [&](const std::string& name, auto& w) {
            EXPECT_EQ(w.grad.layout(), w.value.layout()) << context << name;
            EXPECT_TRUE(xt::allclose(xshard::gather_all(w.grad), expected[i++], 1e-12, 1e-12))
                << context << ": " << name;
        });
        EXPECT_NEAR(xshard::global_norm(grads), xshard::global_norm(serial_grads), 1e-12)
            << context;
        // A second backward pass without zero_grad adds its terms to the sum: twice the
        // gradient, whether synchronised again or gathered as terms.
        run_backward(m, layer, nn::make_layout({"dp", ""}));
        i = 0;
        xshard::for_each_weight(layer, [&](const std::string& name, auto& w) {
            EXPECT_EQ(w.grad.layout().is_partial(), replicas) << context << name;
            EXPECT_TRUE(xt::allclose(xshard::gather_all(w.grad), 2.0 * expected[i++], 1e-12, 1e-12))
                << context << ": " << name;
        });
        xshard::for_each_weight(layer, [&](const std::string& name, auto& w) {
            w.zero_grad();
            EXPECT_EQ(w.grad.layout(), w.term_layout()) << context << name;
            // (Not xt::all: on an empty block, xtensor 0.24 offsets a null pointer.)
            const auto& g = w.grad.local();
            EXPECT_TRUE(std::all_of(g.data(), g.data() + g.size(), [](double v) { return v == 0; }))
                << context << name;
        });
    });
}

TEST(layers, kept_redistributions_plan_once_and_replan_when_the_tensors_change) {
    for_each_dp_tp([](const mesh_t& m) {
        const auto context = where(m);
        nn::kept_redistribution<double, mesh_t> keep;
        EXPECT_FALSE(keep.planned());
        const layout from = nn::make_layout({"dp", "tp"}), to = nn::make_layout({"tp", ""});
        for (const std::size_t rows : {9, 9, 5, 9}) { // the same plan, then a new one, twice
            const auto g = random_array({rows, 7}, unsigned(rows));
            const auto x = xshard::distribute<xshard::dynamic_layout(2)>(m, g, from);
            const auto y = keep(x, to);
            EXPECT_EQ(y.layout(), to) << context;
            EXPECT_EQ(y.local(), xshard::distribute<xshard::dynamic_layout(2)>(m, g, to).local())
                << context << ", " << rows << " rows";
            EXPECT_TRUE(keep.planned() || m.size() == 1 || from == to) << context;
            // Another target layout from the same source: planned anew.
            const auto z = keep(x, nn::make_layout({"", "dp"}));
            EXPECT_TRUE(xt::allclose(xshard::gather_all(z), g)) << context;
            // A tensor already in the layout comes back as it is.
            EXPECT_EQ(keep(y, to).local(), y.local()) << context;
        }
        // A layer run at two batch sizes in turn keeps matching one rank.
        nn::row_parallel_linear<double, mesh_t> layer(m, 6, 4, 9);
        const auto one = serial_mesh();
        nn::row_parallel_linear<double, mesh_t> serial(one, 6, 4, 9);
        for (const std::size_t rows : {8, 6, 8}) {
            const auto gx = random_array({rows, 6}, unsigned(30 + rows));
            const auto x = xshard::distribute<xshard::dynamic_layout(2)>(
                m, gx, nn::make_layout({"dp", "tp"}));
            const auto y = layer.forward(x);
            const auto sy = serial.forward(
                xshard::distribute<xshard::dynamic_layout(2)>(one, gx, nn::make_layout({"", ""})));
            EXPECT_TRUE(xt::allclose(xshard::gather_all(y), sy.local(), 1e-12, 1e-12))
                << context << ", " << rows << " rows";
            const auto r = random_array({rows, 4}, unsigned(40 + rows));
            const auto dx = layer.backward(
                nn::as_gradient(xshard::distribute<xshard::dynamic_layout(2)>(m, r, y.layout())));
            const auto sdx = serial.backward(nn::as_gradient(
                xshard::distribute<xshard::dynamic_layout(2)>(one, r, sy.layout())));
            EXPECT_TRUE(xt::allclose(resolved(dx), sdx.local(), 1e-12, 1e-12))
                << context << ", " << rows << " rows";
        }
    });
}

} // namespace
