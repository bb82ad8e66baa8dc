#pragma once
/// \file
/// A redistribution plan: built once (the expensive part: choosing the candidate, working
/// out every message, making the MPI datatypes, allocating the buffers), executed many
/// times (the cheap part: posting the messages and copying; nothing is allocated).

#include <xshard/compiled.hpp>
#include <xshard/comm/counting_allocator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/pairwise_reduce.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/redistribute/copy.hpp>
#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/meter.hpp>
#include <xshard/redistribute/node_step.hpp>
#include <xshard/redistribute/planner.hpp>
#include <xshard/redistribute/region_exchange.hpp>
#include <xshard/redistribute/region_message.hpp>
#include <xshard/redistribute/route.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace xshard {

/// A plan that moves the local shards of a tensor of element type T and rank N from one
/// layout to another on a mesh. Construction communicates nothing (every rank works out
/// the same choice from the same data); `execute` is collective over the mesh. For a
/// tensor of at least `reduce_tuning::shared_memory_min_bytes`, the first `execute` splits
/// each step's communicator by node and, where all its members share one node, sets the
/// step up to run through shared-memory windows (node_step.hpp); destroying a plan that
/// holds windows is then collective over those members (MPI_Win_free), so destroy plans in
/// the same order on every rank. Tensors whose shards live in node storage (`node_shared`
/// meshes) take the shared-memory path from 1 MiB on by default (`tuning_for`).
template <class T, std::size_t N>
class redistribution_plan {
public:
    using shape_type = std::array<std::size_t, N>;

    /// Plans `from` -> `to` for a tensor of global `shape` on `mesh`, choosing among
    /// `candidates` (those of `plan_redistribution(from, to)` by default).
    template <mesh_type Mesh>
    redistribution_plan(const Mesh& mesh, const shape_type& shape, const layout& from,
                        const layout& to, const cost_model& model = {},
                        const reduce_tuning& tuning = {})
        : redistribution_plan(mesh, shape, plan_redistribution(from, to), model, tuning) {}

    template <mesh_type Mesh>
    redistribution_plan(const Mesh& mesh, const shape_type& shape,
                        const plan_candidates& candidates, const cost_model& model = {},
                        const reduce_tuning& tuning = {})
        : mesh_(mesh.shape())
        , shape_(shape)
        , tuning_(tuning_for<Mesh>(tuning))
        , stats_(std::make_unique<allocation_stats>())
        , reducer_(tuning_, stats_.get())
        , rank_(mesh.rank()) {
        build(candidates, model, tuning,
              [&mesh](axis_set axes) -> const communicator& { return mesh.sub(axes); });
    }

    redistribution_plan(redistribution_plan&&) noexcept = default;
    redistribution_plan& operator=(redistribution_plan&&) noexcept = default;

    /// Runs the plan: reads this rank's source block at `in`, writes its destination block
    /// at `out` (they must not overlap). Collective over the mesh; allocates nothing.
    void execute(const T* in, T* out) {
        bytes_sent_ = 0;
        if (identity_) {
            std::copy_n(in, from_block_.size(), out);
            return;
        }
        const T* src = in;
        for (std::size_t i = 0; i < steps_.size(); ++i) {
            T* dst = steps_[i].last ? out : intermediate_[i % 2].data();
            run(steps_[i], src, dst);
            src = dst;
        }
        redistribution_meter::record(summary_.seconds, bytes_sent_);
    }

    /// The steps, bytes, memory and predicted time of this rank's part.
    const plan_summary& summary() const noexcept { return summary_; }
    /// A printout of the summary.
    std::string describe() const { return xshard::describe(summary_, mesh_); }
    /// This rank's source and destination blocks.
    const box<N>& source_block() const noexcept { return from_block_; }
    const box<N>& destination_block() const noexcept { return to_block_; }
    /// The global shape the plan was made for.
    const shape_type& shape() const noexcept { return shape_; }
    /// The bytes this rank handed to MPI in the last `execute`.
    std::size_t bytes_sent() const noexcept { return bytes_sent_; }
    /// What the plan allocated for its intermediate blocks and scratch buffers (not its
    /// shared-memory windows: see `window_bytes`).
    const allocation_stats& allocations() const noexcept { return *stats_; }
    /// How many steps run through shared memory rather than MPI messages.
    std::size_t shared_memory_steps() const noexcept {
        return std::size_t(std::count_if(steps_.begin(), steps_.end(),
                                         [](const compiled_step& s) { return bool(s.node); }));
    }
    /// How many shared-memory steps' last run had every member write its block into the
    /// destinations (every output block in node storage) instead of reading.
    std::size_t steps_written_in_place() const noexcept {
        return std::size_t(std::count_if(steps_.begin(), steps_.end(), [](const compiled_step& s) {
            return s.node && s.node->wrote_in_place();
        }));
    }
    /// The bytes of this rank's shared-memory windows (staging for peers' reads).
    std::size_t window_bytes() const noexcept {
        std::size_t n = 0;
        for (const auto& s : steps_)
            if (s.node)
                n += s.node->window_bytes();
        return n;
    }

