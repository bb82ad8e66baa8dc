#pragma once
/// \file
/// All-reduce among the ranks of one node through shared memory: every member reads the
/// others' summands in place, no message. Summands and results that lie in node storage
/// (node_arena.hpp) are read where they are; the others are staged once into a window.

#include <xshard/compiled.hpp>
#include <xshard/comm/combine.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/node_arena.hpp>
#include <xshard/comm/node_barrier.hpp>
#include <xshard/comm/node_slots.hpp>
#include <xshard/comm/reduction.hpp>
#include <xshard/comm/shared_window.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace xshard {

namespace detail {

/// Member g's segment of an all-reduce of n elements over p members: its offset and length
/// (n / p elements, one more for the first n % p).
inline std::pair<std::size_t, std::size_t> reduce_segment(std::size_t g, std::size_t n,
                                                          std::size_t p) noexcept {
    return {g * (n / p) + std::min(g, n % p), n / p + (g < n % p ? 1 : 0)};
}

/// Copies the segments of `in` that members other than `me` own into `window`, at their
/// offsets: what a member whose summand is not read in place exposes.
template <class T>
void stage_segments(const T* in, T* window, std::size_t n, std::size_t p, int me) {
    for (std::size_t g = 0; g < p; ++g)
        if (int(g) != me) {
            const auto [lo, len] = reduce_segment(g, n, p);
            std::memcpy(window + lo, in + lo, len * sizeof(T));
        }
}

/// What an all-reduce does to its result by default: nothing. (A `finish(T* p, m)` passed
/// instead is applied once to every element of the result, chunk by chunk while the chunk is
/// in cache, by the member that reduced it, before the others copy it: a mean's division
/// costs no pass of its own.)
struct keep_result {
    template <class T>
    void operator()(T*, std::size_t) const noexcept {}
};

/// The elements [lo, lo + len) of the concatenation of `pieces`, run by run: `f(at, p, m)`
/// for the m > 0 elements at p, whose offset in the concatenation is `at` (empty pieces are
/// skipped).
template <class T, class F>
void for_each_piece_run(std::span<const std::span<T>> pieces, std::size_t lo, std::size_t len,
                        F&& f) {
    if (len == 0)
        return;
    std::size_t start = 0;
    for (const auto& piece : pieces) {
        const std::size_t end = start + piece.size();
        if (start >= lo + len)
            return;
        if (end > lo && end > start) {
            const std::size_t a = std::max(lo, start), b = std::min(lo + len, end);
            f(a, piece.data() + (a - start), b - a);
        }
        start = end;
    }
}

/// The elements an all-reduce adds in one go: a partial result that stays in cache while
/// every term is added.
inline constexpr std::size_t reduce_chunk = 4096;

/// Member `me`'s share of an all-reduce: its segment of `out` = its own term (from `in`)
/// combined with every other member q's term, read from `source(q)` (a pointer to q's n
/// elements: its summand in place or its staged copy), in cache-sized chunks, each
/// finished by `finish`. `in` and `out` may be the same buffer.
template <class T, class Source, class Finish>
void reduce_share(const T* in, T* out, std::size_t n, std::size_t p, int me, Source&& source,
                  reduction op, Finish&& finish) {
    const auto [lo, len] = reduce_segment(std::size_t(me), n, p);
    for (std::size_t c = lo; c < lo + len; c += reduce_chunk) {
        const std::size_t m = std::min(reduce_chunk, lo + len - c);
        bool first = true;
        for (int q = 0; q < int(p); ++q)
            if (q != me) {
                const T* from = source(q);
                combine(out + c, first ? in + c : out + c, from + c, m, op);
                first = false;
            }
        if (first) // one member: nothing to add
            std::memmove(out + c, in + c, m * sizeof(T));
        finish(out + c, m);
    }
}

/// Copies every other member g's segment of the result into `out`, from `result(g)` (a
/// pointer to g's n elements: its output in place or its window).
template <class T, class Result>
void gather_shares(T* out, std::size_t n, std::size_t p, int me, Result&& result) {
    for (std::size_t g = 0; g < p; ++g)
        if (int(g) != me) {
            const auto [lo, len] = reduce_segment(g, n, p);
            std::memcpy(out + lo, result(int(g)) + lo, len * sizeof(T));
        }
}

} // namespace detail

