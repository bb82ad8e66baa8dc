#pragma once
/// \file
/// A barrier among the ranks of one node through a counter in shared memory, waiting with
/// backoff: what orders the writers and readers of shared-memory windows.

#include <xshard/compiled.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/shared_window.hpp>
#include <xshard/comm/watch.hpp>

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>

namespace xshard {

/// A sense-reversing central barrier over the members of a one-node communicator. A
/// waiting rank spins briefly, then yields its core, then sleeps for growing intervals (up
/// to 64 us): on a machine with fewer cores than ranks a spinning rank would steal the core
/// of the rank it waits for. While it waits it keeps MPI progressing (MPI_Iprobe): a peer
/// may still be finishing a message of an earlier step that needs this rank's progress
/// (a rendezvous), and would otherwise never arrive. `arrive_and_wait` also orders memory: every
/// store a member made before arriving is visible to every member after it returns.
///
/// Construction allocates a small shared window and clears it (collective over `c`, ranks of
/// one node, else every member raises: a window and an MPI barrier); `arrive_and_wait`
/// communicates through shared memory only, and a long wait is watched (comm/watch.hpp).
class node_barrier {
public:
    node_barrier() = default;

    explicit node_barrier(const communicator& c);

    /// Waits until every member has arrived. Every member must call it the same number of
    /// times; a member that never arrives leaves the others waiting.
    void arrive_and_wait();

    /// Whether this barrier was made.
    explicit operator bool() const noexcept { return bool(window_); }

private:
    static constexpr std::size_t line = 64; // the two words on separate cache lines

    std::uint64_t* counter(int i) const noexcept {
        return reinterpret_cast<std::uint64_t*>(window_.segment(0) + std::size_t(i) * line);
    }

    void back_off(unsigned spin) const {
        if (spin < 64) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            return;
        }
        int flag = 0;
        detail::check_mpi(
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_.native(), &flag, MPI_STATUS_IGNORE),
            "MPI_Iprobe");
        if (spin < 128) {
            std::this_thread::yield();
        } else {
            const unsigned shift = spin - 128 < 6 ? spin - 128 : 6; // 1 us .. 64 us
            std::this_thread::sleep_for(std::chrono::microseconds(1u << shift));
        }
    }

    shared_window window_;
    communicator comm_;
    std::uint64_t members_ = 1;
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/node_barrier.ipp>
#endif
