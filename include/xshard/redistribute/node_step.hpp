#pragma once
/// \file
/// A plan's step among ranks that share one node, run through shared-memory windows
/// instead of messages: the node-local path of exchanges (all-gather, all-to-all, the
/// general exchange), all-reduce and reduce-scatter.
///
/// Why: on one node Open MPI moves large messages with CMA (process_vm_readv), which pins
/// pages and runs at a fraction of the memory bandwidth, while ranks that copy at the same
/// time share the full bandwidth (benchmarks/README.md). Here every member exposes its
/// source block: in place when the block lies in node storage (comm/node_arena.hpp, the
/// shards of tensors on a `node_shared` mesh), else by copying the parts others need into
/// a window of its own (one staging copy, made by the owner). Then each member copies (or,
/// reducing, adds) what it needs straight from the owners' blocks or windows into its
/// destination block, all members at once; the block a rank keeps is copied directly, while
/// the others stage. When every member's destination block lies in node storage too, an
/// exchange runs the other way round: each member writes its own source block into every
/// destination, reading it in address order (see `exchange`). Two node barriers per run
/// order it: after publishing (nobody reads a block before its owner finished writing it,
/// nobody writes a destination before its owner entered the run) and after copying (nobody
/// changes a block a peer still reads, nobody returns before its destination is complete).

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/combine.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/node.hpp>
#include <xshard/comm/node_arena.hpp>
#include <xshard/comm/node_barrier.hpp>
#include <xshard/comm/node_reduce.hpp>
#include <xshard/comm/node_slots.hpp>
#include <xshard/comm/pairwise_reduce.hpp>
#include <xshard/comm/shared_window.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/redistribute/copy.hpp>
#include <xshard/redistribute/cost_model.hpp>
#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/planner.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace xshard {

namespace detail {

/// An exchange's or reduce-scatter's control slots and barrier, made together (collective).
struct node_control {
    node_slots slots;
    node_barrier barrier;
    explicit node_control(const communicator& c)
        : slots(c)
        , barrier(c) {}
};

} // namespace detail

/// The node-local executor of one step of a plan (see the file comment). Built once with
/// the plan (collective over the step's communicator: a small control window and a
/// barrier), run many times; runs allocate nothing and communicate through shared memory
/// only.
///
/// Blocks in node storage (comm/node_arena.hpp: shards of tensors on a `node_shared` mesh)
/// are read in place: each run, every member publishes in its control slot, before the
/// first barrier, whether its input block (and, for an all-reduce, its output) lies in the
/// arena and where. After the barrier a member reads member q's part straight from q's
/// block when q published one, and from q's staging window otherwise (q stages only when
/// its block is outside the arena). Every member reads every slot, so all take the same
/// decisions. The staging window is allocated by the first run that needs one (collective,
/// decided from the slots): a plan whose blocks all lie in the arena never allocates it.
template <class T, std::size_t N>
class node_step {
public:
    /// The node path for step `geo` over `c` when `node_path_applies` and every member of
    /// `c` shares this node (and allows the transport); null otherwise. `peer_in[q]` and
    /// `peer_out[q]` are member q's input and output blocks (exchange-like steps). Collective over
    /// `c` when `node_path_applies`: every member gets the same answer.
    static std::unique_ptr<node_step> make(const communicator& c, const step_geometry<N>& geo,
                                           std::vector<box<N>> peer_in,
                                           std::vector<box<N>> peer_out, std::size_t tensor_bytes,
                                           const reduce_tuning& tuning) {
        if (!node_path_applies(geo.planned.kind, geo.group_size, tensor_bytes, tuning))
            return nullptr;
        const node_group node(c);
        if (!node.whole_communicator_shares_memory())
            return nullptr;
        // A window MPI refuses on some member (no shared memory segment, too large) makes
        // every member fall back to messages.
        std::unique_ptr<node_step> s;
        if (!made_on_every_rank(c, [&] {
                s.reset(new node_step(c, geo, std::move(peer_in), std::move(peer_out),
                                      tuning.shared_memory_streaming_bytes));
            }))
            return nullptr;
        return s;
    }

