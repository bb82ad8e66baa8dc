// Spatial parallelism (redistribute/halo.hpp, ops/spatial.hpp): images split by height,
// width or both, a naive 2-D convolution and max/avg pooling written here run on the
// extended bands, forward and backward, against the same operations on the whole image
// (serial xtensor); the halo geometry at compile time; bands smaller than the halo; and the
// bytes each rank hands to MPI against an expectation computed here from the intervals.

#include "expect_error.hpp"
#include "mpi_test.hpp"
#include "traffic.hpp"

#include <xshard/ops/spatial.hpp>
#include <xshard/tensor/distribute.hpp>

#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

/// Whether a rank's block equals the serial reference's to 1e-12. An empty block (a rank
/// without a band at 3 or more ranks) is equal: xt::allclose on an empty container forms a
/// null pointer minus 16, which UndefinedBehaviorSanitizer reports.
template <class A, class B>
bool blocks_close(const A& a, const B& b) {
    return a.size() == 0 ? b.size() == 0 : bool(xt::allclose(a, b, 1e-12, 1e-12));
}

using xshard::band_of;
using xshard::sliding_window;
using xshard::windowed_dims;
using tensor4 = xt::xtensor<double, 4>;
namespace traffic = xshard::testing::traffic;

// ---- The geometry at compile time -----------------------------------------------------------

constexpr sliding_window conv3{3, 1, 1, 1, 1};
constexpr sliding_window pool3s2{3, 2, 1, 1, 1};
static_assert(conv3.span() == 3 && conv3.output_extent(8) == 8);
static_assert(sliding_window{3, 1, 2, 2, 2}.span() == 5);
static_assert(pool3s2.output_extent(7) == 4 && sliding_window{2, 2}.output_extent(7) == 3);
static_assert(sliding_window{7, 1, 1, 0, 0}.output_extent(5) == 0);
// 8 rows in two bands, a 3-tap window padded by 1: each band takes one halo row, and the
// image border's padding stays with the band at the border.
static_assert(band_of(8, 2, 0, conv3) == xshard::halo_band{0, 4, 0, 4, 0, 5, 1, 0});
static_assert(band_of(8, 2, 1, conv3) == xshard::halo_band{4, 4, 4, 4, 3, 5, 0, 1});
static_assert(band_of(8, 2, 1, conv3).halo_before() == 1 &&
              band_of(8, 2, 1, conv3).halo_after() == 0);
// Stride 2 over uneven bands (4 + 3 rows, 4 output rows as 2 + 2): band 1 computes output
// rows 2 and 3, from input rows 3 to 6 plus the bottom padding row.
static_assert(band_of(7, 2, 1, pool3s2) == xshard::halo_band{4, 3, 2, 2, 3, 4, 0, 1});
static_assert(band_of(7, 2, 0, pool3s2) == xshard::halo_band{0, 4, 0, 2, 0, 4, 1, 0});
// Bands of 2 rows and a halo of 3: band 0 reaches band 2.
static_assert(xshard::first_band_out_of_reach(8, 4, {7, 1, 1, 3, 3}) == 0);
static_assert(xshard::first_band_out_of_reach(8, 4, conv3) == 4);
static_assert(xshard::first_band_out_of_reach(3, 3, {5, 1, 1, 2, 2}) == 0);
static_assert(xshard::first_band_out_of_reach(2, 2, {5, 1, 1, 2, 2}) == 2);

// ---- Naive kernels on NCHW (the serial reference, and the local kernels) -------------------

struct window2 {
    sliding_window h, w;
};

/// The windows with the padding a band info gives.
window2 padded(const window2& g, const xshard::ops::band_info<4>& at) {
    window2 r = g;
    r.h.pad_before = at.pad_before[2];
    r.h.pad_after = at.pad_after[2];
    r.w.pad_before = at.pad_before[3];
    r.w.pad_after = at.pad_after[3];
    return r;
}

/// The input position of tap `k` of output `o`, or -1 in the padding.
long long tap(const sliding_window& w, std::size_t o, std::size_t k, std::size_t n) {
    const long long i = (long long)(o * w.stride + k * w.dilation) - (long long)w.pad_before;
    return i >= 0 && i < (long long)n ? i : -1;
}

