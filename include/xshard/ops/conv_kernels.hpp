#pragma once
/// \file
/// The local kernels of convolutional networks, on one rank's NCHW blocks: 2-D convolution
/// (forward, backward to the input, backward to the weights) and max / average pooling
/// (forward, backward). No communication: the layers of nn/ and a spatial (halo) wrapper
/// call them on local blocks.
///
/// Padding is asymmetric (top, bottom, left, right), so that a band of rows that carries
/// halos from its neighbours is convolved with padding 0 on its halo sides and the global
/// padding on the sides that are the image's edges.
///
/// Which library computes them (measured by bench_convnet, README "Convolutional networks"):
/// - convolution, float: oneDNN (libdnnl, its plain-NCHW primitives) where the output plane
///   has 64 points or more, im2col over the whole batch + one OpenBLAS GEMM per group below
///   (oneDNN's NCHW path is 4-8x slower on ResNet's 2 x 2 and 1 x 1 late stages);
///   `conv_backend` forces either;
/// - convolution, double: im2col + OpenBLAS GEMM (oneDNN has no f64 convolution on CPUs);
/// - pooling: plain loops over the window, both types (memory-bound, one pass; oneDNN's
///   pooling has no f64 either).
/// oneDNN threads with OpenMP: run one thread per rank (OMP_NUM_THREADS=1, scripts/env.sh).

#include <xshard/compiled.hpp>
#include <xshard/comm/combine.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/ops/matmul.hpp>

#include <dnnl.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace xshard::ops {

/// Padding of the two spatial dimensions, each side on its own (rows above and below,
/// columns left and right), in elements.
struct padding2d {
    std::size_t top = 0, bottom = 0, left = 0, right = 0;

    /// The same padding on every side.
    static constexpr padding2d uniform(std::size_t p) noexcept { return {p, p, p, p}; }
    friend constexpr bool operator==(const padding2d&, const padding2d&) = default;
};

/// The output extent of a sliding window: floor((in + pads - dilation (k - 1) - 1) / stride)
/// + 1, or 0 when the window does not fit once.
constexpr std::size_t window_output_extent(std::size_t in, std::size_t pad_before,
                                           std::size_t pad_after, std::size_t kernel,
                                           std::size_t stride, std::size_t dilation) noexcept {
    const std::size_t span = dilation * (kernel - 1) + 1;
    const std::size_t padded = in + pad_before + pad_after;
    if (kernel == 0 || stride == 0 || padded < span)
        return 0;
    return (padded - span) / stride + 1;
}

/// The shapes of one local 2-D convolution: x [batch, in_channels, in_h, in_w], w
/// [out_channels, in_channels / groups, kernel_h, kernel_w], y [batch, out_channels, out_h(),
/// out_w()]. Both channel counts must be multiples of `groups` (`check()` says so).
struct conv2d_geometry {
    std::size_t batch = 0, in_channels = 0, in_h = 0, in_w = 0;
    std::size_t out_channels = 0, kernel_h = 1, kernel_w = 1;
    std::size_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
    padding2d pad = {};
    std::size_t groups = 1;

    constexpr std::size_t out_h() const noexcept {
        return window_output_extent(in_h, pad.top, pad.bottom, kernel_h, stride_h, dilation_h);
    }
    constexpr std::size_t out_w() const noexcept {
        return window_output_extent(in_w, pad.left, pad.right, kernel_w, stride_w, dilation_w);
    }
    constexpr std::array<std::size_t, 4> input_shape() const noexcept {
        return {batch, in_channels, in_h, in_w};
    }
    constexpr std::array<std::size_t, 4> weight_shape() const noexcept {
        return {out_channels, groups ? in_channels / groups : 0, kernel_h, kernel_w};
    }
    constexpr std::array<std::size_t, 4> output_shape() const noexcept {
        return {batch, out_channels, out_h(), out_w()};
    }