    /// The tuning a plan on mesh type Mesh uses: `tuning`, except that tensors whose shards
    /// live in node storage (a mesh type with a shard allocator, `node_shared<M>`) take the
    /// shared-memory path from `node_storage_min_bytes` on, all-reduces included, unless
    /// `tuning` already sets a threshold: their blocks are read in place, which pays.
    template <class Mesh>
    static reduce_tuning tuning_for(reduce_tuning tuning) {
        if constexpr (has_shard_allocator<Mesh>) {
            if (tuning.shared_memory_min_bytes == SIZE_MAX) {
                tuning.shared_memory_min_bytes = node_storage_min_bytes;
                tuning.shared_memory_all_reduce = true;
            }
        }
        return tuning;
    }
    /// The size from which tensors in node storage take the shared-memory path by default.
    static constexpr std::size_t node_storage_min_bytes = std::size_t(1) << 20;

private:
    using buffer = std::vector<T, counting_allocator<T>>;

    using message = detail::region_message;

    struct compiled_step {
        step_geometry<N> geo;
        communicator comm;
        std::vector<message> sends, recvs;
        message_batch messages;
        std::vector<reduce_piece> pieces; ///< reduce_scatter: every member's piece
        bool chunked = false;             ///< reduce_scatter: contiguous pieces, pipelined
        /// reduce_scatter through MPI's collective (short pieces): every member's count, in
        /// group order (empty: the pairwise path).
        std::vector<int> mpi_counts;
        bool equal_counts = false; ///< all of mpi_counts alike
        bool last = false;
        std::unique_ptr<node_step<T, N>> node; ///< the shared-memory path, when it applies
        bool node_decided = false;             ///< whether the first run chose the path
    };

    /// The first run of a step decides (collectively, over the step's communicator) whether
    /// it takes the shared-memory path, and sets that path up; later runs reuse it. Lazily,
    /// so that building a plan stays free of communication (a plan built on one rank only,
    /// to print it, is fine).
    void decide_path(compiled_step& s) {
        s.node_decided = true;
        const auto& geo = s.geo;
        if (!geo.valid ||
            !node_path_applies(geo.planned.kind, geo.group_size, tensor_bytes(), tuning_))
            return;
        std::vector<box<N>> peer_in, peer_out; // where each member's blocks sit
        for (const int r : mesh_.group_ranks(rank_, geo.group)) {
            peer_in.push_back(block_of(geo.planned.from, mesh_, shape_, r));
            peer_out.push_back(block_of(geo.planned.to, mesh_, shape_, r));
        }
        s.node = node_step<T, N>::make(s.comm, geo, std::move(peer_in), std::move(peer_out),
                                       tensor_bytes(), tuning_);
        if (s.node)
            s.messages = message_batch(); // the MPI path's slots are not needed
    }

