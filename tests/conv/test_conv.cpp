// Convolutional layers (xshard/ops/conv_kernels.hpp, conv_rule.hpp, nn/conv2d.hpp ...
// nn/resnet.hpp): the local kernels against a direct serial loop (both backends, asymmetric
// padding, stride, dilation, groups); every layer against the same layer on one rank and
// against central differences on the meshes dp x mp of the world; ResNet-18 against one
// rank; gradient accumulation against the large-batch step; the rules at compile time.

#include <xshard/io/checkpoint.hpp>
#include <xshard/nn/flatten.hpp>
#include <xshard/nn/global_pooling.hpp>
#include <xshard/nn/pooling.hpp>
#include <xshard/nn/resnet.hpp>
#include <xshard/ops/conv_kernels.hpp>
#include <xshard/ops/conv_rule.hpp>
#include <xshard/tensor/gather.hpp>
#include <xshard/train/gradients.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <vector>

namespace {

using xshard::layout;
using xshard::testing::where;
using xshard::testing::world;
namespace nn = xshard::nn;
namespace ops = xshard::ops;
using mesh_t = xshard::mesh<"dp", "mp">;
template <std::size_t N = 2>
using tensor = nn::tensor<double, mesh_t, N>;

// --- the rules at compile time ------------------------------------------------------------

static_assert(xshard::conv2d_rule("[dp, -, -, -]", "[-, -, -, -]").out == layout("[dp, -, -, -]"));
static_assert(xshard::conv2d_rule("[dp, -, -, -]", "[mp, -, -, -]").out ==
              layout("[dp, mp, -, -]"));
static_assert(xshard::conv2d_rule("[dp, -, -, -]", "[-, mp, -, -]").out ==
              layout("[dp, -, -, -] partial(sum: mp)"));
static_assert(xshard::conv2d_rule("[dp, -, -, -]", "[-, mp, -, -]").x == layout("[dp, mp, -, -]"));
static_assert(xshard::conv2d_rule("[dp, -, mp, -]", "[-, -, -, -]").out ==
              layout("[dp, -, mp, -]"));
static_assert(xshard::conv2d_rule("[-, -, dp, -]", "[mp, -, -, -]").out ==
              layout("[-, mp, dp, -]"));
static_assert(xshard::conv2d_rule("[dp, -, mp, -]", "[mp, -, -, -]").problem ==
              xshard::conv_problem::axis_conflict);
static_assert(xshard::conv2d_rule("[-, -, -, mp]", "[-, mp, -, -]").problem ==
              xshard::conv_problem::axis_conflict);
static_assert(xshard::pool2d_rule("[dp, -, mp, -]").out == layout("[dp, -, mp, -]"));
static_assert(xshard::conv2d_rule("[dp, mp, -, -]", "[-, -, -, -]").problem ==
              xshard::conv_problem::channel_mismatch);
static_assert(xshard::conv2d_rule("[mp, -, -, -]", "[mp, -, -, -]").problem ==
              xshard::conv_problem::axis_conflict);
static_assert(xshard::conv2d_rule("[dp, -, -, -]", "[mp, -, -, -]", 2).problem ==
              xshard::conv_problem::grouped_split);
static_assert(xshard::conv2d_rule("[dp, -, -, -]", "[-, -, mp, -]").problem ==
              xshard::conv_problem::kernel_split);
static_assert(xshard::pool2d_rule("[dp, mp, -, -]").out == layout("[dp, mp, -, -]"));
static_assert(xshard::pool2d_rule("[dp, -, -, -] partial(sum: mp)").problem ==
              xshard::conv_problem::partial_input);
static_assert(
    xshard::conv_rule_holds_v<xshard::conv2d_rule("[dp, -, -, -]", "[mp, -, -, -]").problem>);
static_assert(ops::window_output_extent(7, 1, 0, 3, 2, 1) == 3);
static_assert(ops::window_output_extent(2, 0, 0, 3, 1, 1) == 0);

// --- the local kernels against direct loops -----------------------------------------------

std::vector<double> random_vector(std::size_t n, unsigned seed) {
    std::mt19937 e(seed);
    std::uniform_real_distribution<double> d(-1, 1);
    std::vector<double> v(n);
    for (auto& x : v)
        x = d(e);
    return v;
}

/// y[n, o, i, j] = sum over the group's c, ki, kj of x[n, c, i s - top + ki d, ...] w[o, c, ki,
/// kj].
std::vector<double> direct_conv(const std::vector<double>& x, const std::vector<double>& w,
                                const ops::conv2d_geometry& g) {
    const std::size_t oh = g.out_h(), ow = g.out_w(), cg = g.in_channels / g.groups,
                      og = g.out_channels / g.groups;
    std::vector<double> y(xshard::volume(g.output_shape()), 0.0);
    for (std::size_t n = 0; n < g.batch; ++n)
        for (std::size_t o = 0; o < g.out_channels; ++o)
            for (std::size_t i = 0; i < oh; ++i)
                for (std::size_t j = 0; j < ow; ++j) {
                    double s = 0;
                    for (std::size_t c = 0; c < cg; ++c)
                        for (std::size_t ki = 0; ki < g.kernel_h; ++ki)
                            for (std::size_t kj = 0; kj < g.kernel_w; ++kj) {
                                const long r =
                                    long(i * g.stride_h + ki * g.dilation_h) - long(g.pad.top);
                                const long q =
                                    long(j * g.stride_w + kj * g.dilation_w) - long(g.pad.left);
                                if (r < 0 || q < 0 || r >= long(g.in_h) || q >= long(g.in_w))
                                    continue;
                                const std::size_t ci = (o / og) * cg + c;
                                s += x[((n * g.in_channels + ci) * g.in_h + std::size_t(r)) *
                                           g.in_w +
                                       std::size_t(q)] *
                                     w[((o * cg + c) * g.kernel_h + ki) * g.kernel_w + kj];
                            }
                    y[((n * g.out_channels + o) * oh + i) * ow + j] = s;
                }
    return y;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
    double s = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        s += a[i] * b[i];
    return s;
}

TEST(kernels, convolution_matches_direct_loops_and_its_adjoints) {
    std::vector<ops::conv2d_geometry> cases;
    auto make = [](std::size_t n, std::size_t c, std::size_t h, std::size_t w, std::size_t o,
                   std::size_t k, std::size_t s, std::size_t d, ops::padding2d p,
                   std::size_t groups) {
        ops::conv2d_geometry g;
        g.batch = n, g.in_channels = c, g.in_h = h, g.in_w = w, g.out_channels = o;
        g.kernel_h = k, g.kernel_w = k == 1 ? 1 : k - 1, g.stride_h = s, g.stride_w = 1;
        g.dilation_h = d, g.dilation_w = 1, g.pad = p, g.groups = groups;
        return g;
    };
    cases.push_back(make(2, 3, 7, 6, 4, 3, 1, 1, ops::padding2d::uniform(1), 1));
    cases.push_back(
        make(3, 4, 9, 8, 6, 3, 2, 2, {2, 0, 1, 0}, 2)); // asymmetric: a band's halo side
    cases.push_back(make(2, 4, 5, 5, 4, 1, 1, 1, {}, 4));
    cases.push_back(make(1, 2, 8, 8, 3, 4, 3, 1, {0, 3, 2, 1}, 1));
    // ResNet's late stages: a 1 x 1 plane under a padded 3 x 3 window (most taps read only
    // padding), and more images than im2col's adjoint takes at a time.
    cases.push_back(make(11, 3, 1, 1, 4, 3, 1, 1, ops::padding2d::uniform(1), 1));
    cases.push_back(make(10, 2, 2, 3, 3, 3, 1, 1, ops::padding2d::uniform(1), 1));
    // Stride and dilation along the width too, and padding wider than the kernel reaches.
    auto wide = make(9, 2, 6, 7, 3, 3, 2, 1, {1, 0, 3, 2}, 1);
    wide.kernel_w = 3, wide.stride_w = 2, wide.dilation_w = 2;
    cases.push_back(wide);
    for (const auto& g : cases) {
        g.check();
        const auto x = random_vector(xshard::volume(g.input_shape()), 1);
        const auto w = random_vector(xshard::volume(g.weight_shape()), 2);
        const auto dy = random_vector(xshard::volume(g.output_shape()), 3);
        const auto expected = direct_conv(x, w, g);
        for (auto backend : {ops::conv_backend::gemm, ops::conv_backend::automatic}) {
            std::vector<double> y(expected.size()), dx(x.size()), dw(w.size(), 1.0);
            ops::conv2d_forward(x.data(), w.data(), y.data(), g, backend);
            for (std::size_t i = 0; i < y.size(); ++i)
                ASSERT_NEAR(y[i], expected[i], 1e-12) << "forward element " << i;
            // <conv(x, w), dy> = <x, dx> = <w, dw>
            ops::conv2d_backward_input(dy.data(), w.data(), dx.data(), g, backend);
            ops::conv2d_backward_weight(x.data(), dy.data(), dw.data(), g, false, backend);
            const double lhs = dot(expected, dy);
            EXPECT_NEAR(dot(x, dx), lhs, 1e-10);
            EXPECT_NEAR(dot(w, dw), lhs, 1e-10);
            std::vector<double> dw2(dw);
            ops::conv2d_backward_weight(x.data(), dy.data(), dw2.data(), g, true, backend);
            EXPECT_NEAR(dot(w, dw2), 2 * lhs, 1e-10) << "accumulate";
        }
        // float: oneDNN and GEMM agree with the double result to float accuracy.
        std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()),
            dyf(dy.begin(), dy.end());
        for (auto backend : {ops::conv_backend::gemm, ops::conv_backend::onednn}) {
            std::vector<float> y(expected.size()), dx(x.size()), dw(w.size());
            ops::conv2d_forward(xf.data(), wf.data(), y.data(), g, backend);
            for (std::size_t i = 0; i < y.size(); ++i)
                ASSERT_NEAR(y[i], expected[i], 1e-4) << "float forward element " << i;
            ops::conv2d_backward_input(dyf.data(), wf.data(), dx.data(), g, backend);
            ops::conv2d_backward_weight(xf.data(), dyf.data(), dw.data(), g, false, backend);
            std::vector<double> dxd(dx.begin(), dx.end()), dwd(dw.begin(), dw.end());
            EXPECT_NEAR(dot(x, dxd), dot(expected, dy), 1e-3);
            EXPECT_NEAR(dot(w, dwd), dot(expected, dy), 1e-3);
        }
    }
}