    /// Throws `xshard::error` naming `what` when the geometry is not one a convolution runs.
    void check(const std::string& what = "conv2d") const {
        if (groups == 0 || in_channels % groups != 0 || out_channels % groups != 0)
            throw error("xshard: " + what + ": " + std::to_string(in_channels) + " input and " +
                        std::to_string(out_channels) + " output channels do not split into " +
                        std::to_string(groups) + " groups");
        if (kernel_h == 0 || kernel_w == 0 || stride_h == 0 || stride_w == 0 || dilation_h == 0 ||
            dilation_w == 0)
            throw error("xshard: " + what + ": kernel, stride and dilation must be positive");
        (void)volume({batch, in_channels, in_h, in_w});
        (void)volume({batch, out_channels, out_h(), out_w()});
    }
};

/// The shapes of one local 2-D pooling: x [batch, channels, in_h, in_w] -> y [batch,
/// channels, out_h(), out_w()].
struct pool2d_geometry {
    std::size_t batch = 0, channels = 0, in_h = 0, in_w = 0;
    std::size_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1;
    padding2d pad = {};

    constexpr std::size_t out_h() const noexcept {
        return window_output_extent(in_h, pad.top, pad.bottom, kernel_h, stride_h, 1);
    }
    constexpr std::size_t out_w() const noexcept {
        return window_output_extent(in_w, pad.left, pad.right, kernel_w, stride_w, 1);
    }
    constexpr std::array<std::size_t, 4> input_shape() const noexcept {
        return {batch, channels, in_h, in_w};
    }
    constexpr std::array<std::size_t, 4> output_shape() const noexcept {
        return {batch, channels, out_h(), out_w()};
    }
    void check(const std::string& what = "pool2d") const {
        if (kernel_h == 0 || kernel_w == 0 || stride_h == 0 || stride_w == 0)
            throw error("xshard: " + what + ": kernel and stride must be positive");
        if (pad.top >= kernel_h || pad.bottom >= kernel_h || pad.left >= kernel_w ||
            pad.right >= kernel_w)
            throw error("xshard: " + what +
                        ": padding must be smaller than the window (a window of padding only)");
    }
};

/// The four extents of an NCHW shape (any indexable shape: an xtensor's, a std::array).
template <class S>
constexpr std::array<std::size_t, 4> nchw_shape(const S& s) {
    return {std::size_t(s[0]), std::size_t(s[1]), std::size_t(s[2]), std::size_t(s[3])};
}

/// Which library computes a float convolution (double always uses `gemm`).
enum class conv_backend : std::uint8_t {
    automatic, ///< the measured choice: float planes >= 64 points oneDNN, else gemm
    gemm,      ///< im2col (col2im) + OpenBLAS GEMM
    onednn,    ///< oneDNN's convolution primitives (float only)
};

