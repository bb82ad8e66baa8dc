#pragma once
/// \file
/// Distributed checkpoints: save sharded, load into any strategy, never lose one.
///
/// Two forms (MindSpore's integrated_save):
///  * *integrated* (the default): one safetensors file holding every tensor whole. Written
///    collectively with MPI-IO: each rank writes exactly its own block of each tensor at its
///    place (subarray file views, one collective write for all tensors), only one copy of a
///    replicated block is written, and no rank ever holds a whole tensor. Python's
///    safetensors or numpy read it. The header's `__metadata__` holds the step, the strategy
///    (the strategy file's JSON) and a CRC-32 per tensor.
///  * *per-rank*: a directory with each rank's shards in `rank_<r>.safetensors` (with their
///    CRC-32s), `strategy.json` and `checkpoint.json` (the step).
///
/// `load_checkpoint` reads either form into any strategy, on any mesh and world size: each
/// rank reads only the bytes of its destination blocks (MPI-IO reads with file views for the
/// integrated form; for the per-rank form, the intersecting pieces of the files of the ranks
/// that held them, one copy each). The pieces read are checksummed where they land and the
/// CRCs combined across ranks, so every stored tensor that is loaded is verified without a
/// second pass. The tensors are read into staging buffers first and copied into the model
/// only when everything checked out: a truncated or corrupted file, a wrong dtype or shape, a
/// missing tensor raise the same `io_error` on every rank and leave the model as it was.
///
/// Saving never loses the previous checkpoint: the new one is written under a temporary
/// name, flushed and fsynced, then renamed over the old one (for the per-rank form: the old
/// directory is renamed `<path>.old` for the moment of the swap, and a load falls back to it).
///
/// Optimizer state (momentum, Adam moments, any container of tensors) is saved and restored
/// with the parameters under the prefix "optimizer.", and the step counter with them.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/format.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/strategy_file.hpp>
#include <xshard/param/traversal.hpp>

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
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

/// One tensor of a checkpoint, type-erased: its stored name and shape, and this rank's block.
struct ckpt_tensor {
    std::string name;
    std::string dtype;
    std::size_t element = 0;
    std::vector<std::size_t> shape;
    layout lay;
    std::byte* data = nullptr;
    std::vector<std::size_t> offset, extent; ///< this rank's block
    bool primary = true; ///< the first holder of its block (coordinate 0 off the split axes)
    bool trainable = true;

    std::size_t local_bytes() const {
        std::size_t n = element;
        for (auto e : extent)
            n *= e;
        return n;
    }
    std::size_t global_bytes() const {
        std::size_t n = element;
        for (auto e : shape)
            n *= e;
        return n;
    }
};

struct ckpt_model {
    std::vector<ckpt_tensor> tensors;
    const communicator* comm = nullptr;
    mesh_shape mesh;
    int rank = 0;
    strategy_file strategy; ///< of everything saved (parameters, then optimizer state)
};

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
        const auto& ms = t.mesh().shape();
        const auto b = t.block();
        ckpt_tensor c;
        c.name = prefix + name;
        c.dtype = std::string(dtype_of<T>().name);
        c.element = sizeof(T);
        c.shape.assign(t.shape().begin(), t.shape().end());
        c.lay = t.layout();
        c.data = reinterpret_cast<std::byte*>(const_cast<T*>(t.local().data()));
        c.offset.assign(b.offset.begin(), b.offset.end());
        c.extent.assign(b.extent.begin(), b.extent.end());
        c.primary = ms.group_rank(t.mesh().rank(), t.layout().replicated_axes(ms)) == 0;
        c.trainable = trainable;
        m.comm = &t.mesh().comm();
        m.mesh = ms;
        m.rank = t.mesh().rank();
        m.strategy.mesh = ms;
        m.strategy.parameters.push_back({c.name, c.shape, c.dtype, c.lay, trainable});
        m.tensors.push_back(std::move(c));
    });
}

template <class P, class S>
ckpt_model collect_model(P& params, S& state, bool all) {
    ckpt_model m;
    collect(m, params, "", all);
    collect(m, state, "optimizer.", true);
    if (!m.comm)
        throw error("xshard: checkpoint: nothing to save or load");
    return m;
}

inline derived_datatype bytes_type(std::size_t element) {
    return derived_datatype::contiguous(int(element), MPI_BYTE);
}

/// The MPI datatype of `offset`/`extent` inside an array of `shape` (elements of `element`
/// bytes), for a file view or a read.
inline derived_datatype block_type(const std::vector<std::size_t>& shape,
                                   const std::vector<std::size_t>& offset,
                                   const std::vector<std::size_t>& extent, std::size_t element) {
    const auto elem = bytes_type(element);
    if (shape.empty())
        return derived_datatype::contiguous(1, elem.native());
    std::vector<int> sizes, subsizes, starts;
    for (std::size_t d = 0; d < shape.size(); ++d) {
        sizes.push_back(int(shape[d]));
        subsizes.push_back(int(extent[d]));
        starts.push_back(int(offset[d]));
    }
    return derived_datatype::subarray(sizes, subsizes, starts, elem.native());
}

