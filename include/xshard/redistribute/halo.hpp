#pragma once
/// \file
/// The halo step: spatial parallelism's redistribution. A tensor whose dimension d (an image's
/// height or width) is block-split over mesh axes holds a band of rows per rank; a windowed
/// operation (convolution, pooling) along d needs, for the output rows a rank computes, a few
/// input rows of its neighbours' bands as well. The halo step gathers exactly those rows
/// (the *extended band*: own rows plus halos), with nonblocking point-to-point messages to the
/// neighbouring bands only; its adjoint sends the gradient of each halo back to the rank that
/// owns the rows and sums it there.
///
/// Which rows, exactly (all constexpr, `band_of`): the output of the window along d has
/// `m = window.output_extent(n)` rows, block-split over the same axes by the partition rule
/// (core/partition.hpp), so the output tensor has the input's layout. Output rows
/// [o, o + k) need input rows [o s - p, (o + k - 1) s - p + span) (stride s, padding before
/// p, span = dilation (kernel - 1) + 1), clipped to [0, n); what is clipped off is padding
/// the rank's local window applies itself: the real padding at the image border, 0 on a side
/// that a halo serves. Strides and pooling at band edges are thereby exact, whatever the
/// bands (uneven included): each rank computes its own block of output rows, no more.
///
/// Several windowed dimensions (height and width split over two mesh axes) are one step per
/// dimension, in order; the second step moves the first one's halos along too, so the corner
/// rows reach the diagonal neighbours without messages of their own (4 neighbours, not 8).
///
/// A band that needs rows from beyond its neighbouring bands (bands smaller than the halo)
/// is an error: `xshard::error` on every rank alike (every rank checks every band, no
/// communication), with a sentence naming the sizes.

#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/comm/subarray.hpp>
#include <xshard/compiled.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/static_vector.hpp>
#include <xshard/redistribute/copy.hpp>
#include <xshard/redistribute/cost_model.hpp>
#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/planner.hpp>
#include <xshard/redistribute/region_exchange.hpp>
#include <xshard/redistribute/region_message.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

/// A sliding window along one dimension: `kernel` taps `dilation` apart, moved by `stride`,
/// over the input padded by `pad_before` and `pad_after` (PyTorch's and oneDNN's geometry;
/// floor rounding of the output extent).
struct sliding_window {
    std::size_t kernel = 1;
    std::size_t stride = 1;
    std::size_t dilation = 1;
    std::size_t pad_before = 0;
    std::size_t pad_after = 0;

    /// The input rows one output row covers: dilation (kernel - 1) + 1.
    constexpr std::size_t span() const { return dilation * (kernel - 1) + 1; }

    /// Whether kernel, stride and dilation are all at least 1.
    constexpr bool valid() const { return kernel >= 1 && stride >= 1 && dilation >= 1; }

    /// The output extent over an input of extent `n`: (n + pads - span) / stride + 1, or 0
    /// when the padded input is shorter than the span.
    constexpr std::size_t output_extent(std::size_t n) const {
        const std::size_t padded = n + pad_before + pad_after;
        return padded < span() ? 0 : (padded - span()) / stride + 1;
    }

    /// "kernel 3, stride 1, dilation 1, padding 1/1".
    std::string to_string() const {
        return "kernel " + std::to_string(kernel) + ", stride " + std::to_string(stride) +
               ", dilation " + std::to_string(dilation) + ", padding " +
               std::to_string(pad_before) + "/" + std::to_string(pad_after);
    }

    friend constexpr bool operator==(const sliding_window&, const sliding_window&) = default;
};

/// A window along dimension `dim` of a tensor.
struct windowed_dim {
    std::size_t dim = 0;
    sliding_window window;

    friend constexpr bool operator==(const windowed_dim&, const windowed_dim&) = default;
};

/// The windowed dimensions of an operation (conv2d on NCHW: {{2, h}, {3, w}}), in the order
/// their halo steps run.
using windowed_dims = static_vector<windowed_dim, max_tensor_rank>;

