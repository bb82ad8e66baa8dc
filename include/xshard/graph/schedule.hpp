#pragma once
/// \file
/// The schedule of a laid-out program: the flat list of steps a training step runs, and where
/// each of their buffers lives.
///
/// A *slot* is one buffer of this rank: a value in one layout (a node's operand as it reads
/// it, its result as it writes it, an input, a weight) or the cotangent of such a value. The
/// forward steps are the nodes' kernels and the redistributions on the edges whose layouts
/// differ (`move`s). The backward steps are, in reverse order, each kernel's VJP and each
/// move's adjoint (the redistribution between the cotangents' layouts, core/layout.hpp's
/// `dual`); the cotangents of a value used twice are summed (the second writer adds).
///
/// Recomputation (activation checkpointing): the nodes of a recomputed scope keep nothing
/// for the backward pass. Just before the scope's first VJP, its forward steps run again
/// into fresh slots, and its VJPs read those; only what the scope reads from outside (its
/// inputs, weights) is kept from the forward pass. Steps whose results no VJP of the scope
/// reads are not run again. Kernels are deterministic and keep no state between passes, so
/// the gradients are the same as without it.
///
/// Weights kept sharded (hsdp level 3, layout_options::weight_shard_axes) are gathered by a
/// forward move before their use, and gathered again by a copy of that move just before the
/// first VJP that reads them, so a gathered weight lives around its uses, not across the
/// passes.
///
/// Memory: every arena slot is live from the step that writes it to the last step that reads
/// it (a forward value the VJP keeps lives into the backward pass; the others die in the
/// forward pass), and the slots are packed into one arena by those intervals (first fit,
/// largest first), so the peak is known before the first step and no step allocates.
/// Inputs, weights and the weights' gradients are not in the arena: they are the caller's
/// tensors.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/graph/layouts.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/graph/program.hpp>
#include <xshard/graph/registry.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace xshard::detail {

inline constexpr std::size_t no_slot = std::numeric_limits<std::size_t>::max();

/// Where a slot's bytes are.
enum class buffer_home : std::uint8_t { arena, input, weight, weight_gradient };

struct buffer_slot {
    std::size_t value = 0; ///< the program value it holds (or whose cotangent it holds)
    bool cotangent = false;
    shard_type shard;      ///< global shape, layout, local shape, dtype
    buffer_home home = buffer_home::arena;
    std::size_t index = 0; ///< input or weight index (inputs, weights, their gradients)
    std::size_t bytes = 0;
    std::size_t offset = 0; ///< in the arena
    std::size_t first = no_slot, last = 0;

    void use(std::size_t step) {
        first = std::min(first, step);
        last = std::max(last, step);
    }
};

enum class program_step_kind : std::uint8_t {
    kernel,  ///< a node's forward kernel
    move,    ///< a redistribution (forward edge, or a backward adjoint)
    vjp,     ///< a node's VJP
    add,     ///< cotangent += temporary (an adjoint that adds)
    seed,    ///< an output's cotangent from the caller
};

struct program_step {
    program_step_kind kind = program_step_kind::kernel;
    std::size_t node = 0;                         ///< kernel, vjp
    std::vector<std::size_t> operands, results;   ///< slots (kernel, vjp; move/add: {from}, {to})
    std::vector<std::size_t> result_cotangents;   ///< vjp (no_slot: zero)
    std::vector<std::size_t> operand_cotangents;  ///< vjp (no_slot: not wanted)
    std::vector<bool> accumulate;                 ///< vjp
    std::vector<bool> saved_operands, saved_results; ///< vjp: what it reads
    std::size_t move = 0;                         ///< move: index into the schedule's moves
    std::size_t output = 0;                       ///< seed: which output
};

/// A redistribution the schedule needs: from one slot's layout to another's.
struct move_request {
    std::size_t from = 0, to = 0; ///< slots
    bool adjoint = false;
};

/// The slots and steps of a program on a mesh (see the file comment).
struct schedule {
    std::vector<buffer_slot> slots;
    std::vector<program_step> forward, backward;
    std::vector<move_request> moves;
    /// Per value: the slot that holds it as kept (program_layouts::values).
    std::vector<std::size_t> value_slot;
    /// Per output: its slot and its cotangent's (no_slot when nothing it depends on is
    /// trained).
    std::vector<std::size_t> output_slot, output_cotangent;
    /// Per input: its slot and its cotangent's (no_slot unless input gradients are wanted).
    std::vector<std::size_t> input_slot, input_cotangent;
    /// Per weight: its slot and its gradient's.
    std::vector<std::size_t> weight_slot, weight_gradient;
    /// Per node: the shards its kernels see.
    std::vector<node_shards> nodes;
    std::size_t arena_bytes = 0;
};

/// The local shard of a value of `global` shape laid out as `l` on this rank.
XSHARD_DECL shard_type local_shard_of(const value_shape& global, const layout& l, dtype t,
                                      const mesh_view& mesh);

class schedule_builder {
public:
    /// `recompute`: the scopes (node-name prefixes), and runs of nodes from one scope to
    /// another ("a..b"), recomputed in the backward pass; throws xshard::error naming an
    /// entry that holds no node. `regather`: weights' gathers run
    /// again before the VJPs that read them.
    schedule_builder(const program& p, const program_layouts& lay, const mesh_view& mesh,
                     bool input_gradients, const std::vector<std::string>& recompute = {},
                     bool regather = false);