/// One collective MPI-IO transfer of the blocks `which` of `tensors` between memory `where[i]`
/// (contiguous, the block's bytes) and the file at `data_start + begins[i]` (the tensor
/// stored whole, row-major).
inline void transfer_blocks(MPI_File fh, bool write, std::size_t data_start,
                            const std::vector<ckpt_tensor>& tensors,
                            const std::vector<std::size_t>& which,
                            const std::vector<std::size_t>& begins,
                            const std::vector<std::byte*>& where) {
    std::vector<derived_datatype> parts;
    std::vector<MPI_Datatype> types;
    std::vector<MPI_Aint> file_at, memory_at;
    std::vector<int> ones, lengths;
    // A file view must move forward through the file: the blocks in file order.
    auto order = which;
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return begins[a] < begins[b]; });
    for (std::size_t i : order) {
        const auto& t = tensors[i];
        if (t.local_bytes() == 0)
            continue;
        parts.push_back(block_type(t.shape, t.offset, t.extent, t.element));
        types.push_back(parts.back().native());
        file_at.push_back(MPI_Aint(data_start + begins[i]));
        ones.push_back(1);
        MPI_Aint at = 0;
        check_mpi(MPI_Get_address(where[i], &at), "MPI_Get_address");
        memory_at.push_back(at);
        lengths.push_back(int(t.local_bytes()));
    }
    MPI_Datatype file_type = MPI_BYTE, memory_type = MPI_BYTE;
    std::optional<derived_datatype> ft, mt;
    if (!types.empty()) {
        MPI_Datatype f = MPI_DATATYPE_NULL, m = MPI_DATATYPE_NULL;
        check_mpi(MPI_Type_create_struct(int(types.size()), ones.data(), file_at.data(),
                                         types.data(), &f),
                  "MPI_Type_create_struct");
        ft.emplace(f);
        check_mpi(MPI_Type_create_hindexed(int(lengths.size()), lengths.data(), memory_at.data(),
                                           MPI_BYTE, &m),
                  "MPI_Type_create_hindexed");
        mt.emplace(m);
        file_type = ft->native();
        memory_type = mt->native();
    }
    check_mpi(MPI_File_set_view(fh, 0, MPI_BYTE, file_type, "native", MPI_INFO_NULL),
              "MPI_File_set_view");
    const int count = types.empty() ? 0 : 1;
    if (write)
        check_mpi(MPI_File_write_all(fh, MPI_BOTTOM, count, memory_type, MPI_STATUS_IGNORE),
                  "MPI_File_write_all");
    else
        check_mpi(MPI_File_read_all(fh, MPI_BOTTOM, count, memory_type, MPI_STATUS_IGNORE),
                  "MPI_File_read_all");
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
    const int n = int(mine.size() * 4);
    std::vector<int> counts(std::size_t(c.size())), displs(std::size_t(c.size()));
    gather(c, std::span(&n, 1), c.rank() == 0 ? std::span(counts) : std::span<int>(), 0);
    std::vector<std::uint64_t> all;
    if (c.rank() == 0) {
        int total = 0;
        for (std::size_t r = 0; r < counts.size(); ++r) {
            displs[r] = total;
            total += counts[r];
        }
        all.resize(std::size_t(total));
    }
    gatherv(c, std::span(reinterpret_cast<const std::uint64_t*>(mine.data()), mine.size() * 4), all,
            counts, displs, 0);
    if (c.rank() != 0)
        return {};
    std::vector<crc_run> runs(all.size() / 4);
    std::memcpy(runs.data(), all.data(), all.size() * sizeof(std::uint64_t));
    return runs;
}

/// Runs `f` on rank 0 of `c` and raises its error, if any, on every rank.
template <class F>
void on_rank0(const communicator& c, F&& f) {
    std::optional<std::string> problem;
    if (c.rank() == 0) {
        try {
            f();
        } catch (const std::exception& e) {
            problem = e.what();
        }
    }
    agree_on_error<io_error>(c, problem);
}

/// Runs `f` everywhere; raises the first rank's error on every rank.
template <class F>
void everywhere(const communicator& c, F&& f) {
    std::optional<std::string> problem;
    try {
        f();
    } catch (const std::exception& e) {
        problem = e.what();
    }
    agree_on_error<io_error>(c, problem);
}