/// One band along a windowed dimension: the rows its rank holds, the output rows it
/// computes, the input rows that needs (own rows and halos, clipped to the tensor) and the
/// padding its local window applies on either side (the image border's, or 0).
struct halo_band {
    std::size_t own_offset = 0, own_extent = 0;
    std::size_t out_offset = 0, out_extent = 0;
    std::size_t offset = 0, extent = 0;
    std::size_t pad_before = 0, pad_after = 0;

    /// Rows of the extended band before and after the rank's own rows (halos).
    constexpr std::size_t halo_before() const {
        return extent == 0 || offset >= own_offset ? 0
                                                   : std::min(own_offset, offset + extent) - offset;
    }
    constexpr std::size_t halo_after() const {
        const std::size_t end = offset + extent, own_end = own_offset + own_extent;
        return extent == 0 || end <= own_end ? 0 : end - std::max(own_end, offset);
    }

    friend constexpr bool operator==(const halo_band&, const halo_band&) = default;
};

/// Band `i` of an input extent `n` split `parts` ways, for `w` (see the file comment). An
/// empty output block needs no rows (an empty band at its own offset, no padding).
constexpr halo_band band_of(std::size_t n, std::size_t parts, std::size_t i,
                            const sliding_window& w) {
    halo_band b;
    b.own_offset = block_offset(n, parts, i);
    b.own_extent = block_extent(n, parts, i);
    const std::size_t m = w.output_extent(n);
    b.out_offset = block_offset(m, parts, i);
    b.out_extent = block_extent(m, parts, i);
    b.offset = b.own_offset;
    if (b.out_extent == 0)
        return b;
    using sl = long long; // the window may start in the padding before row 0
    const sl lo = sl(b.out_offset * w.stride) - sl(w.pad_before);
    const sl hi =
        sl((b.out_offset + b.out_extent - 1) * w.stride) - sl(w.pad_before) + sl(w.span());
    const sl a = std::clamp(lo, sl(0), sl(n)), e = std::clamp(hi, a, sl(n));
    b.offset = std::size_t(a);
    b.extent = std::size_t(e - a);
    b.pad_before = std::size_t(a - lo);
    b.pad_after = std::size_t(hi - e);
    return b;
}

/// The first band (of `n` rows split `parts` ways) whose extended band reaches beyond its
/// neighbouring bands, or `parts` when none does.
constexpr std::size_t first_band_out_of_reach(std::size_t n, std::size_t parts,
                                              const sliding_window& w) {
    for (std::size_t i = 0; i < parts; ++i) {
        const auto b = band_of(n, parts, i, w);
        if (b.extent == 0)
            continue;
        const auto first = block_holding(n, parts, b.offset);
        const auto last = block_holding(n, parts, b.offset + b.extent - 1);
        if (first + 1 < i || last > i + 1)
            return i;
    }
    return parts;
}

namespace detail {

/// The box rank `c` holds after the halo steps of the first `steps` windowed dimensions:
/// its block, with those dimensions widened to their extended bands.
template <std::size_t N>
box<N> band_box(const layout& l, const mesh_shape& mesh, const std::array<std::size_t, N>& shape,
                const windowed_dims& dims, std::size_t steps, const mesh_coords& c) {
    auto b = block_of(l, mesh, shape, c);
    for (std::size_t k = 0; k < steps; ++k) {
        const auto d = dims[k].dim;
        const auto band = band_of(shape[d], std::size_t(l.split_count(d, mesh)),
                                  std::size_t(l.block_index(d, mesh, c)), dims[k].window);
        b.offset[d] = band.offset;
        b.extent[d] = band.extent;
    }
    return b;
}

} // namespace detail

