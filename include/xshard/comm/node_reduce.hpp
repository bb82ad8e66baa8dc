#pragma once
/// \file
/// All-reduce among the ranks of one node through shared memory: every member reads the
/// others' summands in place, no message. Summands and results that lie in node storage
/// (node_arena.hpp) are read where they are; the others are staged once into a window.

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

/// Member `me`'s share of an all-reduce: its segment of `out` = its own term (from `in`)
/// combined with every other member q's term, read from `source(q)` (a pointer to q's n
/// elements: its summand in place or its staged copy), in cache-sized chunks (the partial
/// result stays in cache while each term is added). `in` and `out` may be the same buffer.
template <class T, class Source>
void reduce_share(const T* in, T* out, std::size_t n, std::size_t p, int me, Source&& source,
                  reduction op) {
    const auto [lo, len] = reduce_segment(std::size_t(me), n, p);
    constexpr std::size_t chunk = 4096;
    for (std::size_t c = lo; c < lo + len; c += chunk) {
        const std::size_t m = std::min(chunk, lo + len - c);
        bool first = true;
        for (int q = 0; q < int(p); ++q)
            if (q != me) {
                const T* from = source(q);
                combine(out + c, first ? in + c : out + c, from + c, m, op);
                first = false;
            }
        if (first) // one member: nothing to add
            std::memmove(out + c, in + c, m * sizeof(T));
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

    /// All-reduce of `n` elements from `in` into `out` (they may be the same buffer);
    /// collective over the communicator, every member with the same n. Returns the bytes
    /// peers read from this rank, counted as the pairwise algorithm counts its sends.
    template <class T>
    std::size_t all_reduce(const T* in, T* out, std::size_t n, reduction op) {
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
            in, out, n, p, me_, [&](int q) { return source<T>(q); }, op);
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
