#pragma once
/// \file
/// Cross-mesh redistribution: from a layout on one mesh to a layout on another mesh whose
/// ranks are some ranks of the same communicator (pipeline stages of different shapes,
/// loading a tensor saved by other ranks, resharding a live model onto fewer or more ranks).
/// The two meshes may be disjoint, overlap or be the same ranks; ranks in neither take no
/// part. Extents need not divide (the block rule of core/partition.hpp on each mesh).
///
/// The plan is one exchange of exactly the block intersections: every destination rank
/// receives the part of its block that each source block holds, from one holder of that
/// block (itself when it holds it, otherwise the replicas take turns by destination rank,
/// which spreads the sends). A source with pending terms (partial axes) sends each term and
/// the destination adds them up (in term order, so every run gives the same bits); a
/// destination with a pending sum keeps the values on the ranks at coordinate 0 of its
/// partial axes and zeros elsewhere (max and min keep them everywhere). Like plan.hpp,
/// building communicates nothing: every rank works out every rank's part from the meshes,
/// the layouts and the shape; running posts at most one message per peer, described by a
/// contiguous count or an MPI subarray datatype (any count: comm/subarray.hpp).

#include <xshard/comm/combine.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/redistribute/copy.hpp>
#include <xshard/redistribute/cost_model.hpp>
#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/region_message.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace xshard {

/// A mesh laid over some ranks of a communicator: mesh rank i is communicator rank
/// `ranks[i]` (so `ranks.size() == shape.size()`).
struct placed_mesh {
    mesh_shape shape;
    std::vector<int> ranks;

    /// This communicator rank's rank in the mesh, or -1 when it is not in it.
    int mesh_rank_of(int comm_rank) const {
        const auto it = std::find(ranks.begin(), ranks.end(), comm_rank);
        return it == ranks.end() ? -1 : int(it - ranks.begin());
    }

    /// The ranks of a mesh of shape `full` (numbered as its communicator) at coordinate
    /// `index` of axis `axis`, in row-major order of the other axes, as a mesh of shape
    /// `shape` (the stage of a pipeline, whose own mesh may factor the same ranks another
    /// way). Throws `xshard::error` when the sizes do not match.
    static placed_mesh slice_of(const mesh_shape& full, std::size_t axis, int index,
                                const mesh_shape& shape) {
        if (axis >= full.ndim() || index < 0 || index >= full.sizes[axis])
            throw error("xshard: placed_mesh: no coordinate " + std::to_string(index) +
                        " on axis " + std::to_string(axis) + " of mesh(" + full.to_string() + ")");
        placed_mesh p{shape, {}};
        for (int r = 0; r < full.size(); ++r)
            if (full.coords(r)[axis] == index)
                p.ranks.push_back(r);
        if (int(p.ranks.size()) != shape.size())
            throw error("xshard: placed_mesh: a mesh(" + shape.to_string() + ") of " +
                        std::to_string(shape.size()) + " ranks over a slice of " +
                        std::to_string(p.ranks.size()) + " ranks of mesh(" + full.to_string() +
                        ")");
        return p;
    }

    /// "mesh(dp=2, tp=2) on ranks {4, 5, 6, 7}".
    std::string to_string() const {
        std::string s = "mesh(" + shape.to_string() + ") on ranks {";
        for (std::size_t i = 0; i < ranks.size(); ++i)
            s += (i ? ", " : "") + std::to_string(ranks[i]);
        return s + "}";
    }
};

/// A plan moving a tensor of element type T and rank N from layout `from` on mesh `src` to
/// layout `to` on mesh `dst`, both placed on communicator `comm` (see the file comment).
/// Built once, run many times. Communication of `execute`: each destination rank receives
/// its block once per pending term of the source (one message per source block it meets,
/// none for the parts it holds itself); each source rank sends at most one message per
/// destination rank. Peak extra memory: the received terms beyond the first.
template <class T, std::size_t N>
class cross_mesh_plan {
public:
    using shape_type = std::array<std::size_t, N>;