/// Throws `xshard::error` with a sentence when the windows cannot serve a tensor of global
/// `shape` laid out as `l` on `mesh`: a dimension out of range or windowed twice, a window
/// with a zero kernel, stride or dilation, a window longer than the padded input, a band that
/// needs rows from beyond its neighbours. Every rank decides alike from the same data.
template <std::size_t N>
void check_halo(const layout& l, const mesh_shape& mesh, const std::array<std::size_t, N>& shape,
                const windowed_dims& dims) {
    for (std::size_t k = 0; k < dims.size(); ++k) {
        const auto d = dims[k].dim;
        const auto& w = dims[k].window;
        if (d >= N)
            throw error("xshard: halo: dimension " + std::to_string(d) + " of a tensor of rank " +
                        std::to_string(N) + " cannot be windowed");
        for (std::size_t j = 0; j < k; ++j)
            if (dims[j].dim == d)
                throw error("xshard: halo: dimension " + std::to_string(d) + " is windowed twice");
        if (!w.valid())
            throw error("xshard: halo: the window along dimension " + std::to_string(d) + " (" +
                        w.to_string() + ") needs a kernel, stride and dilation of at least 1");
        if (w.output_extent(shape[d]) == 0)
            throw error("xshard: halo: the window along dimension " + std::to_string(d) + " (" +
                        w.to_string() + ", span " + std::to_string(w.span()) +
                        ") is longer than the padded extent " +
                        std::to_string(shape[d] + w.pad_before + w.pad_after));
        const auto parts = std::size_t(l.split_count(d, mesh));
        const auto bad = first_band_out_of_reach(shape[d], parts, w);
        if (bad == parts)
            continue;
        const auto b = band_of(shape[d], parts, bad, w);
        const auto n = shape[d];
        throw error(
            "xshard: halo: dimension " + std::to_string(d) + " of extent " + std::to_string(n) +
            " is split into " + std::to_string(parts) + " bands of " + std::to_string(n / parts) +
            (n % parts ? " or " + std::to_string(n / parts + 1) : std::string()) +
            " rows, but band " + std::to_string(bad) + " (rows [" + std::to_string(b.own_offset) +
            ", " + std::to_string(b.own_offset + b.own_extent) + ")) needs input rows [" +
            std::to_string(b.offset) + ", " + std::to_string(b.offset + b.extent) +
            ") for a window of " + w.to_string() + ": its halo of " +
            std::to_string(b.halo_before()) + " rows before and " + std::to_string(b.halo_after()) +
            " after reaches beyond its neighbouring bands (use fewer ranks along this "
            "dimension, or larger images)");
    }
}

/// Rank `rank`'s part in each halo step (one per windowed dimension, in order), as the
/// planner's step geometry: communicator axes, the box before and after, the regions sent to
/// and received from each neighbour (by group rank), the region kept. Call `check_halo`
/// first.
template <std::size_t N>
std::vector<step_geometry<N>> halo_geometry(const layout& l, const mesh_shape& mesh,
                                            const std::array<std::size_t, N>& shape,
                                            const windowed_dims& dims, int rank) {
    std::vector<step_geometry<N>> steps;
    const auto me = mesh.coords(rank);
    for (std::size_t k = 0; k < dims.size(); ++k) {
        const auto d = dims[k].dim;
        step_geometry<N> g;
        g.planned = step{step_kind::halo, l, l, l.axes(d), std::uint8_t(d), std::uint8_t(d)};
        g.group = l.split_axes(d, mesh);
        g.group_size = mesh.group_size(g.group);
        g.group_rank = mesh.group_rank(rank, g.group);
        g.in_block = detail::band_box(l, mesh, shape, dims, k, me);
        g.out_block = detail::band_box(l, mesh, shape, dims, k + 1, me);
        g.kept = g.in_block.intersect(g.out_block);
        const auto members = mesh.group_ranks(rank, g.group);
        for (int q = 0; q < g.group_size; ++q) {
            if (q == g.group_rank)
                continue;
            const auto them = mesh.coords(members[std::size_t(q)]);
            const auto out =
                g.in_block.intersect(detail::band_box(l, mesh, shape, dims, k + 1, them));
            const auto in = detail::band_box(l, mesh, shape, dims, k, them).intersect(g.out_block);
            if (!out.empty())
                g.sends.emplace_back(q, out);
            if (!in.empty())
                g.recvs.emplace_back(q, in);
        }
        steps.push_back(std::move(g));
    }
    return steps;
}