TEST(kernels, pooling_matches_direct_loops_and_its_adjoints) {
    ops::pool2d_geometry g;
    g.batch = 2, g.channels = 3, g.in_h = 7, g.in_w = 6, g.kernel_h = 3, g.kernel_w = 2;
    g.stride_h = 2, g.stride_w = 2, g.pad = {1, 0, 1, 1};
    g.check();
    const auto x = random_vector(xshard::volume(g.input_shape()), 4);
    const auto dy = random_vector(xshard::volume(g.output_shape()), 5);
    std::vector<double> y(dy.size()), dx(x.size());
    std::vector<std::int32_t> arg(dy.size());
    ops::max_pool2d_forward(x.data(), y.data(), arg.data(), g);
    for (bool include : {true, false}) {
        std::vector<double> a(dy.size()), da(x.size());
        ops::avg_pool2d_forward(x.data(), a.data(), g, include);
        ops::avg_pool2d_backward(dy.data(), da.data(), g, include);
        EXPECT_NEAR(dot(a, dy), dot(x, da), 1e-12);
        for (std::size_t p = 0; p < g.batch * g.channels; ++p)
            for (std::size_t i = 0; i < g.out_h(); ++i)
                for (std::size_t j = 0; j < g.out_w(); ++j) {
                    double best = -1e300, sum = 0;
                    std::size_t count = 0;
                    for (std::size_t ki = 0; ki < g.kernel_h; ++ki)
                        for (std::size_t kj = 0; kj < g.kernel_w; ++kj) {
                            const long r = long(i * 2 + ki) - 1, q = long(j * 2 + kj) - 1;
                            if (r < 0 || q < 0 || r >= 7 || q >= 6)
                                continue;
                            const double v = x[(p * 7 + std::size_t(r)) * 6 + std::size_t(q)];
                            best = std::max(best, v);
                            sum += v;
                            ++count;
                        }
                    const std::size_t at = (p * g.out_h() + i) * g.out_w() + j;
                    EXPECT_EQ(y[at], best);
                    EXPECT_NEAR(a[at], sum / double(include ? 6 : count), 1e-14);
                }
    }
    ops::max_pool2d_backward(dy.data(), arg.data(), dx.data(), g);
    EXPECT_NEAR(dot(y, dy), dot(x, dx), 1e-12);
    ops::pool2d_geometry bad = g;
    bad.pad.top = 3;
    EXPECT_THROW(bad.check(), xshard::error);
}