    /// The bytes of this rank's staging window (0 while every run found its blocks in node
    /// storage).
    std::size_t window_bytes() const noexcept {
        return reducer_ ? reducer_->staging_bytes() : window_ ? window_.segment_bytes(me_) : 0;
    }

    /// How many members' input blocks the last run read in place (from node storage).
    std::size_t read_in_place() const noexcept {
        return reducer_ ? reducer_->read_in_place() : control_->slots.inputs_in_place();
    }

    /// An exchange-like step: this rank's input block at `in`, output block at `out`.
    /// When every member's output block lies in node storage, every member writes its own
    /// input block into the destinations (its output and the peers'), band by band of its
    /// leading dimension: each band is read from memory once, whatever the number of
    /// destinations, where readers would each read runs of it scattered over the block.
    /// Otherwise every member reads what it needs from the owners' blocks or windows. The
    /// slots decide, the same on every member; each run predicts it from the last one (a
    /// member that predicts reads copies its kept block while slower peers arrive).
    /// Returns the bytes peers read from (or this rank wrote to) other members.
    std::size_t exchange(const step_geometry<N>& geo, const T* in, T* out) {
        const bool predicted_push = push_;
        // A member that predicts writing in place does not stage (nobody would read it); if
        // the slots then decide on reading, `agree` stages late, on every member alike.
        const bool staged = publish(geo, in, out, !predicted_push);
        if (!predicted_push)
            detail::copy_region(in, geo.in_block.extent, geo.in_block.offset, out,
                                geo.out_block.extent, geo.out_block.offset, geo.kept, streaming_);
        control_->barrier.arrive_and_wait();
        agree(staged, geo, in, true);
        if (push_) {
            push(geo, in, out, predicted_push);
        } else {
            if (predicted_push)
                detail::copy_region(in, geo.in_block.extent, geo.in_block.offset, out,
                                    geo.out_block.extent, geo.out_block.offset, geo.kept,
                                    streaming_);
            for (const auto& [peer, region] : geo.recvs) {
                const auto& b = peer_in_[std::size_t(peer)];
                detail::copy_region(source(peer), b.extent, b.offset, out, geo.out_block.extent,
                                    geo.out_block.offset, region, streaming_);
            }
        }
        if (streaming_)
            detail::stream_fence(); // the destinations complete before the barrier
        control_->barrier.arrive_and_wait();
        return sent_bytes(geo);
    }

    /// Whether the last exchange wrote every member's block into the destinations in node
    /// storage (instead of each member reading).
    bool wrote_in_place() const noexcept { return push_; }

    /// A reduce-scatter: this rank's piece of the reduction into `out` (its output block),
    /// its own term read from `in` and every peer's from the peer's block or window, in one
    /// pass over `out` (cache-sized chunks). Returns the bytes peers read from this rank.
    std::size_t reduce_scatter(const step_geometry<N>& geo, const T* in, T* out, reduction op) {
        const bool staged = publish(geo, in, nullptr, true);
        control_->barrier.arrive_and_wait();
        agree(staged, geo, in);
        // Every member's input block is the same block (of a pending sum), so a run sits at
        // the same offset in `in`, in every peer's block and in every window.
        detail::for_each_run(in, geo.in_block.extent, geo.in_block.offset, out,
                             geo.out_block.extent, geo.out_block.offset, geo.out_block,
                             [&](T* d, const T* s, std::size_t n) {
                                 const std::size_t at = std::size_t(s - in);
                                 if (geo.recvs.empty()) {
                                     std::memcpy(d, in + at, n * sizeof(T));
                                     return;
                                 }
                                 for (std::size_t c = 0; c < n; c += chunk) {
                                     const std::size_t m = std::min(chunk, n - c);
                                     bool first = true;
                                     for (const auto& r : geo.recvs) {
                                         combine(d + c, first ? in + at + c : d + c,
                                                 source(r.first) + at + c, m, op);
                                         first = false;
                                     }
                                 }
                             });
        control_->barrier.arrive_and_wait();
        return sent_bytes(geo);
    }