/// y[n, co, oh, ow] = sum over c, kh, kw of x[n, c, ih, iw] wt[co, c, kh, kw].
tensor4 conv(const tensor4& x, const tensor4& wt, const window2& g) {
    const auto N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
    const auto Co = wt.shape(0), Ho = g.h.output_extent(H), Wo = g.w.output_extent(W);
    tensor4 y = xt::zeros<double>({N, Co, Ho, Wo});
    for (std::size_t n = 0; n < N; ++n)
        for (std::size_t co = 0; co < Co; ++co)
            for (std::size_t oh = 0; oh < Ho; ++oh)
                for (std::size_t ow = 0; ow < Wo; ++ow) {
                    double acc = 0;
                    for (std::size_t c = 0; c < C; ++c)
                        for (std::size_t kh = 0; kh < g.h.kernel; ++kh)
                            for (std::size_t kw = 0; kw < g.w.kernel; ++kw) {
                                const auto ih = tap(g.h, oh, kh, H), iw = tap(g.w, ow, kw, W);
                                if (ih >= 0 && iw >= 0)
                                    acc += x(n, c, ih, iw) * wt(co, c, kh, kw);
                            }
                    y(n, co, oh, ow) = acc;
                }
    return y;
}

/// The gradients of conv: dx (x's shape) returned, dw (wt's shape) added to `dw`.
tensor4 conv_backward(const tensor4& x, const tensor4& wt, const tensor4& dy, const window2& g,
                      tensor4& dw) {
    const auto N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
    tensor4 dx = xt::zeros<double>(x.shape());
    for (std::size_t n = 0; n < N; ++n)
        for (std::size_t co = 0; co < dy.shape(1); ++co)
            for (std::size_t oh = 0; oh < dy.shape(2); ++oh)
                for (std::size_t ow = 0; ow < dy.shape(3); ++ow)
                    for (std::size_t c = 0; c < C; ++c)
                        for (std::size_t kh = 0; kh < g.h.kernel; ++kh)
                            for (std::size_t kw = 0; kw < g.w.kernel; ++kw) {
                                const auto ih = tap(g.h, oh, kh, H), iw = tap(g.w, ow, kw, W);
                                if (ih < 0 || iw < 0)
                                    continue;
                                dx(n, c, ih, iw) += dy(n, co, oh, ow) * wt(co, c, kh, kw);
                                dw(co, c, kh, kw) += dy(n, co, oh, ow) * x(n, c, ih, iw);
                            }
    return dx;
}

/// Max pooling (padding never wins) or average pooling (padding counts as zeros: the
/// divisor is the kernel's size), and their backward (max: to the first maximum).
tensor4 pool(const tensor4& x, const window2& g, bool max, const tensor4* dy = nullptr) {
    const auto N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
    const auto Ho = g.h.output_extent(H), Wo = g.w.output_extent(W);
    tensor4 y = xt::zeros<double>({N, C, Ho, Wo});
    tensor4 dx = xt::zeros<double>(x.shape());
    const double taps = double(g.h.kernel * g.w.kernel);
    for (std::size_t n = 0; n < N; ++n)
        for (std::size_t c = 0; c < C; ++c)
            for (std::size_t oh = 0; oh < Ho; ++oh)
                for (std::size_t ow = 0; ow < Wo; ++ow) {
                    double best = -std::numeric_limits<double>::infinity(), sum = 0;
                    long long bh = -1, bw = -1;
                    for (std::size_t kh = 0; kh < g.h.kernel; ++kh)
                        for (std::size_t kw = 0; kw < g.w.kernel; ++kw) {
                            const auto ih = tap(g.h, oh, kh, H), iw = tap(g.w, ow, kw, W);
                            if (ih < 0 || iw < 0)
                                continue;
                            const double v = x(n, c, ih, iw);
                            sum += v;
                            if (v > best) {
                                best = v;
                                bh = ih;
                                bw = iw;
                            }
                            if (dy && !max)
                                dx(n, c, ih, iw) += (*dy)(n, c, oh, ow) / taps;
                        }
                    y(n, c, oh, ow) = max ? best : sum / taps;
                    if (dy && max && bh >= 0)
                        dx(n, c, bh, bw) += (*dy)(n, c, oh, ow);
                }
    return dy ? dx : y;
}

