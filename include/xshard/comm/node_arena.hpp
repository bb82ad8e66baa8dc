#pragma once
/// \file
/// Node storage: a process-wide arena in an MPI-3 shared-memory window, from which shards
/// are allocated so that the other ranks of the node can read them in place
/// (redistribute/node_step.hpp), and the allocator that draws from it.

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/node.hpp>
#include <xshard/comm/shared_window.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace xshard {

/// Where a byte of node storage lies: the member of the arena's node communicator whose
/// segment holds it, and its offset in that segment.
struct arena_location {
    int node_rank = 0;
    std::size_t offset = 0;
};

namespace detail {

/// One opened arena: a shared window of `bytes_per_rank` per member of a node
/// communicator, this member's segment cut by a first-fit free list.
class node_arena_state {
public:
    static constexpr std::size_t alignment = 64;

    node_arena_state(const communicator& node, std::size_t bytes_per_rank)
        : window_(node, round_down(bytes_per_rank))
        , node_(node) {
        // MPI aligns a segment as it likes (8 bytes for the first member under Open MPI):
        // blocks start at 64-byte aligned addresses.
        const auto base = reinterpret_cast<std::uintptr_t>(window_.local());
        const std::size_t first = (alignment - base % alignment) % alignment;
        const std::size_t size = window_.segment_bytes(node.rank());
        capacity_ = size > first ? round_down(size - first) : 0;
        if (capacity_ > 0)
            free_.emplace(first, capacity_);
        // An identity every member shares, different from any other arena's (the first
        // member's segment address and a counter, made the same everywhere by a broadcast).
        static std::uint64_t opened = 0;
        std::uint64_t id[1] = {(std::uint64_t(reinterpret_cast<std::uintptr_t>(window_.local()))
                                << 8) ^ ++opened ^ 0x9e3779b97f4a7c15ull};
        bcast(node, std::span(id, 1), 0);
        id_ = id[0] == 0 ? 1 : id[0];
    }

    /// `bytes` from this member's segment, 64-byte aligned; null when it has no room.
    void* allocate(std::size_t bytes);

    /// Returns a block `allocate` gave (of this member's segment) to the free list,
    /// merged with free neighbours.
    void deallocate(void* p);

    /// Whether `p` lies in any member's segment, and where.
    std::optional<arena_location> locate(const void* p) const noexcept {
        const auto* b = static_cast<const std::byte*>(p);
        for (int q = 0; q < window_.size(); ++q) {
            const std::byte* s = window_.segment(q);
            if (s && b >= s && b < s + window_.segment_bytes(q))
                return arena_location{q, std::size_t(b - s)};
        }
        return std::nullopt;
    }

    /// Whether `p` was allocated from this member's segment.
    bool owns(const void* p) const noexcept {
        const auto l = locate(p);
        return l && l->node_rank == window_.rank();
    }

    std::byte* address(int node_rank, std::size_t offset) const noexcept {
        return window_.segment(node_rank) + offset;
    }

    std::size_t live_blocks() const {
        const std::lock_guard lock(mutex_);
        return used_.size();
    }
    std::size_t free_bytes() const {
        const std::lock_guard lock(mutex_);
        std::size_t n = 0;
        for (const auto& [at, size] : free_)
            n += size;
        return n;
    }
    std::size_t free_blocks() const {
        const std::lock_guard lock(mutex_);
        return free_.size();
    }
    std::size_t capacity() const noexcept { return capacity_; }

    const communicator& comm() const noexcept { return node_; }
    std::uint64_t id() const noexcept { return id_; }

private:
  static std::size_t round_up(std::size_t n) {
    return (n + alignment - 1) / alignment * alignment;
  }
    static std::size_t round_down(std::size_t n) { return n / alignment * alignment; }

    shared_window window_;
    communicator node_;
    std::uint64_t id_ = 0;
    std::size_t capacity_ = 0;
    mutable std::mutex mutex_;
    std::map<std::size_t, std::size_t> free_; ///< offset -> bytes, disjoint, merged
    std::map<std::size_t, std::size_t> used_; ///< offset -> bytes
};

/// The process's arenas: the open one (at most one) and closed ones that still hold shards
/// (kept mapped until those are freed, see `node_storage`).
struct node_arenas {
    std::mutex mutex;
    std::shared_ptr<node_arena_state> open;
    std::vector<std::shared_ptr<node_arena_state>> retired;

    static node_arenas& get() {
        static node_arenas a;
        return a;
    }
};

} // namespace detail

/// The process's node arena, as seen by the node path of redistributions: whether one is
/// open, where a pointer lies in it, and the address of a location.
class node_arena {
public:
    /// The open arena (null when none is).
    static std::shared_ptr<detail::node_arena_state> current() {
        auto& a = detail::node_arenas::get();
        const std::lock_guard lock(a.mutex);
        return a.open;
    }

    /// `bytes` from this rank's segment of the open arena, 64-byte aligned; null when no
    /// arena is open or it has no room.
    static void* allocate(std::size_t bytes) {
        const auto a = current();
        return a ? a->allocate(bytes) : nullptr;
    }