namespace conv_detail {

/// A scratch buffer per thread and type, grown as needed and kept: im2col's columns.
template <class T>
T* scratch(std::size_t n, int slot = 0) {
    thread_local std::vector<T> buffers[3];
    auto& b = buffers[slot];
    if (b.size() < n)
        b.resize(n);
    return b.data();
}

/// Where one kernel tap reads along a dimension: output index i reads input i * stride +
/// offset, inside the input for i in [first, last).
struct tap_range {
    std::ptrdiff_t offset = 0;
    std::size_t first = 0, last = 0;
};

/// Where tap k of a window reads along a dimension of `in` inputs and `out` outputs.
XSHARD_DECL tap_range tap_of(std::size_t k, std::size_t dilation, std::size_t pad,
                             std::size_t stride, std::size_t in, std::size_t out);

/// The batch's columns: col [C * kh * kw, batch * oh * ow] (rows `ld` apart, image n at
/// column n * oh * ow) from the channels [C, H, W] of each image of x, images `image` elements
/// apart (zeros in the padding). A tap that reads padding has its row zeroed in one fill and
/// the rest copied, so that small planes (ResNet's late stages: 4 x 4 down to 1 x 1, where
/// most taps read padding) cost a copy per image and row, not a test per element.
template <class T>
void im2col(const T* x, std::size_t batch, std::size_t image, std::size_t channels,
            const conv2d_geometry& g, T* col, std::size_t ld) {
    const std::size_t oh = g.out_h(), ow = g.out_w(), H = g.in_h, W = g.in_w, hw = oh * ow;
    for (std::size_t c = 0; c < channels; ++c)
        for (std::size_t ki = 0; ki < g.kernel_h; ++ki)
            for (std::size_t kj = 0; kj < g.kernel_w; ++kj) {
                const auto r = tap_of(ki, g.dilation_h, g.pad.top, g.stride_h, H, oh);
                const auto s = tap_of(kj, g.dilation_w, g.pad.left, g.stride_w, W, ow);
                T* row = col + ((c * g.kernel_h + ki) * g.kernel_w + kj) * ld;
                if (r.first > 0 || r.last < oh || s.first > 0 || s.last < ow)
                    std::fill_n(row, batch * hw, T(0));
                if (r.first == r.last || s.first == s.last)
                    continue;
                for (std::size_t n = 0; n < batch; ++n) {
                    const T* plane = x + n * image + c * H * W;
                    for (std::size_t i = r.first; i < r.last; ++i) {
                        const T* in =
                            plane + std::size_t(std::ptrdiff_t(i * g.stride_h) + r.offset) * W;
                        T* o = row + n * hw + i * ow;
                        for (std::size_t j = s.first; j < s.last; ++j)
                            o[j] = in[std::ptrdiff_t(j * g.stride_w) + s.offset];
                    }
                }
            }
}

/// The adjoint of im2col: adds col [C * kh * kw, batch * oh * ow] into the channels
/// [C, H, W] of each image of dx, images `image` elements apart. A few images at a time, so
/// that their planes stay in cache while the taps add into them, and the columns are read in
/// runs of images (a whole channel's images at once would map to one cache set where an
/// image is a multiple of 4 KiB).
template <class T>
void col2im(const T* col, std::size_t batch, std::size_t image, std::size_t channels,
            const conv2d_geometry& g, T* dx, std::size_t ld) {
    constexpr std::size_t block = 8;
    const std::size_t oh = g.out_h(), ow = g.out_w(), H = g.in_h, W = g.in_w, hw = oh * ow;
    for (std::size_t n0 = 0; n0 < batch; n0 += block)
        for (std::size_t c = 0; c < channels; ++c)
            for (std::size_t ki = 0; ki < g.kernel_h; ++ki)
                for (std::size_t kj = 0; kj < g.kernel_w; ++kj) {
                    const auto r = tap_of(ki, g.dilation_h, g.pad.top, g.stride_h, H, oh);
                    const auto s = tap_of(kj, g.dilation_w, g.pad.left, g.stride_w, W, ow);
                    const T* row = col + ((c * g.kernel_h + ki) * g.kernel_w + kj) * ld;
                    for (std::size_t n = n0; n < std::min(batch, n0 + block); ++n) {
                        T* plane = dx + n * image + c * H * W;
                        for (std::size_t i = r.first; i < r.last; ++i) {
                            T* out =
                                plane + std::size_t(std::ptrdiff_t(i * g.stride_h) + r.offset) * W;
                            const T* from = row + n * hw + i * ow;
                            for (std::size_t j = s.first; j < s.last; ++j)
                                out[std::ptrdiff_t(j * g.stride_w) + s.offset] += from[j];
                        }
                    }
                }
}

// The whole batch in one GEMM per group: columns [k, batch * hw] (image n at column n * hw),
// outputs gathered as [og, batch * hw]. Per-image GEMMs are skinny (hw = 1..64 columns in
// ResNet's late stages on CIFAR) and measured 2-3x slower there.

/// y_g [batch, og, hw] <-> t [og, batch * hw].
template <class T>
void to_rows(const T* y, std::size_t batch, std::size_t stride, std::size_t og, std::size_t hw,
             T* t) {
    for (std::size_t n = 0; n < batch; ++n)
        for (std::size_t o = 0; o < og; ++o)
            std::copy_n(y + n * stride + o * hw, hw, t + o * batch * hw + n * hw);
}
template <class T>
void from_rows(const T* t, std::size_t batch, std::size_t stride, std::size_t og, std::size_t hw,
               T* y) {
    for (std::size_t n = 0; n < batch; ++n)
        for (std::size_t o = 0; o < og; ++o)
            std::copy_n(t + o * batch * hw + n * hw, hw, y + n * stride + o * hw);
}

template <class T>
void gemm_conv_forward(const T* x, const T* w, T* y, const conv2d_geometry& g) {
    const std::size_t cg = g.in_channels / g.groups, og = g.out_channels / g.groups;
    const std::size_t k = cg * g.kernel_h * g.kernel_w, hw = g.out_h() * g.out_w();
    const std::size_t in_plane = g.in_h * g.in_w, nhw = g.batch * hw;
    T* col = scratch<T>(checked_mul(k, nhw), 0);
    T* out = scratch<T>(checked_mul(og, nhw), 1);
    for (std::size_t gi = 0; gi < g.groups; ++gi) {
        im2col(x + gi * cg * in_plane, g.batch, g.in_channels * in_plane, cg, g, col, nhw);
        xshard::detail::gemm(false, false, og, nhw, k, w + gi * og * k, k, col, nhw, false, out,
                             nhw);
        from_rows(out, g.batch, g.out_channels * hw, og, hw, y + gi * og * hw);
    }
}

template <class T>
void gemm_conv_backward_input(const T* dy, const T* w, T* dx, const conv2d_geometry& g) {
    const std::size_t cg = g.in_channels / g.groups, og = g.out_channels / g.groups;
    const std::size_t k = cg * g.kernel_h * g.kernel_w, hw = g.out_h() * g.out_w();
    const std::size_t in_plane = g.in_h * g.in_w, nhw = g.batch * hw;
    T* col = scratch<T>(checked_mul(k, nhw), 0);
    T* rows = scratch<T>(checked_mul(og, nhw), 1);
    std::fill_n(dx, g.batch * g.in_channels * in_plane, T(0));
    for (std::size_t gi = 0; gi < g.groups; ++gi) {
        to_rows(dy + gi * og * hw, g.batch, g.out_channels * hw, og, hw, rows);
        // dcol [k, nhw] = W_g^T [k, og] dy_g [og, nhw]
        xshard::detail::gemm(true, false, k, nhw, og, w + gi * og * k, k, rows, nhw, false, col,
                             nhw);
        col2im(col, g.batch, g.in_channels * in_plane, cg, g, dx + gi * cg * in_plane, nhw);
    }
}

template <class T>
void gemm_conv_backward_weight(const T* x, const T* dy, T* dw, const conv2d_geometry& g,
                               bool accumulate) {
    const std::size_t cg = g.in_channels / g.groups, og = g.out_channels / g.groups;
    const std::size_t k = cg * g.kernel_h * g.kernel_w, hw = g.out_h() * g.out_w();
    const std::size_t in_plane = g.in_h * g.in_w, nhw = g.batch * hw;
    T* col = scratch<T>(checked_mul(k, nhw), 0);
    T* rows = scratch<T>(checked_mul(og, nhw), 1);
    for (std::size_t gi = 0; gi < g.groups; ++gi) {
        im2col(x + gi * cg * in_plane, g.batch, g.in_channels * in_plane, cg, g, col, nhw);
        to_rows(dy + gi * og * hw, g.batch, g.out_channels * hw, og, hw, rows);
        // dW_g [og, k] (+)= dy_g [og, nhw] col^T [nhw, k]
        xshard::detail::gemm(false, true, og, k, nhw, rows, nhw, col, nhw, accumulate,
                             dw + gi * og * k, k);
    }
}

/// oneDNN's plain-format (NCHW, (g)oihw) convolution primitives on float.
struct onednn_conv {
    using tag = dnnl::memory::format_tag;
    using dims = dnnl::memory::dims;

