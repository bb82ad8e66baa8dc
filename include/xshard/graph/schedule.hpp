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
                     bool regather = false)
        : p_(p)
        , lay_(lay)
        , mesh_(mesh)
        , input_gradients_(input_gradients)
        , regather_(regather) {
        find_segments(recompute);
    }

    schedule build() {
        place_arguments();
        for (std::size_t i = 0; i < p_.nodes().size(); ++i) {
            const auto first = s_.forward.size();
            add_node(i);
            if (segment_[i] != no_slot) {
                auto& seg = segments_[segment_[i]];
                seg.first = std::min(seg.first, first);
                seg.end = s_.forward.size();
            }
        }
        for (auto id : p_.outputs())
            s_.output_slot.push_back(s_.value_slot[id]);
        add_backward();
        plan_memory();
        return std::move(s_);
    }

private:
    std::size_t new_slot(std::size_t value, const layout& l, bool cotangent,
                         buffer_home home = buffer_home::arena, std::size_t index = 0) {
        const auto& v = p_.value(value);
        buffer_slot s;
        s.value = value;
        s.cotangent = cotangent;
        s.shard = local_shard_of(v.shape, l, v.type, mesh_);
        s.home = home;
        s.index = index;
        s.bytes = s.shard.count() * element_bytes(v.type);
        s_.slots.push_back(std::move(s));
        if (in_backward_)
            written_.push_back(home == buffer_home::weight_gradient); // see write()
        return s_.slots.size() - 1;
    }

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
    void find_segments(const std::vector<std::string>& entries) {
        const auto& nodes = p_.nodes();
        segment_.assign(nodes.size(), no_slot);
        // Per run entry: the nodes [first of scope a, last of scope b].
        std::vector<std::pair<std::size_t, std::size_t>> runs(entries.size(), {no_slot, no_slot});
        for (std::size_t k = 0; k < entries.size(); ++k) {
            const auto dots = entries[k].find("..");
            if (dots == std::string::npos)
                continue;
            const std::string a = entries[k].substr(0, dots), b = entries[k].substr(dots + 2);
            for (std::size_t i = 0; i < nodes.size(); ++i) {
                if (runs[k].first == no_slot && in_scope(nodes[i].name, a))
                    runs[k].first = i;
                if (in_scope(nodes[i].name, b))
                    runs[k].second = i;
            }
            if (runs[k].first == no_slot || runs[k].second == no_slot ||
                runs[k].second < runs[k].first)
                throw error("xshard: compile: recompute names the run '" + entries[k] +
                            "', but " +
                            (runs[k].first == no_slot    ? "'" + a + "' holds no node"
                             : runs[k].second == no_slot ? "'" + b + "' holds no node"
                                                         : "'" + b + "' ends before '" + a +
                                                               "' begins") +
                            " of the program");
        }
        std::vector<bool> used(entries.size(), false);
        std::size_t previous = no_slot;
        for (std::size_t i = 0; i < nodes.size(); ++i) {
            std::size_t entry = no_slot;
            for (std::size_t k = 0; k < entries.size() && entry == no_slot; ++k)
                if (runs[k].first != no_slot && runs[k].first <= i && i <= runs[k].second)
                    entry = k;
            const bool in_run = entry != no_slot;
            for (std::size_t k = 0; k < entries.size() && !in_run; ++k)
                if (runs[k].first == no_slot && in_scope(nodes[i].name, entries[k]) &&
                    (entry == no_slot || entries[k].size() < entries[entry].size()))
                    entry = k;
            if (entry != no_slot) {
                used[entry] = true;
                if (entry != previous)
                    segments_.emplace_back();
                segment_[i] = segments_.size() - 1;
            }
            previous = entry;
        }
        for (std::size_t k = 0; k < entries.size(); ++k)
            if (!used[k]) {
                const bool held = std::any_of(nodes.begin(), nodes.end(), [&](const auto& n) {
                    return in_scope(n.name, entries[k]);
                });
                throw error("xshard: compile: recompute names the scope '" + entries[k] + "', " +
                            (held ? "whose nodes all lie in a run it also names"
                                  : "which holds no node of the program"));
            }
    }

    /// What the VJPs of a segment's kernels read (see add_vjp's saves).
    std::vector<bool> saved_by(const segment& seg) const {
        std::vector<bool> read(s_.slots.size(), false);
        for (std::size_t f = seg.first; f < seg.end; ++f) {
            const auto& st = s_.forward[f];
            if (st.kind != program_step_kind::kernel)
                continue;
            const auto& n = p_.nodes()[st.node];
            const std::uint32_t saves = n.custom ? ~std::uint32_t(0) : rules_named(n.op).saves;
            for (std::size_t k = 0; k < st.operands.size(); ++k)
                read[st.operands[k]] = read[st.operands[k]] || (saves & saves_operand(k)) != 0;
            for (std::size_t k = 0; k < st.results.size(); ++k)
                read[st.results[k]] = read[st.results[k]] || (saves & saves_result(k)) != 0;
        }
        return read;
    }

    /// Runs segment `seg`'s forward steps again, into fresh slots, in the backward pass: the
    /// steps that make what its VJPs read, directly or through other steps of the segment.
    void recompute(segment& seg) {
        seg.emitted = true;
        auto needed = saved_by(seg);
        std::vector<bool> runs(seg.end - seg.first, false);
        for (std::size_t f = seg.end; f-- > seg.first;) {
            const auto& st = s_.forward[f];
            for (auto r : st.results)
                runs[f - seg.first] = runs[f - seg.first] || needed[r];
            if (runs[f - seg.first])
                for (auto o : st.operands)
                    needed[o] = true;
        }
        for (std::size_t f = seg.first; f < seg.end; ++f) {
            if (!runs[f - seg.first])
                continue;
            program_step st = s_.forward[f];
            for (auto& o : st.operands)
                if (auto it = seg.again.find(o); it != seg.again.end())
                    o = it->second;
            for (auto& r : st.results) {
                const auto& old = s_.slots[r];
                const auto fresh = new_slot(old.value, old.shard.l, false);
                seg.again[r] = fresh;
                r = fresh;
            }
            s_.backward.push_back(std::move(st)); // a move keeps its plan (`move`)
        }
    }

    /// Points a VJP of a recomputed node at the recomputed values (running them first), and
    /// under `regather` a VJP reading a gathered weight at a gather run again (once, for the
    /// VJPs from there back).
    void read_recomputed(program_step& vjp) {
        if (segment_[vjp.node] != no_slot) {
            auto& seg = segments_[segment_[vjp.node]];
            if (!seg.emitted)
                recompute(seg);
            for (auto* slots : {&vjp.operands, &vjp.results})
                for (auto& sl : *slots)
                    if (auto it = seg.again.find(sl); it != seg.again.end())
                        sl = it->second;
        }
        if (!regather_)
            return;
        for (std::size_t k = 0; k < vjp.operands.size(); ++k) {
            const auto gather = gathers_.find(vjp.operands[k]);
            if (!vjp.saved_operands[k] || gather == gathers_.end())
                continue;
            auto [again, fresh] = regathered_.try_emplace(gather->first, no_slot);
            if (fresh) {
                program_step st = s_.forward[gather->second];
                const auto& old = s_.slots[st.results[0]];
                st.results[0] = again->second = new_slot(old.value, old.shard.l, false);
                s_.backward.push_back(std::move(st));
            }
            vjp.operands[k] = again->second;
        }
    }

    void place_arguments() {
        s_.value_slot.assign(p_.values().size(), no_slot);
        for (std::size_t i = 0; i < p_.inputs().size(); ++i) {
            const auto id = p_.inputs()[i];
            s_.value_slot[id] = new_slot(id, lay_.values[id], false, buffer_home::input, i);
            s_.input_slot.push_back(s_.value_slot[id]);
        }
        for (std::size_t i = 0; i < p_.weights().size(); ++i) {
            const auto id = p_.weights()[i];
            s_.value_slot[id] = new_slot(id, lay_.values[id], false, buffer_home::weight, i);
            s_.weight_slot.push_back(s_.value_slot[id]);
        }
    }

    /// The slot of `value` laid out as `l`: the kept one, or a redistributed copy (made
    /// once per layout, by a move step).
    std::size_t slot_in(std::size_t value, const layout& l) {
        const auto kept = s_.value_slot[value];
        if (s_.slots[kept].shard.l == l)
            return kept;
        const auto key = std::make_pair(value, l.to_string());
        if (auto it = copies_.find(key); it != copies_.end())
            return it->second;
        const auto to = new_slot(value, l, false);
        add_move(kept, to, false);
        copies_[key] = to;
        return to;
    }

    void add_move(std::size_t from, std::size_t to, bool adjoint) {
        if (!adjoint && s_.slots[from].home == buffer_home::weight)
            gathers_[to] = s_.forward.size();
        s_.moves.push_back({from, to, adjoint});
        program_step st;
        st.kind = program_step_kind::move;
        st.operands = {from};
        st.results = {to};
        st.move = s_.moves.size() - 1;
        (adjoint ? s_.backward : s_.forward).push_back(std::move(st));
    }

    void add_node(std::size_t i) {
        const auto& n = p_.nodes()[i];
        const auto& c = lay_.nodes[i];
        node_shards shards;
        shards.node = &n;
        shards.mesh = &mesh_;
        program_step st;
        st.kind = program_step_kind::kernel;
        st.node = i;
        for (std::size_t k = 0; k < n.operands.size(); ++k) {
            const auto sl = slot_in(n.operands[k], c.operands[k]);
            st.operands.push_back(sl);
            shards.operands.push_back(s_.slots[sl].shard);
        }
        std::vector<std::pair<std::size_t, std::size_t>> after; // (raw, kept) to move
        for (std::size_t k = 0; k < n.results.size(); ++k) {
            const auto id = n.results[k];
            const auto kept = new_slot(id, lay_.values[id], false);
            s_.value_slot[id] = kept;
            std::size_t raw = kept;
            if (!(c.results[k] == lay_.values[id])) {
                raw = new_slot(id, c.results[k], false);
                after.emplace_back(raw, kept);
            }
            st.results.push_back(raw);
            shards.results.push_back(s_.slots[raw].shard);
        }
        s_.forward.push_back(std::move(st));
        for (auto [raw, kept] : after)
            add_move(raw, kept, false);
        s_.nodes.push_back(std::move(shards));
    }

    // Backward.

    bool floating(std::size_t value) const { return p_.value(value).type != dtype::i64; }

    /// Which values a cotangent can reach: weights, wanted inputs, and results of nodes
    /// with such an operand.
    std::vector<bool> requires_gradient() const {
        std::vector<bool> r(p_.values().size(), false);
        for (auto id : p_.weights())
            r[id] = true;
        for (auto id : p_.inputs())
            r[id] = input_gradients_ && floating(id);
        for (const auto& n : p_.nodes()) {
            bool any = false;
            for (auto id : n.operands)
                any = any || r[id];
            const bool differentiable = n.custom || rules_named(n.op).differentiable;
            for (auto id : n.results)
                r[id] = any && differentiable && floating(id);
        }
        return r;
    }

    /// The cotangent slot of forward slot `s` (made on first use).
    std::size_t cotangent_of(std::size_t s) {
        if (cot_[s] != no_slot)
            return cot_[s];
        const auto& fs = s_.slots[s];
        const auto l = cotangent_layout(fs.shard.l, mesh_.shape);
        // A backward pass adds to the weights' gradients (new_slot marks them written).
        cot_[s] = fs.home == buffer_home::weight
                      ? new_slot(fs.value, l, true, buffer_home::weight_gradient, fs.index)
                      : new_slot(fs.value, l, true);
        return cot_[s];
    }

    /// Marks cotangent `c` written; returns whether the writer adds to it.
    bool write(std::size_t c) {
        const bool adds = written_[c - first_cot_];
        written_[c - first_cot_] = true;
        return adds;
    }

    void add_backward() {
        const auto needs = requires_gradient();
        cot_.assign(s_.slots.size(), no_slot);
        first_cot_ = s_.slots.size();
        in_backward_ = true;
        auto wants = [&](std::size_t slot) { return bool(needs[s_.slots[slot].value]); };
        for (std::size_t o = 0; o < s_.output_slot.size(); ++o) {
            const auto sl = s_.output_slot[o];
            if (!wants(sl)) {
                s_.output_cotangent.push_back(no_slot);
                continue;
            }
            const auto c = cotangent_of(sl);
            s_.output_cotangent.push_back(c);
            program_step st;
            st.kind = program_step_kind::seed;
            st.output = o;
            st.results = {c};
            st.accumulate = {write(c)};
            s_.backward.push_back(std::move(st));
        }
        for (std::size_t f = s_.forward.size(); f-- > 0;) {
            const program_step fs = s_.forward[f];
            if (fs.kind == program_step_kind::move)
                add_adjoint(fs, wants);
            else
                add_vjp(fs, wants);
        }
        for (auto sl : s_.input_slot)
            s_.input_cotangent.push_back(cot_.size() > sl ? cot_[sl] : no_slot);
        for (auto sl : s_.weight_slot)
            s_.weight_gradient.push_back(cot_[sl]);
    }

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

    void plan_memory() {
        const std::size_t nf = s_.forward.size();
        auto use = [&](std::size_t sl, std::size_t t) {
            if (sl != no_slot)
                s_.slots[sl].use(t);
        };
        for (std::size_t t = 0; t < nf; ++t) {
            for (auto sl : s_.forward[t].operands)
                use(sl, t);
            for (auto sl : s_.forward[t].results)
                use(sl, t);
        }
        // Outputs are read after the forward pass.
        for (auto sl : s_.output_slot)
            use(sl, nf);
        for (std::size_t b = 0; b < s_.backward.size(); ++b) {
            const auto& st = s_.backward[b];
            const std::size_t t = nf + 1 + b;
            if (st.kind == program_step_kind::vjp) {
                for (std::size_t k = 0; k < st.operands.size(); ++k)
                    if (st.saved_operands[k])
                        use(st.operands[k], t);
                for (std::size_t k = 0; k < st.results.size(); ++k)
                    if (st.saved_results[k])
                        use(st.results[k], t);
                for (auto c : st.result_cotangents)
                    use(c, t);
                for (auto c : st.operand_cotangents)
                    use(c, t);
            } else {
                for (auto sl : st.operands)
                    use(sl, t);
                for (auto sl : st.results)
                    use(sl, t);
            }
        }
        // The inputs' cotangents are read after the backward pass.
        for (auto c : s_.input_cotangent)
            use(c, nf + 1 + s_.backward.size());
        // First fit by interval, largest first; 64-byte aligned.
        std::vector<std::size_t> order;
        for (std::size_t i = 0; i < s_.slots.size(); ++i)
            if (s_.slots[i].home == buffer_home::arena && s_.slots[i].first != no_slot)
                order.push_back(i);
        std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
            return s_.slots[a].bytes > s_.slots[b].bytes;
        });
        std::vector<std::size_t> placed;
        for (auto i : order) {
            auto& s = s_.slots[i];
            const std::size_t size = (s.bytes + 63) / 64 * 64;
            std::vector<std::pair<std::size_t, std::size_t>> busy;
            for (auto j : placed) {
                const auto& o = s_.slots[j];
                if (o.first <= s.last && s.first <= o.last)
                    busy.emplace_back(o.offset, o.offset + (o.bytes + 63) / 64 * 64);
            }
            std::sort(busy.begin(), busy.end());
            std::size_t at = 0;
            for (const auto& [lo, hi] : busy) {
                if (at + size <= lo)
                    break;
                at = std::max(at, hi);
            }
            s.offset = at;
            s_.arena_bytes = std::max(s_.arena_bytes, at + size);
            placed.push_back(i);
        }
    }

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
