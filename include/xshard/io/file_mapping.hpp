#pragma once
/// \file
/// A window of a file mapped into memory, moved along as accesses go, and accesses through
/// it that survive the file shrinking underneath.
///
/// A load or store through a mapping cannot report an error: when the page it touches is no
/// longer in the file (another process truncated it, e.g. `cp` over a checkpoint being
/// loaded), the kernel sends SIGBUS, whose default action ends the process. `fault_guard`
/// turns that into an io_error: while a guard lives, a SIGBUS handler is installed (the one
/// installed before it is kept and called for every other SIGBUS, and restored when the last
/// guard goes), and `file_window::access` runs its accesses so that a fault inside the
/// window jumps back out of them. The accesses must own nothing (plain copies and checksums:
/// a jump skips destructors).

#include <xshard/compiled.hpp>
#include <xshard/io/files.hpp>

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <string>
#include <utility>

namespace xshard::detail {

/// Runs shorter than this are stored and loaded through a mapping of the file (a column
/// split's rows): a system call per run costs more (mapped_writer.hpp, checkpoint_reader.hpp
/// read_block). Longer runs go through pwrite and pread.
inline constexpr std::size_t short_run = std::size_t(16) << 10;

/// Where a guarded access of this thread may fault, and where to jump back to.
struct fault_scope {
    sigjmp_buf jump;
    const std::byte* lo = nullptr;
    const std::byte* hi = nullptr;
};
inline thread_local fault_scope* guarded_access = nullptr;

/// The SIGBUS handler in place before the first live guard, and the number of live guards.
struct fault_handlers {
    std::mutex mutex;
    int guards = 0;
    struct sigaction previous {};
};
inline fault_handlers& sigbus_handlers() {
    static fault_handlers h;
    return h;
}

/// SIGBUS: back out of the guarded access it hit, or on to the previous handler.
XSHARD_DECL void on_sigbus(int sig, siginfo_t* info, void* context);

/// While alive, faults of `file_window::access` become io_errors (see the file comment).
/// Installing and restoring the handler are two system calls; accesses under a live guard
/// cost none.
class fault_guard {
public:
    fault_guard() {
        auto& h = sigbus_handlers();
        const std::lock_guard lock(h.mutex);
        if (h.guards++ > 0)
            return;
        struct sigaction a {};
        a.sa_sigaction = on_sigbus;
        // SA_NODEFER: SIGBUS stays unblocked in the handler, so jumping out of it (without
        // restoring a signal mask: no system call per access) leaves it unblocked.
        a.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
        sigemptyset(&a.sa_mask);
        ::sigaction(SIGBUS, &a, &h.previous);
    }
    ~fault_guard() {
        auto& h = sigbus_handlers();
        const std::lock_guard lock(h.mutex);
        if (--h.guards == 0)
            ::sigaction(SIGBUS, &h.previous, nullptr);
    }
    fault_guard(const fault_guard&) = delete;
    fault_guard& operator=(const fault_guard&) = delete;
};

/// A window of at least `window` bytes (page-aligned) of an open file, mapped shared with
/// `protection` (PROT_READ, or PROT_READ | PROT_WRITE), moved to wherever the next access
/// is. Not copyable; unmaps on destruction. Holds a fault_guard.
class file_window {
public:
    file_window(const file& f, int protection, std::size_t window = std::size_t(64) << 20)
        : file_(&f)
        , protection_(protection)
        , window_(window) {}
    file_window(const file_window&) = delete;
    file_window& operator=(const file_window&) = delete;
    ~file_window() { unmap(); }

    /// Maps a window holding the file's bytes [at, at + n) unless the current one does;
    /// false (and false from now on) when mmap refuses (a file system without shared
    /// mappings, a descriptor opened without the access the protection needs).
    bool map(std::size_t at, std::size_t n) {
        if (base_ && at >= lo_ && n <= length_ && at - lo_ <= length_ - n)
            return true;
        unmap();
        if (!usable_)
            return false;
        static const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
        lo_ = at / page * page;
        length_ = std::max(window_, checked_add(at - lo_, n));
        void* p = ::mmap(nullptr, length_, protection_, MAP_SHARED, file_->fd(), off_t(lo_));
        if (p == MAP_FAILED) {
            usable_ = false;
            return false;
        }
        base_ = static_cast<std::byte*>(p);
        return true;
    }

    /// The address of the file's byte `at` in the window (which holds it: see map).
    std::byte* at(std::size_t offset) const noexcept { return base_ + (offset - lo_); }

    /// The file offsets the window holds, [first, second).
    std::pair<std::size_t, std::size_t> range() const noexcept {
        return {lo_, base_ ? lo_ + length_ : lo_};
    }

    /// Runs `f`, which loads or stores through the window only and owns nothing; if the file
    /// shrank under a page it touches, throws io_error naming the file instead (`doing`:
    /// "read", "written").
    template <class F>
    void access(F&& f, const char* doing) {
        fault_scope scope;
        scope.lo = base_;
        scope.hi = base_ + length_;
        if (sigsetjmp(scope.jump, 0) == 0) {
            guarded_access = &scope;
            f();
            guarded_access = nullptr;
            return;
        }
        unmap();
        throw io_error("xshard: " + file_->path() + " shrank while it was " + doing +
                       " (truncated or overwritten by another process?)");
    }

private:
    void unmap() noexcept {
        if (base_)
            ::munmap(base_, length_);
        base_ = nullptr;
    }

    fault_guard guard_;
    const file* file_;
    int protection_;
    std::size_t window_;
    bool usable_ = true;
    std::byte* base_ = nullptr;
    std::size_t lo_ = 0, length_ = 0;
};

/// Chooses, for a pass over a file's bytes in many pieces, between reading them through a
/// file_window (no copy) and pread into a buffer (a copy). Pieces of at least `least` bytes
/// are timed (a mapping's system calls dwarf smaller ones) until each way has `trials` of
/// them, the pieces taking the two ways in turn; then every piece takes the way with the
/// fewer seconds per byte. Which wins depends on the kernel and on how the file came into the
/// page cache: a mapping of large folios costs a fault per folio and then reads at the speed
/// of memory; a file cached in 4 KiB pages (an older kernel, or pages stored through a
/// mapping) costs a fault per page, and there pread wins.
class read_chooser {
public:
    explicit read_chooser(int trials = 4, std::size_t least = std::size_t(256) << 10) noexcept
        : trials_(trials)
        , least_(least) {}

    /// Whether the next piece goes through the mapping.
    bool map_next() const noexcept {
        if (timed_[0] < trials_ || timed_[1] < trials_)
            return timed_[0] != timed_[1] ? timed_[1] < timed_[0] : pieces_ % 2 == 0;
        return seconds_[1] * double(bytes_[0]) <= seconds_[0] * double(bytes_[1]);
    }

    /// Reports that a piece of `bytes` took `seconds`, through the mapping or not.
    void took(bool mapped, std::size_t bytes, double seconds) noexcept {
        ++pieces_;
        if (bytes < least_ || (timed_[0] >= trials_ && timed_[1] >= trials_))
            return;
        ++timed_[mapped];
        bytes_[mapped] += bytes;
        seconds_[mapped] += seconds;
    }

private:
    int trials_;
    std::size_t least_;
    std::size_t pieces_ = 0;
    int timed_[2] = {0, 0};
    std::size_t bytes_[2] = {0, 0};
    double seconds_[2] = {0, 0};
};

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/file_mapping.ipp>
#endif