    static dnnl::engine& engine() {
        static dnnl::engine e(dnnl::engine::kind::cpu, 0);
        return e;
    }
    static dnnl::stream& stream() {
        thread_local dnnl::stream s(engine());
        return s;
    }
    static dnnl::memory::desc md(const dims& d, tag t) {
        return dnnl::memory::desc(d, dnnl::memory::data_type::f32, t);
    }

    explicit onednn_conv(const conv2d_geometry& g)
        : src(md({dim(g.batch), dim(g.in_channels), dim(g.in_h), dim(g.in_w)}, tag::nchw))
        , dst(md({dim(g.batch), dim(g.out_channels), dim(g.out_h()), dim(g.out_w())}, tag::nchw))
        , wei(g.groups == 1
                  ? md({dim(g.out_channels), dim(g.in_channels), dim(g.kernel_h), dim(g.kernel_w)},
                       tag::oihw)
                  : md({dim(g.groups), dim(g.out_channels / g.groups),
                        dim(g.in_channels / g.groups), dim(g.kernel_h), dim(g.kernel_w)},
                       tag::goihw))
        , strides{dim(g.stride_h), dim(g.stride_w)}
        , dilates{dim(g.dilation_h) - 1, dim(g.dilation_w) - 1}
        , pad_l{dim(g.pad.top), dim(g.pad.left)}
        , pad_r{dim(g.pad.bottom), dim(g.pad.right)}
        , fwd(dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                              dnnl::algorithm::convolution_direct, src, wei, dst,
                                              strides, dilates, pad_l, pad_r),
              engine()) {}