    /// The constructor's work, for every mesh type alike: `sub` gives the communicator of
    /// this rank's group along a set of the mesh's axes.
    void build(const plan_candidates& candidates, const cost_model& model,
               const reduce_tuning& tuning,
               const std::function<const communicator&(axis_set)>& sub) {
        const auto path = choose_route(candidates, mesh_, shape_, sizeof(T), model, tuning).steps;
        summary_ = summarize(path, mesh_, shape_, sizeof(T), rank_, model, tuning);
        from_block_ = block_of(candidates.from, mesh_, shape_, rank_);
        to_block_ = block_of(candidates.to, mesh_, shape_, rank_);
        // Intermediate blocks alternate between two buffers: step i writes buffer i % 2
        // while reading the other.
        std::size_t sizes[2] = {0, 0};
        for (std::size_t i = 0; i < path.size(); ++i) {
            auto g = geometry_of(path[i], mesh_, shape_, rank_);
            if (i + 1 < path.size())
                sizes[i % 2] = std::max(sizes[i % 2], g.out_block.size());
            const communicator& comm = sub(g.group);
            steps_.push_back(compile(comm, std::move(g), i + 1 == path.size()));
        }
        for (int b = 0; b < 2; ++b)
            intermediate_[b].resize(sizes[b]);
        identity_ = path.empty();
    }

    compiled_step compile(const communicator& comm, step_geometry<N> g, bool last) {
        compiled_step s{std::move(g), {}, {}, {}, {}, {}, false, {}, false, last, nullptr, false};
        const auto& geo = s.geo;
        s.comm = comm;
        switch (geo.planned.kind) {
        case step_kind::all_reduce:
            reducer_.reserve_all_reduce(geo.in_block.size(), std::size_t(geo.group_size));
            break;
        case step_kind::reduce_scatter: {
            // Every member holds the same input block, so every member makes the same
            // choice of chunking from the same pieces.
            s.pieces.resize(std::size_t(geo.group_size));
            auto piece = [&](const box<N>& region) {
                const auto m = types_.region(0, geo.in_block, region);
                return reduce_piece{m.offset, m.elements, m.count, m.type};
            };
            s.chunked = pipelined(geo);
            for (const auto& [peer, region] : geo.sends)
                s.pieces[std::size_t(peer)] = piece(region);
            s.pieces[std::size_t(geo.group_rank)].elements = geo.out_block.size();
            std::size_t largest = 0;
            for (const auto& p : s.pieces)
                largest = std::max(largest, p.elements);
            if (geo.valid && !tuning_.pairwise_reduce_scatter(
                                 geo.in_block.size(), std::size_t(geo.group_size), sizeof(T)))
                compile_mpi_reduce_scatter(s);
            if (s.mpi_counts.empty())
                reducer_.reserve(geo.out_block.size(), largest, s.chunked);
            break;
        }
        case step_kind::zero:
            break;
        default:
            for (const auto& [peer, region] : geo.sends)
                s.sends.push_back(types_.region(peer, geo.in_block, region));
            for (const auto& [peer, region] : geo.recvs)
                s.recvs.push_back(types_.region(peer, geo.out_block, region));
            s.messages.reserve(s.sends.size() + s.recvs.size());
            break;
        }
        return s;
    }

    std::size_t tensor_bytes() const {
        std::size_t n = sizeof(T);
        for (const auto e : shape_)
            n = detail::saturating_mul(n, e);
        return n;
    }

    void run(compiled_step& s, const T* in, T* out) {
        const auto& geo = s.geo;
        if (!s.node_decided)
            decide_path(s);
        if (s.node) {
            run_node(s, in, out);
            return;
        }
        switch (geo.planned.kind) {
        case step_kind::all_reduce:
            bytes_sent_ +=
                reducer_.all_reduce(s.comm, in, out, geo.in_block.size(), geo.planned.from.op);
            break;
        case step_kind::zero:
            if (geo.holds_term)
                std::copy_n(in, geo.out_block.size(), out);
            else
                std::fill_n(out, geo.out_block.size(), T{});
            break;
        case step_kind::reduce_scatter:
            if (!s.mpi_counts.empty()) {
                run_mpi_reduce_scatter(s, in, out);
                break;
            }
            // This rank's own term of its piece first, then the others' terms added in.
            detail::copy_region(in, geo.in_block.extent, geo.in_block.offset, out,
                                geo.out_block.extent, geo.out_block.offset, geo.out_block);
            bytes_sent_ +=
                reducer_.reduce_scatter(s.comm, in, s.pieces, out, geo.planned.from.op, s.chunked);
            break;
        default:
            run_exchange(s, in, out);
            break;
        }
    }