// --- layers: parity with one rank and finite differences ---------------------------------

/// The meshes dp x mp of the world: (W, 1), (1, W) and (2, W/2).
template <class F>
void for_each_dp_mp(F&& f) {
    const auto w = world();
    std::vector<std::array<int, 2>> shapes{{w.size(), 1}};
    if (w.size() > 1)
        shapes.push_back({1, w.size()});
    if (w.size() > 2 && w.size() % 2 == 0)
        shapes.push_back({2, w.size() / 2});
    for (const auto& s : shapes)
        f(mesh_t(w, s));
}

mesh_t serial_mesh() {
    return mesh_t(xshard::communicator::self(), {1, 1});
}

template <std::size_t N>
xt::xtensor<double, N> random_array(std::array<std::size_t, N> shape, unsigned seed) {
    std::mt19937 e(seed);
    return xt::random::rand<double>(shape, -1.0, 1.0, e);
}

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

/// a equals b to 1e-9 of b's largest magnitude (rounding grows through a deep network's
/// batch norms; elementwise relative tolerances would fail on its near-zero entries).
template <class A, class B>
bool close(const A& a, const B& b, double tolerance = 1e-9) {
    if (!std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(), b.shape().end()))
        return false;
    if (a.size() == 0)
        return true;
    const double scale = xt::amax(xt::abs(b))();
    return xt::amax(xt::abs(a - b))() <= tolerance * scale + 1e-12;
}