    static dnnl::memory::dim dim(std::size_t v) { return static_cast<dnnl::memory::dim>(v); }
    static void* ptr(const float* p) { return const_cast<float*>(p); }

    void forward(const float* x, const float* w, float* y) {
        if (!fwd_prim)
            fwd_prim = dnnl::convolution_forward(fwd);
        fwd_prim->execute(stream(), {{DNNL_ARG_SRC, dnnl::memory(src, engine(), ptr(x))},
                                     {DNNL_ARG_WEIGHTS, dnnl::memory(wei, engine(), ptr(w))},
                                     {DNNL_ARG_DST, dnnl::memory(dst, engine(), y)}});
        stream().wait();
    }
    void backward_input(const float* dy, const float* w, float* dx) {
        if (!bwd_data_prim) {
            dnnl::convolution_backward_data::primitive_desc pd(
                dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src, wei,
                                                      dst, strides, dilates, pad_l, pad_r),
                engine(), fwd);
            bwd_data_prim = dnnl::convolution_backward_data(pd);
        }
        bwd_data_prim->execute(stream(), {{DNNL_ARG_DIFF_DST, dnnl::memory(dst, engine(), ptr(dy))},
                                          {DNNL_ARG_WEIGHTS, dnnl::memory(wei, engine(), ptr(w))},
                                          {DNNL_ARG_DIFF_SRC, dnnl::memory(src, engine(), dx)}});
        stream().wait();
    }
    void backward_weight(const float* x, const float* dy, float* dw) {
        if (!bwd_weights_prim) {
            dnnl::convolution_backward_weights::primitive_desc pd(
                dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src,
                                                         wei, dst, strides, dilates, pad_l, pad_r),
                engine(), fwd);
            bwd_weights_prim = dnnl::convolution_backward_weights(pd);
        }
        bwd_weights_prim->execute(stream(),
                                  {{DNNL_ARG_SRC, dnnl::memory(src, engine(), ptr(x))},
                                   {DNNL_ARG_DIFF_DST, dnnl::memory(dst, engine(), ptr(dy))},
                                   {DNNL_ARG_DIFF_WEIGHTS, dnnl::memory(wei, engine(), dw)}});
        stream().wait();
    }

    dnnl::memory::desc src, dst, wei;
    dims strides, dilates, pad_l, pad_r;
    dnnl::convolution_forward::primitive_desc fwd;
    std::optional<dnnl::convolution_forward> fwd_prim;
    std::optional<dnnl::convolution_backward_data> bwd_data_prim;
    std::optional<dnnl::convolution_backward_weights> bwd_weights_prim;
};

