#pragma once
/// \file
/// Distributed checkpoints: save sharded, load into any strategy, never lose one.
///
/// Two forms (MindSpore's integrated_save):
///  * *integrated* (the default): one safetensors file holding every tensor whole. Each rank
///    writes exactly its own block of each tensor at its place in the file (each contiguous
///    run checksummed as it is stored), only one copy of a replicated block is written, and
///    no rank ever holds a whole tensor. A tensor stored in short runs (a column split) the
///    ranks of a node write together, each a contiguous slice of it (node_io.hpp); ranks on
///    several nodes store short runs through a shared mapping of space allocated first
///    (mapped_writer.hpp). The tensors' bytes start on a page (safetensors.hpp,
///    data_alignment). Python's safetensors or numpy read it.
///    The header's `__metadata__` holds the step, the strategy (the strategy file's JSON), a
///    CRC-32 per tensor and one per block the saving ranks held (format.hpp).
///  * *per-rank*: a directory with each rank's shards in `rank_<r>.safetensors` (with their
///    CRC-32s), `strategy.json` and `checkpoint.json` (the step).
/// Both forms are written and read with POSIX calls on the file system every rank sees (as
/// for any checkpoint library: a parallel or local file system with POSIX semantics). MPI-IO
/// is not used: with Open MPI its collective write reported success for writes that failed
/// (issue 12), and ran four times slower than pwrite here.
///
/// `load_checkpoint` reads either form into any strategy, on any mesh and world size, and
/// checks every stored byte it loads against its CRC-32 (see load): a stored block that lies
/// inside one block of the load's layout (the same layout, or a coarser one) is read once,
/// straight into the model, and checksummed as it is read (stored in short runs, a column
/// split's, it is read once per node, node_io.hpp); a stored block that straddles the
/// load's blocks is first checked by one rank (the ranks share them), then read by those that
/// need a part of it. A truncated file, a wrong dtype or shape, a missing tensor raise the
/// same `io_error` on every rank before anything is read; a checksum mismatch raises it on
/// every rank after the read (the model's values are then unspecified). No memory beyond the
/// model's, one buffer, and the node's two shared windows of 4 MiB (kept per communicator,
/// for its reads and writes).
///
/// Saving never loses the previous checkpoint: the new one is written under a temporary
/// name, read back and checked against the checksums computed from memory while the device
/// writes it, fsynced, then renamed over the old one (for the per-rank form: the old
/// directory is renamed `<path>.old` for the moment of the swap, and a load falls back to
/// it). What a killed save left is removed by a later save once provably abandoned
/// (format.hpp, remove_stale_temporaries).
///
/// Optimizer state (momentum, Adam moments, any container of tensors) is saved and restored
/// with the parameters under the prefix "optimizer.", and the step counter with them.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/format.hpp>
#include <xshard/io/mapped_writer.hpp>
#include <xshard/io/node_io.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/strategy_file.hpp>
#include <xshard/param/tensor_record.hpp>
#include <xshard/param/traversal.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace xshard {

struct checkpoint_options {
    checkpoint_format format = checkpoint_format::integrated;
    /// Save every parameter, not only the trainable ones.
    bool all_parameters = false;
    /// The training step saved with the checkpoint.
    std::int64_t step = 0;
};

/// What a load found.
struct checkpoint_info {
    std::int64_t step = 0;
    checkpoint_format format = checkpoint_format::integrated;
    strategy_file strategy; ///< the strategy the checkpoint was saved with
};

namespace detail {

struct ckpt_model {
    std::vector<tensor_record> tensors; ///< param/tensor_record.hpp
    std::vector<std::string> dtypes;    ///< their safetensors dtypes
    const communicator* comm = nullptr;
    mesh_shape mesh;
    int rank = 0;
    strategy_file strategy; ///< of everything saved (parameters, then optimizer state)
    /// Which tensors this rank holds a block of, to write (empty: all). A pipeline's checkpoint
    /// (pipeline/checkpoint.hpp) lists every stage's tensors on every rank, each held by its
    /// stage's ranks only (its record then gives its stage's mesh, layout and shape).
    std::vector<bool> held;

