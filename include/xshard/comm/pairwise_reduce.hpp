#pragma once
/// \file
/// Bandwidth-optimal reductions over point-to-point messages, with the local reduction
/// vectorised by xsimd.
///
/// Open MPI 4.1's reducing collectives reach a fraction of the memory bandwidth on one node,
/// well below its MPI_Alltoall (figures: benchmarks/README.md). `reducer` runs the textbook
/// bandwidth-optimal algorithms instead: a pairwise reduce-scatter (in round k, member g
/// sends its term of member g+k's piece and receives member g-k's term of its own piece,
/// adding it chunk by chunk as it arrives so that each addition overlaps the next chunk's
/// transfer) and, for all-reduce, that reduce-scatter followed by a pairwise all-gather. Per
/// rank this moves (p-1)/p n bytes for a reduce-scatter and 2 (p-1)/p n for an all-reduce,
/// the lower bounds. Short messages go to MPI (`reduce_tuning::min_piece_bytes`), whose
/// latency-optimal algorithms win there. With `reduce_tuning::shared_memory_all_reduce`, an
/// all-reduce of at least `reduce_tuning::shared_memory_min_bytes` over a communicator whose
/// members share one node reads the members' summands in place through shared memory
/// instead (node_reduce.hpp): no message at all; buffers in node storage (node_arena.hpp)
/// are read and written where they are, others are staged once into a window.

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/combine.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/counting_allocator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/node.hpp>
#include <xshard/comm/node_reduce.hpp>
#include <xshard/comm/reduction.hpp>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace xshard {

namespace detail {

/// The crossovers every reduce_tuning starts from (`use_reduce_crossovers`): per member's
/// piece, 64 KiB for both reductions unless a program installs fitted ones.
struct reduce_crossovers {
    std::atomic<std::size_t> all_reduce{std::size_t(64) << 10};
    std::atomic<std::size_t> reduce_scatter{std::size_t(64) << 10};
};

inline reduce_crossovers& default_crossovers() noexcept {
    static reduce_crossovers c;
    return c;
}

} // namespace detail

/// Tuning of the point-to-point reductions.
struct reduce_tuning {
    /// An all-reduce over p ranks runs the pairwise algorithm when each member's segment
    /// (n / p of the buffer) has at least this many bytes, MPI_Allreduce below. Per segment,
    /// so that the crossover grows with p: the pairwise algorithm takes 2 (p - 1) rounds, the
    /// latency-optimal algorithms MPI uses for short messages about 2 log2 p. Fitted at 2, 4,
    /// 8 and 16 ranks on one node (benchmarks/README.md, "Reductions against MPI"), unless
    /// the program installed crossovers fitted on its own ranks (`use_reduce_crossovers`,
    /// `calibrate_reduce_tuning`).
    std::size_t min_piece_bytes =
        detail::default_crossovers().all_reduce.load(std::memory_order_relaxed);
    /// The chunk of a pipelined round. Every member of a group must use the same value.
    std::size_t chunk_bytes = std::size_t(256) << 10;
    /// Plans run a step among ranks that share one node through shared-memory windows
    /// (redistribute/node_step.hpp) when the tensor has at least this many bytes (every
    /// member decides alike from the global shape); SIZE_MAX (the default) keeps every step
    /// on MPI. Opt-in because, while shards live in private memory, the window path copies
    /// each byte twice: on the idle development machine Open MPI's single-copy transport
    /// was faster for exchanges and as fast for reduce-scatters (README, "Performance on
    /// one node"). The environment variable XSHARD_SHARED_MEMORY=0 turns it off everywhere.
    std::size_t shared_memory_min_bytes = SIZE_MAX;
    /// Whether all-reduces take the shared-memory path too (node_reduce.hpp). Off by
    /// default: while buffers live in private memory the path stages each summand once, and
    /// on the development machine it measured no faster than the pairwise messages for one
    /// 64 MiB all-reduce (Open MPI's CMA is a single copy for contiguous messages) and
    /// slower for 4 MiB gradient buckets, packed and staged (three node barriers each). Buffers in
    /// node storage (node_arena.hpp) are read in place, without staging. A kept gradient
    /// synchronizer turns the path on for its groups on one node (train/gradients.hpp): it reduces
    /// fused buckets on the gradients (`all_reduce_pieces`), which saves packing and unpacking.
    bool shared_memory_all_reduce = false;
    /// Shared-memory exchange steps write output blocks of at least this many bytes with
    /// non-temporal stores (redistribute/node_step.hpp: blocks that, summed over a node's
    /// ranks, outgrow the cache; on the development machine, 32 MiB of L3, they paid from
    /// 8 MiB blocks on, were a toss-up at 4 MiB and cost 1.3-2.5x at 1 MiB, which a cached
    /// copy keeps in L3).
    std::size_t shared_memory_streaming_bytes = std::size_t(8) << 20;
    /// A reduce-scatter over p ranks runs the pairwise algorithm when each member's piece
    /// has at least this many bytes on average, MPI's below (MPI_Reduce_scatter_block for
    /// equal pieces, MPI_Reduce_scatter otherwise; likewise fitted, likewise installed).
    std::size_t reduce_scatter_min_piece_bytes =
        detail::default_crossovers().reduce_scatter.load(std::memory_order_relaxed);