template <class D>
auto resolved(const D& g) {
    return xshard::gather_all(xshard::ops::resolve(g));
}

/// What a layer computes on one rank for the input and output gradient of `check_layer`: its
/// output, its input gradient and its weights' gradients.
struct one_rank_reference {
    xt::xarray<double> y, dx;
    std::vector<xt::xarray<double>> grads;
};

/// The one-rank reference of the layer `make` makes, computed once per name and shape in a
/// process: every mesh a test tries compares with the same serial run (a ResNet-18 on each
/// of 8 ranks would otherwise dominate the test).
template <std::size_t NI, class Make>
const one_rank_reference& one_rank(Make make, const xt::xtensor<double, NI>& gx,
                                   const std::string& name) {
    static std::map<std::string, one_rank_reference> cache;
    std::string key = name;
    for (auto e : gx.shape())
        key += " " + std::to_string(e);
    if (auto it = cache.find(key); it != cache.end())
        return it->second;
    const auto one = serial_mesh();
    auto serial = make(one);
    const auto sx = xshard::distribute<xshard::dynamic_layout(NI)>(one, gx, layout::replicated(NI));
    const auto sy = serial.forward(sx);
    constexpr std::size_t NO = std::remove_cvref_t<decltype(sy)>::rank;
    std::array<std::size_t, NO> os{};
    std::copy_n(sy.local().shape().begin(), NO, os.begin());
    const auto r = random_array<NO>(os, 2);
    const auto sdx = serial.backward(
        nn::as_gradient(xshard::distribute<xshard::dynamic_layout(NO)>(one, r, sy.layout())));
    one_rank_reference ref{sy.local(), sdx.local(), {}};
    xshard::for_each_weight(
        serial, [&](const std::string&, auto& w) { ref.grads.emplace_back(w.grad.local()); });
    return cache.emplace(key, std::move(ref)).first->second;
}

/// Checks a layer made by `make(mesh)` on input [shape] laid out as `in_layout`: forward and
/// backward against the same layer on one rank (`one_rank`: `name` names the layer and its
/// options, not the mesh); with `fd`, the gradients of L = <layer(x), r> against central
/// differences.
template <std::size_t NI, class Make>
void check_layer(const mesh_t& m, Make make, const std::array<std::size_t, NI>& in_shape,
                 const layout& in_layout, const std::string& name, bool fd = true,
                 double tolerance = 1e-9) {
    const auto context = name + " " + where(m);
    const auto gx = random_array<NI>(in_shape, 1);
    auto layer = make(m);
    const auto& serial = one_rank<NI>(make, gx, name);
    auto x = xshard::distribute<xshard::dynamic_layout(NI)>(m, gx, in_layout);
    const auto y = layer.forward(x);
    const auto gy = xshard::gather_all(y);
    ASSERT_TRUE(close(gy, serial.y, tolerance))
        << context << ": forward differs from one rank by " << xt::amax(xt::abs(gy - serial.y))()
        << " (largest " << xt::amax(xt::abs(serial.y))() << ")";
    constexpr std::size_t NO = std::remove_cvref_t<decltype(y)>::rank;
    std::array<std::size_t, NO> os{};
    for (std::size_t d = 0; d < NO; ++d)
        os[d] = gy.shape()[d];
    const auto r = random_array<NO>(os, 2);
    const auto dx = layer.backward(
        nn::as_gradient(xshard::distribute<xshard::dynamic_layout(NO)>(m, r, y.layout())));
    auto grads = xshard::gradients_of{layer};
    xshard::synchronize_gradients(layer, grads);
    const auto gdx = resolved(dx);
    EXPECT_TRUE(close(gdx, serial.dx, tolerance))
        << context << ": input gradient differs from one rank by "
        << xt::amax(xt::abs(gdx - serial.dx))() << " (largest " << xt::amax(xt::abs(gdx))() << ")";
    std::size_t i = 0;
    xshard::for_each_weight(layer, [&](const std::string& wname, auto& w) {
        ASSERT_LT(i, serial.grads.size()) << context << ": more weights than on one rank";
        EXPECT_TRUE(close(xshard::gather_all(w.grad), serial.grads[i++], tolerance))
            << context << ": gradient of " << wname << " differs from one rank";
    });
    if (!fd)
        return;
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
        const std::size_t index = (k * 7919 + 5) % gx.size();
        check(x, gdx.data()[index], index, "x");
    }
    xshard::for_each_weight(layer, [&](const std::string& wname, auto& w) {
        const auto g = xshard::gather_all(w.grad);
        for (std::size_t k = 0; k < 2; ++k) {
            const std::size_t index = (k * 7919 + 3) % g.size();
            check(w.value, g.data()[index], index, wname);
        }
    });
}