    /// Plans the move; every rank of `comm` may build it (ranks in neither mesh get an
    /// empty part). Communicates nothing. Throws `xshard::error`, alike on every rank given
    /// the same arguments, when a layout does not fit its mesh or has another rank than the
    /// tensor, or a mesh's ranks are not distinct ranks of `comm`. Messages use tag `tag`.
    cross_mesh_plan(const communicator& comm, const shape_type& shape, placed_mesh src,
                    const layout& from, placed_mesh dst, const layout& to, int tag = 0,
                    const cost_model& model = {})
        : comm_(comm)
        , shape_(shape)
        , src_(std::move(src))
        , dst_(std::move(dst))
        , from_(from)
        , to_(to)
        , tag_(tag) {
        check_mesh(src_, "source");
        check_mesh(dst_, "destination");
        check_layout(from_, src_, "source");
        check_layout(to_, dst_, "destination");
        const int me = comm_.rank();
        src_rank_ = src_.mesh_rank_of(me);
        dst_rank_ = dst_.mesh_rank_of(me);
        if (src_rank_ >= 0)
            src_block_ = block_of(from_, src_.shape, shape_, src_rank_);
        if (dst_rank_ >= 0) {
            dst_block_ = block_of(to_, dst_.shape, shape_, dst_rank_);
            holds_values_ = holds_values(dst_rank_);
        }
        terms_ = src_.shape.group_size(from_.partial_axes(src_.shape));
        src_index_.assign(std::size_t(comm_.size()), -1);
        for (std::size_t i = 0; i < src_.ranks.size(); ++i)
            src_index_[std::size_t(src_.ranks[i])] = int(i);
        if (src_rank_ >= 0)
            plan_sends();
        if (dst_rank_ >= 0 && holds_values_)
            plan_receives();
        summarize(model);
    }

    cross_mesh_plan(cross_mesh_plan&&) noexcept = default;
    cross_mesh_plan& operator=(cross_mesh_plan&&) noexcept = default;

    /// Runs the plan: reads this rank's source block at `in` (if it is in the source mesh),
    /// writes its destination block at `out` (if it is in the destination mesh); the two
    /// must not overlap. Collective over the ranks of both meshes; the others return at
    /// once. Allocates nothing.
    void execute(const T* in, T* out) {
        post_receives(out, nullptr);
        post_sends(in);
        batch_.wait_all();
        finish(in, out);
    }

    /// The receiving half, for callers that overlap it with other work: posts this rank's
    /// receives into `out` (none for source ranks `skip[i]` true: senders known not to send),
    /// then `wait()` and `finish(in, out)`.
    void post_receives(T* out, const std::vector<bool>* skip) {
        for (auto& r : recvs_) {
            if (skip && (*skip)[std::size_t(r.peer)])
                continue;
            T* at = r.term == 0 ? out + r.offset : scratch_.data() + r.offset;
            batch_.irecv(comm_, at, r.count, r.type, src_.ranks[std::size_t(r.peer)], tag_);
        }
    }
    /// The sending half: posts this rank's sends from `in` (kept alive until `wait()`).
    void post_sends(const T* in) {
        for (const auto& s : sends_)
            batch_.isend(comm_, in + s.offset, s.count, s.type, dst_.ranks[std::size_t(s.peer)],
                         tag_);
    }
    /// Whether the posted messages are delivered (progressing them).
    bool test() { return batch_.test_all(); }
    /// Waits for the posted messages.
    void wait() { batch_.wait_all(); }
    /// After the receives completed: the parts this rank holds itself, the terms added up,
    /// zeros where a pending sum keeps no values. `in` may be null on a rank outside the
    /// source mesh.
    void finish(const T* in, T* out) {
        if (dst_rank_ < 0)
            return;
        if (!holds_values_) {
            std::fill_n(out, dst_block_.size(), T{});
            return;
        }
        for (const auto& l : locals_)
            if (l.term == 0)
                detail::copy_region(in, src_block_.extent, src_block_.offset, out,
                                    dst_block_.extent, dst_block_.offset, l.region);
        // Terms beyond the first, in term order: received ones from scratch, own ones from
        // the input.
        for (int t = 1; t < terms_; ++t) {
            for (const auto& r : recvs_)
                if (r.term == t)
                    add_packed(scratch_.data() + r.offset, out, r.region);
            for (const auto& l : locals_)
                if (l.term == t)
                    detail::for_each_run(
                        in, src_block_.extent, src_block_.offset, out, dst_block_.extent,
                        dst_block_.offset, l.region,
                        [&](T* d, const T* s, std::size_t n) { combine(d, d, s, n, from_.op); });
        }
    }