    bool holds(std::size_t i) const { return held.empty() || held[i]; }
};

/// The bytes of this rank's block of `t`.
inline std::size_t local_bytes(const tensor_record& t) {
    return checked_mul(volume(t.extent), t.element);
}

template <class C>
void collect(ckpt_model& m, C& container, const std::string& prefix, bool all) {
    for_each_parameter(container, [&](const std::string& name, auto& t, bool trainable) {
        using D = std::remove_cvref_t<decltype(t)>;
        using T = typename D::value_type;
        if (!trainable && !all)
            return;
        if (t.layout().is_partial())
            throw error("xshard: checkpoint: '" + name + "' is partial " + t.layout().to_string() +
                        "; resolve it before saving");
        auto c = record_of(prefix + name, t, trainable);
        // A tensor on a mesh of part of the ranks, one of copies of it that tile the mesh
        // (hsdp's state sharded over part of a mesh axis, train/hsdp.hpp), is saved with its
        // own mesh, by the copy holding the mesh's rank 0, and loaded by every copy.
        std::optional<mesh_shape> own;
        std::vector<int> ranks;
        bool writes = true;
        if (m.comm && c.mesh_comm->size() != m.comm->size()) {
            if (c.mesh_comm->size() > m.comm->size() || m.comm->size() % c.mesh_comm->size() != 0)
                throw error("xshard: checkpoint: '" + name + "' lives on a mesh of " +
                            std::to_string(c.mesh_comm->size()) +
                            " ranks, the tensors before it on " + std::to_string(m.comm->size()) +
                            "; a checkpoint saves the tensors of one mesh, or of copies of "
                            "a part of it");
            own = c.mesh;
            // The ranks of the copy holding rank 0, in its mesh's order, known everywhere.
            const int me = m.comm->rank();
            ranks.resize(std::size_t(c.mesh_comm->size()));
            mpi::allgather(*c.mesh_comm, std::span(&me, 1), ranks);
            writes = std::ranges::min(ranks) == 0;
            mpi::bcast(*m.comm, ranks, 0);
        } else {
            m.comm = c.mesh_comm;
            m.mesh = c.mesh;
            m.rank = c.mesh_rank;
            m.strategy.mesh = c.mesh;
        }
        m.dtypes.emplace_back(dtype_of<T>().name);
        m.strategy.parameters.push_back(
            {c.name, c.shape, m.dtypes.back(), c.lay, trainable, -1, own, std::move(ranks)});
        m.held.push_back(writes);
        m.tensors.push_back(std::move(c));
    });
}

/// Throws xshard::error (the same on every rank: every rank holds the same names) when two
/// tensors of `m` have one name, or one is named like safetensors' metadata entry.
inline void check_names(const ckpt_model& m) {
    std::set<std::string_view> seen;
    for (const auto& t : m.tensors) {
        if (t.name == "__metadata__")
            throw error("xshard: checkpoint: a parameter is named '__metadata__', which "
                        "safetensors reserves");
        if (!seen.insert(t.name).second)
            throw error("xshard: checkpoint: two parameters are named '" + printable(t.name) +
                        "'; checkpoint names must be unique");
    }
}

template <class P, class S>
ckpt_model collect_model(P& params, S& state, bool all) {
    ckpt_model m;
    collect(m, params, "", all);
    collect(m, state, "optimizer.", true);
    if (!m.comm)
        throw error("xshard: checkpoint: nothing to save or load");
    check_names(m);
    return m;
}

/// `f()` on every rank of `c`, its failure raised on every rank (agreed, comm/agree.hpp): a
/// failing rank rethrows its own io_error (any other exception becomes one), the others throw
/// io_error naming it. Collective (one all-reduce of an int).
template <class F>
void everywhere(const communicator& c, F&& f) {
    agreed<io_error>(c, [&] {
        try {
            f();
        } catch (const error&) {
            throw;
        } catch (const std::exception& e) {
            throw io_error(std::string("xshard: ") + e.what());
        }
    });
}

/// `f()` on rank 0 of `c`, its failure raised on every rank (see everywhere).
template <class F>
void on_rank0(const communicator& c, F&& f) {
    everywhere(c, [&] {
        if (c.rank() == 0)
            f();
    });
}

/// Writes the block of `t` into the file of `w` (which stores the tensor whole, row-major,
/// from byte `at`): each contiguous run in the file (runs_of) is checksummed as it is stored
/// and recorded in `out` as a piece of tensor `key`; short runs go through the mapping, after
/// the bytes from the first run to the last are reserved (mapped_writer.hpp). Returns the CRC-32 of
/// the block (its bytes in its own row-major order: the runs in turn).
inline std::uint32_t write_block(mapped_writer& w, std::size_t at, const tensor_record& t,
                                 std::uint64_t key, std::vector<crc_run>& out) {
    const auto runs = runs_of(t.shape, t.offset, t.extent, t.element);
    if (runs.empty())
        return 0;
    if (runs.front().second < short_run) {
        const auto first = checked_add(at, runs.front().first);
        w.reserve(first, checked_add(at, runs.back().first + runs.back().second) - first);
    }
    const std::byte* data = t.cdata;
    std::uint32_t block = 0;
    for (const auto& [offset, length] : runs) {
        const auto crc = w.write_checksummed(data, length, at + offset);
        out.push_back({key, offset, length, crc});
        block = std::uint32_t(::crc32_combine(uLong(block), uLong(crc), z_off_t(length)));
        data += length;
    }
    return block;
}

/// Writes a tensor of `length` bytes into `f` (which stores it whole, row-major, from byte
/// `at`) with the other ranks of the node (node_io.hpp), each rank its block: its `runs`
/// (runs_of: offsets in the tensor, lengths; none if it writes none), whose bytes are one
/// after the other at `data`. The blocks the ranks write must partition the tensor. Each run
/// is checksummed as write_block does and recorded in `out` as a piece of tensor `key`.
/// Returns the block's CRC-32. Collective over the node's ranks.
inline std::uint32_t write_together(node_file_io& node, const file& f, std::size_t at,
                                    std::size_t length,
                                    const std::vector<std::pair<std::size_t, std::size_t>>& runs,
                                    const std::byte* data, std::uint64_t key,
                                    std::vector<crc_run>& out) {
    std::vector<node_file_io::source_run> mine;
    for (const auto& [offset, n] : runs) {
        mine.push_back({at + offset, data, n});
        data += n;
    }
    std::vector<std::uint32_t> crc(runs.size(), 0);
    node.write(f, at, length, mine, [&](std::size_t i, const std::byte* p, std::size_t n) {
        crc[i] = crc32_of(p, n, crc[i]);
    });
    std::uint32_t block = 0;
    for (std::size_t i = 0; i < runs.size(); ++i) {
        out.push_back({key, runs[i].first, runs[i].second, crc[i]});
        block =
            std::uint32_t(::crc32_combine(uLong(block), uLong(crc[i]), z_off_t(runs[i].second)));
    }
    return block;
}

/// The checksum runs of a block (of `extent` at `offset` in a tensor of `shape`) whose bytes
/// are contiguous at `data`, as pieces of the stored tensor `key`.
inline void block_runs(std::vector<crc_run>& out, std::uint64_t key,
                       const std::vector<std::size_t>& shape,
                       const std::vector<std::size_t>& offset,
                       const std::vector<std::size_t>& extent, std::size_t element,
                       const std::byte* data) {
    for (const auto& [at, length] : runs_of(shape, offset, extent, element)) {
        out.push_back({key, at, length, crc32_of(data, length)});
        data += length;
    }
}

/// Everyone's checksum runs, on rank 0 of `c`.
inline std::vector<crc_run> gather_runs(const communicator& c, const std::vector<crc_run>& mine) {
    if (mine.size() > std::size_t(INT_MAX / 4))
        throw io_error("xshard: too many checksum runs on one rank");
    const int n = int(mine.size() * 4);
    std::vector<int> counts(std::size_t(c.size())), displs(std::size_t(c.size()));
    gather(c, std::span(&n, 1), c.rank() == 0 ? std::span(counts) : std::span<int>(), 0);
    std::vector<std::uint64_t> all;
    if (c.rank() == 0) {
        std::size_t total = 0;
        for (std::size_t r = 0; r < counts.size(); ++r) {
            if (total > std::size_t(INT_MAX) - std::size_t(counts[r]))
                throw io_error("xshard: too many checksum runs");
            displs[r] = int(total);
            total += std::size_t(counts[r]);
        }
        all.resize(total);
    }
    gatherv(c, std::span(reinterpret_cast<const std::uint64_t*>(mine.data()), mine.size() * 4), all,
            counts, displs, 0);
    if (c.rank() != 0)
        return {};
    std::vector<crc_run> runs(all.size() / 4);
    std::memcpy(runs.data(), all.data(), all.size() * sizeof(std::uint64_t));
    return runs;
}

/// The bytes a load verifies at a time: the one buffer it needs beyond the model.
inline constexpr std::size_t verify_chunk = std::size_t(8) << 20;

/// Checks every stored byte of `stored` in `r` against its CRC-32, each read once, by one
/// rank of `c` (a contiguous share of the pieces, balanced by bytes, through one buffer of
/// verify_chunk bytes); raises io_error on every rank naming the damaged tensors. Collective.
inline void verify_shared(const communicator& c, const checkpoint_reader& r,
                          const std::vector<const strategy_entry*>& stored,
                          const std::string& where,
                          const checkpoint_reader::block_filter& only = {}) {
    std::vector<crc_run> runs;
    everywhere(c, [&] {
        const auto pieces = r.pieces_to_verify(stored, verify_chunk, only);
        std::uint64_t total = 0, at = 0;
        for (const auto& p : pieces)
            total += p.length;
        std::vector<std::byte> buffer;
        for (const auto& p : pieces) {
            if (at * std::uint64_t(c.size()) / total == std::uint64_t(c.rank()))
                runs.push_back(r.checksum_of(p, buffer));
            at += p.length;
        }
    });
    const auto all = gather_runs(c, runs);
    on_rank0(c, [&] {
        if (const auto bad = r.damaged(stored, all, only); !bad.empty())
            throw io_error("xshard: " + where + ": checksum mismatch in " + bad +
                           ": the checkpoint is corrupted");
    });
}

/// Raises io_error on every rank unless every rank's `id` equals rank 0's: the ranks read
/// one and the same file. Collective (a broadcast and an all-reduce).
inline void check_same_file(const communicator& c, std::array<std::uint64_t, 4> id,
                            const std::string& path) {
    auto first = id;
    bcast(c, std::span(first), 0);
    everywhere(c, [&] {
        if (first != id)
            throw io_error("xshard: " + path +
                           " changed while it was being loaded (replaced by another save?)");
    });
}

/// The post-write check of an integrated save, after every rank wrote its blocks and rank 0
/// the header: the temporary `tmp` read back, each byte once by one rank (a contiguous share
/// of the file per rank, in verify_chunk pieces), and checked against `crcs`, the CRC-32 of
/// each tensor computed from memory; rank 0 also checks the file's size and reads the header
/// back. Meanwhile the file is made durable: each rank has the device write its share (the
/// writing runs while it reads its share back), then rank 0 fsyncs the file (its metadata,
/// the device's cache). A write that failed anywhere (a full disk, a quota, a file-size
/// limit, even one the system did not report) raises io_error on every rank. Collective.
inline void check_written(const communicator& c, const std::string& tmp, const std::string& path,
                          const std::string& header, const std::vector<tensor_entry>& entries,
                          const std::vector<std::optional<std::uint32_t>>& crcs,
                          std::size_t expected_size) {
    const auto failed = [&](const std::string& why) {
        return io_error("xshard: writing " + path + " failed: " + why);
    };
    const std::uint64_t p = std::uint64_t(c.size()), me = std::uint64_t(c.rank());
    std::vector<crc_run> runs;
    everywhere(c, [&] {
        file f(tmp, O_WRONLY | O_NOFOLLOW);
        // This rank's share: the pieces that begin in [lo, hi) of the file.
        const std::uint64_t lo = expected_size / p * me,
                            hi = me + 1 == p ? expected_size : expected_size / p * (me + 1);
        f.write_back(lo, hi - lo, false);
        const file in(tmp, O_RDONLY | O_NOFOLLOW);
        std::vector<std::byte> buffer;
        for (std::size_t i = 0; i < entries.size(); ++i) {
            const std::uint64_t start = header.size() + entries[i].begin,
                                bytes = entries[i].end - entries[i].begin;
            for (std::uint64_t o = 0; o < bytes; o += verify_chunk) {
                if (start + o < lo || start + o >= hi)
                    continue;
                const auto n = std::min<std::uint64_t>(verify_chunk, bytes - o);
                buffer.resize(std::size_t(n));
                in.read_at(buffer.data(), buffer.size(), start + o);
                runs.push_back({i, o, n, crc32_of(buffer.data(), buffer.size())});
            }
        }
        f.write_back(lo, hi - lo);
        f.close();
    });
    const auto all = gather_runs(c, runs);
    on_rank0(c, [&] {
        file f(tmp, O_WRONLY | O_NOFOLLOW);
        f.sync();
        if (f.size() != expected_size)
            throw failed("the file has " + std::to_string(f.size()) + " bytes, not " +
                         std::to_string(expected_size));
        const file in(tmp, O_RDONLY | O_NOFOLLOW);
        std::string back(header.size(), '\0');
        in.read_at(back.data(), back.size(), 0);
        if (back != header)
            throw failed("the header read back differs from the one written");
        std::vector<std::uint64_t> sizes;
        for (const auto& e : entries)
            sizes.push_back(e.end - e.begin);
        const auto got = combine_runs(all, sizes);
        std::string bad;
        for (std::size_t i = 0; i < entries.size(); ++i)
            if (!got[i] || !crcs[i] || *got[i] != *crcs[i])
                bad += (bad.empty() ? "" : ", ") + printable(entries[i].name);
        if (!bad.empty())
            throw failed("read back, " + bad + " differ from what was written");
        f.close();
    });
}

/// Runs `cleanup` when it goes out of scope unless `committed` is set by then: what a save
/// removes of its temporaries when it fails (or throws) before the rename.
template <class F>
class unless_committed {
public:
    unless_committed(const bool& committed, F cleanup)
        : committed_(committed)
        , cleanup_(std::move(cleanup)) {}
    unless_committed(const unless_committed&) = delete;
    unless_committed& operator=(const unless_committed&) = delete;
    ~unless_committed() {
        if (!committed_)
            cleanup_();
    }

private:
    const bool& committed_;
    F cleanup_;
};

/// Saves `m` as an integrated checkpoint (see the file comment). Collective over `m.comm`,
/// each rank writing the primary blocks of the tensors it holds (ckpt_model::held).
inline void save_integrated(ckpt_model& m, const std::string& path, std::int64_t step) {
    const auto& c = *m.comm;
    std::vector<tensor_entry> entries;
    std::vector<std::vector<std::uint32_t>> block_crcs;
    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
        const auto& t = m.tensors[i];
        entries.push_back({t.name, m.dtypes[i], t.shape, 0, 0});
        block_crcs.emplace_back(primary_block_count(t.mesh, t.lay), 0);
    }
    std::string header = integrated_header(entries, m.strategy, step, {}, block_crcs);
    std::size_t size = header.size();
    for (const auto& e : entries)
        size = std::max(size, checked_add(header.size(), e.end));
    // Rank 0 checks what it would replace, makes the directories, removes what killed saves
    // left, and creates the temporary, which it holds (files.hpp) until the save ends.
    std::optional<std::string> created;
    std::optional<file> held;
    on_rank0(c, [&] {
        replaceable(path);
        create_parent_directories(path);
        remove_stale_temporaries(path);
        held.emplace(create_temporary_file(path));
        created = held->path();
    });
    const std::string tmp = message_from(c, 0, created);
    bool committed = false;
    const unless_committed guard(committed, [&] {
        if (c.rank() == 0)
            ::unlink(tmp.c_str());
    });

