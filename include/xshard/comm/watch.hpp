#pragma once
/// \file
/// Watched waits: how a rank waiting in a collective learns that a peer has failed (and
/// raises `peer_failure`) or that the collective has stalled (and raises
/// `collective_timeout`), instead of waiting for ever; and the flight recorder of the last
/// collectives each rank waited in.
///
/// - Failure notices travel on a communicator of their own, a duplicate of MPI_COMM_WORLD
///   that `environment` opens. A rank that fails inside a failure scope (`agreed`, so
///   `shard()`, the driver's step and a pipeline's step) sends its message to every member
///   of the scope's communicator before it agrees on the outcome (`announce_failure`).
/// - Every wait of comm/ that can block on other ranks polls its requests, the notices and
///   the clock (`watched_wait`). A wait that has heard of a failure goes on for a grace
///   (`watch_settings::notice_grace`, 1 s): the failing rank may have done its part of it
///   before it failed, and then it completes; otherwise it gives up and raises
///   `peer_failure`. A blocking collective first waits, watched, in a
///   nonblocking barrier, then runs MPI's blocking call, which every rank has then reached:
///   the watching costs one barrier's latency and leaves MPI's tuned algorithms alone, and
///   what a wait can give up is a barrier, which holds no buffer. (A nonblocking collective
///   given up would go on writing into buffers its caller frees.) Point-to-point receives
///   given up are cancelled.
/// - A wait that gives up leaves its collective posted (MPI cannot cancel a collective), so
///   it marks its communicator broken (`communicator::broken()`); every rank of a failure
///   scope in which some rank gave up a wait marks the scope's communicator and every
///   communicator xshard owns broken (comm/agree.hpp). A collective on a broken
///   communicator raises at once, and a wait on one posted before gives up. A program that goes on
///   builds a new mesh, or ends and resumes from a checkpoint. Buffers of the abandoned operation
///   may still be written by MPI until the program ends.
/// - The watchdog: a wait longer than `watch_settings::timeout` asks the communicator's
///   members which of them are waiting too, then raises (or aborts the job) naming the
///   collective, the members and those that did not answer, and prints the flight recorder.
///
/// Communicators made or duplicated by MPI_Comm_* calls (dup, split, shared windows) and
/// MPI-IO are not watched.

#include <xshard/compiled.hpp>
#include <xshard/comm/before_finalize.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace xshard {

/// What the watchdog does when a collective outlasts its timeout.
enum class on_timeout {
    raise, ///< `collective_timeout` on the waiting rank
    abort, ///< the message and the flight recorder on stderr, then MPI_Abort (exit code 1)
};

/// How this rank watches its waits. The defaults come from the environment, read once:
/// XSHARD_COLLECTIVE_TIMEOUT (seconds; 0 for none; 600 when unset) and XSHARD_ON_TIMEOUT
/// (`raise` or `abort`).
struct watch_settings {
    /// How long a collective may wait before the watchdog acts (zero: for ever).
    std::chrono::duration<double> timeout{600.0};
    on_timeout action = on_timeout::raise;
    /// Whether a rank whose wait a peer's failure ended prints its flight recorder.
    bool print_on_failure = true;
    /// How long a wait goes on after a failure notice before it gives up: the failing rank
    /// may have done its part of this wait before it failed, and then the wait completes.
    std::chrono::duration<double> notice_grace{1.0};
};

/// One collective in the flight recorder.
struct flight_entry {
    enum class state { waiting, done, abandoned };
    std::uint64_t sequence = 0;      ///< counts this rank's watched waits from 0
    std::string_view operation;      ///< e.g. "MPI_Allreduce"
    std::uintptr_t communicator = 0; ///< the MPI handle, to tell communicators apart
    int members = 0;                 ///< its size (0 when unknown)
    std::size_t bytes = 0;           ///< the buffer's bytes, where known
    state status = state::waiting;
    double seconds = 0; ///< how long the wait took (so far)
};

namespace detail {

inline constexpr int notice_tag = 1; // a failure notice: the failing rank's message
inline constexpr int query_tag = 2;  // the watchdog's "are you waiting?"
inline constexpr int answer_tag = 3; // "yes"
inline constexpr std::size_t recorder_size = 32;

XSHARD_DECL watch_settings settings_from_environment();

/// This rank's watching: the notice communicator, the settings, the recorder, the notices
/// consumed by waits and not yet settled by an agreement.
struct watch_state {
    MPI_Comm notices = MPI_COMM_NULL;
    watch_settings settings = settings_from_environment();
    std::vector<flight_entry> ring = std::vector<flight_entry>(recorder_size);
    std::uint64_t next = 0;
    std::map<int, int> credits; // notices received in waits, by world rank
    struct heard {
        int rank;
        std::string message;
    };
    std::optional<heard> failure; // the first notice received and not yet settled
    std::uint64_t abandoned = 0;  // waits given up so far
    std::deque<std::string> sent; // the buffers of notices sent (small; kept until the end)
};

inline watch_state& watch() {
    static watch_state state;
    return state;
}

/// Opens the notice communicator (collective over MPI_COMM_WORLD; once; freed at
/// MPI_Finalize). Called by `environment`.
XSHARD_DECL void open_watch();

/// The world ranks of `comm`'s members, in its rank order.
XSHARD_DECL std::vector<int> world_ranks(MPI_Comm comm);

/// "0", "0,2", "0-3", "0-1,4-5": ranks in ascending order, runs as ranges.
XSHARD_DECL std::string rank_list(const std::vector<int>& ranks);

/// Sends `message` to every other member of `comm` as a failure notice (nonblocking; the
/// buffer is kept). Without a notice communicator (no `environment`), does nothing.
XSHARD_DECL void announce_failure(MPI_Comm comm, const std::string& message);

/// Receives the message that `Iprobe` found (`status`) on the notice communicator.
XSHARD_DECL std::string receive_notice(const MPI_Status& status);

/// Consumes one failure notice from world rank `from` that no wait consumed (blocking: an
/// agreement knows it was sent). How an agreement leaves no stale notice behind.
XSHARD_DECL void settle_notice(int from);

/// Forgets the failure heard once an agreement has settled every notice received.
XSHARD_DECL void forget_settled_failure();

/// The flight recorder as text, oldest first.
XSHARD_DECL std::string flight_recorder_text();

/// One wait in progress: its flight recorder entry, its deadline, the notices it heeds.
class wait_watch {
public:
    /// `heed_notices` false: the wait answers the watchdog's queries but leaves failure
    /// notices for an agreement to settle (how agreements themselves wait).
    /// `point_to_point`: the requests are sends and receives, which giving up cancels.
    wait_watch(std::string_view operation, MPI_Comm comm, int members, std::size_t bytes,
               bool heed_notices = true, bool point_to_point = false)
        : state_(watch())
        , start_(std::chrono::steady_clock::now())
        , comm_(comm)
        , heed_(heed_notices)
        , point_to_point_(point_to_point) {
        auto& e = state_.ring[state_.next % recorder_size];
        e = {state_.next,
             operation,
             reinterpret_cast<std::uintptr_t>(comm),
             members,
             bytes,
             flight_entry::state::waiting,
             0};
        entry_ = state_.next++;
    }