constexpr std::array<std::size_t, 4> images{6, 4, 7, 7};

layout nchw(const std::string& n, const std::string& c) {
    return nn::make_layout({n, c, "", ""});
}

TEST(layers, conv2d_every_channel_split) {
    using conv = nn::conv2d<double, mesh_t>;
    for_each_dp_mp([](const mesh_t& m) {
        for (auto split :
             {nn::channel_split::none, nn::channel_split::output, nn::channel_split::input}) {
            const auto label = "conv2d split " + std::to_string(int(split));
            check_layer(
                m,
                [&](const mesh_t& mm) {
                    return conv(mm, 4, 6, 3, 7,
                                {.stride = 2, .padding = 1, .bias = true, .split = split});
                },
                images, nchw("dp", ""), label);
            check_layer(
                m,
                [&](const mesh_t& mm) {
                    return conv(mm, 4, 6, 3, 7, {.padding = 2, .dilation = 2, .split = split});
                },
                images, nchw("dp", split == nn::channel_split::input ? "mp" : ""),
                label + " dilated");
        }
        check_layer(
            m, [](const mesh_t& mm) { return conv(mm, 4, 6, 3, 7, {.padding = 1, .groups = 2}); },
            images, nchw("dp", ""), "conv2d groups 2");
    });
}

TEST(layers, conv2d_rejects_layouts_it_cannot_serve_on_every_rank) {
    for_each_dp_mp([](const mesh_t& m) {
        nn::conv2d<double, mesh_t> c(m, 4, 6, 3, 1, {.padding = 1});
        // The height split over every rank: a 7 x 7 window on 7 rows needs rows beyond the
        // neighbouring bands from 3 bands on, which every rank reports alike.
        nn::conv2d<double, mesh_t> wide(m, 4, 6, 7, 1, {.padding = 3});
        const auto x = xshard::distribute<xshard::dynamic_layout(4)>(
            m, random_array<4>(images, 1), nn::make_layout({"", "", "dp", ""}));
        if (m.shape().sizes[0] < 3) {
            EXPECT_NO_THROW((void)wide.forward(x)) << where(m);
        } else {
            try {
                (void)wide.forward(x);
                ADD_FAILURE() << "a band thinner than the halo accepted " << where(m);
            } catch (const xshard::error& e) {
                EXPECT_NE(std::string(e.what()).find("reaches beyond its neighbouring bands"),
                          std::string::npos)
                    << e.what();
            }
        }
        if (m.shape().sizes[1] > 1) {
            nn::conv2d<double, mesh_t> split(m, 4, 6, 3, 1,
                                             {.padding = 1, .split = nn::channel_split::output});
            const auto y = xshard::distribute<xshard::dynamic_layout(4)>(
                m, random_array<4>(images, 1), nn::make_layout({"", "", "mp", ""}));
            EXPECT_THROW((void)split.forward(y), xshard::error) << where(m);
        }
        EXPECT_THROW((nn::conv2d<double, mesh_t>(m, 4, 6, 3, 1, {.groups = 3})), xshard::error);
    });
}