    /// Frees `p` if it came from an arena (open or closed); returns whether it did.
    static bool deallocate(void* p) {
        auto& a = detail::node_arenas::get();
        const std::lock_guard lock(a.mutex);
        if (a.open && a.open->owns(p)) {
            a.open->deallocate(p);
            return true;
        }
        for (auto it = a.retired.begin(); it != a.retired.end(); ++it)
            if ((*it)->owns(p)) {
                (*it)->deallocate(p);
                // The last shard of a closed arena is gone: its window could go too, but
                // freeing it is collective, so it stays mapped until the process ends.
                return true;
            }
        return false;
    }

    /// Where `p` lies in the open arena (any member's segment); nullopt for memory outside it.
    static std::optional<arena_location> locate(const void* p) {
        const auto a = current();
        return a ? a->locate(p) : std::nullopt;
    }
};

/// Opens the node arena for this process (RAII): splits `c` by node and allocates a
/// shared window of `bytes_per_rank` on every member, from which `node_allocator` then
/// draws (shards of tensors on a `node_shared` mesh). Construction and destruction are
/// collective over `c`; one storage may be open at a time in a process (a second throws).
///
/// Close it after the tensors allocated in it: at destruction, if no member still holds a
/// block, the window is freed (MPI_Win_free); otherwise the window is kept mapped (every
/// member agrees) until the process ends, so that the remaining shards stay valid, and new
/// allocations go to the heap. When the transport is turned off (XSHARD_SHARED_MEMORY=0)
/// or MPI refuses the window, no arena opens and every shard lives on the heap.
class node_storage {
public:
    node_storage(const communicator& c, std::size_t bytes_per_rank) : comm_(c) {
        const node_group node(c);
        std::shared_ptr<detail::node_arena_state> state;
        int ok = shared_memory_allowed() ? 1 : 0;
        {
            auto& a = detail::node_arenas::get();
            const std::lock_guard lock(a.mutex);
            if (a.open)
                ok = -1;
        }
        allreduce(c, std::span(&ok, 1), reduction::min);
        if (ok < 0)
            throw error("xshard::node_storage: a node storage is already open in this process");
        if (ok == 0)
            return;
        // A window MPI refuses on some member leaves every member without an arena.
        if (!made_on_every_rank(c, [&] {
                state = std::make_shared<detail::node_arena_state>(node.comm(), bytes_per_rank);
            }))
            return;
        auto& a = detail::node_arenas::get();
        const std::lock_guard lock(a.mutex);
        a.open = std::move(state);
        open_ = true;
    }

    node_storage(const node_storage&) = delete;
    node_storage& operator=(const node_storage&) = delete;

    ~node_storage() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        std::shared_ptr<detail::node_arena_state> state;
        {
            auto& a = detail::node_arenas::get();
            const std::lock_guard lock(a.mutex);
            if (open_)
                state = std::exchange(a.open, nullptr);
        }
        if (!state || finalized)
            return;
        int live = int(state->live_blocks() > 0);
        try {
            allreduce(comm_, std::span(&live, 1), reduction::max);
        } catch (...) {
            live = 1;
        }
        if (live) {
            auto& a = detail::node_arenas::get();
            const std::lock_guard lock(a.mutex);
            a.retired.push_back(std::move(state));
        }
        // Otherwise `state` goes here: MPI_Win_free on every member at once.
    }

    /// Whether the arena opened (false when the transport is off or MPI refused).
    bool is_open() const noexcept { return open_; }
    /// The bytes of this rank's segment.
    std::size_t capacity() const { return open_ ? node_arena::current()->capacity() : 0; }
    /// The free bytes left in this rank's segment.
    std::size_t free_bytes() const { return open_ ? node_arena::current()->free_bytes() : 0; }
    /// The free runs of this rank's segment (1 when it is empty: free neighbours merge).
    std::size_t free_blocks() const { return open_ ? node_arena::current()->free_blocks() : 0; }

private:
    communicator comm_;
    bool open_ = false;
};

/// An allocator from the open node arena, else from the heap (when no arena is open or it
/// is full), so that correctness never depends on its capacity. Stateless: all instances
/// are equal, and memory from either source may be freed by any of them.
template <class T>
class node_allocator {
public:
    using value_type = T;
    using is_always_equal = std::true_type;

    node_allocator() noexcept = default;
    template <class U>
    node_allocator(const node_allocator<U>&) noexcept {}

    T* allocate(std::size_t n) {
        if (n > std::size_t(-1) / sizeof(T))
            throw std::bad_array_new_length();
        if (alignof(T) <= detail::node_arena_state::alignment)
            if (void* p = node_arena::allocate(n * sizeof(T)))
                return static_cast<T*>(p);
        return std::allocator<T>().allocate(n);
    }

    void deallocate(T* p, std::size_t n) noexcept {
        if (!node_arena::deallocate(p))
            std::allocator<T>().deallocate(p, n);
    }

    template <class U>
    bool operator==(const node_allocator<U>&) const noexcept {
        return true;
    }
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/node_arena.ipp>
#endif