/// oneDNN primitives per geometry, per thread, built on first use and kept (a network has a
/// few dozen distinct convolutions).
XSHARD_DECL onednn_conv& onednn_conv_for(const conv2d_geometry& g);

/// The measured choice (README, "Convolutional networks"): oneDNN's plain-NCHW primitives win
/// on planes of 8 x 8 outputs and more (1.1-1.7x), the batched GEMM below (4-8x on 2 x 2 and
/// 1 x 1 planes, where oneDNN's NCHW path runs per image).
inline constexpr std::size_t onednn_min_plane = 64;

template <class T>
bool use_onednn(conv_backend b, const conv2d_geometry& g) {
    if constexpr (std::is_same_v<T, float>)
        return b == conv_backend::onednn ||
               (b == conv_backend::automatic && g.out_h() * g.out_w() >= onednn_min_plane);
    else
        return (void)b, (void)g, false;
}

/// Whether a geometry has any work (an empty block computes nothing).
inline bool empty(const conv2d_geometry& g) {
    return g.batch == 0 || g.out_channels == 0 || g.out_h() == 0 || g.out_w() == 0;
}

} // namespace conv_detail

/// Concept of the element types the kernels compute in.
template <class T>
concept conv_element = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// y = conv2d(x, w) (cross-correlation, as every framework's conv2d), y overwritten; x, w, y
/// contiguous NCHW / OIHW blocks of `g`'s shapes. Local, no messages.
template <conv_element T>
void conv2d_forward(const T* x, const T* w, T* y, const conv2d_geometry& g,
                    conv_backend backend = conv_backend::automatic) {
    if (conv_detail::empty(g))
        return;
    if (g.in_channels == 0) {
        std::fill_n(y, volume(g.output_shape()), T(0));
        return;
    }
    if (conv_detail::use_onednn<T>(backend, g)) {
        if constexpr (std::is_same_v<T, float>)
            conv_detail::onednn_conv_for(g).forward(x, w, y);
        return;
    }
    conv_detail::gemm_conv_forward(x, w, y, g);
}

/// dx = the gradient of conv2d's input given dy (dx overwritten). Local.
template <conv_element T>
void conv2d_backward_input(const T* dy, const T* w, T* dx, const conv2d_geometry& g,
                           conv_backend backend = conv_backend::automatic) {
    if (g.batch == 0 || g.in_channels == 0 || g.in_h == 0 || g.in_w == 0)
        return;
    if (conv_detail::empty(g)) {
        std::fill_n(dx, volume(g.input_shape()), T(0));
        return;
    }
    if (conv_detail::use_onednn<T>(backend, g)) {
        if constexpr (std::is_same_v<T, float>)
            conv_detail::onednn_conv_for(g).backward_input(dy, w, dx);
        return;
    }
    conv_detail::gemm_conv_backward_input(dy, w, dx, g);
}