tensor4 random_tensor(std::array<std::size_t, 4> shape, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    tensor4 t = tensor4::from_shape(shape);
    for (auto& v : t)
        v = u(rng);
    return t;
}

double dot(const tensor4& a, const tensor4& b) {
    double s = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        s += a.data()[i] * b.data()[i];
    return s;
}

TEST(spatial, the_naive_kernels_are_right) {
    // Ones through a 3x3 kernel of ones, padded by 1: 4 at the corners, 6 on the edges, 9 inside.
    const window2 g{conv3, conv3};
    const tensor4 y = conv(xt::ones<double>({1, 1, 3, 3}), xt::ones<double>({1, 1, 3, 3}), g);
    EXPECT_EQ(y, (tensor4{{{{4, 6, 4}, {6, 9, 6}, {4, 6, 4}}}}));
    // The backward passes are the adjoints: <conv(x), dy> = <x, dx> = <w, dw>.
    const window2 s{{3, 2, 2, 2, 1}, {4, 1, 1, 1, 2}};
    const auto x = random_tensor({2, 3, 9, 8}, 1), wt = random_tensor({2, 3, 3, 4}, 2);
    const auto out = conv(x, wt, s);
    const auto dy = random_tensor({out.shape(0), out.shape(1), out.shape(2), out.shape(3)}, 3);
    tensor4 dw = xt::zeros<double>(wt.shape());
    const auto dx = conv_backward(x, wt, dy, s, dw);
    EXPECT_NEAR(dot(out, dy), dot(x, dx), 1e-10);
    EXPECT_NEAR(dot(out, dy), dot(wt, dw), 1e-10);
    const auto avg = pool(x, s, false);
    const auto pdy = random_tensor({avg.shape(0), avg.shape(1), avg.shape(2), avg.shape(3)}, 4);
    EXPECT_NEAR(dot(avg, pdy), dot(x, pool(x, s, false, &pdy)), 1e-10);
    // Max pooling's gradient sums what reaches the maxima.
    const auto mdx = pool(x, s, true, &pdy);
    EXPECT_NEAR(xt::sum(mdx)(), xt::sum(pdy)(), 1e-10);
    EXPECT_EQ(pool(xt::ones<double>({1, 1, 4, 4}) * 2.0, {{2, 2}, {2, 2}}, false),
              (tensor4{{{{2, 2}, {2, 2}}}}));
}

// ---- The expectation of the exchange, computed from the intervals ----------------------------

std::size_t off(std::size_t n, std::size_t k, std::size_t i) {
    return i * (n / k) + std::min(i, n % k);
}
std::size_t ext(std::size_t n, std::size_t k, std::size_t i) {
    return n / k + (i < n % k ? 1 : 0);
}

/// The input rows [first, last) band i needs (empty when it computes no output row).
std::pair<std::size_t, std::size_t> needed(std::size_t n, std::size_t k, std::size_t i,
                                           const sliding_window& w) {
    const auto m = (n + w.pad_before + w.pad_after - w.span()) / w.stride + 1;
    if (ext(m, k, i) == 0)
        return {0, 0};
    const long long first = (long long)(off(m, k, i) * w.stride) - (long long)w.pad_before;
    const long long last = (long long)((off(m, k, i) + ext(m, k, i) - 1) * w.stride + w.span()) -
                           (long long)w.pad_before;
    return {std::size_t(std::max(first, 0LL)), std::size_t(std::min(last, (long long)n))};
}

/// Whether some band needs rows beyond its neighbours' bands.
bool out_of_reach(std::size_t n, std::size_t k, const sliding_window& w) {
    for (std::size_t i = 0; i < k; ++i) {
        const auto [first, last] = needed(n, k, i, w);
        if (first >= last)
            continue;
        const auto lo = off(n, k, i == 0 ? 0 : i - 1);
        const auto hi = i + 2 >= k ? n : off(n, k, i + 2);
        if (first < lo || last > hi)
            return true;
    }
    return false;
}

