#pragma once
/// \file
/// Batched redistribution: many tensors moved in *one* exchange (MindSpore's fused all-gather
/// and reduce-scatter, comm_fusion). `redistribute_all(tensors, layouts)` for a one-off,
/// `batch_redistribution_plan<T>` to plan once and run every step.
///
/// The exchange moves exactly the block intersections: for each tensor, each rank sends each
/// peer the part of its source block that lies in the peer's destination block, packed with
/// the other tensors' parts for that peer into one message. Among the ranks holding a copy of
/// a source block (its replicated axes) the one whose coordinates on those axes are the
/// receiver's sends, so every element arrives once; a source partial (sum) over some axes
/// sends every term, and the receiver adds them (in rank order: the same sum on every run).
/// So a fused bucket of n bytes over a group of p ranks costs one message per peer and
/// (p-1)/p n bytes per rank for an all-gather ([dp, tp] -> [-, tp]) or a reduce-scatter
/// ([-, tp] partial(dp) -> [dp, tp]), and nothing for a slice. Destinations must be complete
/// (not partial); partial(max/min) sources are refused.

#include <xshard/compiled.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

namespace detail {

/// A contiguous run of a region inside a row-major block: its element offset in the block.
struct batch_run {
    std::size_t offset;
    std::size_t length;
};

/// The contiguous runs of `region` (global coordinates) inside the block at `block` (offset
/// and extent), in row-major order of the region.
template <std::size_t N>
void region_runs(const box<N>& block, const box<N>& region, std::vector<batch_run>& runs) {
    if (region.empty())
        return;
    if constexpr (N == 0) {
        runs.push_back({0, 1});
    } else {
        // Strides of the block; the last dimensions that the region spans whole join the run.
        std::array<std::size_t, N> stride{};
        stride[N - 1] = 1;
        for (std::size_t d = N - 1; d-- > 0;)
            stride[d] = stride[d + 1] * block.extent[d + 1];
        std::size_t inner = N - 1; // the run covers dimensions inner..N-1
        std::size_t length = region.extent[N - 1];
        while (inner > 0 && region.extent[inner] == block.extent[inner]) {
            --inner;
            length *= region.extent[inner];
        }
        std::array<std::size_t, N> index{};
        for (;;) {
            std::size_t off = 0;
            for (std::size_t d = 0; d < N; ++d) {
                const std::size_t i = d < inner ? index[d] : 0;
                off += (region.offset[d] - block.offset[d] + i) * stride[d];
            }
            runs.push_back({off, length});
            std::size_t d = inner;
            while (d > 0) {
                --d;
                if (++index[d] < region.extent[d])
                    break;
                index[d] = 0;
                if (d == 0)
                    return;
            }
            if (inner == 0)
                return;
        }
    }
}

} // namespace detail

/// A plan moving many tensors of element type T on one mesh from their layouts to others in
/// one exchange (see the file comment). Built by `add`ing the tensors (their global shapes and
/// layouts; every rank adds the same ones in the same order), run by `execute` with their
/// local shards. Construction communicates nothing; `execute` is collective over the mesh.
template <class T>
class batch_redistribution_plan {
public:
    template <mesh_type Mesh>
    explicit batch_redistribution_plan(const Mesh& mesh)
        : batch_redistribution_plan(mesh.comm(), mesh.shape()) {}

    /// A plan on the mesh of shape `shape` over communicator `comm` (the mesh's: its ranks
    /// in row-major order of the coordinates).
    batch_redistribution_plan(const communicator& comm, const mesh_shape& shape)
        : comm_(comm)
        , mesh_(shape)
        , rank_(comm.rank())
        , sends_(std::size_t(comm_.size()))
        , recvs_(std::size_t(comm_.size())) {}