/// dw = (or += with `accumulate`) the gradient of conv2d's weights given x and dy. Local.
template <conv_element T>
void conv2d_backward_weight(const T* x, const T* dy, T* dw, const conv2d_geometry& g,
                            bool accumulate = false,
                            conv_backend backend = conv_backend::automatic) {
    const std::size_t n = volume(g.weight_shape());
    if (conv_detail::empty(g) || g.in_channels == 0 || g.in_h == 0 || g.in_w == 0) {
        if (!accumulate)
            std::fill_n(dw, n, T(0));
        return;
    }
    if (conv_detail::use_onednn<T>(backend, g)) {
        if constexpr (std::is_same_v<T, float>) {
            if (!accumulate) {
                conv_detail::onednn_conv_for(g).backward_weight(x, dy, dw);
            } else {
                float* tmp = conv_detail::scratch<float>(n, 2);
                conv_detail::onednn_conv_for(g).backward_weight(x, dy, tmp);
                combine(dw, dw, tmp, n, reduction::sum); // vectorised: 1.2-1.4x a plain loop
            }
        }
        return;
    }
    conv_detail::gemm_conv_backward_weight(x, dy, dw, g, accumulate);
}

/// y = max over each window (padding never wins); `argmax` (y's size) receives the index of
/// the winner within its input plane (row * in_w + column), for the backward pass. Local.
template <conv_element T>
void max_pool2d_forward(const T* x, T* y, std::int32_t* argmax, const pool2d_geometry& g) {
    const std::size_t oh = g.out_h(), ow = g.out_w(), H = g.in_h, W = g.in_w;
    for (std::size_t p = 0; p < g.batch * g.channels; ++p) {
        const T* plane = x + p * H * W;
        for (std::size_t i = 0; i < oh; ++i) {
            const std::ptrdiff_t r0 = std::ptrdiff_t(i * g.stride_h) - std::ptrdiff_t(g.pad.top);
            const std::size_t rb = std::size_t(std::max<std::ptrdiff_t>(r0, 0));
            const std::size_t re = std::size_t(
                std::min<std::ptrdiff_t>(r0 + std::ptrdiff_t(g.kernel_h), std::ptrdiff_t(H)));
            for (std::size_t j = 0; j < ow; ++j) {
                const std::ptrdiff_t c0 =
                    std::ptrdiff_t(j * g.stride_w) - std::ptrdiff_t(g.pad.left);
                const std::size_t cb = std::size_t(std::max<std::ptrdiff_t>(c0, 0));
                const std::size_t ce = std::size_t(
                    std::min<std::ptrdiff_t>(c0 + std::ptrdiff_t(g.kernel_w), std::ptrdiff_t(W)));
                T best = -std::numeric_limits<T>::infinity();
                std::size_t at = rb * W + cb;
                for (std::size_t r = rb; r < re; ++r)
                    for (std::size_t c = cb; c < ce; ++c)
                        if (plane[r * W + c] > best) {
                            best = plane[r * W + c];
                            at = r * W + c;
                        }
                y[(p * oh + i) * ow + j] = best;
                argmax[(p * oh + i) * ow + j] = std::int32_t(at);
            }
        }
    }
}

/// dx = the gradient of max pooling's input: each dy added to its window's winner (dx
/// overwritten). Local.
template <conv_element T>
void max_pool2d_backward(const T* dy, const std::int32_t* argmax, T* dx, const pool2d_geometry& g) {
    const std::size_t oh = g.out_h(), ow = g.out_w(), plane = g.in_h * g.in_w;
    std::fill_n(dx, g.batch * g.channels * plane, T(0));
    for (std::size_t p = 0; p < g.batch * g.channels; ++p)
        for (std::size_t o = 0; o < oh * ow; ++o)
            dx[p * plane + std::size_t(argmax[p * oh * ow + o])] += dy[p * oh * ow + o];
}

namespace conv_detail {

/// The divisor of an average-pooling window: the whole window with `count_include_pad`,
/// else its part inside the input.
XSHARD_DECL std::size_t avg_divisor(const pool2d_geometry& g, std::size_t i, std::size_t j,
                                    bool count_include_pad);

} // namespace conv_detail