std::size_t overlap(std::size_t a0, std::size_t a1, std::size_t b0, std::size_t b1) {
    const auto lo = std::max(a0, b0), hi = std::min(a1, b1);
    return hi > lo ? hi - lo : 0;
}

/// Rows of band i (extent n, k bands) that neighbours i - 1 and i + 1 need.
std::size_t rows_sent(std::size_t n, std::size_t k, std::size_t i, const sliding_window& w) {
    std::size_t rows = 0;
    for (std::size_t j : {i - 1, i + 1}) {
        if (j >= k) // i - 1 wraps for i == 0
            continue;
        const auto [first, last] = needed(n, k, j, w);
        rows += overlap(off(n, k, i), off(n, k, i) + ext(n, k, i), first, last);
    }
    return rows;
}

/// Rows band i receives: those it needs beyond its own.
std::size_t rows_received(std::size_t n, std::size_t k, std::size_t i, const sliding_window& w) {
    const auto [first, last] = needed(n, k, i, w);
    return last - first - overlap(off(n, k, i), off(n, k, i) + ext(n, k, i), first, last);
}

// ---- The distributed runs ------------------------------------------------------------------

struct conv_case {
    window2 g;
    const char* name;
};

const std::vector<conv_case> conv_cases = {
    {{{1, 1, 1, 0, 0}, {1, 1, 1, 0, 0}}, "k1"},
    {{{1, 2, 1, 0, 0}, {1, 2, 1, 0, 0}}, "k1 stride 2 (ResNet's downsampling shortcut)"},
    {{conv3, conv3}, "k3"},
    {{{5, 1, 1, 2, 2}, {5, 1, 1, 2, 2}}, "k5"},
    {{{7, 1, 1, 3, 3}, {7, 1, 1, 3, 3}}, "k7"},
    {{{3, 2, 1, 1, 1}, {3, 2, 1, 1, 1}}, "k3 stride 2"},
    {{{7, 2, 1, 3, 3}, {5, 2, 1, 2, 2}}, "k7/k5 stride 2"},
    {{{3, 1, 2, 2, 2}, {3, 1, 2, 2, 2}}, "k3 dilation 2"},
    {{{4, 2, 1, 1, 2}, {3, 1, 1, 0, 2}}, "asymmetric padding"},
};

const std::vector<std::pair<conv_case, bool>> pool_cases = {
    {{{{2, 2}, {2, 2}}, "max k2 s2"}, true},
    {{{pool3s2, pool3s2}, "max k3 s2 p1"}, true},
    {{{{2, 2}, {2, 2}}, "avg k2 s2"}, false},
    {{{pool3s2, pool3s2}, "avg k3 s2 p1"}, false},
};

constexpr std::size_t batch = 2, channels = 3, out_channels = 2;

/// This rank's block of a global array.
template <class D>
tensor4 block_in(const tensor4& global, const D& t, const std::array<std::size_t, 4>& shape) {
    const auto b = xshard::block_of(t.layout(), t.mesh().shape(), shape, t.mesh().rank());
    return xt::view(global, xt::range(b.offset[0], b.offset[0] + b.extent[0]),
                    xt::range(b.offset[1], b.offset[1] + b.extent[1]),
                    xt::range(b.offset[2], b.offset[2] + b.extent[2]),
                    xt::range(b.offset[3], b.offset[3] + b.extent[3]));
}

/// Bytes this rank sends in the exchange, from the intervals: the H step sends rows times
/// its block's other extents, the W step columns times the H-widened band; forward the rows
/// its neighbours need, the adjoint the rows it received (their gradients go back).
template <class D>
std::size_t expected_bytes(const D& x, const window2& g, bool adjoint = false) {
    const auto& ms = x.mesh().shape();
    const auto& l = x.layout();
    const auto c = ms.coords(x.mesh().rank());
    const auto own = x.block();
    const auto H = x.shape()[2], W = x.shape()[3];
    const auto kh = std::size_t(l.split_count(2, ms)), kw = std::size_t(l.split_count(3, ms));
    const auto ih = std::size_t(l.block_index(2, ms, c)), iw = std::size_t(l.block_index(3, ms, c));
    const auto [h0, h1] = needed(H, kh, ih, g.h);
    const auto nc = own.extent[0] * own.extent[1];
    return sizeof(double) * nc *
           (adjoint ? rows_received(H, kh, ih, g.h) * own.extent[3] +
                          rows_received(W, kw, iw, g.w) * (h1 - h0)
                    : rows_sent(H, kh, ih, g.h) * own.extent[3] +
                          rows_sent(W, kw, iw, g.w) * (h1 - h0));
}

