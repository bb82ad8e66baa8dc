// Programs of convolutional networks and lookups: conv2d, max_pool2d, avg_pool2d, global
// average pooling, batch_norm on [N, C, H, W] and embedding, each against a serial reference
// written here with plain loops (never the kernels under test), its gradients against
// central differences of that reference, on every dp x mp mesh of the world. A convnet split
// by height and width trains like one rank, also with its batch norm recomputed.

#include <xshard/graph.hpp>

#include "expect_error.hpp"
#include "mpi_test.hpp"
#include "op_case.hpp"

#include <gtest/gtest.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace graph_test;

/// The window of a reference convolution or pooling.
struct window {
    std::size_t kh = 1, kw = 1, sh = 1, sw = 1, top = 0, bottom = 0, left = 0, right = 0;
    std::size_t dh = 1, dw = 1;

    std::size_t out(std::size_t in, std::size_t before, std::size_t after, std::size_t k,
                    std::size_t s, std::size_t d) const {
        return (in + before + after - d * (k - 1) - 1) / s + 1;
    }
    std::size_t out_h(std::size_t h) const { return out(h, top, bottom, kh, sh, dh); }
    std::size_t out_w(std::size_t w) const { return out(w, left, right, kw, sw, dw); }
};

/// y[n, o, i, j] = sum over the group's channels c and the kernel (a, b) of
/// x[n, c, i sh + a dh - top, j sw + b dw - left] w[o, c - group start, a, b].
array conv_ref(const array& x, const array& w, window g, std::size_t groups) {
    const std::size_t N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
    const std::size_t O = w.shape()[0], cg = w.shape()[1];
    g.kh = w.shape()[2];
    g.kw = w.shape()[3];
    const std::size_t oh = g.out_h(H), ow = g.out_w(W), og = O / groups;
    array y = xt::zeros<double>({N, O, oh, ow});
    for (std::size_t n = 0; n < N; ++n)
        for (std::size_t o = 0; o < O; ++o)
            for (std::size_t i = 0; i < oh; ++i)
                for (std::size_t j = 0; j < ow; ++j) {
                    double s = 0;
                    for (std::size_t c = 0; c < cg; ++c)
                        for (std::size_t a = 0; a < g.kh; ++a)
                            for (std::size_t b = 0; b < g.kw; ++b) {
                                const auto r =
                                    std::ptrdiff_t(i * g.sh + a * g.dh) - std::ptrdiff_t(g.top);
                                const auto q =
                                    std::ptrdiff_t(j * g.sw + b * g.dw) - std::ptrdiff_t(g.left);
                                if (r < 0 || q < 0 || r >= std::ptrdiff_t(H) ||
                                    q >= std::ptrdiff_t(W))
                                    continue;
                                const std::size_t ch = (o / og) * cg + c;
                                s += x.data()[((n * C + ch) * H + std::size_t(r)) * W +
                                              std::size_t(q)] *
                                     w.data()[((o * cg + c) * g.kh + a) * g.kw + b];
                            }
                    y.data()[((n * O + o) * oh + i) * ow + j] = s;
                }
    return y;
}

/// Max (or mean) of each window; padding never wins a max; a mean divides by the whole
/// window, or by its part inside the image.
array pool_ref(const array& x, window g, bool max, bool count_include_pad = true) {
    const std::size_t N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
    const std::size_t oh = g.out_h(H), ow = g.out_w(W);
    array y = xt::zeros<double>({N, C, oh, ow});
    for (std::size_t p = 0; p < N * C; ++p)
        for (std::size_t i = 0; i < oh; ++i)
            for (std::size_t j = 0; j < ow; ++j) {
                double best = -std::numeric_limits<double>::infinity(), sum = 0;
                std::size_t inside = 0;
                for (std::size_t a = 0; a < g.kh; ++a)
                    for (std::size_t b = 0; b < g.kw; ++b) {
                        const auto r = std::ptrdiff_t(i * g.sh + a) - std::ptrdiff_t(g.top);
                        const auto q = std::ptrdiff_t(j * g.sw + b) - std::ptrdiff_t(g.left);
                        if (r < 0 || q < 0 || r >= std::ptrdiff_t(H) || q >= std::ptrdiff_t(W))
                            continue;
                        const double v = x.data()[(p * H + std::size_t(r)) * W + std::size_t(q)];
                        best = std::max(best, v);
                        sum += v;
                        ++inside;
                    }
                y.data()[(p * oh + i) * ow + j] =
                    max ? best : sum / double(count_include_pad ? g.kh * g.kw : inside);
            }
    return y;
}