    // Every rank writes its own blocks (one copy of a replicated block: its primary holder's)
    // in place, checksumming them as it goes: pieces of each tensor (for its CRC whole) and
    // each block whole (for loads). Tensors stored in short runs (column splits) the node's
    // ranks write together (write_together), when they share a node and their blocks
    // partition the tensor (the same answer on every rank: one all-reduce of each rank's
    // view); the rest each rank writes with pwrite, or short runs through a mapping
    // (write_block).
    const std::size_t nt = m.tensors.size();
    std::vector<std::uint64_t> view(2 * nt, 0); // short runs written, bytes written, by tensor
    std::vector<std::uint64_t> sizes(nt);
    std::vector<std::vector<std::pair<std::size_t, std::size_t>>> mine(nt); // runs written
    everywhere(c, [&] {
        for (std::size_t i = 0; i < nt; ++i) {
            const auto& t = m.tensors[i];
            sizes[i] = t.global_bytes();
            if (m.holds(i) && t.primary()) {
                mine[i] = runs_of(t.shape, t.offset, t.extent, t.element);
                view[i] = !mine[i].empty() && mine[i].front().second < short_run;
                view[nt + i] = t.bytes();
            }
        }
    });
    std::vector<bool> together(nt, false);
    node_file_io* node = nullptr;
    if (c.size() > 1) {
        allreduce(c, std::span(view), reduction::sum);
        for (std::size_t i = 0; i < nt; ++i)
            together[i] = view[i] > 0 && view[nt + i] == sizes[i];
        if (std::find(together.begin(), together.end(), true) != together.end()) {
            node = &node_file_io::of(c); // empty when the ranks do not share one node
            if (!*node)
                std::fill(together.begin(), together.end(), false);
        }
    }
    std::vector<crc_run> runs, blocks;
    std::optional<file> f; // (read and write: a shared mapping of a file must be readable)
    everywhere(c, [&] { f.emplace(tmp, O_RDWR | O_NOFOLLOW); });
    // The node's writes first, all of them on every rank: a node write fails on every rank
    // together, and so before any rank could fail alone in a write of its own.
    for (std::size_t i = 0; i < nt; ++i) {
        const auto& t = m.tensors[i];
        if (!together[i])
            continue;
        const auto crc = write_together(*node, *f, header.size() + entries[i].begin, sizes[i],
                                        mine[i], t.cdata, i, runs);
        if (m.holds(i) && t.primary())
            blocks.push_back(
                {i, std::uint64_t(t.mesh.group_color(t.mesh_rank, t.replicated)), t.bytes(), crc});
    }
    everywhere(c, [&] {
        {
            mapped_writer w(*f);
            for (std::size_t i = 0; i < nt; ++i) {
                const auto& t = m.tensors[i];
                if (!together[i] && m.holds(i) && t.primary()) {
                    const auto crc =
                        write_block(w, checked_add(header.size(), entries[i].begin), t, i, runs);
                    blocks.push_back({i,
                                      std::uint64_t(t.mesh.group_color(t.mesh_rank, t.replicated)),
                                      t.bytes(), crc});
                }
            }
        }
        f->close();
    });
    // Then rank 0 writes the header with the checksums (its length does not depend on them).
    const auto crcs = combine_runs(gather_runs(c, runs), sizes);
    const auto all_blocks = gather_runs(c, blocks);
    on_rank0(c, [&] {
        for (const auto& b : all_blocks)
            block_crcs.at(b.tensor).at(b.offset) = std::uint32_t(b.crc);
        header = integrated_header(entries, m.strategy, step, crcs, block_crcs);
        file f(tmp, O_WRONLY | O_NOFOLLOW);
        f.write_at(header.data(), header.size(), 0);
        f.close();
    });
    // (Every rank's header has the final one's length; rank 0's is the final one.)
    check_written(c, tmp, path, header, entries, crcs, size);
    on_rank0(c, [&] { replace_checkpoint(tmp, path); });
    committed = true;
}

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
    const std::size_t nt = m.tensors.size();
    std::vector<const strategy_entry*> stored(nt);
    std::vector<std::vector<stored_block>> blocks(nt);
    bool shared = false; // some stored block straddles blocks of the load's layout
    // The tensors the node's ranks read together, and this rank's part of each read.
    std::vector<std::optional<checkpoint_reader::node_read>> together(nt);
    everywhere(c, [&] {
        for (std::size_t i = 0; i < nt; ++i) {
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
        // Every file read below is opened now (its header parsed, every block checked to be
        // stored as the strategy says), before any data is read.
        for (std::size_t i = 0; i < nt; ++i) {
            const auto& t = m.tensors[i];
            blocks[i] = r.blocks(*stored[i]);
            std::vector<stored_block> mine; // the blocks this rank reads from
            for (const auto& b : blocks[i]) {
                const bool straddles = !inside_one_block(t, b);
                shared = shared || straddles;
                const bool reads = meets(t, b);
                if (reads)
                    mine.push_back(b);
                if (straddles || reads)
                    r.segments(*stored[i], b);
            }
            if (c.size() > 1 && read_on_node(r, *stored[i], t, blocks[i]))
                together[i] = r.plan_node_read(*stored[i], mine, t.offset, t.extent);
        }
    });
    check_same_file(c, r.identity(), r.path());
    node_file_io* node = nullptr;
    if (std::any_of(together.begin(), together.end(),
                    [](const auto& p) { return p.has_value(); })) {
        node = &node_file_io::of(c); // empty when the ranks do not share one node
        if (!*node)
            for (auto& p : together)
                p.reset();
    }
    if (node && *node) {
        // A tensor whose blocks in the load's layout partition it (the ranks need its bytes
        // once in all) is read straight into the ranks' tensors where it can be.
        std::vector<std::uint64_t> needed(nt, 0);
        for (std::size_t i = 0; i < nt; ++i)
            if (together[i])
                for (const auto& runs : together[i]->runs)
                    for (const auto& run : runs)
                        needed[i] += run[2];
        allreduce(c, std::span(needed), reduction::sum);
        for (std::size_t i = 0; i < nt; ++i)
            if (together[i])
                together[i]->direct = needed[i] == together[i]->length;
    }
    // Pass 1, for the stored blocks that straddle the load's blocks: verified, shared.
    if (shared)
        verify_shared(c, r, stored, where, [&](std::size_t i, const stored_block& b) {
            return !inside_one_block(m.tensors[i], b);
        });
    // Pass 2 (the only one for blocks inside one of the load's): each rank reads what it
    // needs straight into the model, checksumming the blocks it reads whole.
    std::string damage;
    everywhere(c, [&] {
        // The node's reads first, all of them on every rank: a node read fails on every rank
        // together, and so before any rank could fail alone in a read of its own.
        std::vector<std::vector<std::uint32_t>> crcs(nt);
        for (std::size_t i = 0; i < nt; ++i)
            if (together[i])
                crcs[i] = read_together(*node, *together[i], m.tensors[i].data);
        std::set<std::string> seen;
        for (std::size_t i = 0; i < nt; ++i) {
            const auto& t = m.tensors[i];
            std::size_t read = 0; // blocks of crcs[i] compared
            for (const auto& b : blocks[i]) {
                if (!meets(t, b))
                    continue;
                const auto want = inside_one_block(t, b) ? r.checksum(*stored[i], b) : std::nullopt;
                if (!want) {
                    r.read_part(*stored[i], b, t.offset, t.extent, t.data);
                } else if (crc_hex(together[i] ? crcs[i][read++]
                                               : r.read_block(*stored[i], b, t.offset, t.extent,
                                                              t.data)) != *want) {
                    const auto name = r.block_name(*stored[i], b);
                    if (seen.insert(name).second)
                        damage += (damage.empty() ? "" : ", ") + name;
                }
            }
        }
    });
    agree_on_error<io_error>(c, damage.empty()
                                    ? std::nullopt
                                    : std::optional("xshard: " + where + ": checksum mismatch in " +
                                                    damage + ": the checkpoint is corrupted"));
    return {r.step(), r.format(), r.strategy()};
}

