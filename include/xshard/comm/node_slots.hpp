#pragma once
/// \file
/// The control slots of a node-local collective run (node_reduce.hpp,
/// redistribute/node_step.hpp): before a node barrier every member publishes where its input
/// and output buffers lie in node storage (node_arena.hpp), if they do; after it every member
/// reads every slot, so all members decide alike which buffers are read (or written) in
/// place and which are staged.

#include <xshard/compiled.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/node_arena.hpp>
#include <xshard/comm/shared_window.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace xshard::detail {

class node_slots {
public:
    /// Flags of a slot: the input, the output lies in node storage.
    static constexpr std::uint64_t in_arena = 1, out_arena = 2;

    /// Collective over `c`, whose members share one node (a small shared window; throws
    /// `error` when MPI refuses it).
    explicit node_slots(const communicator& c);

    /// Writes this member's slot for `in` and `out` (either may be null) in the node
    /// storage open now; read by the others after the next barrier. Returns its flags.
    std::uint64_t publish(const void* in, const void* out) {
        arena_ = node_arena::current();
        slot s;
        if (arena_) {
            s.arena = arena_->id();
            if (const auto l = in ? arena_->locate(in) : std::nullopt) {
                s.flags |= in_arena;
                s.in_rank = std::uint64_t(l->node_rank);
                s.in_offset = l->offset;
            }
            if (const auto l = out ? arena_->locate(out) : std::nullopt) {
                s.flags |= out_arena;
                s.out_rank = std::uint64_t(l->node_rank);
                s.out_offset = l->offset;
            }
        }
        std::memcpy(control_.segment(me_), &s, sizeof s);
        return s.flags;
    }

    /// After the barrier that follows every member's `publish`: reads every slot. Member
    /// q's buffers are reachable in place when q published them in the node storage this
    /// member has open too, and every member has the same one open.
    void read() {
        bool common = arena_ != nullptr;
        for (std::size_t q = 0; q < slots_.size(); ++q) {
            std::memcpy(&slots_[q], control_.segment(int(q)), sizeof(slot));
            common = common && slots_[q].arena == arena_->id();
        }
        for (std::size_t q = 0; q < slots_.size(); ++q) {
            const auto& s = slots_[q];
            in_[q] = common && (s.flags & in_arena)
                         ? arena_->address(int(s.in_rank), std::size_t(s.in_offset))
                         : nullptr;
            out_[q] = common && (s.flags & out_arena)
                          ? arena_->address(int(s.out_rank), std::size_t(s.out_offset))
                          : nullptr;
        }
    }

    /// Member q's input and output in place (null: not reachable), and its flags, as the
    /// last `read` found them.
    template <class T>
    const T* in(int q) const noexcept {
        return reinterpret_cast<const T*>(in_[std::size_t(q)]);
    }
    template <class T>
    T* out(int q) const noexcept {
        return reinterpret_cast<T*>(out_[std::size_t(q)]);
    }
    std::uint64_t flags(int q) const noexcept { return slots_[std::size_t(q)].flags; }

    /// How many members' inputs, outputs the last `read` found in place.
    std::size_t inputs_in_place() const noexcept { return count(in_); }
    std::size_t outputs_in_place() const noexcept { return count(out_); }

private:
    struct slot {
        std::uint64_t arena = 0; ///< the id of the member's open arena, 0 for none
        std::uint64_t in_rank = 0, in_offset = 0, out_rank = 0, out_offset = 0;
        std::uint64_t flags = 0;
    };
    static constexpr std::size_t slot_bytes = 64;
    static_assert(sizeof(slot) <= slot_bytes);

    static std::size_t count(const std::vector<std::byte*>& v) noexcept {
        std::size_t n = 0;
        for (const auto* b : v)
            n += b != nullptr;
        return n;
    }

    shared_window control_; ///< one slot per member
    std::shared_ptr<node_arena_state> arena_;
    std::vector<slot> slots_;
    std::vector<std::byte*> in_, out_;
    int me_ = 0;
};

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/node_slots.ipp>
#endif