/// What a halo plan reads of a mesh: its shape, this rank's number and coordinates, and the
/// communicators of its groups of axes. Every `mesh_type` has them; so can a view of a mesh
/// that knows no axis names at compile time (a compiled program's, graph/primitive.hpp).
template <class M>
concept halo_mesh = requires(const M& m, axis_set a) {
    { m.shape() } -> std::convertible_to<const mesh_shape&>;
    { m.rank() } -> std::convertible_to<int>;
    { m.coords() } -> std::convertible_to<mesh_coords>;
    { m.sub(a) } -> std::convertible_to<const communicator&>;
};

/// A halo exchange of a tensor of element type T and rank N: built once (geometry, checks,
/// MPI datatypes, buffers), run many times (`forward`, `adjoint`: post the messages and copy;
/// nothing allocated). Construction communicates nothing and throws `xshard::error` alike on
/// every rank when the windows cannot serve the tensor (see `check_halo`).
///
/// Cost per run: per windowed dimension split over axes A, one message to and from each
/// neighbouring band over the communicator of A (at most 2 each way), of the halo rows times
/// the other extents (the box, as an MPI subarray type: no packing), plus one local copy of
/// the rank's own rows into the band. The adjoint sends the same bytes back the other way and
/// adds them up.
template <class T, std::size_t N>
class halo_plan {
public:
    using shape_type = std::array<std::size_t, N>;

    template <halo_mesh Mesh>
    halo_plan(const Mesh& mesh, const shape_type& shape, const layout& l, const windowed_dims& dims,
              const cost_model& model = {})
        : mesh_(mesh.shape())
        , shape_(shape)
        , layout_(l)
        , dims_(dims) {
        if (l.rank() != N)
            throw error("xshard: halo: the layout " + l.to_string() + " has rank " +
                        std::to_string(l.rank()) + ", the tensor " + std::to_string(N));
        check_halo(l, mesh_, shape, dims);
        const auto me = mesh.coords();
        source_ = block_of(l, mesh_, shape, me);
        band_ = detail::band_box(l, mesh_, shape, dims, dims.size(), me);
        output_shape_ = shape;
        for (const auto& wd : dims) {
            const auto d = wd.dim;
            output_shape_[d] = wd.window.output_extent(shape[d]);
            const auto b = band_of(shape[d], std::size_t(l.split_count(d, mesh_)),
                                   std::size_t(l.block_index(d, mesh_, me)), wd.window);
            pad_before_[d] = b.pad_before;
            pad_after_[d] = b.pad_after;
        }
        output_ = block_of(l, mesh_, output_shape_, me);
        std::size_t sizes[2] = {0, 0};
        auto geometry = halo_geometry(l, mesh_, shape, dims, mesh.rank());
        for (std::size_t i = 0; i < geometry.size(); ++i) {
            summary_.steps.push_back(summarize(geometry[i], mesh_, sizeof(T), model));
            if (i + 1 < geometry.size())
                sizes[i % 2] = std::max(sizes[i % 2], geometry[i].out_block.size());
            steps_.push_back(compile(mesh, std::move(geometry[i])));
        }
        std::size_t scratch = 0;
        for (auto& s : steps_) {
            std::size_t n = 0;
            for (const auto& m : s.sends)
                n += m.elements;
            scratch = std::max(scratch, n);
        }
        for (const auto& s : summary_.steps)
            summary_.seconds += s.seconds;
        for (int b = 0; b < 2; ++b)
            intermediate_[b].resize(sizes[b]);
        scratch_.resize(scratch);
        summary_.source_bytes = source_.size() * sizeof(T);
        summary_.destination_bytes = band_.size() * sizeof(T);
        summary_.peak_extra_bytes = (sizes[0] + sizes[1]) * sizeof(T);
        for (auto& s : summary_.steps)
            s.scratch_bytes = 0; // the forward needs none; the adjoint's is below
        if (!summary_.steps.empty())
            summary_.steps.back().scratch_bytes = scratch * sizeof(T);
    }