    friend constexpr bool operator==(const reduce_tuning&, const reduce_tuning&) = default;

    /// Elements of `element` bytes in a chunk.
    std::size_t chunk_elements(std::size_t element) const {
        return std::max<std::size_t>(1, chunk_bytes / element);
    }
    /// Scratch elements for receiving a piece of `n` elements: the whole piece when it
    /// travels as one message or fits one chunk, two alternating chunks otherwise.
    std::size_t scratch_elements(std::size_t n, bool chunked, std::size_t element) const {
        const std::size_t c = chunk_elements(element);
        return !chunked || n <= c ? n : 2 * c;
    }
    /// Whether an all-reduce of `n` elements on `p` ranks runs the pairwise algorithm
    /// (rather than MPI_Allreduce).
    bool pairwise_all_reduce(std::size_t n, std::size_t p, std::size_t element) const {
        return p > 1 && n >= p && n / p * element >= min_piece_bytes;
    }
    /// Whether a reduce-scatter of a block of `n` elements over `p` ranks runs the pairwise
    /// algorithm (rather than MPI's, for types MPI can add).
    bool pairwise_reduce_scatter(std::size_t n, std::size_t p, std::size_t element) const {
        return p > 1 && n / p * element >= reduce_scatter_min_piece_bytes;
    }
};

/// Makes `fitted`'s two crossovers (`min_piece_bytes`, `reduce_scatter_min_piece_bytes`) those
/// of every reduce_tuning this process makes from now on: a default one, and the fields a
/// designated initializer leaves out. Plans made afterwards, and gradient synchronizers at
/// their first reduction, choose between the pairwise path and MPI's collectives by them (and
/// price steps by that choice); a plan keeps those it was made with. Typically those that
/// `calibrate_reduce_tuning` (search/calibrate.hpp) fits on the world's ranks, which differ
/// from the defaults with the rank count and the network:
///
///     xshard::use_reduce_crossovers(xshard::calibrate_reduce_tuning(world).tuning);
///
/// The members of a group must choose alike, so every rank must hold the same crossovers:
/// collective over MPI_COMM_WORLD, and when they differ among its ranks every rank raises
/// std::invalid_argument and none changes. Not to be called while another thread makes
/// plans.
inline void use_reduce_crossovers(const reduce_tuning& fitted) {
    const auto r = value_ranges<2>(
        communicator::world(),
        {fitted.min_piece_bytes, fitted.reduce_scatter_min_piece_bytes});
    if (!r[0].agrees() || !r[1].agrees())
        throw std::invalid_argument(
            "use_reduce_crossovers: the ranks hold different crossovers (all-reduce " +
            std::to_string(r[0].least) + " to " + std::to_string(r[0].most) +
            " bytes, reduce-scatter " + std::to_string(r[1].least) + " to " +
            std::to_string(r[1].most) + "); the members of a group must choose alike");
    auto& d = detail::default_crossovers();
    d.all_reduce.store(fitted.min_piece_bytes, std::memory_order_relaxed);
    d.reduce_scatter.store(fitted.reduce_scatter_min_piece_bytes, std::memory_order_relaxed);
}

/// One member's piece in a reduction: where its term sits in the input (offset, then `count`
/// items of `type`: a plain count for a contiguous piece, a derived datatype otherwise) and
/// how many elements it has.
struct reduce_piece {
    std::size_t offset = 0;
    std::size_t elements = 0;
    int count = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
};

