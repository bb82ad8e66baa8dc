#pragma once
/// \file
/// The collective load (checkpoint.hpp's load_checkpoint): a checkpoint of either form read
/// into any strategy, every stored byte it loads checked against its CRC-32 (see load).

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/io/checkpoint_model.hpp>
#include <xshard/io/checkpoint_reader.hpp>
#include <xshard/io/collective_verify.hpp>
#include <xshard/io/everywhere.hpp>
#include <xshard/io/file_mapping.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/node_io.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/stored_blocks.hpp>
#include <xshard/io/strategy_file.hpp>
#include <xshard/param/tensor_record.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

/// What a load found.
struct checkpoint_info {
    std::int64_t step = 0;
    checkpoint_format format = checkpoint_format::integrated;
    strategy_file strategy; ///< the strategy the checkpoint was saved with
};

namespace detail {

/// Whether stored block `b` lies inside one block of `t`'s layout (that of the load): then a
/// rank that needs any of its bytes needs them all, and reads and verifies it whole.
inline bool inside_one_block(const tensor_record& t, const stored_block& b) {
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

/// Whether stored block `b` holds bytes of this rank's block of `t`.
inline bool meets(const tensor_record& t, const stored_block& b) {
    for (std::size_t d = 0; d < b.offset.size(); ++d)
        if (b.extent[d] == 0 || t.extent[d] == 0 || b.offset[d] >= t.offset[d] + t.extent[d] ||
            t.offset[d] >= b.offset[d] + b.extent[d])
            return false;
    return true;
}

/// Whether the ranks read stored blocks `bs` of tensor `t` together (node_io.hpp): in the
/// integrated form, when each lies inside one block of the load's layout and is stored in
/// short runs (a column split), which a rank alone copies out of a mapping of the file. The
/// same answer on every rank (it depends on the strategy and the model's layout only).
inline bool read_on_node(const checkpoint_reader& r, const strategy_entry& e,
                         const tensor_record& t, const std::vector<stored_block>& bs) {
    if (r.format() != checkpoint_format::integrated)
        return false;
    const stored_block* first = nullptr;
    for (const auto& b : bs) {
        if (!inside_one_block(t, b) || !r.checksum(e, b))
            return false;
        if (!first && b.size() > 0)
            first = &b;
    }
    return first && r.segments(e, *first).front().second < short_run;
}

/// Reads the blocks `plan` lists into `out` with the other ranks of the node (node_io.hpp),
/// each piece of a run checksummed right after it is copied, while in the cache. Returns the
/// CRC-32 of each block (its bytes in its own order, which its stored checksum is).
/// When no other rank needs these bytes (`plan.direct`), the parts of the runs in this rank's
/// slice of a window are read straight into `out`, and only the rest is copied out of the
/// window. Collective over the node reader's ranks, each with its own plan of the same tensor.
inline std::vector<std::uint32_t>
read_together(node_file_io& node, const checkpoint_reader::node_read& plan, std::byte* out) {
    const auto blocks = plan.runs.size();
    std::vector<std::uint32_t> crc(blocks, 0);
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
                          crc[b] = crc32_of(out + to + d, k, crc[b]);
                          if ((d += k) == n) {
                              ++i;
                              d = 0;
                          }
                      }
                  }
              });
    return crc;
}

/// What a load reads, planned before anything is read: for each tensor of the model, its
/// entry in the checkpoint's strategy and its stored blocks; whether some stored block
/// straddles blocks of the load's layout (`shared`: those are verified first,
/// verify_shared); the tensors the node's ranks read together (read_together) through `node`,
/// with this rank's part of each read.
struct load_plan {
    std::vector<const strategy_entry*> stored;
    std::vector<std::vector<stored_block>> blocks;
    bool shared = false;
    std::vector<std::optional<checkpoint_reader::node_read>> together;
    node_file_io* node = nullptr;
};