/// y = the mean of each window; padding counts as zeros when `count_include_pad` (PyTorch's
/// default), else the mean is over the window's part inside the input. Local.
template <conv_element T>
void avg_pool2d_forward(const T* x, T* y, const pool2d_geometry& g, bool count_include_pad = true) {
    const std::size_t oh = g.out_h(), ow = g.out_w(), H = g.in_h, W = g.in_w;
    for (std::size_t p = 0; p < g.batch * g.channels; ++p) {
        const T* plane = x + p * H * W;
        for (std::size_t i = 0; i < oh; ++i) {
            const std::ptrdiff_t r0 = std::ptrdiff_t(i * g.stride_h) - std::ptrdiff_t(g.pad.top);
            const std::size_t rb = std::size_t(std::max<std::ptrdiff_t>(r0, 0));
            const std::size_t re = std::size_t(
                std::min<std::ptrdiff_t>(r0 + std::ptrdiff_t(g.kernel_h), std::ptrdiff_t(H)));
            for (std::size_t j = 0; j < ow; ++j) {
                const std::ptrdiff_t c0 =
                    std::ptrdiff_t(j * g.stride_w) - std::ptrdiff_t(g.pad.left);
                const std::size_t cb = std::size_t(std::max<std::ptrdiff_t>(c0, 0));
                const std::size_t ce = std::size_t(
                    std::min<std::ptrdiff_t>(c0 + std::ptrdiff_t(g.kernel_w), std::ptrdiff_t(W)));
                T s = 0;
                for (std::size_t r = rb; r < re; ++r)
                    for (std::size_t c = cb; c < ce; ++c)
                        s += plane[r * W + c];
                const std::size_t d = conv_detail::avg_divisor(g, i, j, count_include_pad);
                y[(p * oh + i) * ow + j] = d ? s / T(d) : T(0);
            }
        }
    }
}

/// dx = the gradient of average pooling's input (dx overwritten). Local.
template <conv_element T>
void avg_pool2d_backward(const T* dy, T* dx, const pool2d_geometry& g,
                         bool count_include_pad = true) {
    const std::size_t oh = g.out_h(), ow = g.out_w(), H = g.in_h, W = g.in_w;
    std::fill_n(dx, g.batch * g.channels * H * W, T(0));
    for (std::size_t p = 0; p < g.batch * g.channels; ++p) {
        T* plane = dx + p * H * W;
        for (std::size_t i = 0; i < oh; ++i) {
            const std::ptrdiff_t r0 = std::ptrdiff_t(i * g.stride_h) - std::ptrdiff_t(g.pad.top);
            const std::size_t rb = std::size_t(std::max<std::ptrdiff_t>(r0, 0));
            const std::size_t re = std::size_t(
                std::min<std::ptrdiff_t>(r0 + std::ptrdiff_t(g.kernel_h), std::ptrdiff_t(H)));
            for (std::size_t j = 0; j < ow; ++j) {
                const std::ptrdiff_t c0 =
                    std::ptrdiff_t(j * g.stride_w) - std::ptrdiff_t(g.pad.left);
                const std::size_t cb = std::size_t(std::max<std::ptrdiff_t>(c0, 0));
                const std::size_t ce = std::size_t(
                    std::min<std::ptrdiff_t>(c0 + std::ptrdiff_t(g.kernel_w), std::ptrdiff_t(W)));
                const std::size_t d = conv_detail::avg_divisor(g, i, j, count_include_pad);
                if (d == 0)
                    continue;
                const T v = dy[(p * oh + i) * ow + j] / T(d);
                for (std::size_t r = rb; r < re; ++r)
                    for (std::size_t c = cb; c < ce; ++c)
                        plane[r * W + c] += v;
            }
        }
    }
}

} // namespace xshard::ops

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/ops/conv_kernels.ipp>
#endif