/// Batch normalisation of [N, C, H, W] with the batch's statistics per channel.
array batch_norm2d_ref(const array& x, const array& gamma, const array& beta) {
    const std::size_t N = x.shape()[0], C = x.shape()[1], hw = x.shape()[2] * x.shape()[3];
    array y = x;
    for (std::size_t c = 0; c < C; ++c) {
        double mean = 0, var = 0;
        for (std::size_t n = 0; n < N; ++n)
            for (std::size_t k = 0; k < hw; ++k)
                mean += x.data()[(n * C + c) * hw + k];
        mean /= double(N * hw);
        for (std::size_t n = 0; n < N; ++n)
            for (std::size_t k = 0; k < hw; ++k) {
                const double d = x.data()[(n * C + c) * hw + k] - mean;
                var += d * d;
            }
        var /= double(N * hw);
        for (std::size_t n = 0; n < N; ++n)
            for (std::size_t k = 0; k < hw; ++k) {
                auto& e = y.data()[(n * C + c) * hw + k];
                e = (e - mean) / std::sqrt(var + 1e-5) * gamma(c) + beta(c);
            }
    }
    return y;
}

/// Row ids[i] of the table for every id: [ids.., H].
array embedding_ref(const array& table, const array& ids) {
    const std::size_t h = table.shape()[1];
    std::vector<std::size_t> shape(ids.shape().begin(), ids.shape().end());
    shape.push_back(h);
    array y(shape);
    for (std::size_t i = 0; i < ids.size(); ++i)
        for (std::size_t j = 0; j < h; ++j)
            y.data()[i * h + j] = table(std::size_t(ids.data()[i]), j);
    return y;
}

using V = std::vector<traced_tensor>;
using A = std::vector<array>;
using M = xshard::mesh_shape;