/// Throws (io_error, or xshard::error for a const tensor) unless every tensor of `m` is in
/// `r` with its dtype and shape; sets `stored` to their entries. `where` names the load.
inline void check_stored(const ckpt_model& m, const checkpoint_reader& r, const std::string& where,
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

/// Plans the load of `m` from `r` (load_plan), checking first that the checkpoint matches the
/// model (check_stored). Every file the load reads is opened here (its header parsed, every
/// block checked to be stored as the strategy says), before any data is read; then the ranks
/// check that they opened one checkpoint (check_same_file) and, where the node's ranks read
/// tensors together, which of those reads go straight into the ranks' tensors. Collective.
inline load_plan plan_load(ckpt_model& m, const checkpoint_reader& r, const std::string& where) {
    const auto& c = *m.comm;
    const std::size_t nt = m.tensors.size();
    load_plan p{std::vector<const strategy_entry*>(nt), std::vector<std::vector<stored_block>>(nt),
                false, std::vector<std::optional<checkpoint_reader::node_read>>(nt), nullptr};
    everywhere(c, [&] {
        check_stored(m, r, where, p.stored);
        for (std::size_t i = 0; i < nt; ++i) {
            const auto& t = m.tensors[i];
            p.blocks[i] = r.blocks(*p.stored[i]);
            std::vector<stored_block> mine; // the blocks this rank reads from
            for (const auto& b : p.blocks[i]) {
                const bool straddles = !inside_one_block(t, b);
                p.shared = p.shared || straddles;
                const bool reads = meets(t, b);
                if (reads)
                    mine.push_back(b);
                if (straddles || reads)
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

/// Reads into `m` what this rank needs of `r` as `p` plans, checksumming the stored blocks
/// it reads whole: the node's reads first, all of them on every rank (a node read fails on
/// every rank together, and so before any rank could fail alone in a read of its own), then
/// this rank's own. Returns the damaged blocks ("w1, b (in dir/rank_3.safetensors)"), empty
/// if none. Collective over the node's ranks where `p` has node reads.
inline std::string read_stored(ckpt_model& m, const checkpoint_reader& r, const load_plan& p) {
    const std::size_t nt = m.tensors.size();
    std::vector<std::vector<std::uint32_t>> crcs(nt);
    for (std::size_t i = 0; i < nt; ++i)
        if (p.together[i])
            crcs[i] = read_together(*p.node, *p.together[i], m.tensors[i].data);
    std::string damage;
    std::set<std::string> seen;
    for (std::size_t i = 0; i < nt; ++i) {
        const auto& t = m.tensors[i];
        const auto& e = *p.stored[i];
        std::size_t read = 0; // blocks of crcs[i] compared
        for (const auto& b : p.blocks[i]) {
            if (!meets(t, b))
                continue;
            const auto want = inside_one_block(t, b) ? r.checksum(e, b) : std::nullopt;
            if (!want) {
                r.read_part(e, b, t.offset, t.extent, t.data);
            } else if (crc_hex(p.together[i]
                                   ? crcs[i][read++]
                                   : r.read_block(e, b, t.offset, t.extent, t.data)) != *want) {
                const auto name = r.block_name(e, b);
                if (seen.insert(name).second)
                    damage += (damage.empty() ? "" : ", ") + name;
            }
        }
    }
    return damage;
}

/// Loads the blocks of `m` from `r`, verifying every stored byte it loads against its CRC-32:
///  * a stored block inside one block of the load's layout (a load into the layout it was
///    saved in, or into a coarser one) is read whole, straight into the model, by each rank
///    that needs it, and checksummed as it is read (one pass: the bytes are read once);
///    When it is stored in short runs (a column split) and the ranks share a node, the node
///    reads the tensor's bytes once, each rank a slice, and each rank copies its runs from
///    shared memory, but for those in its own slice, which it reads straight in when no
///    other rank needs them (read_together);
///  * a stored block that straddles blocks of the load's layout (a load into another layout)
///    is first verified by one rank (the ranks share them, verify_shared), then each rank
///    reads its part of it (two passes, so that no rank reads more than its part twice).
/// The shapes, dtypes and presence of every tensor are checked first: a checkpoint that does
/// not match changes nothing. A checksum mismatch raises io_error on every rank, naming the
/// damaged tensors, after the read: the tensors loaded are then in an unspecified state
/// (reload a good checkpoint). Every file is opened before anything is read and read through
/// the descriptors opened then, and the ranks check that they opened one file, so a save
/// renamed over the checkpoint meanwhile is never read. Collective.
inline checkpoint_info load(ckpt_model& m, const checkpoint_reader& r) {
    const auto& c = *m.comm;
    const std::string where = "load_checkpoint " + r.path();
    const auto p = plan_load(m, r, where);
    // Pass 1, for the stored blocks that straddle the load's blocks: verified, shared.
    if (p.shared)
        verify_shared(c, r, p.stored, where, [&](std::size_t i, const stored_block& b) {
            return !inside_one_block(m.tensors[i], b);
        });
    // Pass 2 (the only one for blocks inside one of the load's): each rank reads what it
    // needs straight into the model, checksumming the blocks it reads whole.
    std::string damage;
    everywhere(c, [&] { damage = read_stored(m, r, p); });
    agree_on_error<io_error>(c, damage.empty()
                                    ? std::nullopt
                                    : std::optional("xshard: " + where + ": checksum mismatch in " +
                                                    damage + ": the checkpoint is corrupted"));
    return {r.step(), r.format(), r.strategy()};
}

} // namespace detail

} // namespace xshard