template <xshard::layout L, class Mesh>
void run_layout(const Mesh& mesh, std::size_t H, std::size_t W) {
    const std::array<std::size_t, 4> shape{batch, channels, H, W};
    const auto xg = random_tensor(shape, 7);
    const auto wt = random_tensor({out_channels, channels, 7, 7}, 8);
    const auto x = xshard::distribute<L>(mesh, xg);
    const auto& ms = mesh.shape();
    const std::string where = xshard::testing::where(mesh) + ", layout " + L.to_string() +
                              ", image " + std::to_string(H) + "x" + std::to_string(W);
    const auto parts_h = std::size_t(x.layout().split_count(2, ms));
    const auto parts_w = std::size_t(x.layout().split_count(3, ms));

    auto run = [&](const conv_case& cc, auto forward, auto backward, std::size_t cout) {
        const auto& g = cc.g;
        const windowed_dims dims{{2, g.h}, {3, g.w}};
        const std::string what = where + ", " + cc.name;
        if (out_of_reach(H, parts_h, g.h) || out_of_reach(W, parts_w, g.w)) {
            xshard::testing::expect_error([&] { xshard::ops::spatial_op op(x, dims); },
                                          "reaches beyond its neighbouring bands");
            return;
        }
        xshard::ops::spatial_op op(x, dims);
        // Forward against the whole image.
        const tensor4 yg = forward(xg, g);
        traffic::reset();
        op.exchange(x);
        const auto sent = traffic::sent();
        const auto expect = expected_bytes(x, g);
        EXPECT_EQ(sent, expect) << what;
        EXPECT_EQ(op.plan().bytes_sent(), expect) << what;
        EXPECT_EQ(op.plan().summary().bytes_sent(), expect) << what;
        const auto y = op.forward(x,
                                  [&](const tensor4& band, const xshard::ops::band_info<4>& at) {
                                      return forward(band, padded(g, at));
                                  },
                                  {batch, cout, 0, 0});
        const std::array<std::size_t, 4> yshape{batch, cout, yg.shape(2), yg.shape(3)};
        ASSERT_EQ(y.shape(), yshape) << what;
        EXPECT_TRUE(blocks_close(y.local(), block_in(yg, y, yshape))) << what;
        // Backward: the gradients of x (and of the weights) against the whole image's.
        const auto dyg = random_tensor(yshape, 9);
        const auto dy = xshard::distribute<L>(mesh, dyg);
        tensor4 dw = xt::zeros<double>(wt.shape()), dwg = xt::zeros<double>(wt.shape());
        const tensor4 dxg = backward(xg, dyg, g, dwg);
        traffic::reset();
        const auto dx = op.backward(dy, [&](const tensor4& band, const tensor4& dy_local,
                                            const xshard::ops::band_info<4>& at) {
            return backward(band, dy_local, padded(g, at), dw);
        });
        EXPECT_EQ(traffic::sent(), expected_bytes(x, g, true)) << what << " (adjoint)";
        EXPECT_EQ(op.plan().bytes_sent(), expected_bytes(x, g, true)) << what << " (adjoint)";
        EXPECT_TRUE(blocks_close(dx.local(), block_in(dxg, dx, shape))) << what;
        // Weight gradients are partial over the bands (and over a split batch): summed, the
        // whole image's.
        op.reduce_over_bands(std::span(dw.data(), dw.size()));
        const auto rest = x.layout().split_axes(0, ms);
        if (ms.group_size(rest) > 1)
            allreduce(mesh.sub(rest), std::span(dw.data(), dw.size()), xshard::reduction::sum);
        EXPECT_TRUE(xt::allclose(dw, dwg, 1e-12, 1e-12)) << what;
        // The one-off forms agree.
        const auto y1 =
            xshard::ops::halo_apply(x, dims,
                                    [&](const tensor4& band, const xshard::ops::band_info<4>& at) {
                                        return forward(band, padded(g, at));
                                    },
                                    {batch, cout, 0, 0});
        EXPECT_EQ(y1.local(), y.local()) << what;
        tensor4 unused = xt::zeros<double>(wt.shape());
        const auto dx1 = xshard::ops::halo_apply_backward(
            x, dy, dims,
            [&](const tensor4& band, const tensor4& dy_local, const xshard::ops::band_info<4>& at) {
                return backward(band, dy_local, padded(g, at), unused);
            });
        EXPECT_EQ(dx1.local(), dx.local()) << what;
    };

    for (const auto& cc : conv_cases) {
        const std::size_t k = cc.g.h.kernel, kw = cc.g.w.kernel;
        const tensor4 w = xt::view(wt, xt::all(), xt::all(), xt::range(0, k), xt::range(0, kw));
        run(
            cc, [&](const tensor4& in, const window2& g) { return conv(in, w, g); },
            [&](const tensor4& in, const tensor4& dy, const window2& g, tensor4& dw) {
                tensor4 dwk = xt::zeros<double>(w.shape());
                auto dx = conv_backward(in, w, dy, g, dwk);
                xt::view(dw, xt::all(), xt::all(), xt::range(0, k), xt::range(0, kw)) += dwk;
                return dx;
            },
            out_channels);
    }
    for (const auto& [cc, max] : pool_cases)
        run(
            cc, [&, max = max](const tensor4& in, const window2& g) { return pool(in, g, max); },
            [&, max = max](const tensor4& in, const tensor4& dy, const window2& g, tensor4&) {
                return pool(in, g, max, &dy);
            },
            channels);
}