TEST(graph, convolutions_and_poolings_against_central_differences_on_every_mesh) {
    std::vector<op_case> cases;
    const window pad1{.top = 1, .bottom = 1, .left = 1, .right = 1};
    cases.push_back({"conv2d data parallel, the batch split unevenly",
                     {{4, 3, 5, 5}, {4, 3, 3, 3}},
                     [](const V& w, const M&) {
                         return ops::conv2d.with({.padding = 1})
                             .shard({lay("[(dp,mp), -, -, -]"), lay("[-, -, -, -]")})(w[0], w[1]);
                     },
                     [pad1](const A& w) {
                         return conv_ref(w[0], w[1], pad1, 1);
                     }});
    cases.push_back({"conv2d output channels split, strategy ((dp, 1, 1, 1), (mp, 1, 1, 1)), "
                     "stride 2",
                     {{4, 3, 6, 6}, {6, 3, 3, 3}},
                     [](const V& w, const M& m) {
                         const int dp = m.sizes[0], mp = m.sizes[1];
                         return ops::conv2d.with({.stride = 2, .padding = 1})
                             .shard({{dp, 1, 1, 1}, {mp, 1, 1, 1}})(w[0], w[1]);
                     },
                     [](const A& w) {
                         return conv_ref(
                             w[0], w[1],
                             {.sh = 2, .sw = 2, .top = 1, .bottom = 1, .left = 1, .right = 1}, 1);
                     }});
    cases.push_back({"conv2d input channels split (a pending sum), strategy ((dp, mp, 1, 1), "
                     "(1, mp, 1, 1)), dilation 2",
                     {{2, 4, 5, 5}, {3, 4, 3, 3}},
                     [](const V& w, const M& m) {
                         const int dp = m.sizes[0], mp = m.sizes[1];
                         return ops::conv2d.with({.padding = {2, 1}, .dilation = {2, 1}})
                             .shard({{dp, mp, 1, 1}, {1, mp, 1, 1}})(w[0], w[1]);
                     },
                     [](const A& w) {
                         return conv_ref(w[0], w[1],
                                         {.top = 2, .bottom = 2, .left = 1, .right = 1, .dh = 2},
                                         1);
                     }});
    cases.push_back({"conv2d grouped, asked for split channels, asymmetric padding",
                     {{2, 4, 4, 5}, {6, 2, 3, 2}},
                     [](const V& w, const M&) {
                         return ops::conv2d
                             .with({.stride = {1, 2},
                                    .padding = ops::window_padding::sides(1, 0, 0, 1),
                                    .groups = 2})
                             .shard({lay("[dp, mp, -, -]"), lay("[mp, -, -, -]")})(w[0], w[1]);
                     },
                     [](const A& w) {
                         return conv_ref(w[0], w[1], {.sw = 2, .top = 1, .right = 1}, 2);
                     }});
    cases.push_back({"conv2d data parallel by default after an input split by height and width",
                     {{3, 2, 4, 4}, {3, 2, 2, 2}},
                     [](const V& w, const M&) {
                         return ops::conv2d(ops::neg.shard({lay("[-, -, dp, mp]")})(w[0]), w[1]);
                     },
                     [](const A& w) {
                         return conv_ref(-w[0], w[1], {}, 1);
                     }});
    cases.push_back(
        {"max_pool2d kernel 3 stride 2 padding 1, batch and channels split",
         {{2, 3, 7, 7}},
         [](const V& w, const M&) {
             return ops::max_pool2d(ops::neg.shard({lay("[dp, mp, -, -]")})(w[0]),
                                    {.kernel = 3, .stride = 2, .padding = 1});
         },
         [](const A& w) {
             return pool_ref(
                 -w[0],
                 {.kh = 3, .kw = 3, .sh = 2, .sw = 2, .top = 1, .bottom = 1, .left = 1, .right = 1},
                 true);
         }});
    cases.push_back(
        {"avg_pool2d kernel 2, asked split by height",
         {{3, 2, 4, 6}},
         [](const V& w, const M&) {
             return ops::avg_pool2d.with({.kernel = 2}).shard({lay("[dp, -, mp, -]")})(w[0]);
         },
         [](const A& w) {
             return pool_ref(w[0], {.kh = 2, .kw = 2, .sh = 2, .sw = 2}, false);
         }});
    cases.push_back(
        {"avg_pool2d kernel (3, 2) padding 1 without the padding in the mean",
         {{2, 4, 5, 4}},
         [](const V& w, const M&) {
             return ops::avg_pool2d
                 .with({.kernel = {3, 2}, .stride = 1, .padding = 1, .count_include_pad = false})
                 .shard({lay("[mp, dp, -, -]")})(w[0]);
         },
         [](const A& w) {
             return pool_ref(w[0], {.kh = 3, .kw = 2, .top = 1, .bottom = 1, .left = 1, .right = 1},
                             false, false);
         }});
    cases.push_back({"global_avg_pool2d over a split height (a pending sum)",
                     {{2, 3, 4, 5}},
                     [](const V& w, const M&) {
                         return ops::global_avg_pool2d(
                             ops::neg.shard({lay("[dp, -, mp, -]")})(w[0]));
                     },
                     [](const A& w) {
                         return array(xt::mean(-w[0], {2, 3}));
                     }});
    cases.push_back({"conv2d, max_pool2d and avg_pool2d of one input (the cotangents add)",
                     {{2, 3, 5, 5}, {3, 3, 3, 3}},
                     [](const V& w, const M&) {
                         const ops::pool2d_options o{.kernel = 3, .stride = 1, .padding = 1};
                         return ops::conv2d(w[0], w[1], {.padding = 1}) + ops::max_pool2d(w[0], o) +
                                ops::avg_pool2d(w[0], o) + ops::conv2d(w[0], w[1], {.padding = 1});
                     },
                     [pad1](const A& w) {
                         window p = pad1;
                         p.kh = p.kw = 3;
                         return array(2.0 * conv_ref(w[0], w[1], pad1, 1) +
                                      pool_ref(w[0], p, true) + pool_ref(w[0], p, false));
                     }});
    // Height and width split (spatial parallelism): halos over the bands' edges. On every
    // mesh of up to 8 ranks the bands are at least as thick as the halos.
    cases.push_back(
        {"conv2d split by height and width, stride (2, 1), asymmetric padding",
         {{2, 2, 16, 12}, {3, 2, 3, 3}},
         [](const V& w, const M&) {
             return ops::conv2d
                 .with({.stride = {2, 1}, .padding = ops::window_padding::sides(1, 1, 0, 1)})
                 .shard({lay("[-, -, dp, mp]"), lay("[-, -, -, -]")})(w[0], w[1]);
         },
         [](const A& w) {
             return conv_ref(w[0], w[1], {.sh = 2, .top = 1, .bottom = 1, .right = 1}, 1);
         }});
    cases.push_back({"conv2d split by height and output channels, dilation 2",
                     {{2, 2, 16, 6}, {4, 2, 3, 3}},
                     [](const V& w, const M&) {
                         return ops::conv2d.with({.padding = 2, .dilation = 2})
                             .shard({lay("[-, -, dp, -]"), lay("[mp, -, -, -]")})(w[0], w[1]);
                     },
                     [](const A& w) {
                         return conv_ref(
                             w[0], w[1],
                             {.top = 2, .bottom = 2, .left = 2, .right = 2, .dh = 2, .dw = 2}, 1);
                     }});
    cases.push_back(
        {"max_pool2d split by height and width, kernel 3 stride 2 padding 1",
         {{2, 2, 16, 16}},
         [](const V& w, const M&) {
             return ops::max_pool2d.with({.kernel = 3, .stride = 2, .padding = 1})
                 .shard({lay("[-, -, mp, dp]")})(w[0]);
         },
         [](const A& w) {
             return pool_ref(
                 w[0],
                 {.kh = 3, .kw = 3, .sh = 2, .sw = 2, .top = 1, .bottom = 1, .left = 1, .right = 1},
                 true);
         }});
    cases.push_back(
        {"conv2d, max_pool2d and avg_pool2d of one input split by height and width "
         "(the halos' cotangents add)",
         {{2, 2, 16, 16}, {2, 2, 3, 3}},
         [](const V& w, const M&) {
             const auto s = lay("[-, -, dp, mp]");
             const ops::pool2d_options o{.kernel = 3, .stride = 1, .padding = 1};
             return ops::conv2d.with({.padding = 1}).shard({s, lay("[-, -, -, -]")})(w[0], w[1]) +
                    ops::max_pool2d.with(o).shard({s})(w[0]) +
                    ops::avg_pool2d.with(o).shard({s})(w[0]);
         },
         [pad1](const A& w) {
             window p = pad1;
             p.kh = p.kw = 3;
             return array(conv_ref(w[0], w[1], pad1, 1) + pool_ref(w[0], p, true) +
                          pool_ref(w[0], p, false));
         }});
    cases.push_back({"batch_norm2d split by height and width",
                     {{2, 3, 8, 8}, {3}, {3}},
                     [](const V& w, const M&) {
                         return ops::batch_norm(ops::neg.shard({lay("[-, -, dp, mp]")})(w[0]), w[1],
                                                w[2]);
                     },
                     [](const A& w) {
                         return batch_norm2d_ref(-w[0], w[1], w[2]);
                     }});
    // batch_norm2d: batch_norm on [N, C, H, W], gamma and beta split with the channels.
    cases.push_back({"batch_norm2d split over the batch",
                     {{4, 3, 2, 2}, {3}, {3}},
                     [](const V& w, const M&) {
                         return ops::batch_norm(ops::neg.shard({lay("[(dp,mp), -, -, -]")})(w[0]),
                                                w[1], w[2]);
                     },
                     [](const A& w) {
                         return batch_norm2d_ref(-w[0], w[1], w[2]);
                     }});
    cases.push_back(
        {"batch_norm2d split over the batch and the channels",
         {{4, 4, 2, 3}, {4}, {4}},
         [](const V& w, const M&) {
             return trace_call(
                 "batch_norm", xshard::op_attributes{{}, {1e-5}},
                 xshard::op_annotation{{}, {lay("[dp, mp, -, -]"), lay("[mp]"), lay("[mp]")}, {}},
                 w[0], w[1], w[2]);
         },
         [](const A& w) {
             return batch_norm2d_ref(w[0], w[1], w[2]);
         }});
    for (const auto& c : cases) {
        SCOPED_TRACE(c.name);
        check_op(c);
    }
}

