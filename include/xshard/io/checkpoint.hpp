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
///    CRC-32 per tensor and one per block the saving ranks held (checkpoint_forms.hpp).
///  * *per-rank*: a directory with each rank's shards in `rank_<r>.safetensors` (with their
///    CRC-32s), `strategy.json` and `checkpoint.json` (the step).
/// Both forms are written and read with POSIX calls on the file system every rank sees (as
/// for any checkpoint library: a parallel or local file system with POSIX semantics). MPI-IO
/// is not used: Open MPI's collective write can report success for writes that failed, and
/// is slower than pwrite (benchmarks/README.md).
///
/// `load_checkpoint` reads either form into any strategy, on any mesh and world size, all or
/// nothing: every stored byte it loads is first checked against its CRC-32, each by one rank
/// (in large reads of a contiguous share of the files), and only then read into the model
/// (from the page cache the check filled): a stored block that lies inside one block of the
/// load's layout (the same layout, or a coarser one) whole, straight into the model (stored in
/// short runs, a column split's, once per node, node_io.hpp), any other in part by each rank
/// that needs a part of it. A truncated file, a wrong dtype or shape, a missing tensor or a
/// checksum mismatch raise the same `io_error` on every rank before anything of the model
/// changes; only a read that fails after the check (a device error, a file truncated by
/// another process meanwhile) leaves the model's values unspecified. No memory beyond the
/// model's, one buffer of 1 MiB, and the node's two shared windows of 4 MiB (kept per
/// communicator, for its reads and writes).
///
/// Saving never loses the previous checkpoint: the new one is written under a temporary
/// name, read back and checked against the checksums computed from memory while the device
/// writes it, fsynced, then renamed over the old one (for the per-rank form: the old
/// directory is renamed `<path>.old` for the moment of the swap, and a load falls back to
/// it). What a killed save left is removed by a later save once provably abandoned
/// (atomic_replace.hpp, remove_stale_temporaries).
///
/// Optimizer state (momentum, Adam moments, any container of tensors) is saved and restored
/// with the parameters under the prefix "optimizer.", and the step counter with them.
///
/// The parts: checkpoint_model.hpp (the tensors saved or loaded), checkpoint_save.hpp and
/// checkpoint_load.hpp (the collective save and load), collective_verify.hpp (checksums
/// checked over the ranks), and format.hpp's headers (the on-disk forms, replacing, the
/// staged-save protocol, the reader).

#include <xshard/io/checkpoint_load.hpp>
#include <xshard/io/checkpoint_model.hpp>
#include <xshard/io/checkpoint_save.hpp>
#include <xshard/io/collective_verify.hpp>
#include <xshard/io/everywhere.hpp>
#include <xshard/io/format.hpp>
#include <xshard/io/strategy_file.hpp>
#include <xshard/param/traversal.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

namespace xshard {

/// How save_checkpoint saves.
struct checkpoint_options {
    checkpoint_format format = checkpoint_format::integrated;
    /// Save every parameter, not only the trainable ones.
    bool all_parameters = false;
    /// The training step saved with the checkpoint.
    std::int64_t step = 0;
};

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
/// layouts now, all or nothing. Collective; throws io_error on every rank if the checkpoint
/// does not match the model or is damaged (a checksum mismatch, a truncated file, a missing
/// one): then nothing of the model or of the state has changed, and the program can go on
/// with what it had (or try an older checkpoint).
template <parameter_container P, parameter_container S = std::tuple<>>
checkpoint_info load_checkpoint(const std::string& path, P& params, S&& optimizer_state = {},
                                bool all_parameters = false) {
    auto m = detail::collect_model(params, optimizer_state, all_parameters);
    std::optional<checkpoint_reader> r;
    detail::everywhere(*m.comm, [&] { r.emplace(path); });
    return detail::load(m, *r);
}

} // namespace xshard