TEST(spatial, height_split_matches_the_whole_image) {
    const auto w = xshard::testing::world();
    const xshard::mesh<"x"> mesh(w, {w.size()});
    run_layout<"[-, -, x, -]">(mesh, 13, 11);
    run_layout<"[-, -, x, -]">(mesh, 24, 6); // even bands, 24 / 6 = 4 rows for k7 at 6 ranks
    run_layout<"[-, -, x, -]">(mesh, 5, 4);  // at 4 and 6 ranks, bands without output rows
}

TEST(spatial, width_split_matches_the_whole_image) {
    const auto w = xshard::testing::world();
    const xshard::mesh<"x"> mesh(w, {w.size()});
    run_layout<"[-, -, -, x]">(mesh, 9, 14);
}

TEST(spatial, height_and_width_split_on_a_2d_mesh) {
    const auto w = xshard::testing::world();
    for (int a = 1; a <= w.size(); ++a) {
        if (w.size() % a != 0)
            continue;
        const xshard::mesh<"a", "b"> mesh(w, {a, w.size() / a});
        run_layout<"[-, -, a, b]">(mesh, 13, 11);
        run_layout<"[a, -, -, b]">(mesh, 10, 12);    // batch over a (data parallel), width over b
        run_layout<"[-, -, (a,b), -]">(mesh, 20, 7); // height over both axes
    }
}

TEST(spatial, bands_thinner_than_the_halo_raise_on_every_rank) {
    // One row per rank and a 5-row window: from 3 ranks on, band 0 needs band 2's row.
    const auto w = xshard::testing::world();
    const xshard::mesh<"x"> mesh(w, {w.size()});
    const auto p = std::size_t(w.size());
    const auto x = xshard::distribute<"[-, -, x, -]">(mesh, random_tensor({1, 2, p, 6}, 3));
    const windowed_dims dims{{2, {5, 1, 1, 2, 2}}, {3, {5, 1, 1, 2, 2}}};
    if (p >= 3) {
        xshard::testing::expect_error([&] { xshard::ops::spatial_op op(x, dims); },
                                      "dimension 2 of extent " + std::to_string(p) +
                                          " is split into " + std::to_string(p) +
                                          " bands of 1 rows, but band 0");
    } else {
        xshard::ops::spatial_op op(x, dims);
        EXPECT_EQ(op.plan().output_shape(), (std::array<std::size_t, 4>{1, 2, p, 6}));
    }
    // A window longer than the padded image, a dimension windowed twice.
    xshard::testing::expect_error(
        [&] {
            xshard::ops::spatial_op op(x, windowed_dims{{3, {9, 1, 1, 1, 1}}});
        },
        "is longer than the padded extent 8");
    xshard::testing::expect_error(
        [&] {
            xshard::ops::spatial_op op(x, windowed_dims{{3, conv3}, {3, conv3}});
        },
        "dimension 3 is windowed twice");
}