    /// Whether this rank is in the source / destination mesh.
    bool in_source() const noexcept { return src_rank_ >= 0; }
    bool in_destination() const noexcept { return dst_rank_ >= 0; }
    /// This rank's source and destination blocks (empty outside the mesh).
    const box<N>& source_block() const noexcept { return src_block_; }
    const box<N>& destination_block() const noexcept { return dst_block_; }
    const shape_type& shape() const noexcept { return shape_; }
    const layout& source_layout() const noexcept { return from_; }
    const layout& destination_layout() const noexcept { return to_; }
    const placed_mesh& source_mesh() const noexcept { return src_; }
    const placed_mesh& destination_mesh() const noexcept { return dst_; }
    /// The source mesh ranks this rank receives from.
    std::vector<int> sources() const {
        std::vector<int> out;
        for (const auto& r : recvs_)
            out.push_back(r.peer);
        return out;
    }
    /// This rank's part: messages, bytes sent and received, bytes copied locally, predicted
    /// seconds (the exchange's alpha-beta cost).
    const step_summary& summary() const noexcept { return summary_; }
    /// A printout of this rank's part.
    std::string describe() const {
        char buf[160];
        std::snprintf(buf, sizeof buf,
                      "%zu messages, sent %zu bytes, received %zu bytes, copied %zu bytes, "
                      "predicted %.1f us\n",
                      summary_.messages, summary_.bytes_sent, summary_.bytes_received,
                      summary_.bytes_copied, summary_.seconds * 1e6);
        return "cross-mesh exchange: " + from_.to_string() + " on " + src_.to_string() + " -> " +
               to_.to_string() + " on " + dst_.to_string() + "\n   rank " +
               std::to_string(comm_.rank()) + ": " + buf;
    }

private:
    /// A message: `count` items of `type` at element `offset` of its buffer (the input, the
    /// output, or for terms beyond the first the scratch buffer, packed).
    /// A message to or from `peer` (the mesh rank of the other side) carrying `region` of
    /// pending term `term`.
    struct message : detail::region_message {
        int term;
        box<N> region;
    };
    /// A part this rank holds itself: `region` of term `term`.
    struct local_part {
        int term;
        box<N> region;
    };