inline void save_integrated(ckpt_model& m, const std::string& path, std::int64_t step) {
    const auto& c = *m.comm;
    std::vector<tensor_entry> entries;
    for (const auto& t : m.tensors)
        entries.push_back({t.name, t.dtype, t.shape, 0, 0});
    std::string header = integrated_header(entries, m.strategy, step);
    const std::string tmp = path + ".tmp";
    on_rank0(c, [&] { std::filesystem::remove(tmp); });
    MPI_File fh = MPI_FILE_NULL;
    check_mpi(MPI_File_open(c.native(), tmp.c_str(), MPI_MODE_CREATE | MPI_MODE_WRONLY,
                            MPI_INFO_NULL, &fh),
              "MPI_File_open " + tmp);
    std::vector<std::size_t> writers, begins;
    std::vector<std::byte*> where;
    std::vector<crc_run> runs;
    std::vector<std::uint64_t> sizes;
    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
        const auto& t = m.tensors[i];
        begins.push_back(entries[i].begin);
        where.push_back(t.data);
        sizes.push_back(t.global_bytes());
        if (t.primary) {
            writers.push_back(i);
            block_runs(runs, i, t.shape, t.offset, t.extent, t.element, t.data);
        }
    }
    transfer_blocks(fh, true, header.size(), m.tensors, writers, begins, where);
    const auto crcs = combine_runs(gather_runs(c, runs), sizes);
    check_mpi(MPI_File_set_view(fh, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL),
              "MPI_File_set_view");
    if (c.rank() == 0) {
        header = integrated_header(entries, m.strategy, step, crcs);
        check_mpi(MPI_File_write_at(fh, 0, header.data(), int(header.size()), MPI_BYTE,
                                    MPI_STATUS_IGNORE),
                  "MPI_File_write_at");
    }
    check_mpi(MPI_File_sync(fh), "MPI_File_sync");
    check_mpi(MPI_File_close(&fh), "MPI_File_close");
    on_rank0(c, [&] {
        file(tmp, O_RDONLY).sync();
        commit_rename(tmp, path);
    });
}

/// The bytes a load verifies at a time: the one buffer it needs beyond the model.
inline constexpr std::size_t verify_chunk = std::size_t(8) << 20;

/// Loads the blocks of `m` from `r` in two passes: first every stored byte to be loaded is
/// checked against its CRC-32 (each read once, by one rank: a contiguous share of the pieces,
/// balanced by bytes, through one buffer of verify_chunk bytes); then, if all passed, each
/// rank reads its blocks straight into the model. So a damaged checkpoint changes nothing, and
/// a load needs no memory beyond the model's and one buffer.
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
                throw io_error("xshard: " + where + ": no tensor '" + t.name +
                               "' in the checkpoint");
            if (stored[i]->dtype != t.dtype)
                throw io_error("xshard: " + where + ": '" + t.name + "' is stored as " +
                               stored[i]->dtype + ", the model has " + t.dtype);
            if (stored[i]->shape != t.shape)
                throw io_error("xshard: " + where + ": '" + t.name + "' is stored with shape " +
                               shape_string(stored[i]->shape) + ", the model has " +
                               shape_string(t.shape));
        }
    });
    // Pass 1: verification.
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
    std::optional<std::string> problem;
    if (c.rank() == 0) {
        try {
            if (const auto bad = r.damaged(stored, all); !bad.empty())
                problem = "xshard: " + where + ": checksum mismatch in " + bad +
                          ": the checkpoint is corrupted";
        } catch (const std::exception& e) {
            problem = e.what();
        }
    }
    agree_on_error<io_error>(c, problem);
    // Pass 2: the blocks, into the model.
    if (r.format() == checkpoint_format::integrated) {
        // One collective MPI-IO read of every rank's blocks.
        std::vector<std::size_t> all_tensors, begins;
        std::vector<std::byte*> into;
        const auto& h = r.header(0);
        for (std::size_t i = 0; i < nt; ++i) {
            all_tensors.push_back(i);
            begins.push_back(h.find(m.tensors[i].name)->begin);
            into.push_back(m.tensors[i].data);
        }
        MPI_File fh = MPI_FILE_NULL;
        check_mpi(MPI_File_open(c.native(), r.path().c_str(), MPI_MODE_RDONLY, MPI_INFO_NULL, &fh),
                  "MPI_File_open " + r.path());
        transfer_blocks(fh, false, h.data_start, m.tensors, all_tensors, begins, into);
        check_mpi(MPI_File_close(&fh), "MPI_File_close");
    } else {
        // The intersecting pieces of the stored blocks, from the files that hold them.
        everywhere(c, [&] {
            for (std::size_t i = 0; i < nt; ++i) {
                const auto& t = m.tensors[i];
                r.read_box(*stored[i], t.offset, t.extent, t.data);
            }
        });
    }
    return {r.step(), r.format(), r.strategy()};
}

inline void save_per_rank(ckpt_model& m, const std::string& path, std::int64_t step) {
    const auto& c = *m.comm;
    const std::string tmp = path + ".tmp";
    on_rank0(c, [&] {
        std::filesystem::remove_all(tmp);
        std::filesystem::create_directories(tmp);
    });
    everywhere(c, [&] {
        std::vector<tensor_entry> entries;
        std::vector<const std::byte*> data;
        for (const auto& t : m.tensors) {
            entries.push_back({t.name, t.dtype, t.extent, 0, 0});
            data.push_back(t.data);
        }
        write_rank_file(tmp, m.rank, std::move(entries), data);
    });
    on_rank0(c, [&] { finish_per_rank(tmp, path, m.strategy, step, false); });
    // The previous checkpoint's files, removed by their ranks at once (freeing a large file's
    // blocks takes a while).
    const std::string old = path + ".old";
    everywhere(c, [&] { std::filesystem::remove(rank_file(old, m.rank)); });
    on_rank0(c, [&] { std::filesystem::remove_all(old); });
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