    /// An all-reduce of `n` elements from `in` into `out` (they may be the same buffer):
    /// comm/node_reduce.hpp's node_all_reducer (summands and results read in place where
    /// they lie in node storage). Returns the bytes peers read from this rank.
    std::size_t all_reduce(const T* in, T* out, std::size_t n, reduction op) {
        return reducer_->all_reduce(in, out, n, op);
    }

private:
    /// Writes this member's slot (read by peers after the next barrier) and, when `early`
    /// and the staging window exists, stages the input block if it lies outside node
    /// storage. Returns whether it staged early where needed: `early` and the window
    /// existed, the same on every member.
    bool publish(const step_geometry<N>& geo, const T* in, const T* out, bool early) {
        const bool in_arena = control_->slots.publish(in, out) & detail::node_slots::in_arena;
        const bool staged = early && window_;
        if (staged && !in_arena)
            stage(geo, in);
        return staged;
    }

    /// After the first barrier: reads every member's slot and decides, the same on every
    /// member, whose blocks are read in place (or, `may_push` and every output in node
    /// storage, written in place). Members whose blocks are not read in place, and that have
    /// not staged yet (not `staged`: no window existed, or the run predicted writing in
    /// place; or their arena differs from the others'), stage now, into a window allocated
    /// now if there was none, and a barrier follows.
    void agree(bool staged, const step_geometry<N>& geo, const T* in, bool may_push = false) {
        const int p = comm_.size();
        control_->slots.read();
        // Writing into every member's output in node storage: nobody reads an input.
        push_ = may_push && control_->slots.outputs_in_place() == std::size_t(p);
        if (push_)
            return;
        bool need_window = false, late = false;
        for (int q = 0; q < p; ++q)
            if (!control_->slots.in<T>(q)) {
                need_window = true;
                late = late || !staged || (control_->slots.flags(q) & detail::node_slots::in_arena);
            }
        if (need_window && !window_)
            window_ = shared_window(comm_, staging_bytes_);
        if (!late)
            return;
        if (!control_->slots.in<T>(me_) &&
            (!staged || (control_->slots.flags(me_) & detail::node_slots::in_arena)))
            stage(geo, in);
        control_->barrier.arrive_and_wait();
    }

    /// Member q's input block: in place, or its staged copy.
    const T* source(int q) const noexcept {
        const T* p = control_->slots.in<T>(q);
        return p ? p : staging(q);
    }

    /// Writes this rank's input block (at `in`) into the destinations: the kept region into
    /// `out` (when `with_kept`) and each peer's region into the peer's output block in node
    /// storage, band by band (about `band_bytes` of consecutive input each: a band of the
    /// outermost dimension whose trailing slices fit, at every index of the dimensions
    /// before it). So the input is read in address order, nearly as one stream, where
    /// copying destination by destination would read it in strided runs, which copy more
    /// slowly than a contiguous stream (figures in benchmarks/README.md).
    void push(const step_geometry<N>& geo, const T* in, T* out, bool with_kept) {
        const auto& b = geo.in_block;
        auto write = [&](const box<N>& band) {
            if (with_kept)
                detail::copy_region(in, b.extent, b.offset, out, geo.out_block.extent,
                                    geo.out_block.offset, geo.kept.intersect(band), streaming_);
            for (const auto& [peer, region] : geo.sends) {
                const auto& o = peer_out_[std::size_t(peer)];
                detail::copy_region(in, b.extent, b.offset, control_->slots.out<T>(peer), o.extent,
                                    o.offset, region.intersect(band), streaming_);
            }
        };
        if constexpr (N == 0) {
            write(b);
        } else {
            if (b.empty())
                return;
            std::size_t d = 0, slice = b.size() / b.extent[0] * sizeof(T);
            while (d + 1 < N && slice > band_bytes)
                slice /= b.extent[++d];
            const std::size_t rows =
                std::max<std::size_t>(1, band_bytes / std::max<std::size_t>(slice, 1));
            std::array<std::size_t, N> idx{};
            box<N> band = b;
            for (;;) {
                for (std::size_t j = 0; j < d; ++j) {
                    band.offset[j] = b.offset[j] + idx[j];
                    band.extent[j] = 1;
                }
                for (std::size_t lo = 0; lo < b.extent[d]; lo += rows) {
                    band.offset[d] = b.offset[d] + lo;
                    band.extent[d] = std::min(rows, b.extent[d] - lo);
                    write(band);
                }
                std::size_t j = d; // the next index of the dimensions before d
                for (; j > 0; --j) {
                    if (++idx[j - 1] < b.extent[j - 1])
                        break;
                    idx[j - 1] = 0;
                }
                if (j == 0)
                    return;
            }
        }
    }

