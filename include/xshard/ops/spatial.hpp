#pragma once
/// \file
/// Spatial parallelism: any local windowed kernel (convolution, pooling, written with
/// oneDNN, im2col + GEMM or loops) run on an image split by height and/or width. The
/// wrapper gathers each rank's extended band through the planner's `halo` step
/// (redistribute/halo.hpp), calls the local function on it with the padding it must apply
/// (the real padding at the image border, 0 on a side a halo serves), and returns the output
/// split the same way; backward runs the local backward function on the band and sums the
/// halo gradients back onto the ranks owning the rows (the halo step's adjoint).
///
///     xshard::windowed_dims w{{2, {.kernel = 3, .stride = 1, .pad_before = 1, .pad_after = 1}},
///                             {3, {.kernel = 3, .stride = 1, .pad_before = 1, .pad_after = 1}}};
///     xshard::ops::spatial_op op(x, w);                     // plan once (x: NCHW, H over sp)
///     auto y = op.forward(x, [&](const auto& band, const xshard::ops::band_info<4>& at) {
///         return my_conv(band, weight, at.pad_before, at.pad_after); // -> at.output extents
///     }, {n, c_out, 0, 0});                              // the output's non-windowed extents
///     auto dx = op.backward(dy, [&](const auto& band, const auto& dy_local, const auto& at) {
///         my_conv_backward_weights(band, dy_local, at, dweight);   // this band's term
///         return my_conv_backward_data(dy_local, weight, at);      // -> band extents
///     });
///
/// Weight gradients: a local backward over one band gives that band's term of a weight's
/// gradient, so the gradient of a weight replicated over the spatial axes is *partial* over
/// them: exactly the dual layout xshard gives the gradient of a replicated weight
/// (param/weight.hpp), which `synchronize_gradients` sums over the weight's replicated axes
/// (the spatial ones with the data-parallel ones, in one fused all-reduce). Code outside the
/// training helpers can sum it at once with `reduce_over_bands`.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/redistribute/cost_model.hpp>
#include <xshard/redistribute/halo.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <xtensor/xtensor.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace xshard {

namespace detail {

template <class X, std::size_t N>
std::string local_shape_problem(const X& got, const std::array<std::size_t, N>& want,
                                const char* what, int rank) {
    const auto shape = to_array<N>(got.shape());
    if (shape == want && got.dimension() == N)
        return {};
    return "xshard: spatial: on rank " + std::to_string(rank) + " the local " + what +
           " function returned shape " + shape_string(shape) + " where " + shape_string(want) +
           " was expected";
}

} // namespace detail

