#pragma once
/// \file
/// A nonblocking operation in flight.

#include <xshard/comm/error.hpp>

#include <mpi.h>

#include <cstdio>
#include <span>
#include <utility>
#include <vector>

namespace xshard {

/// An MPI request (from a nonblocking collective or point-to-point call). Move-only. A
/// request still active when destroyed is waited for there, so buffers are never left in
/// use by MPI; an error at that point cannot be thrown from a destructor and is reported
/// on stderr instead: call `wait()` to see errors as exceptions.
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

    /// Blocks until the operation completes.
    void wait() {
        if (active())
            detail::check_mpi(MPI_Wait(&handle_, MPI_STATUS_IGNORE), "MPI_Wait");
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
        if (MPI_Wait(&handle_, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            std::fprintf(stderr, "xshard: a request destroyed while active failed in MPI_Wait\n");
    }

    MPI_Request handle_ = MPI_REQUEST_NULL;
};

/// Waits for every request (MPI_Waitall).
inline void wait_all(std::span<request> requests) {
    std::vector<MPI_Request> handles;
    handles.reserve(requests.size());
    for (auto& r : requests)
        handles.push_back(*r.native());
    const int code =
        MPI_Waitall(static_cast<int>(handles.size()), handles.data(), MPI_STATUSES_IGNORE);
    for (std::size_t i = 0; i < requests.size(); ++i)
        *requests[i].native() = handles[i];
    detail::check_mpi(code, "MPI_Waitall");
}

} // namespace xshard