inline void save_per_rank(ckpt_model& m, const std::string& path, std::int64_t step) {
    const auto& c = *m.comm;
    std::optional<std::string> created;
    std::optional<file> held; // (see save_integrated)
    on_rank0(c, [&] {
        replaceable(path);
        create_parent_directories(path);
        remove_stale_temporaries(path);
        held.emplace(create_temporary_directory(path));
        created = held->path();
    });
    const std::string tmp = message_from(c, 0, created);
    bool committed = false;
    const unless_committed guard(committed, [&] {
        ::unlink(rank_file(tmp, c.rank()).c_str());
        if (c.rank() == 0)
            remove_temporary_directory(tmp);
    });
    everywhere(c, [&] {
        std::vector<tensor_entry> entries;
        std::vector<const std::byte*> data;
        for (std::size_t i = 0; i < m.tensors.size(); ++i) {
            entries.push_back({m.tensors[i].name, m.dtypes[i], m.tensors[i].extent, 0, 0});
            data.push_back(m.tensors[i].cdata);
        }
        write_rank_file(tmp, m.rank, std::move(entries), data);
    });
    // Every rank's file is there before rank 0 commits (everywhere agreed on it).
    on_rank0(c, [&] { finish_per_rank(tmp, path, m.strategy, step, false); });
    committed = true;
    // The previous checkpoint's files, removed by their ranks at once (freeing a large file's
    // blocks takes a while); then the rest of it by rank 0.
    const std::string old = previous_name(path);
    everywhere(c, [&] {
        if (std::filesystem::is_directory(old) && !std::filesystem::is_symlink(old))
            ::unlink(rank_file(old, m.rank).c_str());
    });
    on_rank0(c, [&] { remove_checkpoint(old); });
}

} // namespace detail