TEST(layers, batch_norm_pooling_flatten) {
    for_each_dp_mp([](const mesh_t& m) {
        using bn = nn::batch_norm2d<double, mesh_t>;
        check_layer(
            m, [](const mesh_t& mm) { return bn(mm, 4, {.sync = true}); }, images, nchw("dp", ""),
            "batch_norm2d sync");
        check_layer(
            m, [](const mesh_t& mm) { return bn(mm, 4, {.sync = true, .axis = "mp"}); }, images,
            nchw("dp", "mp"), "batch_norm2d sync, channels split");
        check_layer(
            m,
            [](const mesh_t& mm) {
                return nn::max_pool2d<double, mesh_t>(mm, {.kernel = 3, .stride = 2, .padding = 1});
            },
            images, nchw("dp", "mp"), "max_pool2d");
        check_layer(
            m,
            [](const mesh_t& mm) {
                return nn::avg_pool2d<double, mesh_t>(
                    mm, {.kernel = 2, .stride = 2, .padding = 1, .count_include_pad = false});
            },
            images, nchw("dp", "mp"), "avg_pool2d");
        check_layer(
            m, [](const mesh_t& mm) { return nn::global_avg_pool2d<double, mesh_t>(mm); }, images,
            nchw("dp", "mp"), "global_avg_pool2d");
        check_layer(
            m, [](const mesh_t& mm) { return nn::flatten<double, mesh_t>(mm); }, images,
            nchw("dp", ""), "flatten");
    });
}

// --- spatial parallelism: every layer with height and/or width split, against one rank --

/// The spatial layouts of the world: height over every rank (mesh 1 x W), width over every
/// rank (W x 1, up to 6 ranks: 11 columns in 8 bands are thinner than a stride-2 halo), and
/// on 2 x W/2 the batch over dp with height over mp, and height over dp with width over mp.
template <class F>
void for_each_spatial_layout(F&& f) {
    const auto w = world();
    f(mesh_t(w, {1, w.size()}), nn::make_layout({"", "", "mp", ""}));
    if (w.size() <= 6)
        f(mesh_t(w, {w.size(), 1}), nn::make_layout({"", "", "", "dp"}));
    if (w.size() > 2 && w.size() % 2 == 0) {
        const mesh_t m(w, {2, w.size() / 2});
        f(m, nn::make_layout({"dp", "", "mp", ""}));
        f(m, nn::make_layout({"", "", "dp", "mp"}));
    }
}

/// 13 x 11 images: uneven bands on 2, 3, 4, 6 and 8 ranks.
constexpr std::array<std::size_t, 4> spatial_images{3, 4, 13, 11};

TEST(spatial_layers, convolution_and_pooling_equal_one_rank) {
    using conv = nn::conv2d<double, mesh_t>;
    for_each_spatial_layout([](const mesh_t& m, const layout& l) {
        const auto label = " " + l.to_string();
        check_layer(
            m, [](const mesh_t& mm) { return conv(mm, 4, 5, 3, 7, {.padding = 1, .bias = true}); },
            spatial_images, l, "conv2d 3x3" + label, true, 1e-12);
        check_layer(
            m, [](const mesh_t& mm) { return conv(mm, 4, 5, 3, 7, {.stride = 2, .padding = 1}); },
            spatial_images, l, "conv2d 3x3 stride 2" + label, false, 1e-12);
        check_layer(
            m, [](const mesh_t& mm) { return conv(mm, 4, 6, 1, 7, {.stride = 2}); }, spatial_images,
            l, "conv2d 1x1 stride 2" + label, false, 1e-12);
        check_layer(
            m,
            [](const mesh_t& mm) {
                return nn::max_pool2d<double, mesh_t>(mm, {.kernel = 3, .stride = 2, .padding = 1});
            },
            spatial_images, l, "max_pool2d 3/2/1" + label, true, 1e-12);
        check_layer(
            m,
            [](const mesh_t& mm) {
                return nn::avg_pool2d<double, mesh_t>(
                    mm, {.kernel = 2, .stride = 2, .padding = 1, .count_include_pad = false});
            },
            spatial_images, l, "avg_pool2d 2/2/1" + label, false, 1e-12);
    });
}