namespace ops {

/// The windows of a 2-D window geometry on NCHW (`conv2d_geometry`, `pool2d_geometry`): height
/// (dimension 2) and width (3), with the geometry's kernel, stride, padding and dilation (1
/// where it has none).
template <class G>
windowed_dims windows_of(const G& g) {
    std::size_t dilation_h = 1, dilation_w = 1;
    if constexpr (requires { g.dilation_h; }) {
        dilation_h = g.dilation_h;
        dilation_w = g.dilation_w;
    }
    return {{2, {g.kernel_h, g.stride_h, dilation_h, g.pad.top, g.pad.bottom}},
            {3, {g.kernel_w, g.stride_w, dilation_w, g.pad.left, g.pad.right}}};
}

/// What a local windowed function gets besides its band: where the band sits in the global
/// input, the output block it must return (global coordinates; its extents are the shape to
/// return), and per dimension the padding its window applies before and after the band (the
/// window's own at the image border, 0 where a halo serves, 0 on non-windowed dimensions).
/// Run with these paddings and the windows' kernel, stride and dilation, a kernel's natural
/// output extent is exactly `output.extent` along every windowed dimension.
/// The local function runs on every rank, also where the block is empty (more bands than
/// output rows, a batch split thinner than the ranks): it returns an empty tensor of
/// `output.extent` there (kernels that reject empty shapes test `output.size() == 0`).
template <std::size_t N>
struct band_info {
    box<N> band;
    box<N> output;
    std::array<std::size_t, N> pad_before{};
    std::array<std::size_t, N> pad_after{};
};

/// A windowed operation on distributed tensors like `like` (type D), along `windows`: the
/// halo plan built once (redistribute/halo.hpp), the band buffer allocated once; `forward`
/// and `backward` run many times. The windowed dimensions may be split over any mesh axes,
/// the others too (a batch split over dp is data parallelism alongside); bands smaller than
/// the halo throw `xshard::error` on every rank at construction. A partial(sum) input is
/// right only for a linear local function (convolution, average pooling: the output keeps
/// the pending sum), as with `shard_local`; partial(max/min) is a compile error (or an error
/// for a run-time layout).
template <distributed_tensor D>
class spatial_op {
public:
    using tensor_type = std::remove_cvref_t<D>;
    using value_type = typename tensor_type::value_type;
    using mesh_type = typename tensor_type::mesh_type;
    static constexpr std::size_t rank = tensor_type::rank;
    static constexpr layout static_layout = tensor_type::static_layout;
    using shape_type = std::array<std::size_t, rank>;
    using local_type = typename tensor_type::local_type;
    static_assert(rank >= 1, "xshard: spatial_op: a scalar has no dimension to slide a window on");
    // A pending sum passes through a linear local function (a convolution of the terms is a
    // term of the convolution), and the halo adjoint is a sum; pending max/min terms have
    // neither property.
    static_assert(static_layout.dynamic || !static_layout.is_partial() ||
                      static_layout.op == reduction::sum,
                  "xshard: spatial_op: a partial(max) or partial(min) tensor cannot be windowed; "
                  "redistribute it to a layout without pending max/min terms first");

    /// Plans the halo exchange of tensors like `like` (its mesh, global shape and layout).
    /// Communicates nothing; throws on every rank alike when the windows cannot serve it.
    spatial_op(const tensor_type& like, const windowed_dims& windows, const cost_model& model = {})
        : mesh_(like.mesh())
        , layout_(like.layout())
        , plan_(like.mesh(), like.shape(), like.layout(), windows, model)
        , band_(local_type::from_shape(plan_.band().extent)) {
        if (layout_.is_partial() && layout_.op != reduction::sum)
            throw error("xshard: spatial_op: the partial(" + std::string(to_string(layout_.op)) +
                        ") tensor " + layout_.to_string() +
                        " cannot be windowed; redistribute "
                        "it first");
        for (const auto& w : windows)
            spatial_axes_ = spatial_axes_ | layout_.split_axes(w.dim, mesh_.shape());
    }

    /// Gathers `x`'s extended band into `band()` (its own rows and its neighbours' halo
    /// rows). Collective: one all-reduce of one int over the mesh (agreeing that no rank's
    /// shard was resized), then the halo step over the spatial axes; allocates nothing.
    /// Throws (alike on every rank) when `x` is not a tensor the plan was made for.
    const local_type& exchange(const tensor_type& x) {
        check(x);
        std::optional<std::string> resized;
        if (xshard::detail::to_array<rank>(x.local().shape()) != plan_.source_block().extent)
            resized = "xshard: spatial_op: the local shard of rank " +
                      std::to_string(mesh_.rank()) +
                      " was resized (it no longer has the shape "
                      "its layout gives it)";
        agree_on_error(mesh_.comm(), resized);
        plan_.forward(x.local().data(), band_.data());
        return band_;
    }

    /// `exchange` for a tensor whose local block has its layout's shape by construction (the
    /// layers' own activations): no agreement round before the messages (one collective
    /// fewer per windowed layer); a caller-resized block is not detected. Collective over the
    /// ranks' neighbouring bands only.
    const local_type& exchange_block(const tensor_type& x) {
        check(x);
        plan_.forward(x.local().data(), band_.data());
        return band_;
    }