TEST(graph, embedding_against_central_differences_on_every_mesh) {
    std::vector<op_case> cases;
    const xt::xarray<std::int64_t> ids1 = {3, 0, 4, 3, 1, 3};
    const xt::xarray<std::int64_t> ids2 = {{5, 0}, {2, 5}, {6, 1}};
    cases.push_back({"embedding, the ids split over the batch by default",
                     {{5, 4}},
                     [](const V& w, const M&) { return ops::embedding(w[1], w[0]); },
                     [](const A& w) { return embedding_ref(w[0], w[1]); },
                     false,
                     ids1});
    cases.push_back({"embedding, the table split by rows (a pending sum)",
                     {{7, 3}},
                     [](const V& w, const M&) {
                         return trace_call(
                             "embedding", xshard::op_attributes{},
                             xshard::op_annotation{{}, {lay("[dp, -]"), lay("[mp, -]")}, {}}, w[1],
                             w[0]);
                     },
                     [](const A& w) { return embedding_ref(w[0], w[1]); },
                     false,
                     ids2});
    cases.push_back({"embedding, the ids replicated, the table split by rows and columns",
                     {{5, 4}},
                     [](const V& w, const M&) {
                         return trace_call(
                             "embedding", xshard::op_attributes{},
                             xshard::op_annotation{{}, {lay("[-]"), lay("[dp, mp]")}, {}}, w[1],
                             w[0]);
                     },
                     [](const A& w) { return embedding_ref(w[0], w[1]); },
                     false,
                     ids1});
    for (const auto& c : cases) {
        SCOPED_TRACE(c.name);
        check_op(c);
    }
}

