#pragma once
/// \file
/// A nonblocking operation in flight.

#include <xshard/compiled.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/watch.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdio>
#include <span>
#include <utility>
#include <vector>

namespace xshard {

/// An MPI request (from a nonblocking collective or point-to-point call). Move-only. A
/// request still active when destroyed is waited for there, so buffers are never left in
/// use by MPI; an error at that point cannot be thrown from a destructor and is reported
/// on stderr instead: call `wait()` to see errors as exceptions. Waits are watched
/// (comm/watch.hpp): a peer's failure or the watchdog ends them; the destructor's wait then
/// leaves the operation posted.
class request {
public:
    request() = default;
    explicit request(MPI_Request handle) noexcept
        : handle_(handle) {}

    request(request&& other) noexcept
        : handle_(std::exchange(other.handle_, MPI_REQUEST_NULL)) {}
    request& operator=(request&& other) noexcept {
        if (this != &other) {
            finish_quietly();
            handle_ = std::exchange(other.handle_, MPI_REQUEST_NULL);
        }
        return *this;
    }
    ~request() { finish_quietly(); }

    /// Whether the operation may still be running.
    bool active() const noexcept { return handle_ != MPI_REQUEST_NULL; }

    /// Blocks until the operation completes (watched: raises `peer_failure` or
    /// `collective_timeout` instead of waiting for ever).
    void wait() {
        if (active())
            detail::watched_wait(std::span(&handle_, 1), "MPI_Wait");
    }

    /// Blocks until the operation completes, watched by the watchdog but not ended by a
    /// failure notice: for protocols that tell their peers of a failure themselves (a
    /// pipeline's aborted transfers), so that a peer's failure elsewhere leaves their
    /// messages matched.
    void wait_unheeded() {
        if (active())
            detail::watched_wait(std::span(&handle_, 1), "MPI_Wait", MPI_COMM_NULL, 0, 0,
                                 {false, false});
    }

    /// Whether the operation has completed (progressing it).
    bool test() {
        if (!active())
            return true;
        int done = 0;
        detail::check_mpi(MPI_Test(&handle_, &done, MPI_STATUS_IGNORE), "MPI_Test");
        return done != 0;
    }

    MPI_Request* native() noexcept { return &handle_; }

private:
    void finish_quietly() noexcept {
        if (!active())
            return;
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (finalized)
            return;
        if (!detail::finish_quietly(std::span(&handle_, 1)))
            std::fprintf(stderr, "xshard: a request destroyed while active did not complete\n");
    }

    MPI_Request handle_ = MPI_REQUEST_NULL;
};

/// Waits for every request (watched, as `request::wait`).
XSHARD_DECL void wait_all(std::span<request> requests);

/// Point-to-point messages posted together and completed together (MPI_Waitall), each
/// `count` items of an MPI datatype at a pointer: how plans exchange blocks. Its request
/// slots are reserved once, so that posting allocates nothing afterwards. Destroyed with
/// messages in flight, it waits for them (reporting a failure on stderr).
class message_batch {
public:
    message_batch() = default;
    message_batch(message_batch&&) noexcept = default;
    message_batch& operator=(message_batch&& other) noexcept {
        if (this != &other) {
            finish_quietly();
            handles_ = std::move(other.handles_);
        }
        return *this;
    }
    ~message_batch() { finish_quietly(); }

    /// Room for `n` messages in flight without allocating.
    void reserve(std::size_t n) { handles_.reserve(n); }

    /// Starts sending `count` items of `type` at `data` to rank `peer` of `c`.
    void isend(const communicator& c, const void* data, int count, MPI_Datatype type, int peer,
               int tag) {
        detail::require_whole(c, "MPI_Isend");
        comm_ = c.native();
        handles_.push_back(MPI_REQUEST_NULL);
        detail::check_mpi(MPI_Isend(data, count, type, peer, tag, c.native(), &handles_.back()),
                          "MPI_Isend");
    }

    /// Starts receiving `count` items of `type` at `data` from rank `peer` of `c`.
    void irecv(const communicator& c, void* data, int count, MPI_Datatype type, int peer,
               int tag) {
        detail::require_whole(c, "MPI_Irecv");
        comm_ = c.native();
        handles_.push_back(MPI_REQUEST_NULL);
        detail::check_mpi(MPI_Irecv(data, count, type, peer, tag, c.native(), &handles_.back()),
                          "MPI_Irecv");
    }

    /// Waits for every message posted since the last wait (watched, as `request::wait`;
    /// raises at once when their communicator has been marked broken since).
    void wait_all() {
        struct clear { // empty afterwards, whether the wait returns or raises
            std::vector<MPI_Request>& handles;
            ~clear() { handles.clear(); }
        } after{handles_};
        detail::watched_wait(handles_, "MPI_Waitall", comm_, 0, 0, {true, true});
    }

    /// Whether every message posted since the last wait is delivered (progressing them;
    /// MPI_Testall; never blocks). When true, the batch is empty again (`wait_all` then
    /// returns at once).
    bool test_all() {
        if (handles_.empty())
            return true;
        int done = 0;
        detail::check_mpi(MPI_Testall(static_cast<int>(handles_.size()), handles_.data(), &done,
                                      MPI_STATUSES_IGNORE),
                          "MPI_Testall");
        if (done)
            handles_.clear();
        return done != 0;
    }

    /// Messages posted and not yet waited for.
    std::size_t size() const noexcept { return handles_.size(); }

private:
    void finish_quietly() noexcept {
        if (handles_.empty())
            return;
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized && !detail::finish_quietly(handles_))
            std::fprintf(stderr, "xshard: messages in flight at destruction did not complete\n");
        handles_.clear();
    }

    std::vector<MPI_Request> handles_;
    MPI_Comm comm_ = MPI_COMM_NULL; // of the last message posted
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/request.ipp>
#endif
