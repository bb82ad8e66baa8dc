#pragma once
/// \file
/// A byte range of a file read once per node: the ranks of a node each read a contiguous
/// slice of it into shared memory, then every rank takes what it needs from the whole.
///
/// A load of a column-split tensor needs, on each rank, every other short run of the tensor's
/// bytes. Read alone, each rank maps the file and copies its runs out: the page tables of the
/// mapping (every page of the tensor is mapped and unmapped on every rank) cost as much as
/// the copy. Read together, the node reads each byte once, with large preads at the page
/// cache's speed, and each rank copies its runs from a window that is in the cache. Runs that
/// no other rank needs, a rank reads straight to their place where its own slice holds them
/// (a scattered read), and copies only what the other ranks read for it.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/node.hpp>
#include <xshard/comm/node_barrier.hpp>
#include <xshard/comm/shared_window.hpp>
#include <xshard/io/files.hpp>

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xshard::detail {

/// Reads file ranges together with the other ranks of a communicator that lies on one node,
/// through two windows of `window_bytes` in shared memory (one filled while the other is
/// taken from). Made collectively over the communicator; empty (false) when it has one rank,
/// spans several nodes, or the shared-memory transport is off or refused on some rank (the
/// same answer on every rank).
class node_file_reader {
public:
    /// Bytes read per window by the node together: two windows stay in the last-level cache
    /// while the ranks copy from them.
    static constexpr std::size_t window_bytes = std::size_t(4) << 20;

    node_file_reader() = default;

    /// Collective over `c`: a split by node, an all-reduce, and, when the node is the whole
    /// communicator, the windows' allocation (which all ranks agree can be made) and another
    /// all-reduce (of whether it succeeded everywhere).
    explicit node_file_reader(const communicator& c) {
        if (c.size() < 2 || !node_group(c).whole_communicator_shares_memory())
            return;
        const auto bytes = c.rank() == 0 ? 2 * window_bytes + flag_bytes(c.size()) : 0;
        if (!made_on_every_rank(c, [&] {
                window_ = shared_window(c, bytes);
                barrier_ = node_barrier(c);
                if (c.rank() == 0)
                    std::fill_n(&flag(0, 0, c.size()), 2 * c.size(), std::uint64_t(0));
            })) {
            barrier_ = node_barrier();
            window_ = shared_window();
            return;
        }
        barrier_.arrive_and_wait(); // the flags are cleared before anyone reads them
        members_ = c.size();
        rank_ = c.rank();
    }

    /// The reader of `c`, made at the first call for `c` (then collective over `c`) and kept
    /// for the life of the process, so that later reads find their windows' pages mapped
    /// (touching new shared memory costs as much as the reads it serves). Not thread-safe.
    static node_file_reader& of(const communicator& c) {
        static std::vector<std::pair<communicator, std::unique_ptr<node_file_reader>>> readers;
        const auto it = std::find_if(readers.begin(), readers.end(),
                                     [&](const auto& r) { return r.first == c; });
        if (it != readers.end())
            return *it->second;
        readers.emplace_back(c, std::make_unique<node_file_reader>(c));
        return *readers.back().second;
    }

    explicit operator bool() const noexcept { return members_ > 1; }

    /// The bytes this rank has read for the node so far.
    std::size_t bytes_read() const noexcept { return read_; }

    /// A run of the file that no other rank takes from the windows: the rank whose slice of a
    /// window holds (part of) it reads that part straight to its destination.
    struct direct_run {
        std::size_t at; ///< its position in the file
        std::byte* to;  ///< where its first byte goes
        std::size_t n;  ///< its bytes
    };

    /// This rank's slice of the window [lo, hi) (the bytes it reads for the node): [first,
    /// second), empty on the ranks past the window's end.
    std::pair<std::size_t, std::size_t> slice(std::size_t lo, std::size_t hi) const noexcept {
        const auto each =
            round_up((window_bytes + std::size_t(members_) - 1) / std::size_t(members_));
        const auto from = std::min(hi, lo + std::size_t(rank_) * each);
        return {from, std::min(hi, from + each)};
    }

    /// Reads bytes [begin, begin + length) of `f` a window at a time: each rank preads its
    /// slice of the window into shared memory, and after a barrier every rank calls
    /// `take(lo, hi, bytes)` with the window's file range [lo, hi) and its bytes (`bytes[0]`
    /// is the byte at `lo`). Windows come in increasing order. Every rank must call `read`
    /// with the same range, the same number of times.
    ///
    /// `direct` (sorted by position, disjoint) are this rank's runs that no other rank takes:
    /// the parts of them in this rank's slice of a window (`slice`) are read straight to
    /// their destinations (one preadv), before `take` is called for that window, and the
    /// window does not hold them. This saves the copy out of shared memory of what a rank
    /// read for itself.
    ///
    /// No rank is left waiting: a failure on one rank (its read, or its `take` throwing) is
    /// kept until the last window has passed on every rank; then that rank rethrows it and
    /// every other rank throws io_error naming it. After a failure no rank calls `take`
    /// with a window that a failed read left unfilled.
    template <class Take>
    void read(const file& f, std::size_t begin, std::size_t length,
              std::span<const direct_run> direct, Take&& take) {
        ++call_;
        std::exception_ptr mine;
        int seen = -1; // a rank whose failure this rank has seen
        const auto fail = [&] {
            mine = std::current_exception();
            std::atomic_ref(flag(rank_)).store(call_, std::memory_order_relaxed);
        };
        const auto failed_rank = [&] {
            for (int q = 0; q < members_; ++q)
                if (std::atomic_ref(flag(q)).load(std::memory_order_relaxed) == call_)
                    return q;
            return -1;
        };
        std::size_t next = 0; // the first run of `direct` not wholly before this rank's slice
        for (std::size_t lo = begin, k = 0; lo < begin + length; lo += window_bytes, ++k) {
            const auto hi = std::min(begin + length, lo + window_bytes);
            std::byte* bytes = window_.segment(0) + (k % 2) * window_bytes;
            const auto [from, to] = slice(lo, hi);
            if (!mine && from < to) {
                try {
                    read_slice(f, from, to, bytes + (from - lo), direct, next);
                    read_ += to - from;
                } catch (...) {
                    fail();
                }
            }
            // After this barrier every slice of window k is read, and every rank has taken
            // from window k - 1, whose buffer window k + 1 refills.
            barrier_.arrive_and_wait();
            if (seen < 0)
                seen = failed_rank();
            if (seen < 0) {
                try {
                    take(lo, hi, static_cast<const std::byte*>(bytes));
                } catch (...) {
                    fail();
                }
            }
        }
        // Every rank's failures of this call are now flagged. A rank already in the next call
        // flags in the other set, and none can be in the call after it (whose first barrier
        // waits for every rank to leave this one): so every rank reads the same flags.
        barrier_.arrive_and_wait();
        if (mine)
            std::rethrow_exception(mine);
        if (const int q = failed_rank(); q >= 0)
            throw io_error("xshard: reading " + f.path() + " together with rank " +
                           std::to_string(q) + " of the node failed there");
    }

    /// `read` with every byte taken from the windows.
    template <class Take>
    void read(const file& f, std::size_t begin, std::size_t length, Take&& take) {
        read(f, begin, length, {}, std::forward<Take>(take));
    }

private:
    /// Reads bytes [from, to) of `f`: the parts of `direct` runs among them to their
    /// destinations, the rest to `window` (which stands for `from`). `next` is the first run
    /// of `direct` not wholly before `from`, and is advanced.
    void read_slice(const file& f, std::size_t from, std::size_t to, std::byte* window,
                    std::span<const direct_run> direct, std::size_t& next) {
        while (next < direct.size() && direct[next].at + direct[next].n <= from)
            ++next;
        if (next == direct.size() || direct[next].at >= to) {
            f.read_at(window, to - from, from);
            return;
        }
        parts_.clear();
        std::size_t at = from;
        for (std::size_t i = next; i < direct.size() && direct[i].at < to; ++i) {
            const auto lo = std::max(direct[i].at, from);
            const auto hi = std::min(direct[i].at + direct[i].n, to);
            if (lo > at)
                parts_.push_back({window + (at - from), lo - at});
            parts_.push_back({direct[i].to + (lo - direct[i].at), hi - lo});
            at = hi;
        }
        if (at < to)
            parts_.push_back({window + (at - from), to - at});
        f.read_scattered_at(parts_, from);
    }

    /// Two sets of a flag per member, used by turns by successive reads: the number of the
    /// read in which the member failed.
    static std::size_t flag_bytes(int members) {
        return 2 * std::size_t(members) * sizeof(std::uint64_t);
    }
    static std::size_t round_up(std::size_t n) { return (n + 4095) / 4096 * 4096; }

    std::uint64_t& flag(int q) const noexcept { return flag(q, call_, members_); }
    std::uint64_t& flag(int q, std::uint64_t call, int members) const noexcept {
        return reinterpret_cast<std::uint64_t*>(
            window_.segment(0) +
            2 * window_bytes)[std::size_t(call % 2) * std::size_t(members) + std::size_t(q)];
    }

    shared_window window_;
    node_barrier barrier_;
    int members_ = 1;
    int rank_ = 0;
    std::uint64_t call_ = 0;
    std::size_t read_ = 0;
    std::vector<::iovec> parts_; // read_slice's, kept from read to read
};

} // namespace xshard::detail
