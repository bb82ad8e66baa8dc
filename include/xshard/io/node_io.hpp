#pragma once
/// \file
/// A byte range of a file read or written once per node: the ranks of a node each read (or
/// write) a contiguous slice of it through shared memory, where every rank takes what it
/// needs from the whole (or puts what it holds).
///
/// A column-split tensor is stored as short runs of every rank's bytes, one after the other.
/// A load of it needs, on each rank, every other short run. Read alone, each rank maps the
/// file and copies its runs out: the page tables of the mapping (every page of the tensor is
/// mapped and unmapped on every rank) cost as much as the copy. Read together, the node reads
/// each byte once, with large preads at the page cache's speed, and each rank copies its runs
/// from a window that is in the cache. Runs that no other rank needs, a rank reads straight
/// to their place where its own slice holds them (a scattered read), and copies only what
/// the other ranks read for it.
///
/// A save writes the same runs. Written alone, with a pwrite per run, the ranks take turns
/// on the file's write lock, one system call per run; through a shared mapping of the file,
/// every page costs a fault, and the page cache holds the file in 4 KiB pages, which the
/// kernel reads back at two thirds of its speed for large pages. Written together, each rank
/// puts the runs it holds in the other ranks' slices into the window, and writes its own
/// slice with one pwritev (its own runs straight from its memory): large writes, whose pages
/// are the page cache's large ones.

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/before_finalize.hpp>
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
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xshard::detail {

/// Reads and writes file ranges together with the other ranks of a communicator that lies on
/// one node, through two windows of `window_bytes` in shared memory (one filled while the
/// other is used). Made collectively over the communicator; empty (false) when it has one
/// rank, spans several nodes, or the shared-memory transport is off or refused on some rank
/// (the same answer on every rank).
class node_file_io {
public:
    /// Bytes read or written per window by the node together: two windows stay in the
    /// last-level cache while the ranks copy from or into them.
    static constexpr std::size_t window_bytes = std::size_t(4) << 20;

    node_file_io() = default;

    /// Collective over `c`: a split by node, an all-reduce, and, when the node is the whole
    /// communicator, the windows' allocation (which all ranks agree can be made) and another
    /// all-reduce (of whether it succeeded everywhere).
    explicit node_file_io(const communicator& c);

    /// The reader and writer of `c`, made at the first call for `c` (then collective over
    /// `c`) and kept until MPI_Finalize, so that later reads and writes find their windows'
    /// pages mapped (touching new shared memory costs as much as the reads it serves). At
    /// the start of MPI_Finalize they are freed in the order they were made, the same on
    /// every rank (before_finalize.hpp). Not thread-safe.
    static node_file_io& of(const communicator& c);

    explicit operator bool() const noexcept { return members_ > 1; }

    /// The bytes this rank has read for the node so far.
    std::size_t bytes_read() const noexcept { return read_; }
    /// The bytes this rank has written for the node so far.
    std::size_t bytes_written() const noexcept { return written_; }

    /// A run of the file and its bytes in this rank's memory: `Byte` is std::byte for a run read
    /// (a destination), const std::byte for a run written (a source).
    template <class Byte>
    struct file_run {
        std::size_t at; ///< its position in the file
        Byte* bytes;    ///< where its first byte goes, or comes from
        std::size_t n;  ///< its bytes
    };
    /// A run of the file that no other rank takes from the windows: the rank whose slice of a
    /// window holds (part of) it reads that part straight to its destination.
    using direct_run = file_run<std::byte>;
    /// A run of the file this rank writes.
    using source_run = file_run<const std::byte>;

    /// This rank's slice of the window [lo, hi) (the bytes it reads or writes for the node):
    /// [first, second), empty on the ranks past the window's end.
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
        std::size_t next = 0; // the first run of `direct` not wholly before this rank's slice
        by_windows(
            f, begin, length, "reading",
            [&](std::size_t lo, std::size_t, std::byte* window, std::size_t from, std::size_t to) {
                if (from < to) {
                    slice_parts(from, to, window + (from - lo), direct, next);
                    f.read_scattered_at(parts_, from);
                    read_ += to - from;
                }
            },
            [&](std::size_t lo, std::size_t hi, std::byte* window, std::size_t, std::size_t) {
                take(lo, hi, static_cast<const std::byte*>(window));
            });
    }

    /// Writes bytes [begin, begin + length) of `f` a window at a time, each byte from the one
    /// rank whose `runs` hold it: every rank copies the parts of its runs in the other ranks'
    /// slices of the window into shared memory, and after a barrier writes its own slice
    /// (one pwritev: its own runs from its memory, the rest from the window). Every byte of the
    /// range must be in exactly one rank's runs (or the window's stale bytes are written).
    /// `runs` are sorted by position and disjoint. `visit(i, bytes, n)` is called with each
    /// piece of this rank's runs in turn (`i`: the run), just before it is copied or written,
    /// while a checksum of it finds it in the cache. Every rank must call `write` with the
    /// same range, the same number of times. Failures are agreed on as in `read`: no rank is
    /// left waiting, and every rank throws.
    template <class Visit>
    void write(const file& f, std::size_t begin, std::size_t length,
               std::span<const source_run> runs, Visit&& visit) {
        std::size_t given = 0, done = 0; // the run, and bytes of it, put or visited so far
        std::size_t next = 0;            // the first run not wholly before this rank's slice
        by_windows(
            f, begin, length, "writing",
            [&](std::size_t lo, std::size_t hi, std::byte* window, std::size_t from,
                std::size_t to) {
                for (; given < runs.size() && runs[given].at + done < hi;) {
                    const auto& r = runs[given];
                    const auto p = r.at + done, k = std::min(r.n - done, hi - p);
                    const std::byte* src = r.bytes + done;
                    visit(given, src, k);
                    // [p, p + k) goes to the window, but for [s, e), which this rank writes.
                    const auto s = std::clamp(from, p, p + k), e = std::clamp(to, p, p + k);
                    std::memcpy(window + (p - lo), src, s - p);
                    std::memcpy(window + (e - lo), src + (e - p), p + k - e);
                    if ((done += k) == r.n) {
                        ++given;
                        done = 0;
                    }
                }
            },
            [&](std::size_t lo, std::size_t, std::byte* window, std::size_t from, std::size_t to) {
                if (from < to) {
                    slice_parts(from, to, window + (from - lo), runs, next);
                    f.write_gathered_at(parts_, from);
                    written_ += to - from;
                }
            });
    }

    /// `read` with every byte taken from the windows.
    template <class Take>
    void read(const file& f, std::size_t begin, std::size_t length, Take&& take) {
        read(f, begin, length, {}, std::forward<Take>(take));
    }

private:
    static std::vector<std::pair<communicator, std::unique_ptr<node_file_io>>>& registry() {
        static std::vector<std::pair<communicator, std::unique_ptr<node_file_io>>> all;
        return all;
    }

    /// Calls, for each window [lo, hi) of [begin, begin + length) in turn, `fill(lo, hi,
    /// window, from, to)` (this rank's slice [from, to): slice), a barrier, then `use(lo, hi,
    /// window, from, to)`, where `window` holds the window's bytes (`window[0]` is the byte at
    /// `lo`). A failure (`fill` or `use` throwing) is flagged for the other ranks; once any
    /// rank's is seen, no rank fills or uses another window, and after the last window has
    /// passed on every rank the failed rank rethrows and every other rank throws io_error
    /// naming it (`doing`: "reading", "writing").
    template <class Fill, class Use>
    void by_windows(const file& f, std::size_t begin, std::size_t length, const char* doing,
                    Fill&& fill, Use&& use) {
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
        for (std::size_t lo = begin, k = 0; lo < begin + length; lo += window_bytes, ++k) {
            const auto hi = std::min(begin + length, lo + window_bytes);
            std::byte* window = window_.segment(0) + (k % 2) * window_bytes;
            const auto [from, to] = slice(lo, hi);
            if (seen < 0 && !mine) {
                try {
                    fill(lo, hi, window, from, to);
                } catch (...) {
                    fail();
                }
            }
            // After this barrier every rank has filled window k, and has used window k - 1,
            // whose buffer window k + 1 refills.
            barrier_.arrive_and_wait();
            if (seen < 0)
                seen = failed_rank();
            if (seen < 0) {
                try {
                    use(lo, hi, window, from, to);
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
            throw io_error("xshard: " + std::string(doing) + " " + f.path() +
                           " together with rank " + std::to_string(q) +
                           " of the node failed there");
    }

    /// Sets parts_ to the bytes [from, to) of the file: the parts of `runs` among them in
    /// this rank's memory, the rest in `window` (which stands for `from`). `next` is the first
    /// run not wholly before `from`, and is advanced.
    template <class Byte>
    void slice_parts(std::size_t from, std::size_t to, std::byte* window,
                     std::span<const file_run<Byte>> runs, std::size_t& next) {
        while (next < runs.size() && runs[next].at + runs[next].n <= from)
            ++next;
        parts_.clear();
        std::size_t at = from;
        for (std::size_t i = next; i < runs.size() && runs[i].at < to; ++i) {
            const auto lo = std::max(runs[i].at, from);
            const auto hi = std::min(runs[i].at + runs[i].n, to);
            if (lo > at)
                parts_.push_back({window + (at - from), lo - at});
            // (A written run's bytes are only read, by pwritev.)
            parts_.push_back({const_cast<std::byte*>(runs[i].bytes) + (lo - runs[i].at), hi - lo});
            at = hi;
        }
        if (at < to)
            parts_.push_back({window + (at - from), to - at});
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
    std::size_t read_ = 0, written_ = 0;
    std::vector<::iovec> parts_; // slice_parts', kept from call to call
};

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/node_io.ipp>
#endif