    /// Adds a tensor of global `shape` going from `from` to `to`; returns its index (the
    /// position of its shards in `execute`'s spans). Throws xshard::error for a partial
    /// destination or a partial(max/min) source, or a layout that does not fit the mesh.
    template <std::size_t N>
    std::size_t add(const std::array<std::size_t, N>& shape, const layout& from, const layout& to) {
        try {
            from.validate(mesh_);
            to.validate(mesh_);
        } catch (const std::invalid_argument& e) {
            throw error(e.what());
        }
        if (from.rank() != N || to.rank() != N)
            throw error("xshard: redistribute_all: the layouts " + from.to_string() + " and " +
                        to.to_string() + " do not have the tensor's rank " + std::to_string(N));
        if (to.is_partial())
            throw error("xshard: redistribute_all: the destination " + to.to_string() +
                        " is partial; batched redistribution makes complete tensors");
        if (from.is_partial() && from.op != reduction::sum)
            throw error("xshard: redistribute_all: a partial(" + std::string(to_string(from.op)) +
                        ") source is not supported");
        const std::size_t index = in_sizes_.size();
        const auto mine_in = block_of(from, mesh_, shape, rank_);
        const auto mine_out = block_of(to, mesh_, shape, rank_);
        in_sizes_.push_back(mine_in.size());
        out_sizes_.push_back(mine_out.size());
        sums_.push_back(from.is_partial());
        const axis_set copies = from.replicated_axes(mesh_);
        const auto me = mesh_.coords(rank_);
        auto same_on_copies = [&](const mesh_coords& c) {
            for (std::size_t a = 0; a < mesh_.ndim(); ++a)
                if (copies.contains(a) && c[a] != me[a])
                    return false;
            return true;
        };
        for (int peer = 0; peer < comm_.size(); ++peer) {
            const auto pc = mesh_.coords(peer);
            if (!same_on_copies(pc))
                continue;
            // What I send the peer: my source block within its destination block.
            const auto give = mine_in.intersect(block_of(to, mesh_, shape, peer));
            // What the peer sends me: its source block within my destination block.
            const auto take = block_of(from, mesh_, shape, peer).intersect(mine_out);
            add_pieces(sends_[std::size_t(peer)], index, mine_in, give);
            add_pieces(recvs_[std::size_t(peer)], index, mine_out, take);
        }
        return index;
    }

    /// The number of tensors added.
    std::size_t size() const noexcept { return in_sizes_.size(); }

    /// The elements of this rank's source and destination shards of tensor i.
    std::size_t source_size(std::size_t i) const { return in_sizes_[i]; }
    std::size_t destination_size(std::size_t i) const { return out_sizes_[i]; }

    /// The bytes this rank sends to other ranks per execution.
    std::size_t bytes_sent() const {
        std::size_t n = 0;
        for (int p = 0; p < comm_.size(); ++p)
            if (p != rank_)
                n += sends_[std::size_t(p)].elements * sizeof(T);
        return n;
    }

    /// Runs the exchange: `in[i]` is this rank's source shard of tensor i, `out[i]` its
    /// destination shard (not overlapping any input). Collective over the mesh: one message
    /// to and from each peer that shares data with this rank.
    void execute(std::span<const T* const> in, std::span<T* const> out) {
        start(in, out);
        finish();
    }

    /// The first half of `execute`, nonblocking: packs what this rank sends (so `in` may be
    /// freed or overwritten as soon as it returns), posts the messages (tag `tag`: plans in
    /// flight at once on one communicator use distinct tags) and writes this rank's own part.
    /// `out` must stay valid and untouched until `finish()`. Every rank starts the same plans
    /// in the same order.
    void start(std::span<const T* const> in, std::span<T* const> out, int tag = 7) {
        if (in.size() != size() || out.size() != size())
            throw error("xshard: redistribute_all: the plan is for " + std::to_string(size()) +
                        " tensors, not " + std::to_string(in.size()));
        if (in_flight_)
            throw error("xshard: redistribute_all: the plan was started again before finish()");
        out_.assign(out.begin(), out.end());
        const auto p = std::size_t(comm_.size());
        buffers_.resize(2 * p);
        messages_.reserve(2 * p);
        for (std::size_t i = 0; i < size(); ++i)
            if (sums_[i])
                std::fill_n(out[i], out_sizes_[i], T{});
        for (std::size_t peer = 0; peer < p; ++peer) {
            if (int(peer) == rank_ || recvs_[peer].elements == 0)
                continue;
            auto& b = buffers_[p + peer];
            b.resize(recvs_[peer].elements);
            messages_.irecv(comm_, b.data(), count_of(b.size()), datatype_of<T>(), int(peer), tag);
        }
        for (std::size_t peer = 0; peer < p; ++peer) {
            if (int(peer) == rank_ || sends_[peer].elements == 0)
                continue;
            auto& b = buffers_[peer];
            b.resize(sends_[peer].elements);
            T* at = b.data();
            for (const auto& piece : sends_[peer].pieces)
                for (const auto& r : piece.runs) {
                    at = std::copy_n(in[piece.tensor] + r.offset, r.length, at);
                }
            messages_.isend(comm_, b.data(), count_of(b.size()), datatype_of<T>(), int(peer), tag);
        }
        // This rank's own part, while the messages travel.
        const auto self = std::size_t(rank_);
        {
            auto& s = sends_[self];
            auto& r = recvs_[self];
            // Same pieces on both sides, in the same order: copy run to run.
            std::vector<T>& staging = buffers_[self];
            staging.resize(s.elements);
            T* at = staging.data();
            for (const auto& piece : s.pieces)
                for (const auto& run : piece.runs)
                    at = std::copy_n(in[piece.tensor] + run.offset, run.length, at);
            unpack(r, staging.data(), out);
        }
        in_flight_ = true;
    }