/// Saves `params` (trainable ones unless `all_parameters`) and `optimizer_state` in `path`
/// (see the file comment for the forms). Collective over the tensors' mesh.
template <parameter_container P, parameter_container S = std::tuple<>>
void save_checkpoint(const std::string& path, const P& params,
                     const checkpoint_options& options = {}, const S& optimizer_state = {}) {
    auto m = detail::collect_model(params, optimizer_state, options.all_parameters);
    if (options.format == checkpoint_format::integrated) {
        detail::save_integrated(m, path, options.step);
    } else {
        detail::save_per_rank(m, path, options.step);
    }
}

/// Loads a checkpoint of either form (a file: integrated; a directory: per-rank) into
/// `params` (trainable ones unless `all_parameters`) and `optimizer_state`, whatever their
/// layouts now. Collective; throws io_error on every rank if the checkpoint does not match the
/// model (then nothing is changed) or is damaged (a checksum mismatch, found as the bytes are
/// read: the tensors loaded are then in an unspecified state; reload a good checkpoint).
template <parameter_container P, parameter_container S = std::tuple<>>
checkpoint_info load_checkpoint(const std::string& path, P& params, S&& optimizer_state = {},
                                bool all_parameters = false) {
    auto m = detail::collect_model(params, optimizer_state, all_parameters);
    std::optional<checkpoint_reader> r;
    detail::everywhere(*m.comm, [&] { r.emplace(path); });
    return detail::load(m, *r);
}

} // namespace xshard