TEST(graph, the_rules_give_the_layouts_each_primitive_runs_with) {
    // On a 2 x 4 mesh (no ranks needed: rules are functions of layouts).
    const xshard::mesh_shape m({"dp", "mp"}, {2, 4});
    auto run = [&](const char* op, const xshard::op_attributes& at,
                   std::vector<xshard::operand_type> types, std::vector<layout> asked) {
        return xshard::detail::rules_named(op).rule(at, types, std::move(asked), m);
    };
    const xshard::operand_type x{{8, 4, 6, 6}}, w{{6, 4, 3, 3}, xshard::dtype::f64, true};
    const auto conv = ops::conv2d_options{.padding = 1}.attributes();
    // The input's channels take the weight's split; height and width are gathered; the result
    // is a pending sum over the input channels' axis.
    auto c = run("conv2d", conv, {x, w}, {lay("[dp, -, mp, -]"), lay("[-, mp, -, -]")});
    EXPECT_EQ(c.operands[0], lay("[dp, mp, -, -]"));
    EXPECT_EQ(c.operands[1], lay("[-, mp, -, -]"));
    EXPECT_EQ(c.results[0], lay("[dp, -, -, -] partial(sum: mp)"));
    c = run("conv2d", conv, {x, w}, {lay("[dp, -, -, -]"), lay("[mp, -, -, -]")});
    EXPECT_EQ(c.results[0], lay("[dp, mp, -, -]"));
    // A grouped convolution takes its channels whole.
    c = run("conv2d", ops::conv2d_options{.groups = 2}.attributes(),
            {x, {{6, 2, 3, 3}, xshard::dtype::f64, true}},
            {lay("[dp, mp, -, -]"), lay("[mp, -, -, -]")});
    EXPECT_EQ(c.operands[0], lay("[dp, -, -, -]"));
    EXPECT_EQ(c.operands[1], lay("[-, -, -, -]"));
    // MindSpore's Conv2D strategy ((2, 4, 1, 1), (1, 4, 1, 1)) on the device matrix.
    const std::vector<xshard::strategy> s{{2, 4, 1, 1}, {1, 4, 1, 1}};
    const auto resolved = xshard::detail::rules_named("conv2d").resolve(s, m);
    EXPECT_EQ(resolved[0], lay("[dp, mp, -, -]"));
    EXPECT_EQ(resolved[1], lay("[-, mp, -, -]"));
    // Height and width stay split where halos serve the bands, and the weight's channels use
    // other axes.
    c = run("conv2d", conv, {x, w}, {lay("[-, -, dp, mp]"), lay("[-, -, -, -]")});
    EXPECT_EQ(c.operands[0], lay("[-, -, dp, mp]"));
    EXPECT_EQ(c.results[0], lay("[-, -, dp, mp]"));
    c = run("conv2d", conv, {x, w}, {lay("[-, -, dp, -]"), lay("[mp, -, -, -]")});
    EXPECT_EQ(c.results[0], lay("[-, mp, dp, -]"));
    // A band thinner than the halo: height is taken whole.
    const xshard::operand_type thin{{8, 4, 4, 6}};
    c = run("conv2d", ops::conv2d_options{.padding = 2, .dilation = 2}.attributes(), {thin, w},
            {lay("[-, -, mp, -]"), lay("[-, -, -, -]")});
    EXPECT_EQ(c.operands[0], lay("[-, -, -, -]"));
    // Poolings keep the batch's, the channels' and (halos serving) the spatial splits.
    c = run("max_pool2d", ops::pool2d_options{}.attributes(), {x}, {lay("[dp, mp, -, -]")});
    EXPECT_EQ(c.results[0], lay("[dp, mp, -, -]"));
    c = run("avg_pool2d", ops::pool2d_options{}.attributes(), {x}, {lay("[-, dp, mp, -]")});
    EXPECT_EQ(c.operands[0], lay("[-, dp, mp, -]"));
    c = run("max_pool2d", ops::pool2d_options{.kernel = 2}.attributes(), {thin},
            {lay("[-, -, mp, dp]")});
    EXPECT_EQ(c.operands[0], lay("[-, -, -, -]"));
    // batch_norm keeps every split; gamma and beta follow the channels.
    c = run("batch_norm", {{}, {1e-5}},
            {x, {{4}, xshard::dtype::f64, true}, {{4}, xshard::dtype::f64, true}},
            {lay("[dp, -, mp, -]"), lay("[-]"), lay("[-]")});
    EXPECT_EQ(c.results[0], lay("[dp, -, mp, -]"));
    // embedding: the table split by rows gives a pending sum; it gives up the ids' axes.
    const xshard::operand_type ids{{8, 5}, xshard::dtype::i64},
        table{{10, 6}, xshard::dtype::f64, true};
    c = run("embedding", {}, {ids, table}, {lay("[dp, -]"), lay("[mp, -]")});
    EXPECT_EQ(c.results[0], lay("[dp, -, -] partial(sum: mp)"));
    c = run("embedding", {}, {ids, table}, {lay("[dp, -]"), lay("[dp, mp]")});
    EXPECT_EQ(c.operands[1], lay("[-, mp]"));
    EXPECT_EQ(c.results[0], lay("[dp, -, mp]"));
}

