#pragma once
/// \file
/// The definitions of what io/checkpoint_load.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/checkpoint_load.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL bool inside_one_block(const tensor_record& t, const stored_block& b) {
    if (b.size() == 0)
        return true;
    for (std::size_t d = 0; d < b.offset.size(); ++d) {
        const auto k = std::size_t(t.lay.split_count(d, t.mesh));
        if (block_holding(t.shape[d], k, b.offset[d]) !=
            block_holding(t.shape[d], k, b.offset[d] + b.extent[d] - 1))
            return false;
    }
    return true;
}

XSHARD_DECL bool meets(const tensor_record& t, const stored_block& b) {
    for (std::size_t d = 0; d < b.offset.size(); ++d)
        if (b.extent[d] == 0 || t.extent[d] == 0 || b.offset[d] >= t.offset[d] + t.extent[d] ||
            t.offset[d] >= b.offset[d] + b.extent[d])
            return false;
    return true;
}

XSHARD_DECL bool read_on_node(const checkpoint_reader& r, const strategy_entry& e,
                              const tensor_record& t, const std::vector<stored_block>& bs) {
    if (r.format() != checkpoint_format::integrated)
        return false;
    const stored_block* first = nullptr;
    for (const auto& b : bs) {
        if (!inside_one_block(t, b))
            return false;
        if (!first && b.size() > 0)
            first = &b;
    }
    return first && r.segments(e, *first).front().second < short_run;
}

XSHARD_DECL void read_together(node_file_io& node, const checkpoint_reader::node_read& plan,
                               std::byte* out) {
    const auto blocks = plan.runs.size();
    std::vector<std::size_t> next(blocks, 0), done(blocks, 0); // the run, and bytes of it copied
    std::vector<node_file_io::direct_run> direct;
    if (plan.direct) {
        for (const auto& runs : plan.runs)
            for (const auto& [at, to, n] : runs)
                direct.push_back({at, out + to, n});
        std::sort(direct.begin(), direct.end(),
                  [](const auto& a, const auto& b) { return a.at < b.at; });
    }
    node.read(*plan.file, plan.begin, plan.length, direct,
              [&](std::size_t lo, std::size_t hi, const std::byte* bytes) {
                  // What this rank read straight into `out` ([lo, lo): nothing).
                  const auto [read_lo, read_hi] =
                      plan.direct ? node.slice(lo, hi) : std::pair(lo, lo);
                  for (std::size_t b = 0; b < blocks; ++b) {
                      const auto& runs = plan.runs[b];
                      auto& i = next[b];
                      auto& d = done[b];
                      while (i < runs.size() && runs[i][0] + d < hi) {
                          const auto& [at, to, n] = runs[i];
                          const auto p = at + d, k = std::min(n - d, hi - p);
                          // [p, p + k) of the file, but for [s, e), which is in place.
                          const auto s = std::clamp(read_lo, p, p + k),
                                     e = std::clamp(read_hi, p, p + k);
                          std::memcpy(out + to + d, bytes + (p - lo), s - p);
                          std::memcpy(out + to + d + (e - p), bytes + (e - lo), p + k - e);
                          if ((d += k) == n) {
                              ++i;
                              d = 0;
                          }
                      }
                  }
              });
}

XSHARD_DECL void check_stored(const ckpt_model& m, const checkpoint_reader& r,
                              const std::string& where,
                              std::vector<const strategy_entry*>& stored) {
    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
        const auto& t = m.tensors[i];
        stored[i] = r.strategy().find(t.name);
        if (!stored[i])
            throw io_error("xshard: " + where + ": no tensor '" + printable(t.name) +
                           "' in the checkpoint");
        if (!t.data && t.cdata) // (an empty block has neither)
            throw error("xshard: " + where + ": '" + printable(t.name) +
                        "' is const; a load needs tensors it can write");
        if (stored[i]->dtype != m.dtypes[i])
            throw io_error("xshard: " + where + ": '" + printable(t.name) + "' is stored as " +
                           stored[i]->dtype + ", the model has " + m.dtypes[i]);
        if (stored[i]->shape != t.shape)
            throw io_error("xshard: " + where + ": '" + printable(t.name) +
                           "' is stored with shape " + shape_string(stored[i]->shape) +
                           ", the model has " + shape_string(t.shape));
    }
}

XSHARD_DECL load_plan plan_load(ckpt_model& m, const checkpoint_reader& r,
                                const std::string& where) {
    const auto& c = *m.comm;
    const std::size_t nt = m.tensors.size();
    load_plan p{std::vector<const strategy_entry*>(nt), std::vector<std::vector<stored_block>>(nt),
                std::vector<std::optional<checkpoint_reader::node_read>>(nt), nullptr};
    everywhere(c, [&] {
        check_stored(m, r, where, p.stored);
        for (std::size_t i = 0; i < nt; ++i) {
            const auto& t = m.tensors[i];
            p.blocks[i] = r.blocks(*p.stored[i]);
            std::vector<stored_block> mine; // the blocks this rank reads from
            for (const auto& b : p.blocks[i]) {
                if (meets(t, b))
                    mine.push_back(b);
                r.segments(*p.stored[i], b);
            }
            if (c.size() > 1 && read_on_node(r, *p.stored[i], t, p.blocks[i]))
                p.together[i] = r.plan_node_read(*p.stored[i], mine, t.offset, t.extent);
        }
    });
    check_same_file(c, r.identity(), r.path());
    if (std::any_of(p.together.begin(), p.together.end(),
                    [](const auto& read) { return read.has_value(); })) {
        p.node = &node_file_io::of(c); // empty when the ranks do not share one node
        if (!*p.node)
            for (auto& read : p.together)
                read.reset();
    }
    if (p.node && *p.node) {
        // A tensor whose blocks in the load's layout partition it (the ranks need its bytes
        // once in all) is read straight into the ranks' tensors where it can be.
        std::vector<std::uint64_t> needed(nt, 0);
        for (std::size_t i = 0; i < nt; ++i)
            if (p.together[i])
                for (const auto& runs : p.together[i]->runs)
                    for (const auto& run : runs)
                        needed[i] += run[2];
        allreduce(c, std::span(needed), reduction::sum);
        for (std::size_t i = 0; i < nt; ++i)
            if (p.together[i])
                p.together[i]->direct = needed[i] == p.together[i]->length;
    }
    return p;
}

XSHARD_DECL void read_stored(ckpt_model& m, const checkpoint_reader& r, const load_plan& p) {
    for (std::size_t i = 0; i < m.tensors.size(); ++i)
        if (p.together[i])
            read_together(*p.node, *p.together[i], m.tensors[i].data);
    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
        if (p.together[i])
            continue;
        const auto& t = m.tensors[i];
        for (const auto& b : p.blocks[i])
            if (meets(t, b)) {
                if (inside_one_block(t, b))
                    r.read_whole(*p.stored[i], b, t.offset, t.extent, t.data);
                else
                    r.read_part(*p.stored[i], b, t.offset, t.extent, t.data);
            }
    }
}

XSHARD_DECL checkpoint_info load(ckpt_model& m, const checkpoint_reader& r) {
    const auto& c = *m.comm;
    const std::string where = "load_checkpoint " + r.path();
    const auto p = plan_load(m, r, where);
    verify_shared(c, r, p.stored, where);
    everywhere(c, [&] { read_stored(m, r, p); });
    return {r.step(), r.format(), r.strategy()};
}

} // namespace detail

} // namespace xshard