/// All-reduces over a communicator whose members share one node, through shared memory.
/// Built once per communicator (collective: a small control window and a node barrier), run
/// many times.
///
/// A run of `all_reduce(in, out, n, op)`: member g owns segment g (about n / p elements).
/// Before the first barrier every member publishes in its control slot whether its `in`
/// and `out` lie in the open node arena (node_arena.hpp) and where. After it every member
/// reads every slot, so all decide alike: when all members' arena is the same one, member
/// q's summand is read in place if q published it, else from q's staging window (one copy of
/// the (p-1)/p n elements others own, made by q). Then g adds every member's term of its
/// segment into its `out` (xsimd, cache-sized chunks), and publishes the result in place (its
/// `out` in the arena) or in its window; after a second barrier every member copies the
/// others' results; a third keeps the next run from overwriting a block a peer still reads.
/// Each byte is read once per stage, all members copy and add at the same time. The staging
/// window is allocated (collectively, decided from the slots) by the first run that needs
/// one: runs whose buffers all lie in node storage never allocate it.
class node_all_reducer {
public:
    /// Collective over `c`, whose members must share one node (throws `error` when MPI
    /// refuses the control window).
    explicit node_all_reducer(const communicator& c)
        : comm_(c)
        , slots_(c)
        , barrier_(c)
        , me_(c.rank()) {}

    node_all_reducer(const node_all_reducer&) = delete;
    node_all_reducer& operator=(const node_all_reducer&) = delete;

    /// All-reduce of `n` elements from `in` into `out` (they may be the same buffer), the
    /// result finished by `finish` (detail::keep_result); collective over the communicator,
    /// every member with the same n. Returns the bytes peers read from this rank, counted as
    /// the pairwise algorithm counts its sends.
    template <class T, class Finish = detail::keep_result>
    std::size_t all_reduce(const T* in, T* out, std::size_t n, reduction op, Finish finish = {}) {
        if (n == 0) // on every member alike (the same n everywhere): nothing to reduce
            return 0;
        const auto p = std::size_t(comm_.size());
        const std::size_t bytes = n * sizeof(T);
        // The same on every member: every run had the same n everywhere.
        const bool had_window = staging_ && staging_bytes_ >= bytes;
        const auto mine = slots_.publish(in, out);
        if (had_window && !(mine & detail::node_slots::in_arena))
            detail::stage_segments(in, staging<T>(me_), n, p, me_);
        barrier_.arrive_and_wait();
        slots_.read();
        bool late = false, need_window = false;
        for (int q = 0; q < int(p); ++q) {
            const bool in_place = slots_.in<T>(q) != nullptr;
            need_window = need_window || !in_place || !slots_.out<T>(q);
            // Not staged before the barrier: no window existed, or q published a block
            // the others cannot read (their arena differs).
            late = late ||
                   (!in_place && (!had_window || (slots_.flags(q) & detail::node_slots::in_arena)));
        }
        if (need_window && !had_window) {
            staging_ = shared_window(comm_, bytes);
            staging_bytes_ = bytes;
        }
        if (late) {
            if (!slots_.in<T>(me_) && (!had_window || (mine & detail::node_slots::in_arena)))
                detail::stage_segments(in, staging<T>(me_), n, p, me_);
            barrier_.arrive_and_wait();
        }
        in_place_ = slots_.inputs_in_place();
        detail::reduce_share(
            in, out, n, p, me_, [&](int q) { return source<T>(q); }, op, finish);
        const auto [lo, len] = detail::reduce_segment(std::size_t(me_), n, p);
        if (!slots_.out<T>(me_) && len > 0)
            std::memcpy(staging<T>(me_) + lo, out + lo, len * sizeof(T));
        barrier_.arrive_and_wait();
        detail::gather_shares(out, n, p, me_, [&](int g) {
            const T* r = slots_.out<T>(g);
            return r ? r : staging<T>(g);
        });
        barrier_.arrive_and_wait();
        return (n - len) * sizeof(T) + (p - 1) * len * sizeof(T);
    }