TEST(graph, integer_inputs_never_get_a_cotangent) {
    // An embedding whose ids are an input of a program compiled with input gradients: the
    // floating input gets one, the ids none (the schedule asks cotangents of floating values
    // only), and the table's gradient is still complete.
    auto p = xshard::trace(
        [](traced_tensor x, traced_tensor ids) {
            auto table = xshard::param("table", {5, 3}, xshard::initializer::uniform(-1, 1));
            return ops::sum_all(ops::mul(ops::embedding(ids, table), x));
        },
        xshard::input<double>("x", {4, 3}), xshard::input<std::int64_t>("ids", {4}));
    const xt::xarray<std::int64_t> ids = {1, 4, 1, 0};
    const array x = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 12}};
    for_each_2d_mesh([&](const mesh_t& mesh) {
        auto net = xshard::compile<double>(p, mesh, {.input_gradients = true});
        net.train_step(dist<2>(mesh, x, "[-, -]"), dist<1, std::int64_t>(mesh, ids, "[-]"));
        const array table = value_of(net, "table");
        array dx = xt::zeros<double>({4, 3});
        array dtable = xt::zeros<double>({5, 3});
        for (std::size_t i = 0; i < 4; ++i)
            for (std::size_t j = 0; j < 3; ++j) {
                dx(i, j) = table(std::size_t(ids(i)), j);
                dtable(std::size_t(ids(i)), j) += x(i, j);
            }
        EXPECT_LT(max_error(xshard::gather_all(net.input_gradient<2>(0)), dx), 1e-12)
            << net.describe();
        EXPECT_LT(max_error(gradient_of(net, "table"), dtable), 1e-12) << net.describe();
        xshard::testing::expect_error([&] { (void)net.input_gradient<1>(1); },
                                      "no gradient of input 1");
    });
}