    /// Copies the parts of this rank's input block (at `in`) that peers read into this
    /// rank's window, at the offsets they have in the block.
    void stage(const step_geometry<N>& geo, const T* in) {
        T* mine = staging(me_);
        for (const auto& [peer, region] : geo.sends)
            detail::copy_region(in, geo.in_block.extent, geo.in_block.offset, mine,
                                geo.in_block.extent, geo.in_block.offset, region);
    }

    static std::size_t sent_bytes(const step_geometry<N>& geo) {
        std::size_t sent = 0;
        for (const auto& [peer, region] : geo.sends)
            sent += region.size() * sizeof(T);
        return sent;
    }

    /// Elements reduced at a time: the partial result stays in cache while each peer's term
    /// is added.
    static constexpr std::size_t chunk = 4096;
    /// Input bytes a pushing member copies to every destination before the next band.
    static constexpr std::size_t band_bytes = std::size_t(64) << 10;

    node_step(const communicator& c, const step_geometry<N>& geo, std::vector<box<N>> peer_in,
              std::vector<box<N>> peer_out, std::size_t streaming_bytes)
        : comm_(c)
        , reducer_(geo.planned.kind == step_kind::all_reduce ? std::make_unique<node_all_reducer>(c)
                                                             : nullptr)
        , peer_in_(std::move(peer_in))
        , peer_out_(std::move(peer_out))
        , staging_bytes_(geo.in_block.size() * sizeof(T))
        , streaming_(geo.out_block.size() * sizeof(T) >= streaming_bytes)
        , me_(c.rank()) {
        if (!reducer_) // an all-reduce step runs on the reducer's slots and barrier
            control_.emplace(c);
    }

    T* staging(int q) const noexcept { return reinterpret_cast<T*>(window_.segment(q)); }

    communicator comm_;
    std::optional<detail::node_control> control_; ///< not an all-reduce step's (its reducer's)
    shared_window window_; ///< staging, allocated by the first run that needs it
    std::unique_ptr<node_all_reducer> reducer_; ///< an all-reduce step's
    std::vector<box<N>> peer_in_, peer_out_;    ///< members' input and output blocks
    std::size_t staging_bytes_ = 0;
    /// Output blocks written with non-temporal stores (reduce_tuning's
    /// shared_memory_streaming_bytes, 8 MiB by default): larger than the cache can hold for
    /// every member, they would only evict it, and a cached store first reads every line it
    /// writes. 32 KiB runs into a 256 MiB block measured 1.15-1.25x a whole-block memcpy with
    /// cached stores and 0.7-0.85x with non-temporal ones; 8 KiB runs into 32 MiB blocks
    /// 1.0-1.3x and 0.85-1.0x (benchmarks/README.md).
    bool streaming_ = false;
    int me_ = 0;
    bool push_ = false; ///< whether the last exchange wrote into every member's output
};

} // namespace xshard
