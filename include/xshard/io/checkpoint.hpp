#pragma once
/// \file
/// Distributed checkpoints: save sharded, load into any strategy, never lose one.
///
/// Two forms (MindSpore's integrated_save):
///  * *integrated* (the default): one safetensors file holding every tensor whole. Each rank
///    writes exactly its own block of each tensor at its place in the file (pwrite of each
///    contiguous run, checksummed as it is written), only one copy of a replicated block is
///    written, and no rank ever holds a whole tensor. Python's safetensors or numpy read it.
///    The header's `__metadata__` holds the step, the strategy (the strategy file's JSON) and
///    a CRC-32 per tensor.
///  * *per-rank*: a directory with each rank's shards in `rank_<r>.safetensors` (with their
///    CRC-32s), `strategy.json` and `checkpoint.json` (the step).
/// Both forms are written and read with POSIX calls on the file system every rank sees (as
/// for any checkpoint library: a parallel or local file system with POSIX semantics). MPI-IO
/// is not used: with Open MPI its collective write reported success for writes that failed
/// (issue 12), and ran four times slower than pwrite here.
///
/// `load_checkpoint` reads either form into any strategy, on any mesh and world size, in two
/// passes over the files it opened first: every stored byte to be loaded is read once, by
/// one rank, and checked against its CRC-32 (the ranks' CRCs combined); then, only if all
/// checked out, each rank reads the pieces of its destination blocks straight into the
/// model. A truncated or corrupted file, a wrong dtype or shape, a missing tensor raise the
/// same `io_error` on every rank and leave the model as it was, with no memory beyond the
/// model's and one buffer; the price is the second read (from the page cache).
///
/// Saving never loses the previous checkpoint: the new one is written under a temporary
/// name, fsynced, read back and checked against the checksums computed from memory, then
/// renamed over the old one (for the per-rank form: the old directory is renamed `<path>.old`
/// for the moment of the swap, and a load falls back to it). What a killed save left is
/// removed by a later save once provably abandoned (format.hpp, remove_stale_temporaries).
///
/// Optimizer state (momentum, Adam moments, any container of tensors) is saved and restored
/// with the parameters under the prefix "optimizer.", and the step counter with them.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/format.hpp>
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
        m.comm = c.mesh_comm;
        m.mesh = c.mesh;
        m.rank = c.mesh_rank;
        m.strategy.mesh = c.mesh;
        m.dtypes.emplace_back(dtype_of<T>().name);
        m.strategy.parameters.push_back({c.name, c.shape, m.dtypes.back(), c.lay, trainable});
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