/// A small convnet whose windows and normalisation are annotated `s` (height over dp, width
/// over mp): conv - batch norm - relu - max-pool - conv - global average - fc - cross-entropy,
/// on 4 images of 16 x 16.
xshard::program spatial_convnet() {
    return xshard::trace(
        [](traced_tensor x, traced_tensor labels) {
            const auto s = lay("[-, -, dp, mp]"), whole = lay("[-, -, -, -]");
            auto h = ops::conv2d.with({.padding = 1})
                         .shard({s, whole})(x, xshard::param("conv1.weight", {4, 3, 3, 3}));
            h = trace_call("batch_norm", xshard::op_attributes{{}, {1e-5}},
                           xshard::op_annotation{{}, {s, lay("[-]"), lay("[-]")}, {}}, h,
                           xshard::param("bn.gamma", {4}, xshard::initializer::constant(1)),
                           xshard::param("bn.beta", {4}, xshard::initializer::zeros()));
            h = ops::relu.shard({s})(h);
            h = ops::max_pool2d.with({.kernel = 3, .stride = 2, .padding = 1}).shard({s})(h);
            h = ops::conv2d.with({.padding = 1})
                    .shard({s, whole})(h, xshard::param("conv2.weight", {5, 4, 3, 3}));
            auto logits =
                ops::matmul(ops::global_avg_pool2d(h), xshard::param("fc.weight", {5, 3}));
            return ops::mean_all(ops::cross_entropy(logits, labels));
        },
        xshard::input<double>("x", {4, 3, 16, 16}), xshard::input<std::int64_t>("labels", {4}));
}

TEST(graph, a_convnet_split_by_height_and_width_trains_like_one_rank) {
    // Every mesh of up to 8 ranks gives bands at least as thick as the halos, so every window
    // keeps the spatial split, exchanges halos, and the step equals one rank's.
    std::mt19937 engine(5);
    const array x = xt::random::randn<double>({4, 3, 16, 16}, 0.0, 1.0, engine);
    const xt::xarray<std::int64_t> labels = {2, 0, 1, 2};
    auto step = [&](const mesh_t& mesh, std::vector<std::string> recompute = {}) {
        auto net = xshard::compile<double>(spatial_convnet(), mesh,
                                           {.seed = 3, .recompute = std::move(recompute)});
        const double loss = net.train_step(dist<4>(mesh, x, "[dp, -, -, -]"),
                                           dist<1, std::int64_t>(mesh, labels, "[-]"));
        std::map<std::string, array> grads;
        for (const auto* name :
             {"conv1.weight", "bn.gamma", "bn.beta", "conv2.weight", "fc.weight"})
            grads[name] = gradient_of(net, name);
        return std::tuple{loss, grads, std::move(net)};
    };
    const mesh_t one(xshard::communicator::self(), {1, 1});
    const auto [loss1, grads1, net1] = step(one);
    for_each_2d_mesh([&](const mesh_t& mesh) {
        const auto [loss, grads, net] = step(mesh);
        const std::string where = "on mesh(" + mesh.shape().to_string() + ")\n" + net.describe();
        EXPECT_NEAR(loss, loss1, 1e-12) << where;
        for (const auto& [name, g] : grads)
            EXPECT_LT(max_error(g, grads1.at(name)), 1e-12) << name << " " << where;
        const auto& nodes = net.source().nodes();
        for (std::size_t i = 0; i < nodes.size(); ++i) {
            if (nodes[i].op == "conv2d" || nodes[i].op == "max_pool2d" ||
                nodes[i].op == "batch_norm") {
                EXPECT_EQ(net.layouts().nodes[i].results[0], lay("[-, -, dp, mp]"))
                    << nodes[i].name << " " << where;
            }
        }
        if (world().size() > 1) {
            EXPECT_NE(net.describe().find("halos send"), std::string::npos) << where;
        }
        // Batch norm, relu and max-pool recomputed in the backward pass: the batch norm's
        // statistics, kept for its backward pass, are those of the recomputed forward.
        const auto [again_loss, again, again_net] = step(mesh, {"batch_norm..max_pool2d"});
        EXPECT_NE(again_net.report().find("recomputed in the backward pass"), std::string::npos);
        EXPECT_NEAR(again_loss, loss1, 1e-12) << where;
        for (const auto& [name, g] : again)
            EXPECT_LT(max_error(g, grads1.at(name)), 1e-12) << name << ", recomputed " << where;
    });
}