TEST(spatial, a_local_function_of_the_wrong_shape_raises_on_every_rank) {
    const auto w = xshard::testing::world();
    const xshard::mesh<"x"> mesh(w, {w.size()});
    const auto x = xshard::distribute<"[-, -, x, -]">(
        mesh, random_tensor({1, 1, 2 * std::size_t(w.size()), 4}, 5));
    xshard::ops::spatial_op op(x, windowed_dims{{2, conv3}});
    xshard::testing::expect_error(
        [&] {
            (void)op.forward(x, [&](const tensor4& band, const xshard::ops::band_info<4>& at) {
                tensor4 y = band; // the band, not the output block: wrong on ranks with halos
                if (w.size() == 1 && at.output.extent[2] == band.shape(2))
                    y = xt::zeros<double>({1, 1, 1, 1});
                return y;
            });
        },
        "the local forward function returned shape");
}

TEST(spatial, a_resized_shard_raises_on_every_rank) {
    const auto w = xshard::testing::world();
    const xshard::mesh<"x"> mesh(w, {w.size()});
    auto x = xshard::distribute<"[-, -, x, -]">(
        mesh, random_tensor({1, 1, 2 * std::size_t(w.size()), 4}, 5));
    xshard::ops::spatial_op op(x, windowed_dims{{2, conv3}});
    if (mesh.rank() == w.size() - 1)
        x.local() = xt::zeros<double>({1, 1, 1, 4});
    xshard::testing::expect_error([&] { op.exchange(x); }, "was resized");
}

TEST(spatial, the_plan_prints_its_halo_steps) {
    const auto w = xshard::testing::world();
    const xshard::mesh<"x"> mesh(w, {w.size()});
    const auto x = xshard::distribute<"[-, -, x, -]">(
        mesh, random_tensor({2, 3, 4 * std::size_t(w.size()), 5}, 6));
    // The README's spelling of the windows.
    const windowed_dims dims{{2, {.kernel = 3, .stride = 1, .pad_before = 1, .pad_after = 1}},
                             {3, {.kernel = 3, .stride = 1, .pad_before = 1, .pad_after = 1}}};
    xshard::ops::spatial_op op(x, dims);
    const auto text = op.describe();
    EXPECT_NE(text.find("window on dim 2: kernel 3, stride 1, dilation 1, padding 1/1"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("1. halo(x): [-, -, x, -] + halo on dim 2"), std::string::npos) << text;
    EXPECT_NE(text.find("2. halo: [-, -, x, -] + halo on dim 3"), std::string::npos) << text;
    const auto& steps = op.plan().summary().steps;
    ASSERT_EQ(steps.size(), 2u);
    EXPECT_EQ(steps[0].planned.kind, xshard::step_kind::halo);
    EXPECT_EQ(to_string(steps[0].planned.kind), "halo");
    // Middle bands send one row (2 x 3 x 5 doubles) to each of two neighbours.
    const auto r = std::size_t(mesh.rank()), p = std::size_t(w.size());
    const std::size_t neighbours = (r > 0 ? 1 : 0) + (r + 1 < p ? 1 : 0);
    EXPECT_EQ(steps[0].bytes_sent, neighbours * 2 * 3 * 5 * sizeof(double));
    EXPECT_EQ(steps[0].messages, neighbours);
    EXPECT_EQ(steps[1].bytes_sent, 0u);
    EXPECT_GT(op.plan().summary().seconds, neighbours ? 0.0 : -1.0);
}

} // namespace