    void check_mesh(const placed_mesh& m, const char* which) const {
        if (int(m.ranks.size()) != m.shape.size())
            throw error("xshard: cross-mesh redistribution: the " + std::string(which) + " mesh(" +
                        m.shape.to_string() + ") has " + std::to_string(m.shape.size()) +
                        " ranks but is placed on " + std::to_string(m.ranks.size()));
        std::vector<int> sorted = m.ranks;
        std::sort(sorted.begin(), sorted.end());
        if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
            (!sorted.empty() && (sorted.front() < 0 || sorted.back() >= comm_.size())))
            throw error("xshard: cross-mesh redistribution: the " + std::string(which) + " " +
                        m.to_string() + " is not placed on distinct ranks of a communicator of " +
                        std::to_string(comm_.size()));
    }

    static void check_layout(const layout& l, const placed_mesh& m, const char* which) {
        if (l.rank() != N)
            throw error("xshard: cross-mesh redistribution: the " + std::string(which) +
                        " layout " + l.to_string() + " is for rank " + std::to_string(l.rank()) +
                        ", the tensor has rank " + std::to_string(N));
        try {
            l.validate(m.shape);
        } catch (const std::invalid_argument& e) {
            throw error(std::string(e.what()) + " (the " + which + " of a cross-mesh " +
                        "redistribution)");
        }
    }

    /// Whether destination rank `j` keeps the values (a pending sum keeps them at
    /// coordinate 0 of its partial axes only).
    bool holds_values(int j) const {
        if (to_.partial.empty() || to_.op != reduction::sum)
            return true;
        const auto c = dst_.shape.coords(j);
        for (const auto& a : to_.partial)
            if (c[dst_.shape.index(a)] != 0)
                return false;
        return true;
    }

    /// Whether source rank `i` is the holder destination rank `j` takes its block's term
    /// from: itself when it holds that block's term, otherwise the replica whose index
    /// along the replicated axes is j modulo their count.
    bool chosen(int i, int j) const {
        const auto& s = src_.shape;
        const auto replicated = from_.replicated_axes(s);
        const int me_in_src = src_index_[std::size_t(dst_.ranks[std::size_t(j)])];
        if (me_in_src >= 0) {
            // Does destination j hold the same block and term as i (differing only along
            // replicated axes)?
            const auto a = s.coords(i), b = s.coords(me_in_src);
            bool same = true;
            for (std::size_t x = 0; x < s.ndim(); ++x)
                same = same && (replicated.contains(x) || a[x] == b[x]);
            if (same)
                return i == me_in_src;
        }
        const int r = s.group_size(replicated);
        return s.group_rank(i, replicated) == j % r;
    }

    int term_of(int i) const { return src_.shape.group_rank(i, from_.partial_axes(src_.shape)); }

    message describe_region(int peer, int term, const box<N>& block, const box<N>& region,
                            bool packed, std::size_t packed_offset) {
        return {packed ? types_.contiguous(peer, packed_offset, region.size())
                       : types_.region(peer, block, region),
                term, region};
    }

    void plan_sends() {
        const int me = comm_.rank();
        const int term = term_of(src_rank_);
        for (int j = 0; j < dst_.shape.size(); ++j) {
            if (!holds_values(j) || !chosen(src_rank_, j))
                continue;
            const auto region = src_block_.intersect(block_of(to_, dst_.shape, shape_, j));
            if (region.empty())
                continue;
            if (dst_.ranks[std::size_t(j)] == me)
                continue; // the receiving side copies it (as a local part)
            sends_.push_back(describe_region(j, term, src_block_, region, false, 0));
        }
    }

    void plan_receives() {
        const int me = comm_.rank();
        std::size_t packed = 0;
        for (int i = 0; i < src_.shape.size(); ++i) {
            if (!chosen(i, dst_rank_))
                continue;
            const auto region = block_of(from_, src_.shape, shape_, i).intersect(dst_block_);
            if (region.empty())
                continue;
            const int term = term_of(i);
            if (src_.ranks[std::size_t(i)] == me) {
                locals_.push_back({term, region});
                continue;
            }
            recvs_.push_back(describe_region(i, term, dst_block_, region, term != 0, packed));
            if (term != 0)
                packed += region.size();
        }
        scratch_.resize(packed);
    }

    /// out[region] (op)= the packed values at `from`.
    void add_packed(const T* from, T* out, const box<N>& region) {
        box<N> whole{region.offset, region.extent};
        detail::for_each_run(
            from, region.extent, region.offset, out, dst_block_.extent, dst_block_.offset, whole,
            [&](T* d, const T* s, std::size_t n) { combine(d, d, s, n, from_.op); });
    }

    void summarize(const cost_model& model) {
        summary_.planned = step{step_kind::exchange, from_, to_, {}, 0, 0};
        for (const auto& s : sends_)
            summary_.bytes_sent += s.region.size() * sizeof(T);
        for (const auto& r : recvs_)
            summary_.bytes_received += r.region.size() * sizeof(T);
        for (const auto& l : locals_)
            summary_.bytes_copied += l.region.size() * sizeof(T);
        summary_.messages = std::max(sends_.size(), recvs_.size());
        summary_.scratch_bytes = scratch_.size() * sizeof(T);
        summary_.output_bytes = dst_block_.size() * sizeof(T);
        summary_.seconds = model.seconds(step_kind::exchange, summary_.messages,
                                         std::max(summary_.bytes_sent, summary_.bytes_received),
                                         summary_.bytes_copied, false);
    }

    communicator comm_;
    shape_type shape_;
    placed_mesh src_, dst_;
    layout from_, to_;
    int tag_ = 0;
    int src_rank_ = -1, dst_rank_ = -1, terms_ = 1;
    std::vector<int> src_index_; ///< communicator rank -> source mesh rank (-1: none)
    bool holds_values_ = false;
    box<N> src_block_{}, dst_block_{};
    std::vector<message> sends_, recvs_;
    std::vector<local_part> locals_;
    std::vector<T> scratch_;
    detail::region_types<T> types_;
    message_batch batch_;
    step_summary summary_;
};

} // namespace xshard