TEST(spatial_layers, batch_norm_pooling_flatten_and_blocks_equal_one_rank) {
    for_each_spatial_layout([](const mesh_t& m, const layout& l) {
        const auto label = " " + l.to_string();
        using bn = nn::batch_norm2d<double, mesh_t>;
        // Unsynchronised, a batch split over dp normalises each rank's images alone (not one
        // rank's figures); the bands of one image are reduced either way.
        for (bool sync : {false, true})
            if (sync || !l.is_split(0))
                check_layer(
                    m, [&](const mesh_t& mm) { return bn(mm, 4, {.sync = sync}); }, spatial_images,
                    l, std::string("batch_norm2d") + (sync ? " sync" : "") + label, sync, 1e-12);
        check_layer(
            m, [](const mesh_t& mm) { return nn::global_avg_pool2d<double, mesh_t>(mm); },
            spatial_images, l, "global_avg_pool2d" + label, true, 1e-12);
        check_layer(
            m, [](const mesh_t& mm) { return nn::flatten<double, mesh_t>(mm); }, spatial_images, l,
            "flatten" + label, false, 1e-12);
        // Stride-2 block: both convolutions, batch norms, the strided 1x1 shortcut and the
        // residual add on bands.
        check_layer(
            m,
            [](const mesh_t& mm) {
                return nn::basic_block<double, mesh_t>(mm, 4, 6, 2, 5, {.sync_bn = true});
            },
            spatial_images, l, "basic_block stride 2" + label, false, 1e-12);
    });
}

TEST(spatial_layers, resnet18_with_the_height_split_equals_one_rank) {
    // Height over 2 ranks and the batch over the others (3 on 3 ranks): 16 x 16 images end
    // in planes of 1 x 1, which bands of 4 ranks could not serve.
    const auto w = world();
    const mesh_t m = w.size() % 2 == 0 ? mesh_t(w, {w.size() / 2, 2}) : mesh_t(w, {1, w.size()});
    const nn::resnet_options o{.blocks = {.sync_bn = true}};
    check_layer(
        m, [&](const mesh_t& mm) { return nn::resnet18<double>(mm, 5, o); },
        std::array<std::size_t, 4>{4, 3, 16, 16}, nn::make_layout({"dp", "", "mp", ""}),
        "resnet18 spatial", false);
}

TEST(layers, batch_norm_unsynchronised_uses_each_ranks_images) {
    for_each_dp_mp([](const mesh_t& m) {
        const auto gx = random_array<4>(images, 3);
        nn::batch_norm2d<double, mesh_t> layer(m, 4);
        const auto y =
            layer.forward(xshard::distribute<xshard::dynamic_layout(4)>(m, gx, nchw("dp", "")));
        // Each rank's images normalised alone: every channel of the local block has mean 0.
        const auto& a = y.local();
        for (std::size_t c = 0; c < a.shape()[1] && a.shape()[0] > 0; ++c) {
            double s = 0;
            for (std::size_t n = 0; n < a.shape()[0]; ++n)
                for (std::size_t k = 0; k < 49; ++k)
                    s += a(n, c, k / 7, k % 7);
            EXPECT_NEAR(s, 0.0, 1e-10) << where(m);
        }
        // Evaluation: the running statistics, one step of momentum 0.1 from (0, 1).
        layer.train(false);
        const auto z =
            layer.forward(xshard::distribute<xshard::dynamic_layout(4)>(m, gx, nchw("dp", "")));
        EXPECT_EQ(z.local().shape(), y.local().shape());
        if (m.rank() == 0 && a.shape()[0] > 0) {
            const double mean = layer.running_mean()[0] / 0.1;
            EXPECT_NEAR(z.local()(0, 0, 0, 0) * std::sqrt(layer.running_var()[0] + 1e-5),
                        gx(0, 0, 0, 0) - 0.1 * mean, 1e-9);
        }
    });
}

TEST(layers, residual_blocks_in_every_mode) {
    for_each_dp_mp([](const mesh_t& m) {
        for (bool mp : {false, true}) {
            const nn::block_options o{.model_parallel = mp, .sync_bn = true};
            const std::string mode = mp ? " model parallel" : " data parallel";
            check_layer(
                m,
                [&](const mesh_t& mm) {
                    return nn::basic_block<double, mesh_t>(mm, 4, 6, 2, 5, o);
                },
                images, nchw("dp", ""), "basic_block" + mode);
            check_layer(
                m,
                [&](const mesh_t& mm) { return nn::bottleneck<double, mesh_t>(mm, 4, 2, 1, 5, o); },
                images, nchw("dp", ""), "bottleneck" + mode, mp);
        }
    });
}

TEST(models, resnet18_equals_one_rank) {
    for_each_dp_mp([](const mesh_t& m) {
        for (bool mp : {false, true}) {
            const nn::resnet_options o{.blocks = {.model_parallel = mp, .sync_bn = true},
                                       .classifier_parallel = mp};
            check_layer(
                m, [&](const mesh_t& mm) { return nn::resnet18<double>(mm, 5, o); },
                std::array<std::size_t, 4>{4, 3, 16, 16}, nchw("dp", ""),
                std::string("resnet18") + (mp ? " model parallel" : ""), false);
        }
    });
}