/// The pairwise reduce-scatter and all-gather, with their workspace (scratch chunks and
/// request slots) kept between calls: after the first call of a given size, a call
/// allocates nothing.
template <class T>
class reducer {
public:
    explicit reducer(reduce_tuning tuning = {}, allocation_stats* stats = nullptr)
        : tuning_(tuning)
        , scratch_(counting_allocator<T>(stats)) {}

    const reduce_tuning& tuning() const noexcept { return tuning_; }

    /// The bytes of this rank's staging windows of the shared-memory path (0 while every
    /// all-reduce through it read every member's buffers in place, from node storage).
    std::size_t node_staging_bytes() const noexcept {
        std::size_t b = 0;
        for (const auto& s : nodes_)
            if (s->reducer)
                b += s->reducer->staging_bytes();
        return b;
    }

    /// Makes room for receiving pieces of up to `n` elements and sending pieces of up to
    /// `send_elements` in one round; `execute`-time calls within these sizes allocate
    /// nothing.
    void reserve(std::size_t n, std::size_t send_elements, bool chunked) {
        if (scratch_.size() < tuning_.scratch_elements(n, chunked, sizeof(T)))
            scratch_.resize(tuning_.scratch_elements(n, chunked, sizeof(T)));
        const std::size_t c = tuning_.chunk_elements(sizeof(T));
        requests_.reserve((chunked ? send_elements / c : 0) + 2);
    }

    /// Makes room for `all_reduce` of `n` elements on `p` ranks.
    void reserve_all_reduce(std::size_t n, std::size_t p) {
        if (tuning_.pairwise_all_reduce(n, p, sizeof(T))) {
            const std::size_t segment = n / p + 1;
            const std::size_t chunks = segment / tuning_.chunk_elements(sizeof(T)) + 1;
            reserve(segment, segment, true);
            gather_requests_.reserve(2 * (p - 1) * chunks);
            pieces_.reserve(p);
        }
    }

    /// The scratch this reducer holds, in bytes.
    std::size_t scratch_bytes() const noexcept { return scratch_.size() * sizeof(T); }

    /// Reduce-scatter over the members of `c`: `pieces[g]`
    /// locates member g's piece in `in`; `out` (contiguous, pieces[me].elements long)
    /// receives the reduction of all terms of this rank's piece. This rank's own term is
    /// read from `own` (contiguous) when given, fused with the first addition; otherwise
    /// `out` must already hold it. With `chunked`, every piece must be contiguous (type =
    /// the element type). Returns the bytes sent.
    std::size_t reduce_scatter(const communicator& c, const T* in,
                               std::span<const reduce_piece> pieces, T* out, reduction op,
                               bool chunked, const T* own = nullptr) {
        return reduce_scatter(c, in, pieces, out, op, chunked, own,
                              [](std::size_t, std::size_t) {});
    }

