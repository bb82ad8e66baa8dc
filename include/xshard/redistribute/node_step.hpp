#pragma once
/// \file
/// A plan's step among ranks that share one node, run through shared-memory windows
/// instead of messages: the node-local path of exchanges (all-gather, all-to-all, the
/// general exchange), all-reduce and reduce-scatter.
///
/// Why: on one node Open MPI moves large messages with CMA (process_vm_readv), which pins
/// pages and runs at a fraction of the memory bandwidth, while ranks that copy at the same
/// time share the full bandwidth (benchmarks/README.md). Here every member exposes the
/// parts of its source block that others need in a window of its own (one staging copy,
/// made by the owner), then each member copies (or, reducing, adds) what it needs straight
/// from the owners' windows into its destination block, all members at once. A byte read
/// by a peer is written once into the window and read once from it; the block a rank
/// keeps is copied directly, while the others stage. Two node barriers per run order it:
/// after staging (nobody reads a window before its owner finished writing it) and after
/// reading (nobody overwrites a window a peer still reads).

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/combine.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/node.hpp>
#include <xshard/comm/node_barrier.hpp>
#include <xshard/comm/node_reduce.hpp>
#include <xshard/comm/pairwise_reduce.hpp>
#include <xshard/comm/shared_window.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/redistribute/copy.hpp>
#include <xshard/redistribute/cost_model.hpp>
#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/planner.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace xshard {

namespace detail {

/// `region` of an array of shape `from_shape` at `from_origin`, combined (op) into the same
/// region of one of shape `to_shape` at `to_origin`: to = to (op) from, run by run.
template <class T, std::size_t N>
void combine_region(const T* from, const std::array<std::size_t, N>& from_shape,
                    const std::array<std::size_t, N>& from_origin, T* to,
                    const std::array<std::size_t, N>& to_shape,
                    const std::array<std::size_t, N>& to_origin, const box<N>& region,
                    reduction op) {
    for_each_run(from, from_shape, from_origin, to, to_shape, to_origin, region,
                 [op](T* d, const T* s, std::size_t n) { combine(d, d, s, n, op); });
}

} // namespace detail

/// The node-local executor of one step of a plan (see the file comment). Built once with
/// the plan (collective over the step's communicator: two window allocations), run many
/// times; runs allocate nothing and communicate through shared memory only.
template <class T, std::size_t N>
class node_step {
public:
    /// The node path for step `geo` over `c` when `node_path_applies` and every member of
    /// `c` shares this node (and allows the transport); null otherwise. `peer_in[q]` is
    /// member q's input block (exchange-like steps). Collective over `c` when
    /// `node_path_applies`: every member gets the same answer.
    static std::unique_ptr<node_step> make(const communicator& c, const step_geometry<N>& geo,
                                           std::vector<box<N>> peer_in,
                                           std::size_t tensor_bytes, const reduce_tuning& tuning) {
        if (!node_path_applies(geo.planned.kind, geo.group_size, tensor_bytes, tuning))
            return nullptr;
        const node_group node(c);
        if (!node.whole_communicator_shares_memory())
            return nullptr;
        // A window MPI refuses on some member (no shared memory segment, too large) makes
        // every member fall back to messages.
        std::unique_ptr<node_step> s;
        int ok = 1;
        try {
            s.reset(new node_step(c, geo, std::move(peer_in)));
        } catch (const error&) {
            ok = 0;
        }
        allreduce(c, std::span(&ok, 1), reduction::min);
        if (!ok)
            return nullptr;
        return s;
    }

    /// The bytes of this rank's window.
    std::size_t window_bytes() const noexcept { return window_.segment_bytes(me_); }

    /// An exchange-like step: this rank's input block at `in`, output block at `out`.
    /// Returns the bytes peers read from this rank's window.
    std::size_t exchange(const step_geometry<N>& geo, const T* in, T* out) {
        const std::size_t sent = stage(geo, in);
        // The block this rank keeps, while slower peers still stage.
        detail::copy_region(in, geo.in_block.extent, geo.in_block.offset, out, geo.out_block.extent,
                            geo.out_block.offset, geo.kept);
        barrier_.arrive_and_wait();
        for (const auto& [peer, region] : geo.recvs) {
            const auto& b = peer_in_[std::size_t(peer)];
            detail::copy_region(staging(peer), b.extent, b.offset, out, geo.out_block.extent,
                                geo.out_block.offset, region);
        }
        barrier_.arrive_and_wait();
        return sent;
    }

    /// A reduce-scatter: this rank's piece of the reduction into `out` (its output block),
    /// its own term read from `in` and every peer's from the peer's window, in one pass
    /// over `out` (cache-sized chunks). Returns the bytes peers read from this rank.
    std::size_t reduce_scatter(const step_geometry<N>& geo, const T* in, T* out, reduction op) {
        const std::size_t sent = stage(geo, in);
        barrier_.arrive_and_wait();
        // Every member's input block is the same block (of a pending sum), so a run sits at
        // the same offset in `in` and in every window.
        const T* origin = geo.recvs.empty() ? in : staging(geo.recvs.front().first);
        detail::for_each_run(origin, geo.in_block.extent, geo.in_block.offset, out,
                             geo.out_block.extent, geo.out_block.offset, geo.out_block,
                             [&](T* d, const T* s, std::size_t n) {
                                 const std::size_t at = std::size_t(s - origin);
                                 if (geo.recvs.empty()) {
                                     std::memcpy(d, in + at, n * sizeof(T));
                                     return;
                                 }
                                 for (std::size_t c = 0; c < n; c += chunk) {
                                     const std::size_t m = std::min(chunk, n - c);
                                     bool first = true;
                                     for (const auto& r : geo.recvs) {
                                         combine(d + c, first ? in + at + c : d + c,
                                                 staging(r.first) + at + c, m, op);
                                         first = false;
                                     }
                                 }
                             });
        barrier_.arrive_and_wait();
        return sent;
    }

    /// An all-reduce of `n` elements from `in` into `out` (see node_all_reduce).
    std::size_t all_reduce(const T* in, T* out, std::size_t n, reduction op) {
        return node_all_reduce(window_, barrier_, in, out, n, op);
    }

private:
    /// Copies the parts of this rank's input block (at `in`) that peers read into this
    /// rank's window, at the offsets they have in the block. Returns their bytes.
    std::size_t stage(const step_geometry<N>& geo, const T* in) {
        T* mine = staging(me_);
        std::size_t sent = 0;
        for (const auto& [peer, region] : geo.sends) {
            detail::copy_region(in, geo.in_block.extent, geo.in_block.offset, mine,
                                geo.in_block.extent, geo.in_block.offset, region);
            sent += region.size() * sizeof(T);
        }
        return sent;
    }

    /// Elements reduced at a time: the partial result stays in cache while each peer's term
    /// is added.
    static constexpr std::size_t chunk = 4096;

    node_step(const communicator& c, const step_geometry<N>& geo, std::vector<box<N>> peer_in)
        : window_(c, geo.in_block.size() * sizeof(T))
        , barrier_(c)
        , peer_in_(std::move(peer_in))
        , me_(c.rank()) {}

    T* staging(int q) const noexcept { return reinterpret_cast<T*>(window_.segment(q)); }

    shared_window window_;
    node_barrier barrier_;
    std::vector<box<N>> peer_in_;
    int me_ = 0;
};

} // namespace xshard