    /// All-reduce in place of the concatenation of `pieces` (n elements in all, the same n
    /// on every member), the result finished by `finish`: what a fused gradient bucket is,
    /// reduced without packing it. Each member copies the parts of its pieces that the others
    /// own into its staging window ((p - 1) / p of n); after a barrier it adds every member's
    /// term of its own segment into its pieces, finishes each chunk and copies it into its
    /// window; after a second barrier it copies the others' results from their windows into
    /// its pieces; a third keeps the next run from overwriting a window a peer still reads.
    /// Pieces are read and written where they are, in node storage or not (the window makes
    /// every member's terms readable). The sums are those of `all_reduce` (each element is
    /// added by its segment's owner, its own term first, then the others' in rank order).
    /// Returns the bytes peers read from this rank.
    template <class T, class Finish = detail::keep_result>
    std::size_t all_reduce_pieces(std::span<const std::span<T>> pieces, reduction op,
                                  Finish finish = {}) {
        std::size_t n = 0;
        for (const auto& s : pieces)
            n += s.size();
        if (n == 0) // on every member alike: nothing to reduce
            return 0;
        const auto p = std::size_t(comm_.size());
        if (p == 1) {
            detail::for_each_piece_run(pieces, 0, n,
                                       [&](std::size_t, T* d, std::size_t m) { finish(d, m); });
            return 0;
        }
        const std::size_t bytes = n * sizeof(T);
        if (!staging_ || staging_bytes_ < bytes) { // the same on every member (same history)
            staging_ = shared_window(comm_, bytes);
            staging_bytes_ = bytes;
        }
        T* window = staging<T>(me_);
        for (std::size_t g = 0; g < p; ++g)
            if (int(g) != me_) {
                const auto [lo, len] = detail::reduce_segment(g, n, p);
                detail::for_each_piece_run(pieces, lo, len,
                                           [&](std::size_t at, T* d, std::size_t m) {
                                               std::memcpy(window + at, d, m * sizeof(T));
                                           });
            }
        barrier_.arrive_and_wait();
        const auto [lo, len] = detail::reduce_segment(std::size_t(me_), n, p);
        detail::for_each_piece_run(pieces, lo, len, [&](std::size_t at, T* d, std::size_t m) {
            for (std::size_t c = 0; c < m; c += detail::reduce_chunk) {
                const std::size_t k = std::min(detail::reduce_chunk, m - c);
                for (int q = 0; q < int(p); ++q)
                    if (q != me_)
                        combine(d + c, d + c, staging<T>(q) + at + c, k, op);
                finish(d + c, k);
                std::memcpy(window + at + c, d + c, k * sizeof(T));
            }
        });
        barrier_.arrive_and_wait();
        for (std::size_t g = 0; g < p; ++g)
            if (int(g) != me_) {
                const auto [glo, glen] = detail::reduce_segment(g, n, p);
                const T* result = staging<T>(int(g));
                detail::for_each_piece_run(pieces, glo, glen,
                                           [&](std::size_t at, T* d, std::size_t m) {
                                               std::memcpy(d, result + at, m * sizeof(T));
                                           });
            }
        barrier_.arrive_and_wait();
        in_place_ = 0;
        return (n - len) * sizeof(T) + (p - 1) * len * sizeof(T);
    }

    /// The bytes of this rank's staging window (0 while every run read every member's
    /// buffers in place).
    std::size_t staging_bytes() const noexcept { return staging_ ? staging_bytes_ : 0; }

    /// How many members' summands the last run read in place (from node storage).
    std::size_t read_in_place() const noexcept { return in_place_; }

private:
    template <class T>
    T* staging(int q) const noexcept {
        return reinterpret_cast<T*>(staging_.segment(q));
    }

    /// Member q's summand: in place, or its staged copy.
    template <class T>
    const T* source(int q) const noexcept {
        const T* b = slots_.in<T>(q);
        return b ? b : staging<T>(q);
    }

    communicator comm_;
    detail::node_slots slots_;
    shared_window staging_; ///< allocated by the first run that needs it
    node_barrier barrier_;
    std::size_t staging_bytes_ = 0, in_place_ = 0;
    int me_ = 0;
};

} // namespace xshard

#ifdef XSHARD_SEPARATE_COMPILATION
namespace xshard {
#define XSHARD_DETAIL_NODE_REDUCE(T)                                                               \
    XSHARD_INSTANTIATE std::size_t node_all_reducer::all_reduce<T, detail::keep_result>(           \
        const T*, T*, std::size_t, reduction, detail::keep_result);
XSHARD_COMPILED_ELEMENTS(XSHARD_DETAIL_NODE_REDUCE)
#undef XSHARD_DETAIL_NODE_REDUCE
} // namespace xshard
#endif