    /// Sets up a reduce_scatter of short pieces to run through MPI's collective, for the
    /// types MPI can add, pieces that lie in group order, each one run of the input block
    /// (always so for contiguous pieces: a reduce-scatter acts on one axis), and int counts;
    /// else the step stays on the pairwise path, which sends strided pieces without packing
    /// them. Every member holds the same input block and decides alike.
    void compile_mpi_reduce_scatter(compiled_step& s) {
        if constexpr (summable<T>) {
            // From every piece, this rank's own included, so that every member decides alike
            // (an empty piece is in order wherever it is).
            const auto& geo = s.geo;
            std::vector<box<N>> pieces(std::size_t(geo.group_size));
            for (const auto& [peer, region] : geo.sends)
                pieces[std::size_t(peer)] = region;
            pieces[std::size_t(geo.group_rank)] = geo.out_block;
            std::vector<int> counts;
            std::size_t at = 0;
            for (const auto& b : pieces) {
                if (b.size() > std::size_t(INT_MAX) ||
                    (!b.empty() && (!detail::is_contiguous_in(geo.in_block.extent, b) ||
                                    offset_in(geo.in_block, b) != at)))
                    return;
                at += b.size();
                counts.push_back(int(b.size()));
            }
            s.equal_counts = std::all_of(counts.begin(), counts.end(),
                                         [&](int c) { return c == counts.front(); });
            s.mpi_counts = std::move(counts);
        }
    }

    /// The reduce-scatter of a step set up by compile_mpi_reduce_scatter.
    void run_mpi_reduce_scatter(compiled_step& s, const T* in, T* out) {
        if constexpr (summable<T>) {
            const auto& geo = s.geo;
            // Equal pieces through MPI_Reduce_scatter_block, whose algorithms (recursive
            // halving among them) Open MPI does not use for MPI_Reduce_scatter's counts.
            if (s.equal_counts)
                mpi::reduce_scatter_block(s.comm, std::span(in, geo.in_block.size()),
                                          std::span(out, geo.out_block.size()),
                                          geo.planned.from.op);
            else
                mpi::reduce_scatter(s.comm, std::span(in, geo.in_block.size()),
                                    std::span(out, geo.out_block.size()), s.mpi_counts,
                                    geo.planned.from.op);
            bytes_sent_ += (geo.in_block.size() - geo.out_block.size()) * sizeof(T);
        }
    }

    /// The element offset of `region`'s first element inside `block` (row-major).
    static std::size_t offset_in(const box<N>& block, const box<N>& region) {
        std::size_t offset = 0;
        for (std::size_t d = 0; d < N; ++d)
            offset = offset * block.extent[d] + (region.offset[d] - block.offset[d]);
        return offset;
    }

    void run_node(compiled_step& s, const T* in, T* out) {
        const auto& geo = s.geo;
        switch (geo.planned.kind) {
        case step_kind::all_reduce:
            bytes_sent_ += s.node->all_reduce(in, out, geo.in_block.size(), geo.planned.from.op);
            break;
        case step_kind::reduce_scatter:
            bytes_sent_ += s.node->reduce_scatter(geo, in, out, geo.planned.from.op);
            break;
        default:
            bytes_sent_ += s.node->exchange(geo, in, out);
            break;
        }
    }

    void run_exchange(compiled_step& s, const T* in, T* out) {
        bytes_sent_ += detail::exchange_step(s.comm, s.messages, s.recvs, s.sends, s.geo, in, out);
    }

    mesh_shape mesh_;
    shape_type shape_;
    reduce_tuning tuning_;
    std::unique_ptr<allocation_stats> stats_;
    reducer<T> reducer_;
    buffer intermediate_[2] = {buffer(counting_allocator<T>(stats_.get())),
                               buffer(counting_allocator<T>(stats_.get()))};
    detail::region_types<T> types_;
    std::vector<compiled_step> steps_;
    plan_summary summary_;
    box<N> from_block_, to_block_;
    int rank_ = 0;
    bool identity_ = false;
    std::size_t bytes_sent_ = 0;
};

} // namespace xshard

#ifdef XSHARD_SEPARATE_COMPILATION
namespace xshard {
#define XSHARD_DETAIL_PLAN(T, N) XSHARD_INSTANTIATE class redistribution_plan<T, N>;
XSHARD_COMPILED_ELEMENTS_AND_RANKS(XSHARD_DETAIL_PLAN)
#undef XSHARD_DETAIL_PLAN
} // namespace xshard
#endif