    /// `f(band, info)` on every rank's extended band of `x` (see band_info), as a tensor of
    /// `x`'s layout whose windowed dimensions are the windows' output extents and whose other
    /// extents are those of `out_shape` (default: `x`'s; its windowed entries are ignored).
    /// `f` returns the local output block (an xtensor expression of `info.output.extent`);
    /// it may change extents of non-windowed dimensions (channels) as `out_shape` says.
    /// Collective: `exchange`, then one all-reduce of one int agreeing that `f` returned the
    /// right shape and did not throw on any rank (else every rank throws).
    template <class F>
    requires std::invocable < F&, const local_type&, const band_info<rank>
    & > auto forward(const tensor_type& x, F&& f, shape_type out_shape = {}) {
        exchange(x);
        using result_t = std::remove_cvref_t<
            std::invoke_result_t<F&, const local_type&, const band_info<rank>&>>;
        using U = typename result_t::value_type;
        using out_tensor = dtensor<U, mesh_type, static_layout>;
        if (out_shape == shape_type{})
            out_shape = x.shape();
        for (const auto& w : plan_.windows())
            out_shape[w.dim] = plan_.output_shape()[w.dim];
        const auto info = info_for(out_shape);
        auto local = agreed(mesh_.comm(), [&] {
            typename out_tensor::local_type y = f(std::as_const(band_), info);
            const auto problem =
                xshard::detail::local_shape_problem(y, info.output.extent, "forward", mesh_.rank());
            if (!problem.empty())
                throw error(problem);
            return y;
        });
        return out_tensor(xshard::detail::unchecked, mesh_, out_shape, std::move(local), layout_);
    }

    /// The gradient of the last `forward`'s input: `f(band, grad_out_local, info)` returns
    /// the gradient of the band (band extents) from the band that forward gathered and this
    /// rank's block of `grad_out` (the output's gradient, laid out like the output); the halo
    /// step's adjoint then sums the halo entries onto the ranks owning those rows. Weight
    /// gradients `f` computes on the side are this band's terms (see the file comment).
    /// Collective: one all-reduce of one int (agreeing on `f`), then the adjoint exchange.
    template <distributed_tensor G, class F>
    requires std::invocable < F&, const local_type&, const typename G::local_type&,
        const band_info<rank>
    & > tensor_type backward(const G& grad_out, F&& f) {
        static_assert(G::rank == rank, "xshard: spatial_op::backward: the output gradient's rank "
                                       "differs from the input's");
        if (!(grad_out.mesh() == mesh_) || !(grad_out.layout() == layout_))
            throw error("xshard: spatial_op::backward: the output gradient must be laid out as "
                        "the input, " +
                        layout_.to_string() + ", on its mesh; it is " +
                        grad_out.layout().to_string());
        for (const auto& w : plan_.windows())
            if (grad_out.shape()[w.dim] != plan_.output_shape()[w.dim])
                throw error("xshard: spatial_op::backward: the output gradient has shape " +
                            xshard::detail::shape_string(grad_out.shape()) + ", the output " +
                            xshard::detail::shape_string(plan_.output_shape()) +
                            " on the windowed dimensions");
        const auto info = info_for(grad_out.shape());
        auto grad_band = agreed(mesh_.comm(), [&] {
            local_type g = f(std::as_const(band_), grad_out.local(), info);
            const auto problem = xshard::detail::local_shape_problem(g, plan_.band().extent,
                                                                     "backward", mesh_.rank());
            if (!problem.empty())
                throw error(problem);
            return g;
        });
        auto grad = local_type::from_shape(plan_.source_block().extent);
        plan_.adjoint(grad_band.data(), grad.data());
        return tensor_type(xshard::detail::unchecked, mesh_, plan_.shape(), std::move(grad),
                           layout_);
    }

    /// Whether `x` is a tensor the plan was made for (its mesh, global shape and layout):
    /// a layer keeping the plan across steps rebuilds it when not. Local, no message.
    bool fits(const tensor_type& x) const {
        return x.mesh() == mesh_ && x.shape() == plan_.shape() && x.layout() == layout_;
    }