    halo_plan(halo_plan&&) noexcept = default;
    halo_plan& operator=(halo_plan&&) noexcept = default;

    /// Gathers the extended band: reads this rank's block (`source_block()` extents) at `in`,
    /// writes the band (`band()` extents) at `out`. Collective over the axes splitting the
    /// windowed dimensions; allocates nothing.
    void forward(const T* in, T* out) {
        bytes_sent_ = 0;
        const T* src = in;
        for (std::size_t i = 0; i < steps_.size(); ++i) {
            T* dst = i + 1 == steps_.size() ? out : intermediate_[i % 2].data();
            run_forward(steps_[i], src, dst);
            src = dst;
        }
        if (steps_.empty())
            std::copy_n(in, source_.size(), out);
    }

    /// The adjoint: from a gradient of the band (`band()` extents) at `grad_band`, the
    /// gradient of this rank's block at `grad_in`: its own rows' entries plus the halo
    /// entries its neighbours computed for its rows, summed. Collective like `forward`;
    /// allocates nothing.
    void adjoint(const T* grad_band, T* grad_in) {
        bytes_sent_ = 0;
        const T* src = grad_band;
        for (std::size_t i = steps_.size(); i-- > 0;) {
            T* dst = i == 0 ? grad_in : intermediate_[(i - 1) % 2].data();
            run_adjoint(steps_[i], src, dst);
            src = dst;
        }
        if (steps_.empty())
            std::copy_n(grad_band, source_.size(), grad_in);
    }

    /// This rank's block of the input (global coordinates).
    const box<N>& source_block() const noexcept { return source_; }
    /// This rank's extended band (global coordinates): its block widened by the halos.
    const box<N>& band() const noexcept { return band_; }
    /// The padding this rank's local window applies before / after its band, per dimension
    /// (the window's own at the image border, 0 where a halo serves and on other dimensions).
    const shape_type& pad_before() const noexcept { return pad_before_; }
    const shape_type& pad_after() const noexcept { return pad_after_; }
    /// The global shape of the windowed operation's output (the windowed dimensions shrunk
    /// by their windows, the others as the input's).
    const shape_type& output_shape() const noexcept { return output_shape_; }
    /// The block of that output this rank computes: the input's layout on `output_shape()`.
    const box<N>& output_block() const noexcept { return output_; }
    /// Whether this rank's band is its own block and it sends and receives nothing (no halo
    /// here: a window covering every row once, or nothing split): it may skip `forward` and
    /// `adjoint` (the other ranks expect no message from it).
    bool trivial() const noexcept { return trivial_; }
    /// The global input shape, layout and windows the plan was made for.
    const shape_type& shape() const noexcept { return shape_; }
    const layout& source_layout() const noexcept { return layout_; }
    const windowed_dims& windows() const noexcept { return dims_; }
    /// Bytes this rank handed to MPI in the last `forward` or `adjoint`.
    std::size_t bytes_sent() const noexcept { return bytes_sent_; }
    /// One `halo` step per windowed dimension: bytes, messages, predicted time (the cost
    /// model prices a halo step as an exchange: alpha per message, beta per byte).
    const plan_summary& summary() const noexcept { return summary_; }
    /// A printout: the windows, then the steps (describe() of geometry.hpp).
    std::string describe() const {
        std::string out;
        for (const auto& wd : dims_)
            out += "window on dim " + std::to_string(wd.dim) + ": " + wd.window.to_string() + " (" +
                   std::to_string(shape_[wd.dim]) + " -> " + std::to_string(output_shape_[wd.dim]) +
                   " rows)\n";
        return out + xshard::describe(summary_, mesh_);
    }

private:
    using message = detail::region_message;