TEST(graph, convolution_misuse_raises_one_sentence_naming_the_node) {
    using xshard::testing::expect_error;
    expect_error(
        [] {
            xshard::trace(
                [](traced_tensor x) {
                    return ops::conv2d(x, xshard::param("w", {4, 2, 3, 3}), {.groups = 2});
                },
                xshard::input<double>("x", {2, 6, 5, 5}));
        },
        "node conv2d (conv2d): the input (2, 6, 5, 5) and the weight (4, 2, 3, 3) do not "
        "convolve in 2 groups");
    expect_error(
        [] {
            xshard::trace([](traced_tensor x) { return ops::max_pool2d(x, {.kernel = 7}); },
                          xshard::input<double>("x", {2, 3, 5, 5}));
        },
        "node max_pool2d (max_pool2d): the window does not fit the padded input (2, 3, 5, 5)");
    expect_error(
        [] {
            xshard::trace([](traced_tensor x) { return ops::embedding(x, x); },
                          xshard::input<double>("x", {4, 3}));
        },
        "node embedding (embedding): the ids must be integers (i64), not f64");
    expect_error(
        [] {
            xshard::trace([](traced_tensor x) { return ops::global_avg_pool2d(x); },
                          xshard::input<double>("x", {4, 3}));
        },
        "global_avg_pool2d takes [N, C, H, W], not a tensor of 2 dimensions");
    const mesh_t mesh(world(), {1, world().size()});
    if (world().size() > 1) {
        auto p = xshard::trace(
            [](traced_tensor x) {
                return ops::conv2d.shard({{1, 2, 1, 1}, {1, 1, 1, 1}})(
                    x, xshard::param("w", {2, 4, 3, 3}));
            },
            xshard::input<double>("x", {2, 4, 5, 5}));
        expect_error([&] { xshard::compile<double>(p, mesh); }, "compile: node conv2d (conv2d)");
        expect_error([&] { xshard::compile<double>(p, mesh); },
                     "Conv2D strategy ((1, 2, 1, 1), (1, 1, 1, 1)): the strategies must be "
                     "((n, i, h, w), (o, i, 1, 1)) with the same input-channel count i");
    }
    // An id outside the table, on one rank's block only: every rank raises.
    auto p = xshard::trace(
        [](traced_tensor ids) {
            return ops::sum_all(ops::embedding(ids, xshard::param("t", {4, 2})));
        },
        xshard::input<std::int64_t>("ids", {2}));
    auto net = xshard::compile<double>(p, mesh);
    const xt::xarray<std::int64_t> ids = {1, 9};
    expect_error([&] { net.forward_scalar(dist<1, std::int64_t>(mesh, ids, "[-]")); },
                 "(embedding): id 9 is not one of the table's 4 rows");
}

} // namespace