/// Writes the block of `t` into `f` (which stores the tensor whole, row-major, from byte
/// `at`) with pwrite, one call per contiguous run in the file (runs_of), each run checksummed
/// just before it is written and recorded in `out` as a piece of tensor `key`.
inline void write_block(const file& f, std::size_t at, const tensor_record& t, std::uint64_t key,
                        std::vector<crc_run>& out) {
    const std::byte* data = t.cdata;
    for (const auto& [offset, length] : runs_of(t.shape, t.offset, t.extent, t.element)) {
        out.push_back({key, offset, length, write_checksummed(f, data, length, at + offset)});
        data += length;
    }
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
                          const std::string& where) {
    std::vector<crc_run> runs;
    everywhere(c, [&] {
        const auto pieces = r.pieces_to_verify(stored, verify_chunk);
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
        if (const auto bad = r.damaged(stored, all); !bad.empty())
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

/// The post-write check of a save: the temporary `tmp` read back and checked against the
/// checksums computed from memory, shared among the ranks as a load's verification is; a
/// write that failed anywhere (a full disk, a quota, a file-size limit, even one MPI-IO did
/// not report) raises io_error on every rank.
inline void check_written(const communicator& c, const std::string& tmp,
                          const std::string& path, const std::vector<tensor_record>& tensors,
                          std::size_t expected_size) {
    std::optional<checkpoint_reader> r;
    std::vector<const strategy_entry*> stored;
    everywhere(c, [&] {
        r.emplace(tmp);
        if (r->header(0).data_start + r->header(0).tensors.back().end != expected_size &&
            !tensors.empty())
            throw io_error("xshard: writing " + path + " failed: the file is not complete");
        for (const auto& t : tensors)
            stored.push_back(r->strategy().find(t.name));
    });
    verify_shared(c, *r, stored, "writing " + path + " failed: read back");
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

inline void save_integrated(ckpt_model& m, const std::string& path, std::int64_t step) {
    const auto& c = *m.comm;
    std::vector<tensor_entry> entries;
    for (std::size_t i = 0; i < m.tensors.size(); ++i)
        entries.push_back({m.tensors[i].name, m.dtypes[i], m.tensors[i].shape, 0, 0});
    std::string header = integrated_header(entries, m.strategy, step);
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
    // in place with pwrite, checksumming them as it goes, and fsyncs them.
    std::vector<crc_run> runs;
    std::vector<std::uint64_t> sizes;
    everywhere(c, [&] {
        file f(tmp, O_WRONLY | O_NOFOLLOW);
        for (std::size_t i = 0; i < m.tensors.size(); ++i) {
            const auto& t = m.tensors[i];
            sizes.push_back(t.global_bytes());
            if (t.primary())
                write_block(f, checked_add(header.size(), entries[i].begin), t, i, runs);
        }
        f.sync();
        f.close();
    });
    // Then rank 0 writes the header with the checksums (its length does not depend on them).
    const auto crcs = combine_runs(gather_runs(c, runs), sizes);
    on_rank0(c, [&] {
        header = integrated_header(entries, m.strategy, step, crcs);
        file f(tmp, O_WRONLY | O_NOFOLLOW);
        f.write_at(header.data(), header.size(), 0);
        f.sync();
        f.close();
    });
    check_written(c, tmp, path, m.tensors, size);
    on_rank0(c, [&] { replace_checkpoint(tmp, path); });
    committed = true;
}

/// Loads the blocks of `m` from `r` in two passes: first every stored byte to be loaded is
/// checked against its CRC-32 (verify_shared); then, if all passed, each rank reads its
/// blocks straight into the model. So a damaged checkpoint changes nothing, and a load needs
/// no memory beyond the model's and one buffer. Every file is opened before the check and
/// read through the descriptor checked, so a save renamed over the checkpoint meanwhile is
/// never read unverified.
inline checkpoint_info load(ckpt_model& m, const checkpoint_reader& r) {
    const auto& c = *m.comm;
    const std::string where = "load_checkpoint " + r.path();
    const std::size_t nt = m.tensors.size();
    std::vector<const strategy_entry*> stored(nt);
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
                throw io_error("xshard: " + where + ": '" + printable(t.name) +
                               "' is stored as " + stored[i]->dtype + ", the model has " +
                               m.dtypes[i]);
            if (stored[i]->shape != t.shape)
                throw io_error("xshard: " + where + ": '" + printable(t.name) +
                               "' is stored with shape " + shape_string(stored[i]->shape) +
                               ", the model has " + shape_string(t.shape));
        }
        for (const auto& p : r.pieces_to_verify(stored, verify_chunk))
            r.header(p.file);
        for (std::size_t i = 0; i < nt; ++i)
            r.open_box(*stored[i], m.tensors[i].offset, m.tensors[i].extent);
    });
    check_same_file(c, r.identity(), r.path());
    // Pass 1: verification.
    verify_shared(c, r, stored, where);
    // Pass 2: each rank reads the pieces of its blocks, wherever they are stored, straight
    // into the model, through the descriptors pass 1 verified.
    everywhere(c, [&] {
        for (std::size_t i = 0; i < nt; ++i) {
            const auto& t = m.tensors[i];
            r.read_box(*stored[i], t.offset, t.extent, t.data);
        }
    });
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
    if (options.format == checkpoint_format::integrated)
        detail::save_integrated(m, path, options.step);
    else
        detail::save_per_rank(m, path, options.step);
}

/// Loads a checkpoint of either form (a file: integrated; a directory: per-rank) into
/// `params` (trainable ones unless `all_parameters`) and `optimizer_state`, whatever their
/// layouts now. Collective; throws io_error on every rank, and changes nothing, if the file is
/// damaged or does not match the model.
template <parameter_container P, parameter_container S = std::tuple<>>
checkpoint_info load_checkpoint(const std::string& path, P& params, S&& optimizer_state = {},
                                bool all_parameters = false) {
    auto m = detail::collect_model(params, optimizer_state, all_parameters);
    std::optional<checkpoint_reader> r;
    detail::everywhere(*m.comm, [&] { r.emplace(path); });
    return detail::load(m, *r);
}

} // namespace xshard