    schedule build();

private:
    std::size_t new_slot(std::size_t value, const layout& l, bool cotangent,
                         buffer_home home = buffer_home::arena, std::size_t index = 0);

    // Recomputed scopes.

    /// A run of consecutive nodes of one recomputed scope, its forward steps [first, end),
    /// and once the backward pass has run them again, forward slot -> recomputed slot.
    struct segment {
        std::size_t first = no_slot, end = 0;
        bool emitted = false;
        std::map<std::size_t, std::size_t> again;
    };

    static bool in_scope(const std::string& node, const std::string& scope) {
        return node.size() >= scope.size() && node.compare(0, scope.size(), scope) == 0 &&
               (node.size() == scope.size() || node[scope.size()] == '.');
    }

    /// Each node's segment: its entry is the first run ("a..b") it lies in, else the shortest
    /// recomputed scope it lies in, and a new segment begins where the entry changes.
    void find_segments(const std::vector<std::string>& entries);

    /// What the VJPs of a segment's kernels read (see add_vjp's saves).
    std::vector<bool> saved_by(const segment& seg) const;

    /// Runs segment `seg`'s forward steps again, into fresh slots, in the backward pass: the
    /// steps that make what its VJPs read, directly or through other steps of the segment.
    void recompute(segment& seg);

    /// Points a VJP of a recomputed node at the recomputed values (running them first), and
    /// under `regather` a VJP reading a gathered weight at a gather run again (once, for the
    /// VJPs from there back).
    void read_recomputed(program_step& vjp);

    void place_arguments();

    /// The slot of `value` laid out as `l`: the kept one, or a redistributed copy (made
    /// once per layout, by a move step).
    std::size_t slot_in(std::size_t value, const layout& l);

    void add_move(std::size_t from, std::size_t to, bool adjoint);

    void add_node(std::size_t i);

    // Backward.

    bool floating(std::size_t value) const { return p_.value(value).type != dtype::i64; }

    /// Which values a cotangent can reach: weights, wanted inputs, and results of nodes
    /// with such an operand.
    std::vector<bool> requires_gradient() const;

    /// The cotangent slot of forward slot `s` (made on first use).
    std::size_t cotangent_of(std::size_t s);

    /// Marks cotangent `c` written; returns whether the writer adds to it.
    bool write(std::size_t c) {
        const bool adds = written_[c - first_cot_];
        written_[c - first_cot_] = true;
        return adds;
    }

    void add_backward();

    template <class Wants>
    void add_adjoint(const program_step& fs, Wants& wants) {
        const auto from = fs.operands[0], to = fs.results[0];
        if (cot_[to] == no_slot || !wants(from))
            return;
        const auto target = cotangent_of(from);
        if (!write(target)) {
            add_move(cot_[to], target, true);
            return;
        }
        // The cotangent has terms already: the adjoint lands in a temporary, then adds.
        const auto temp = new_slot(s_.slots[target].value, s_.slots[target].shard.l, true);
        add_move(cot_[to], temp, true);
        program_step st;
        st.kind = program_step_kind::add;
        st.operands = {temp};
        st.results = {target};
        s_.backward.push_back(std::move(st));
    }

    template <class Wants>
    void add_vjp(const program_step& fs, Wants& wants) {
        const auto& n = p_.nodes()[fs.node];
        bool any = false;
        for (auto r : fs.results)
            any = any || cot_[r] != no_slot;
        if (!any)
            return;
        const std::uint32_t saves = n.custom ? ~std::uint32_t(0) : rules_named(n.op).saves;
        program_step st;
        st.kind = program_step_kind::vjp;
        st.node = fs.node;
        st.operands = fs.operands;
        st.results = fs.results;
        for (std::size_t k = 0; k < fs.results.size(); ++k) {
            st.result_cotangents.push_back(cot_[fs.results[k]]);
            st.saved_results.push_back((saves & saves_result(k)) != 0);
        }
        bool wanted = false;
        for (std::size_t k = 0; k < fs.operands.size(); ++k) {
            st.saved_operands.push_back((saves & saves_operand(k)) != 0);
            const auto o = fs.operands[k];
            if (!wants(o) || !floating(s_.slots[o].value)) {
                st.operand_cotangents.push_back(no_slot);
                st.accumulate.push_back(false);
                continue;
            }
            const auto c = cotangent_of(o);
            st.operand_cotangents.push_back(c);
            st.accumulate.push_back(write(c));
            wanted = true;
        }
        if (!wanted)
            return;
        read_recomputed(st);
        s_.backward.push_back(std::move(st));
    }

    // Memory.

    void plan_memory();

    const program& p_;
    const program_layouts& lay_;
    const mesh_view& mesh_;
    bool input_gradients_;
    schedule s_;
    std::map<std::pair<std::size_t, std::string>, std::size_t> copies_;
    std::vector<std::size_t> cot_;
    std::vector<bool> written_;
    std::size_t first_cot_ = 0;
    bool in_backward_ = false;
    bool regather_ = false;
    std::map<std::size_t, std::size_t> gathers_;    // gathered weight slot -> its forward move
    std::map<std::size_t, std::size_t> regathered_; // gathered weight slot -> gathered again
    std::vector<segment> segments_;
    std::vector<std::size_t> segment_; // per node: its segment, or no_slot
};

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/schedule.ipp>
#endif