TEST(models, batch_norm_running_statistics_round_trip_through_a_checkpoint) {
    // Trained with the channels split over mp (mesh 1 x W), saved with every parameter,
    // loaded into a replicated layer on mesh W x 1 that splits the height over dp: the
    // running statistics are one rank's, and evaluation uses them.
    const auto w = world();
    const auto gx = random_array<4>(spatial_images, 4);
    const mesh_t a(w, {1, w.size()}), b(w, {w.size(), 1});
    using bn = nn::batch_norm2d<double, mesh_t>;
    bn trained(a, 4, {.axis = "mp"}), serial(serial_mesh(), 4);
    for (int step = 0; step < 2; ++step) {
        const xt::xtensor<double, 4> gs = gx * double(step + 1);
        (void)trained.forward(
            xshard::distribute<xshard::dynamic_layout(4)>(a, gs, layout::replicated(4)));
        (void)serial.forward(xshard::distribute<xshard::dynamic_layout(4)>(serial_mesh(), gs,
                                                                           layout::replicated(4)));
    }
    std::vector<std::string> names;
    xshard::for_each_parameter(trained, [&](const std::string& name, auto&, bool trainable) {
        names.push_back(name + (trainable ? "" : " (not trainable)"));
    });
    EXPECT_EQ(names, (std::vector<std::string>{"gamma", "beta", "moving_mean (not trainable)",
                                               "moving_variance (not trainable)"}));
    const auto path = (std::filesystem::temp_directory_path() /
                       ("xshard_test_conv_bn_" + std::to_string(w.size()) + ".safetensors"))
                          .string();
    xshard::save_checkpoint(path, trained, {.all_parameters = true});
    bn loaded(b, 4);
    xshard::load_checkpoint(path, loaded, std::tuple<>{}, true);
    for (std::size_t k = 0; k < 4; ++k) {
        EXPECT_NEAR(loaded.running_mean()(k), serial.running_mean()(k), 1e-12) << k;
        EXPECT_NEAR(loaded.running_var()(k), serial.running_var()(k), 1e-12) << k;
    }
    loaded.train(false);
    serial.train(false);
    const auto y = loaded.forward(
        xshard::distribute<xshard::dynamic_layout(4)>(b, gx, nn::make_layout({"", "", "dp", ""})));
    const auto sy = serial.forward(
        xshard::distribute<xshard::dynamic_layout(4)>(serial_mesh(), gx, layout::replicated(4)));
    EXPECT_TRUE(close(xshard::gather_all(y), sy.local(), 1e-12));
    if (w.rank() == 0)
        std::filesystem::remove(path);
}

TEST(models, gradient_accumulation_equals_the_large_batch) {
    // Batch norm in evaluation (running statistics): with batch statistics the micro-batches
    // are normalised differently from the whole batch, in every framework.
    for_each_dp_mp([](const mesh_t& m) {
        const nn::resnet_options o{.blocks = {.sync_bn = true}};
        auto whole = nn::resnet18<double>(m, 5, o);
        auto micro = nn::resnet18<double>(m, 5, o);
        whole.train(false);
        micro.train(false);
        const auto gx = random_array<4>({8, 3, 16, 16}, 9);
        const auto r = random_array<2>({8, 5}, 10);
        auto step = [&](auto& net, std::size_t begin, std::size_t end, double scale) {
            xt::xtensor<double, 4> xs = xt::view(gx, xt::range(begin, end));
            xt::xtensor<double, 2> rs = xt::view(r, xt::range(begin, end)) * scale;
            const auto y =
                net.forward(xshard::distribute<xshard::dynamic_layout(4)>(m, xs, nchw("dp", "")));
            net.backward(
                nn::as_gradient(xshard::distribute<xshard::dynamic_layout(2)>(m, rs, y.layout())));
        };
        step(whole, 0, 8, 1.0);
        step(micro, 0, 4, 1.0);
        step(micro, 4, 8, 1.0);
        auto gw = xshard::gradients_of{whole};
        auto gm = xshard::gradients_of{micro};
        xshard::synchronize_gradients(whole, gw);
        xshard::synchronize_gradients(micro, gm);
        std::vector<xt::xarray<double>> a;
        xshard::for_each_weight(whole, [&](const std::string&, auto& w) {
            a.emplace_back(xshard::gather_all(w.grad));
        });
        std::size_t i = 0;
        xshard::for_each_weight(micro, [&](const std::string& name, auto& w) {
            EXPECT_TRUE(close(xshard::gather_all(w.grad), a[i++])) << name << " " << where(m);
        });
    });
}

} // namespace