    /// Marks the wait done.
    void done() noexcept { close(flight_entry::state::done); }

    /// Raises `peer_failure` once a failure notice has come and the wait has gone on for the
    /// grace since, `xshard::error` when the communicator is broken (by a failure scope
    /// after the operation was posted), `collective_timeout` past the deadline (after
    /// abandoning `requests`); answers the watchdog's queries. `spin` counts
    /// the caller's polls: after the first thousand it yields the core between them.
    void check(std::span<MPI_Request> requests, unsigned spin);

private:
    void close(flight_entry::state s) noexcept {
        auto& e = state_.ring[entry_ % recorder_size];
        if (e.sequence != entry_)
            return;
        e.status = s;
        e.seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }

    // Leaves `requests` posted for good (MPI cannot cancel a collective; point-to-point
    // ones are cancelled and freed) and marks the communicator broken.
    void abandon(std::span<MPI_Request> requests) {
        for (auto& q : requests) {
            if (point_to_point_ && q != MPI_REQUEST_NULL) {
                MPI_Cancel(&q);
                MPI_Request_free(&q);
            }
            q = MPI_REQUEST_NULL;
        }
        close(flight_entry::state::abandoned);
        ++state_.abandoned;
        mark_broken(comm_);
    }

    std::chrono::duration<double> timeout() const {
        return state_.settings.timeout.count() > 0 ? state_.settings.timeout
                                                   : std::chrono::duration<double>::max();
    }

    // A message on the notice communicator: a failure notice is kept (the wait gives up
    // after the grace), a watchdog's question answered, a late answer dropped.
    void handle(const MPI_Status& status);

    [[noreturn]] void peer_failed(std::span<MPI_Request> requests) {
        abandon(requests);
        if (state_.settings.print_on_failure)
            std::fprintf(stderr, "%s", flight_recorder_text().c_str());
        throw peer_failure(state_.failure->rank, state_.failure->message);
    }

    // The members of the communicator that say they are waiting too, asked through the
    // notice communicator and given a second (or the timeout, if shorter) to answer.
    std::vector<int> waiting_members(const std::vector<int>& members);

    [[noreturn]] void timed_out(std::span<MPI_Request> requests);

    watch_state& state_;
    std::chrono::steady_clock::time_point start_;
    MPI_Comm comm_;
    std::uint64_t entry_ = 0;
    bool heed_;
    bool point_to_point_;
    std::optional<std::chrono::steady_clock::time_point> heard_; // when this wait learnt of it
};

/// How a watched wait treats its requests and the notices.
struct wait_kind {
    bool heed_notices = true;    ///< false: an agreement's wait (see `wait_watch`)
    bool point_to_point = false; ///< sends and receives, cancelled when given up
};

/// Waits for every one of `requests`, watched (see the file comment). An abandoned wait sets
/// its requests to MPI_REQUEST_NULL before it raises.
XSHARD_DECL void watched_wait(std::span<MPI_Request> requests, std::string_view operation,
                              MPI_Comm comm = MPI_COMM_NULL, int members = 0, std::size_t bytes = 0,
                              wait_kind kind = {});

/// Waits for `requests` where raising is not possible (a destructor, perhaps while an
/// exception unwinds): returns false, leaving them posted, when a wait has been given up
/// since it began, once a failure notice has waited for the grace, or past the watchdog's
/// timeout, instead of waiting for ever.
XSHARD_DECL bool finish_quietly(std::span<MPI_Request> requests) noexcept;

/// Raises at once when `c` is broken (see the file comment).
XSHARD_DECL void require_whole(const communicator& c, std::string_view operation);

} // namespace detail

/// This rank's watch settings.
inline watch_settings current_watch_settings() {
    return detail::watch().settings;
}

/// Sets this rank's watch settings (local; set them alike on every rank).
inline void set_watch_settings(const watch_settings& s) {
    detail::watch().settings = s;
}

/// This rank's last waits, oldest first (at most 32).
XSHARD_DECL std::vector<flight_entry> flight_recorder();

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/watch.ipp>
#endif