    /// The same, calling `done(lo, len)` as soon as elements [lo, lo + len) of `out` hold
    /// their final value (so that a caller can send them on at once).
    template <class Done>
    std::size_t reduce_scatter(const communicator& c, const T* in,
                               std::span<const reduce_piece> pieces, T* out, reduction op,
                               bool chunked, const T* own, Done&& done) {
        const int p = c.size(), me = c.rank();
        detail::require_whole(c, "a pairwise reduction");
        const MPI_Comm comm = c.native();
        const std::size_t n = pieces[std::size_t(me)].elements;
        reserve(n, 0, chunked); // a no-op once reserved
        const std::size_t chunk =
            chunked ? tuning_.chunk_elements(sizeof(T)) : std::max<std::size_t>(n, 1);
        const std::size_t chunks = (n + chunk - 1) / chunk;
        std::size_t sent = 0;
        for (int k = 1; k < p; ++k) {
            const int to = (me + k) % p, from = (me - k + p) % p;
            const auto& theirs = pieces[std::size_t(to)];
            requests_.clear();
            if (theirs.elements > 0) {
                if (chunked) {
                    for (std::size_t lo = 0; lo < theirs.elements; lo += chunk)
                        post_send(requests_, in + theirs.offset + lo,
                                  int(std::min(chunk, theirs.elements - lo)), datatype_of<T>(), to,
                                  scatter_tag(lo / chunk), comm);
                } else {
                    post_send(requests_, in + theirs.offset, theirs.count, theirs.type, to,
                              scatter_tag(0), comm);
                }
                sent += theirs.elements * sizeof(T);
            }
            MPI_Request pending[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
            auto post = [&](std::size_t j) {
                // One message of n elements when not chunked: beyond an int count it is one
                // item of a derived type.
                const auto [count, type] = detail::wire_count<T>(std::min(chunk, n - j * chunk));
                detail::check_mpi(MPI_Irecv(slot(j, chunk), count, type, from, scatter_tag(j), comm,
                                            &pending[j % 2]),
                                  "MPI_Irecv");
            };
            if (chunks > 0)
                post(0);
            for (std::size_t j = 0; j < chunks; ++j) {
                if (j + 1 < chunks)
                    post(j + 1);
                detail::watched_wait(std::span(&pending[j % 2], 1), "pairwise reduce-scatter", comm,
                                     int(p), std::min(chunk, n - j * chunk) * sizeof(T),
                                     {true, true});
                const std::size_t lo = j * chunk;
                const T* mine = k == 1 && own ? own + lo : out + lo;
                combine(out + lo, mine, slot(j, chunk), std::min(chunk, n - lo), op);
                if (k == p - 1)
                    done(lo, std::min(chunk, n - lo));
            }
            detail::watched_wait(requests_, "pairwise reduce-scatter", comm, int(p), sent,
                                 {true, true});
        }
        return sent;
    }

    /// All-reduce of `in` into `out` (n elements each; they may be the same buffer) over
    /// `c`, the result finished by `finish` (`finish(T* p, m)` applied once to every element,
    /// before it is shared where it can be: see detail::keep_result): with segments of
    /// `tuning().min_piece_bytes` and more, the pairwise reduce-scatter, each chunk of this rank's
    /// segment sent to every other member as soon as it is reduced (the all-gather overlaps
    /// the reduce-scatter); MPI_Allreduce below. Returns the bytes this rank sent (for
    /// MPI_Allreduce, the bandwidth-optimal figure 2 (p-1)/p n).
    template <class Finish = detail::keep_result>
    std::size_t all_reduce(const communicator& c, const T* in, T* out, std::size_t n, reduction op,
                           Finish finish = {}) {
        const auto p = std::size_t(c.size());
        const std::size_t bytes = n * sizeof(T);
        if (tuning_.shared_memory_all_reduce && p > 1 && n > 0 &&
            bytes >= tuning_.shared_memory_min_bytes)
            if (auto* node = node_path(c))
                return node->all_reduce(in, out, n, op, finish);
        if constexpr (summable<T>) {
            if (!tuning_.pairwise_all_reduce(n, p, sizeof(T))) {
                if (in == out)
                    allreduce(c, std::span(out, n), op);
                else
                    allreduce(c, std::span(in, n), std::span(out, n), op);
                finish(out, n);
                return p == 1 ? 0 : 2 * (p - 1) * bytes / p;
            }
        } else if (p == 1) { // types MPI cannot add (16-bit floats) always take the pairwise path
            std::copy_n(in, n, out);
            finish(out, n);
            return 0;
        }
        reserve_all_reduce(n, p);
        pieces_.resize(p);
        // Segment g: n / p elements, one more for the first n % p (sent in chunks, so the
        // count of a piece is unused).
        for (std::size_t g = 0; g < p; ++g)
            pieces_[g] = {g * (n / p) + std::min(g, n % p), n / p + (g < n % p ? 1 : 0), 0,
                          datatype_of<T>()};
        const int me = c.rank();
        detail::require_whole(c, "a pairwise reduction");
        const MPI_Comm comm = c.native();
        const std::size_t chunk = tuning_.chunk_elements(sizeof(T));
        // Every other member's segment, chunk by chunk, as its owner finishes it.
        gather_requests_.clear();
        for (std::size_t g = 0; g < p; ++g) {
            if (int(g) == me)
                continue;
            const auto& seg = pieces_[g];
            for (std::size_t lo = 0; lo < seg.elements; lo += chunk) {
                gather_requests_.emplace_back();
                detail::check_mpi(MPI_Irecv(out + seg.offset + lo,
                                            int(std::min(chunk, seg.elements - lo)),
                                            datatype_of<T>(), int(g), gather_tag(lo / chunk), comm,
                                            &gather_requests_.back()),
                                  "MPI_Irecv");
            }
        }
        const auto mine = pieces_[std::size_t(me)];
        std::size_t gathered = 0;
        const std::size_t scattered = reduce_scatter(
            c, in, pieces_, out + mine.offset, op, true, in + mine.offset,
            [&](std::size_t lo, std::size_t len) {
                finish(out + mine.offset + lo, len);
                for (std::size_t k = 1; k < p; ++k)
                    post_send(gather_requests_, out + mine.offset + lo, int(len), datatype_of<T>(),
                              int((std::size_t(me) + k) % p), gather_tag(lo / chunk), comm);
                gathered += (p - 1) * len * sizeof(T);
            });
        detail::watched_wait(gather_requests_, "pairwise all-gather", comm, int(p), gathered,
                             {true, true});
        return scattered + gathered;
    }

    /// Whether all-reduces over `c` can take the shared-memory path (its members share a
    /// node and the control window was made). The first call for `c` is collective over `c`.
    bool shares_node(const communicator& c) { return c.size() > 1 && node_path(c) != nullptr; }

    /// All-reduce in place over `c` of the concatenation of `pieces`, through shared memory
    /// (node_all_reducer::all_reduce_pieces: nothing packed); requires `shares_node(c)`.
    /// Returns the bytes peers read from this rank.
    template <class Finish = detail::keep_result>
    std::size_t all_reduce_pieces(const communicator& c, std::span<const std::span<T>> pieces,
                                  reduction op, Finish finish = {}) {
        auto* node = node_path(c);
        if (!node)
            throw error("xshard: all_reduce_pieces: the members do not share a node");
        return node->all_reduce_pieces(pieces, op, finish);
    }

private:
    /// The shared-memory path over one communicator: whether its members share a node, and
    /// its all-reducer.
    struct node_state {
        communicator comm;
        bool usable = false;
        std::unique_ptr<node_all_reducer> reducer;
    };

    /// The shared-memory path for all-reduces over `c`, or null when its members do not
    /// share a node. The first call for `c` is collective over `c` (every member decides
    /// alike); a control window MPI refuses anywhere turns the path off everywhere.
    node_all_reducer* node_path(const communicator& c) {
        auto it =
            std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& s) { return s->comm == c; });
        if (it == nodes_.end()) {
            auto s = std::make_unique<node_state>();
            s->comm = c;
            s->usable = node_group(c).whole_communicator_shares_memory();
            if (s->usable && !made_on_every_rank(c, [&] {
                    s->reducer = std::make_unique<node_all_reducer>(c);
                })) {
                s->usable = false;
                s->reducer.reset();
            }
            nodes_.push_back(std::move(s));
            it = std::prev(nodes_.end());
        }
        return (*it)->usable ? (*it)->reducer.get() : nullptr;
    }

    T* slot(std::size_t j, std::size_t chunk) {
        return scratch_.data() + (scratch_.size() >= 2 * chunk ? (j % 2) * chunk : 0);
    }

    // Tags of the two phases; chunks reuse them cyclically (MPI keeps the order of messages
    // between two ranks with one tag, and receives are posted in order).
    static int scatter_tag(std::size_t chunk) { return int(chunk % 8192); }
    static int gather_tag(std::size_t chunk) { return 8192 + int(chunk % 8192); }

    static void post_send(std::vector<MPI_Request>& requests, const T* data, int count,
                          MPI_Datatype type, int to, int tag, MPI_Comm comm) {
        requests.emplace_back();
        detail::check_mpi(MPI_Isend(data, count, type, to, tag, comm, &requests.back()),
                          "MPI_Isend");
    }

    reduce_tuning tuning_;
    std::vector<T, counting_allocator<T>> scratch_;
    std::vector<MPI_Request> requests_;
    std::vector<MPI_Request> gather_requests_;
    std::vector<reduce_piece> pieces_;
    std::vector<std::unique_ptr<node_state>> nodes_;
};

} // namespace xshard

#ifdef XSHARD_SEPARATE_COMPILATION
namespace xshard {
#define XSHARD_DETAIL_REDUCER(T)                                                                   \
    XSHARD_INSTANTIATE class reducer<T>;                                                           \
    XSHARD_INSTANTIATE std::size_t reducer<T>::all_reduce<detail::keep_result>(                    \
        const communicator&, const T*, T*, std::size_t, reduction, detail::keep_result);
XSHARD_COMPILED_ELEMENTS(XSHARD_DETAIL_REDUCER)
#undef XSHARD_DETAIL_REDUCER
} // namespace xshard
#endif
