#pragma once
/// \file
/// The definitions of what graph/schedule.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/schedule.hpp>

namespace xshard::detail {

XSHARD_DECL shard_type local_shard_of(const value_shape& global, const layout& l, dtype t,
                                      const mesh_view& mesh) {
    shard_type s{global, l, value_shape(global.size()), t};
    for (std::size_t d = 0; d < global.size(); ++d) {
        const auto k = std::size_t(l.split_count(d, mesh.shape));
        const auto i = std::size_t(l.block_index(d, mesh.shape, mesh.coords));
        s.local[d] = block_extent(global[d], k, i);
    }
    return s;
}

XSHARD_DECL schedule_builder::schedule_builder(const program& p, const program_layouts& lay,
                                               const mesh_view& mesh, bool input_gradients,
                                               const std::vector<std::string>& recompute,
                                               bool regather)
    : p_(p)
    , lay_(lay)
    , mesh_(mesh)
    , input_gradients_(input_gradients)
    , regather_(regather) {
    find_segments(recompute);
}

XSHARD_DECL schedule schedule_builder::build() {
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

XSHARD_DECL std::size_t schedule_builder::new_slot(std::size_t value, const layout& l,
                                                   bool cotangent, buffer_home home,
                                                   std::size_t index) {
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

XSHARD_DECL void schedule_builder::find_segments(const std::vector<std::string>& entries) {
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
        if (runs[k].first == no_slot || runs[k].second == no_slot || runs[k].second < runs[k].first)
            throw error("xshard: compile: recompute names the run '" + entries[k] + "', but " +
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

XSHARD_DECL std::vector<bool> schedule_builder::saved_by(const segment& seg) const {
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

XSHARD_DECL void schedule_builder::recompute(segment& seg) {
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

XSHARD_DECL void schedule_builder::read_recomputed(program_step& vjp) {
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

XSHARD_DECL void schedule_builder::place_arguments() {
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

XSHARD_DECL std::size_t schedule_builder::slot_in(std::size_t value, const layout& l) {
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

XSHARD_DECL void schedule_builder::add_move(std::size_t from, std::size_t to, bool adjoint) {
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

XSHARD_DECL void schedule_builder::add_node(std::size_t i) {
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

XSHARD_DECL std::vector<bool> schedule_builder::requires_gradient() const {
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

XSHARD_DECL std::size_t schedule_builder::cotangent_of(std::size_t s) {
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

XSHARD_DECL void schedule_builder::add_backward() {
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

XSHARD_DECL void schedule_builder::plan_memory() {
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

} // namespace xshard::detail