    /// Whether a started exchange has arrived (progressing its messages; never blocks).
    bool test() { return !in_flight_ || messages_.test_all(); }

    /// Frees the staging buffers (kept between runs otherwise, so that a run allocates
    /// nothing): for a caller that holds memory only while in use (optimizer sharding's
    /// level3). Not while an exchange is in flight.
    void release_buffers() {
        if (in_flight_)
            return;
        std::vector<std::vector<T>>().swap(buffers_);
    }

    /// Whether the plan was started and not yet finished.
    bool in_flight() const noexcept { return in_flight_; }

    /// The second half of `execute`: waits for the messages and writes what arrived into the
    /// destinations given to `start`. Does nothing when no exchange is in flight.
    void finish() {
        if (!in_flight_)
            return;
        in_flight_ = false;
        messages_.wait_all();
        const auto p = std::size_t(comm_.size());
        for (std::size_t peer = 0; peer < p; ++peer)
            if (int(peer) != rank_ && recvs_[peer].elements)
                unpack(recvs_[peer], buffers_[p + peer].data(), out_);
    }

private:
    struct piece {
        std::size_t tensor;
        std::vector<detail::batch_run> runs;
    };
    struct peer_pieces {
        std::vector<piece> pieces;
        std::size_t elements = 0;
    };

    template <std::size_t N>
    static void add_pieces(peer_pieces& to, std::size_t tensor, const box<N>& block,
                           const box<N>& region) {
        if (region.empty())
            return;
        piece pc{tensor, {}};
        detail::region_runs(block, region, pc.runs);
        to.elements += region.size();
        to.pieces.push_back(std::move(pc));
    }

    static int count_of(std::size_t n) {
        if (n > std::size_t(INT_MAX))
            throw error("xshard: redistribute_all: a message of " + std::to_string(n) +
                        " elements is too large for one MPI count; use smaller fusion buckets");
        return int(n);
    }

    void unpack(const peer_pieces& from, const T* data, std::span<T* const> out) const {
        for (const auto& pc : from.pieces) {
            T* dst = out[pc.tensor];
            const bool sum = sums_[pc.tensor];
            for (const auto& r : pc.runs) {
                if (sum)
                    for (std::size_t k = 0; k < r.length; ++k)
                        dst[r.offset + k] += data[k];
                else
                    std::copy_n(data, r.length, dst + r.offset);
                data += r.length;
            }
        }
    }

    communicator comm_;
    mesh_shape mesh_;
    int rank_;
    std::vector<std::size_t> in_sizes_, out_sizes_;
    std::vector<bool> sums_;
    std::vector<peer_pieces> sends_, recvs_;
    std::vector<std::vector<T>> buffers_;
    std::vector<T*> out_; // the destinations of the exchange in flight
    bool in_flight_ = false;
    message_batch messages_;
};