    struct compiled_step {
        step_geometry<N> geo;
        communicator comm;
        std::vector<message> sends;  ///< regions of the input box (forward sends)
        std::vector<message> recvs;  ///< regions of the band box (forward receives, adjoint sends)
        std::vector<message> packed; ///< adjoint receives: the send regions, packed in scratch
        message_batch messages;
    };

    template <halo_mesh Mesh>
    compiled_step compile(const Mesh& mesh, step_geometry<N> g) {
        const communicator& comm = mesh.sub(g.group);
        compiled_step s{std::move(g), comm, {}, {}, {}, {}};
        const auto& geo = s.geo;
        std::size_t at = 0;
        for (const auto& [peer, region] : geo.sends) {
            s.sends.push_back(types_.region(peer, geo.in_block, region));
            s.packed.push_back(types_.contiguous(peer, at, region.size()));
            at += region.size();
        }
        for (const auto& [peer, region] : geo.recvs)
            s.recvs.push_back(types_.region(peer, geo.out_block, region));
        s.messages.reserve(s.sends.size() + s.recvs.size());
        trivial_ =
            trivial_ && geo.in_block == geo.out_block && geo.sends.empty() && geo.recvs.empty();
        return s;
    }

    void run_forward(compiled_step& s, const T* in, T* out) {
        bytes_sent_ += detail::exchange_step(s.comm, s.messages, s.recvs, s.sends, s.geo, in, out);
    }

    /// The forward's messages the other way round (tag 1): the halo gradients go back from
    /// the band's regions and arrive packed in scratch.
    void run_adjoint(compiled_step& s, const T* grad_out, T* grad_in) {
        const auto& geo = s.geo;
        bytes_sent_ += detail::exchange_regions(
            s.comm, s.messages, s.packed, scratch_.data(), s.recvs, grad_out, 1, [&] {
                if (!(geo.kept == geo.in_block))
                    std::fill_n(grad_in, geo.in_block.size(), T{});
                detail::copy_region(grad_out, geo.out_block.extent, geo.out_block.offset, grad_in,
                                    geo.in_block.extent, geo.in_block.offset, geo.kept);
            });
        // The neighbours' entries for this rank's rows, added in (two neighbours' regions
        // may overlap on a thin band).
        for (std::size_t j = 0; j < geo.sends.size(); ++j) {
            const auto& region = geo.sends[j].second;
            detail::for_each_run(scratch_.data() + s.packed[j].offset, region.extent, region.offset,
                                 grad_in, geo.in_block.extent, geo.in_block.offset, region,
                                 [](T* d, const T* x, std::size_t n) {
                                     for (std::size_t e = 0; e < n; ++e)
                                         d[e] += x[e];
                                 });
        }
    }

    mesh_shape mesh_;
    shape_type shape_;
    layout layout_;
    windowed_dims dims_;
    box<N> source_, band_, output_;
    shape_type output_shape_{}, pad_before_{}, pad_after_{};
    detail::region_types<T> types_;
    std::vector<compiled_step> steps_;
    std::vector<T> intermediate_[2];
    std::vector<T> scratch_;
    plan_summary summary_;
    std::size_t bytes_sent_ = 0;
    bool trivial_ = true;
};

} // namespace xshard

#ifdef XSHARD_SEPARATE_COMPILATION
namespace xshard {
#define XSHARD_DETAIL_HALO(N)                                                                      \
    XSHARD_INSTANTIATE void check_halo<N>(const layout&, const mesh_shape&,                        \
                                          const std::array<std::size_t, N>&,                       \
                                          const windowed_dims&);                                   \
    XSHARD_INSTANTIATE std::vector<step_geometry<N>> halo_geometry<N>(                             \
        const layout&, const mesh_shape&, const std::array<std::size_t, N>&, const windowed_dims&, \
        int);
XSHARD_COMPILED_RANKS(XSHARD_DETAIL_HALO)
#undef XSHARD_DETAIL_HALO
// The halos of the convolutions' NCHW tensors.
XSHARD_INSTANTIATE class halo_plan<float, 4>;
XSHARD_INSTANTIATE class halo_plan<double, 4>;
} // namespace xshard
#endif