    /// The halo step's adjoint alone: from the gradient of the band `exchange` gathered
    /// (`plan().band()` extents), this rank's block of the input's gradient (its own rows'
    /// entries plus its neighbours' halo entries for them). For layers whose output is laid
    /// out unlike their input (a convolution splitting its output channels), which call
    /// `exchange` and their local kernels themselves. Collective like `backward`.
    local_type adjoint(const local_type& grad_band) {
        if (xshard::detail::to_array<rank>(grad_band.shape()) != plan_.band().extent)
            throw error(
                "xshard: spatial_op::adjoint: the band gradient has shape " +
                xshard::detail::shape_string(xshard::detail::to_array<rank>(grad_band.shape())) +
                ", the band " + xshard::detail::shape_string(plan_.band().extent));
        auto grad = local_type::from_shape(plan_.source_block().extent);
        plan_.adjoint(grad_band.data(), grad.data());
        return grad;
    }

    /// The extended band the last `forward` (or `exchange`) gathered.
    const local_type& band() const noexcept { return band_; }
    /// The halo plan (its geometry, its summary).
    const halo_plan<value_type, rank>& plan() const noexcept { return plan_; }
    /// The mesh axes splitting the windowed dimensions: the axes weight gradients are
    /// partial over.
    axis_set spatial_axes() const noexcept { return spatial_axes_; }
    /// The plan's printout: the windows, then one `halo` step per windowed dimension.
    std::string describe() const { return plan_.describe(); }

    /// Sums `terms` (a weight gradient's band terms) over the spatial axes, in place: what
    /// `synchronize_gradients` does for replicated weights, for code outside it. Collective
    /// over the spatial axes: one all-reduce of `terms`.
    template <class T>
    void reduce_over_bands(std::span<T> terms) const {
        if (mesh_.shape().group_size(spatial_axes_) > 1)
            allreduce(mesh_.sub(spatial_axes_), terms, reduction::sum);
    }

private:
    void check(const tensor_type& x) const {
        if (!(x.mesh() == mesh_) || x.shape() != plan_.shape() || !(x.layout() == layout_))
            throw error("xshard: spatial_op: the plan is for " + layout_.to_string() + " " +
                        xshard::detail::shape_string(plan_.shape()) +
                        " on its mesh, the tensor is " + x.layout().to_string() + " " +
                        xshard::detail::shape_string(x.shape()));
    }

    band_info<rank> info_for(const shape_type& out_shape) const {
        band_info<rank> info;
        info.band = plan_.band();
        info.output = block_of(layout_, mesh_.shape(), out_shape, mesh_.rank());
        info.pad_before = plan_.pad_before();
        info.pad_after = plan_.pad_after();
        return info;
    }

    mesh_type mesh_;
    layout layout_;
    halo_plan<value_type, rank> plan_;
    local_type band_;
    axis_set spatial_axes_;
};

template <distributed_tensor D>
spatial_op(const D&, const windowed_dims&, const cost_model& = {}) -> spatial_op<D>;

/// One-off `spatial_op(x, windows).forward(x, f, out_shape)`: plans, exchanges the halos,
/// runs `f` on the band (see spatial_op::forward).
template <distributed_tensor D, class F>
auto halo_apply(const D& x, const windowed_dims& windows, F&& f,
                typename spatial_op<D>::shape_type out_shape = {}) {
    spatial_op<D> op(x, windows);
    return op.forward(x, std::forward<F>(f), out_shape);
}

/// One-off backward: the gradient of `x` from the output gradient `grad_out`, gathering
/// `x`'s band again (a halo exchange forward, then its adjoint; see spatial_op::backward).
template <distributed_tensor D, distributed_tensor G, class F>
D halo_apply_backward(const D& x, const G& grad_out, const windowed_dims& windows, F&& f) {
    spatial_op<D> op(x, windows);
    op.exchange(x);
    return op.backward(grad_out, std::forward<F>(f));
}

} // namespace ops

} // namespace xshard