/// The tensors of `tensors` (a std::vector of one distributed tensor type) in the layouts
/// `to` (one per tensor), moved in one exchange (see the file comment). Collective over their
/// mesh. Throws xshard::error on every rank alike for a count mismatch, a tensor on another
/// mesh, or a layout the batch cannot make.
template <distributed_tensor D>
std::vector<dtensor<typename D::value_type, typename D::mesh_type, dynamic_layout(D::rank)>>
redistribute_all(const std::vector<D>& tensors, const std::vector<layout>& to) {
    using T = typename D::value_type;
    using R = dtensor<T, typename D::mesh_type, dynamic_layout(D::rank)>;
    if (tensors.size() != to.size())
        throw error("xshard: redistribute_all: " + std::to_string(tensors.size()) +
                    " tensors but " + std::to_string(to.size()) + " layouts");
    std::vector<R> out;
    if (tensors.empty())
        return out;
    batch_redistribution_plan<T> plan(tensors.front().mesh());
    std::vector<const T*> in;
    std::vector<T*> dst;
    out.reserve(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const auto& t = tensors[i];
        if (!(t.mesh() == tensors.front().mesh()))
            throw error("xshard: redistribute_all: tensor " + std::to_string(i) +
                        " lives on another mesh than tensor 0");
        plan.add(t.shape(), t.layout(), to[i]);
        const auto& ms = t.mesh().shape();
        out.push_back(
            R(detail::unchecked, t.mesh(), t.shape(),
              R::local_type::from_shape(block_of(to[i], ms, t.shape(), t.mesh().rank()).extent),
              to[i]));
        in.push_back(t.local().data());
        dst.push_back(out.back().local().data());
    }
    plan.execute(in, dst);
    return out;
}

/// The tensors of the tuple `tensors` (of one element type and mesh, any ranks) in the
/// layouts `to`, moved in one exchange. Collective over their mesh.
template <distributed_tensor... D>
requires(sizeof...(D) > 0) auto redistribute_all(const std::tuple<D...>& tensors,
                                                 const std::array<layout, sizeof...(D)>& to) {
    using First = std::tuple_element_t<0, std::tuple<D...>>;
    using T = typename First::value_type;
    static_assert((std::is_same_v<typename D::value_type, T> && ...),
                  "xshard: redistribute_all moves tensors of one element type in one exchange");
    using Out = std::tuple<dtensor<T, typename D::mesh_type, dynamic_layout(D::rank)>...>;
    batch_redistribution_plan<T> plan(std::get<0>(tensors).mesh());
    std::vector<const T*> in;
    std::vector<T*> dst;
    std::size_t i = 0;
    Out out = std::apply(
        [&](const auto&... t) {
            auto one = [&](const auto& x) {
                using X = std::remove_cvref_t<decltype(x)>;
                using R = dtensor<T, typename X::mesh_type, dynamic_layout(X::rank)>;
                const layout& l = to[i++];
                plan.add(x.shape(), x.layout(), l);
                const auto& ms = x.mesh().shape();
                return R(
                    detail::unchecked, x.mesh(), x.shape(),
                    R::local_type::from_shape(block_of(l, ms, x.shape(), x.mesh().rank()).extent),
                    l);
            };
            return Out{one(t)...};
        },
        tensors);
    std::apply([&](const auto&... t) { (in.push_back(t.local().data()), ...); }, tensors);
    std::apply([&](auto&... t) { (dst.push_back(t.local().data()), ...); }, out);
    plan.execute(in, dst);
    return out;
}

} // namespace xshard

#ifdef XSHARD_SEPARATE_COMPILATION
namespace xshard {
#define XSHARD_DETAIL_BATCH(T) XSHARD_INSTANTIATE class batch_redistribution_plan<T>;
XSHARD_COMPILED_ELEMENTS(XSHARD_DETAIL_BATCH)
#undef XSHARD_DETAIL_BATCH
#define XSHARD_DETAIL_BATCH_ADD(T, N)                                                              \
    XSHARD_INSTANTIATE std::size_t batch_redistribution_plan<T>::add<N>(                           \
        const std::array<std::size_t, N>&, const layout&, const layout&);
XSHARD_COMPILED_ELEMENTS_AND_RANKS(XSHARD_DETAIL_BATCH_ADD)
#undef XSHARD_DETAIL_BATCH_ADD
} // namespace xshard
#endif
